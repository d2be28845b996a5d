"""Training profiles as files: what one iteration of a model looks like to the block planner.

A profile (YAML or JSON) lists each parameter's size and the moment its gradient is ready in backward, and
each layer's forward time (:class:`~topocc.runtime.training.profile.Profile`, which the runtime measures);
every error names the file, the place and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from topocc.planner._yaml import YDict, YList, load_yaml
from topocc.planner.errors import TopoccError, UsageError
from topocc.planner.units import UnitError, parse_size, parse_time
from topocc.runtime.training.profile import ParamProfile, Profile

__all__ = ["ProfileError", "load_profile", "parse_profile", "profile_to_dict"]


class ProfileError(UsageError):
    """A profile file that cannot be used: unreadable, missing fields, impossible values."""



def _where(source: str, obj: Any, key: Any = None) -> str:
    line = 0
    if isinstance(obj, YDict) and key is not None:
        line = obj.lines.get(key, obj.line)
    elif isinstance(obj, YList) and isinstance(key, int) and key < len(obj.lines):
        line = obj.lines[key]
    elif isinstance(obj, (YDict, YList)):
        line = obj.line
    return f"{source}:{line}" if line else source


def _mapping(doc: Any, source: str, place: Any, what: str, required: Sequence[str],
             optional: Sequence[str] = ()) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise ProfileError(f"{what} must be a mapping, got {type(doc).__name__}", where=_where(source, place))
    for key in doc:
        if key not in (*required, *optional):
            raise ProfileError(f"unknown field {key!r} in {what}", where=_where(source, doc, key),
                               fix=f"fields: {', '.join((*required, *optional))}")
    for key in required:
        if key not in doc:
            raise ProfileError(f"{what} has no {key!r}", where=_where(source, doc))
    return doc


def _seconds(value: Any, source: str, obj: Any, key: Any, what: str) -> float:
    try:
        t = parse_time(value) if isinstance(value, str) else float(value)
    except (UnitError, TypeError, ValueError) as exc:
        raise ProfileError(f"{what} is not a time: {exc}", where=_where(source, obj, key)) from None
    if isinstance(value, bool) or not math.isfinite(t) or t < 0:
        raise ProfileError(f"{what} must be a finite time >= 0, got {value!r}", where=_where(source, obj, key))
    return t


def parse_profile(doc: Any, source: str = "<profile>") -> Profile:
    """A :class:`Profile` from a parsed YAML/JSON document; errors are one-line :class:`ProfileError`.

    Format::

        name: mlp                          # optional
        backward_time_s: 0.0042            # optional; default: the last ready time
        layers:                            # forward order
          - {name: fc0, forward_time_s: 0.0005}
        parameters:                        # forward order (model.parameters())
          - {name: fc0.weight, layer: fc0, bytes: 1 MiB, ready_time_s: 0.0040}

    ``layer`` is a layer name or index; ``bytes`` a number or a size with a unit;
    times are seconds or strings with units (``"40 us"``).
    """
    top = _mapping(doc, source, doc, "the profile", ("layers", "parameters"),
                   ("name", "backward_time_s", "itemsize"))
    layers_doc, params_doc = top["layers"], top["parameters"]
    if not isinstance(layers_doc, list) or not layers_doc:
        raise ProfileError("layers must be a non-empty list", where=_where(source, top, "layers"))
    if not isinstance(params_doc, list) or not params_doc:
        raise ProfileError("parameters must be a non-empty list", where=_where(source, top, "parameters"))
    names: list[str] = []
    fwd: list[float] = []
    for i, item in enumerate(layers_doc):
        m = _mapping(item, source, layers_doc, f"layers[{i}]", ("name", "forward_time_s"))
        name = str(m["name"])
        if name in names:
            raise ProfileError(f"duplicate layer name {name!r}", where=_where(source, layers_doc, i))
        names.append(name)
        fwd.append(_seconds(m["forward_time_s"], source, m, "forward_time_s", f"layers[{i}].forward_time_s"))
    itemsize = top.get("itemsize", 4)
    if not isinstance(itemsize, int) or isinstance(itemsize, bool) or itemsize not in (1, 2, 4, 8):
        raise ProfileError(f"itemsize must be 1, 2, 4 or 8 bytes, got {itemsize!r}",
                           where=_where(source, top, "itemsize"))
    params: list[ParamProfile] = []
    for i, item in enumerate(params_doc):
        what = f"parameters[{i}]"
        m = _mapping(item, source, params_doc, what, ("name", "layer", "bytes", "ready_time_s"))
        layer = m["layer"]
        if isinstance(layer, int) and not isinstance(layer, bool):
            if not 0 <= layer < len(names):
                raise ProfileError(f"{what}.layer {layer} is out of range (there are {len(names)} layers)",
                                   where=_where(source, m, "layer"))
            index = layer
        elif str(layer) in names:
            index = names.index(str(layer))
        else:
            raise ProfileError(f"{what}.layer names unknown layer {layer!r}", where=_where(source, m, "layer"),
                               fix=f"layers: {', '.join(names[:8])}")
        try:
            nbytes = parse_size(m["bytes"])
        except (UnitError, TypeError, ValueError) as exc:
            raise ProfileError(f"{what}.bytes is not a size: {exc}", where=_where(source, m, "bytes")) from None
        if nbytes <= 0 or nbytes % itemsize:
            raise ProfileError(f"{what}.bytes must be a positive multiple of the {itemsize}-byte item size, "
                               f"got {nbytes}", where=_where(source, m, "bytes"))
        ready = _seconds(m["ready_time_s"], source, m, "ready_time_s", f"{what}.ready_time_s")
        params.append(ParamProfile(str(m["name"]), index, nbytes, ready, itemsize))
    last = max(p.ready_time_s for p in params)
    backward = last
    if "backward_time_s" in top:
        backward = _seconds(top["backward_time_s"], source, top, "backward_time_s", "backward_time_s")
        if backward < last:
            raise ProfileError(f"backward_time_s {backward:g} is before the last gradient is ready ({last:g} s)",
                               where=_where(source, top, "backward_time_s"))
    return Profile(tuple(params), tuple(names), tuple(fwd), backward, name=str(top.get("name", Path(source).stem)))


def load_profile(path: str | Path) -> Profile:
    """Load a profile YAML file (see :func:`parse_profile`); every failure is a one-line :class:`ProfileError`."""
    try:
        doc = load_yaml(path)
    except TopoccError as exc:
        raise ProfileError(exc.message.replace("topology file", "profile"), where=exc.where, fix=exc.fix) from None
    return parse_profile(doc, str(path))


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """The YAML/JSON form of a profile (what :func:`parse_profile` reads back)."""
    return {
        "name": profile.name,
        "backward_time_s": profile.backward_time_s,
        "itemsize": profile.params[0].itemsize if profile.params else 4,
        "layers": [{"name": n, "forward_time_s": t} for n, t in zip(profile.layers, profile.forward_time_s)],
        "parameters": [{"name": p.name, "layer": profile.layers[p.layer], "bytes": p.nbytes,
                        "ready_time_s": p.ready_time_s} for p in profile.params],
    }
