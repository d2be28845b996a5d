"""topocc: a topology-aware compiler for collective communication, and the thin runtime that replays its plans.

Two subpackages, one import name:

* :mod:`topocc.planner` compiles (offline): topology YAML -> verified, timed schedule JSON;
* :mod:`topocc.runtime` replays (at training time): schedule JSON -> sends, receives and reductions over
  MPI, gloo or NCCL.  It never imports the planner, so a training job loads only numpy and its transport.

The names below are the public API, loaded on first use (``import topocc`` costs nothing until then):

>>> import topocc                                                           # doctest: +SKIP
>>> topology = topocc.load_topology("topologies/dgx1-v100.yaml")            # doctest: +SKIP
>>> compiled = topocc.compile_schedule(topology, "allreduce")               # doctest: +SKIP
>>> topocc.save_schedule(compiled.schedule, "out/dgx1-allreduce.json")     # doctest: +SKIP
>>> comm = topocc.Communicator("out/dgx1-allreduce.json")                  # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public name -> the module that defines it.
_EXPORTS = {
    "Topology": "topocc.planner.topology.model",
    "load_topology": "topocc.planner.topology.parse",
    "parse_topology_text": "topocc.planner.topology.parse",
    "Network": "topocc.planner.routing.network",
    "Options": "topocc.planner.compiler.options",
    "ALGORITHMS": "topocc.planner.compiler.algorithms",
    "compile_schedule": "topocc.planner.compiler.compile",
    "compile_plan": "topocc.planner.compiler.size_buckets",
    "verify": "topocc.planner.analysis.verify",
    "simulate": "topocc.planner.analysis.simulate",
    "lower_bound": "topocc.planner.analysis.bounds",
    "Schedule": "topocc.runtime.schedule",
    "load_schedule": "topocc.runtime.schedule",
    "save_schedule": "topocc.runtime.schedule",
    "Plan": "topocc.runtime.plan",
    "Communicator": "topocc.runtime.communicator",
    "TopoccError": "topocc.runtime.errors",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from topocc.planner.analysis.bounds import lower_bound as lower_bound
    from topocc.planner.analysis.simulate import simulate as simulate
    from topocc.planner.analysis.verify import verify as verify
    from topocc.planner.compiler.algorithms import ALGORITHMS as ALGORITHMS
    from topocc.planner.compiler.compile import compile_schedule as compile_schedule
    from topocc.planner.compiler.options import Options as Options
    from topocc.planner.compiler.size_buckets import compile_plan as compile_plan
    from topocc.planner.routing.network import Network as Network
    from topocc.planner.topology.model import Topology as Topology
    from topocc.planner.topology.parse import load_topology as load_topology
    from topocc.planner.topology.parse import parse_topology_text as parse_topology_text
    from topocc.runtime.communicator import Communicator as Communicator
    from topocc.runtime.errors import TopoccError as TopoccError
    from topocc.runtime.plan import Plan as Plan
    from topocc.runtime.schedule import Schedule as Schedule
    from topocc.runtime.schedule import load_schedule as load_schedule
    from topocc.runtime.schedule import save_schedule as save_schedule


def __getattr__(name: str) -> Any:
    """Load a public name's module on first use (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'topocc' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
