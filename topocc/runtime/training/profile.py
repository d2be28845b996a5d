"""What the block planner (``topocc.planner.gradblocks.block_plan``) needs from one training iteration, and how
to measure it.

:class:`Profile` and :class:`ParamProfile` are plain data with no torch import at module level, so the
planner can read profiles without importing torch (and the runtime never imports the planner);
:func:`profile_model` measures one with torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from topocc.runtime.errors import CommunicatorError

if TYPE_CHECKING:
    import torch

__all__ = ["ParamProfile", "Profile", "owners", "profile_model"]


@dataclass(frozen=True, slots=True)
class ParamProfile:
    """One parameter: its size and when its gradient is ready, in seconds after backward starts."""

    name: str
    layer: int
    nbytes: int
    ready_time_s: float
    itemsize: int = 4


@dataclass(frozen=True, slots=True)
class Profile:
    """One training iteration as the block planner sees it (parameters and layers in forward order).

    ``forward_time_s[l]`` is layer ``l``'s forward compute time (including the
    parameter-free modules that follow it); ``backward_time_s`` the length of the
    backward pass, at least the last ready time.
    """

    params: tuple[ParamProfile, ...]
    layers: tuple[str, ...]
    forward_time_s: tuple[float, ...]
    backward_time_s: float
    name: str = "profile"

    @property
    def total_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    @property
    def forward_total_s(self) -> float:
        return float(sum(self.forward_time_s))


def owners(model: torch.nn.Module) -> tuple[list[str], list[torch.nn.Module], list[int]]:
    """Modules owning parameters (in order of first parameter) and each parameter's owner index.

    A parameter belongs to the module that holds it, unless an enclosing module holds parameters of its own:
    such a module may use its children's weights without calling them (``nn.MultiheadAttention`` applies
    ``out_proj.weight`` itself, and ``out_proj``'s forward never runs), so it is the layer that uses them.
    """
    modules_by_name = dict(model.named_modules())
    owner_of: dict[int, tuple[str, torch.nn.Module]] = {}
    for mname, module in model.named_modules():
        holder = mname
        while holder:
            parent = holder.rpartition(".")[0]
            if not any(True for _ in modules_by_name[parent].parameters(recurse=False)):
                break
            holder = parent
        for p in module.parameters(recurse=False):
            owner_of.setdefault(id(p), (holder, modules_by_name[holder]))
    names: list[str] = []
    modules: list[torch.nn.Module] = []
    layer_of: list[int] = []
    for p in model.parameters():
        mname, module = owner_of[id(p)]
        if not modules or modules[-1] is not module:
            if any(m is module for m in modules):
                layer_of.append(next(i for i, m in enumerate(modules) if m is module))
                continue
            names.append(mname or "<root>")
            modules.append(module)
        layer_of.append(len(modules) - 1)
    return names, modules, layer_of


def profile_model(model: torch.nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor], batch: tuple[Any, Any], *,
                  repeats: int = 5, warmup: int = 2) -> Profile:
    """Measure per-parameter gradient ready times and per-layer forward times (median of ``repeats`` runs).

    Ready times come from ``Tensor.register_post_accumulate_grad_hook``, relative
    to the moment ``backward()`` is called; forward times from forward pre-hooks
    on the modules that own parameters (a layer's time runs until the next such
    module starts, so activations are charged to the layer before them).
    On CUDA every timestamp waits for the GPU first (so a time is when the kernels finished, not when
    they were enqueued).  Gradients are zeroed afterwards; the model is otherwise unchanged.

    >>> prof = profile_model(mlp, nn.functional.mse_loss, (x, y))   # doctest: +SKIP
    """

    if repeats < 1:
        raise CommunicatorError(f"repeats must be at least 1, got {repeats}")
    params = list(model.parameters())
    names, modules, layer_of = owners(model)
    pnames = [n for n, _ in model.named_parameters()]
    ready = np.zeros((repeats, len(params)))
    fwd = np.zeros((repeats, len(modules)))
    bwd = np.zeros(repeats)
    marks: list[float] = []
    stamp: list[float] = [0.0]
    current: list[int] = [-1]

    if params and params[0].is_cuda:  # kernels run behind the host: read the clock once the GPU caught up
        from topocc.runtime.transports.torch_ops import wait_for_gpu

        def clock() -> float:
            wait_for_gpu(20e-6)  # fine-grained: the steps measured here are short
            return time.perf_counter()
    else:
        clock = time.perf_counter

    def on_ready(i: int) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            if current[0] >= 0:
                ready[current[0], i] = clock() - stamp[0]
        return hook

    def on_forward(_: torch.nn.Module, __: Any) -> None:
        marks.append(clock())

    handles = [p.register_post_accumulate_grad_hook(on_ready(i)) for i, p in enumerate(params)]
    handles += [m.register_forward_pre_hook(on_forward) for m in modules]
    x, y = batch
    try:
        for r in range(-warmup, repeats):
            current[0] = r
            model.zero_grad(set_to_none=True)
            marks.clear()
            start = clock()
            loss = loss_fn(model(x), y)
            end = clock()
            stamp[0] = clock()
            loss.backward()
            done = clock() - stamp[0]
            if r >= 0 and len(marks) == len(modules):
                edges = [*marks, end]
                fwd[r] = np.diff(edges)
                fwd[r, 0] += marks[0] - start
                bwd[r] = done
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
        current[0] = -1
    med_ready = np.median(ready, axis=0)
    entries = tuple(
        ParamProfile(pnames[i], layer_of[i], p.numel() * p.element_size(), float(med_ready[i]), p.element_size())
        for i, p in enumerate(params)
    )
    backward = max(float(np.median(bwd)), max((e.ready_time_s for e in entries), default=0.0))
    return Profile(entries, tuple(names), tuple(float(v) for v in np.median(fwd, axis=0)), backward,
                   name=type(model).__name__)
