"""Training-time integration: a DDP communication hook, Prophet block scheduling and DASO.

Three ways to run a compiled allreduce plan inside a PyTorch training loop, one module each:

* :mod:`topocc.runtime.training.hook`: :func:`topocc_allreduce_hook` with :class:`TopoccHookState`, a DDP
  communication hook averaging each bucket with the plan (MPI on CPU buckets, NCCL on CUDA ones);
* :mod:`topocc.runtime.training.blocks`: :class:`BlockScheduler`, Prophet's gradient blocks sent as soon
  as they are ready, in planned order, with per-layer updates in the next forward pass (CPU tensors
  over MPI or gloo, CUDA tensors over NCCL);
* :mod:`topocc.runtime.training.daso`: :class:`DASO`, node-local averaging every step and stale global
  averaging every ``B`` steps (over MPI from plans, or over given communicators on any transport);

:mod:`topocc.runtime.training.bucket_feedback`, the hook's error feedback over DDP's buckets (with an encoded plan) and
step ahead, and :mod:`topocc.runtime.training.profile`, which measures what the block planner
(``topocc.planner.gradblocks.block_plan``) needs.  Nothing here imports torch at module level: the
planner reads :class:`Profile` without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from topocc.runtime.training.blocks import BlockScheduler as BlockScheduler
    from topocc.runtime.training.blocks import Piece as Piece
    from topocc.runtime.training.blocks import load_block_plan as load_block_plan
    from topocc.runtime.training.daso import DASO as DASO
    from topocc.runtime.training.hook import TopoccHookState as TopoccHookState
    from topocc.runtime.training.hook import topocc_allreduce_hook as topocc_allreduce_hook
    from topocc.runtime.training.profile import ParamProfile as ParamProfile
    from topocc.runtime.training.profile import Profile as Profile
    from topocc.runtime.training.profile import profile_model as profile_model

#: Each name this package exports, and the module that defines it: a module loads at the first use of one of
#: its names, so a job that needs one of them (the backend's error feedback, the planner's profile) does
#: not load the replay the others bring.
_HOMES = {
    "BlockScheduler": "blocks", "Piece": "blocks", "load_block_plan": "blocks", "DASO": "daso",
    "TopoccHookState": "hook", "topocc_allreduce_hook": "hook",
    "ParamProfile": "profile", "Profile": "profile", "profile_model": "profile",
}

__all__ = sorted(_HOMES, key=str.lower)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
