"""PyTorch's generic distributed tests (``distributed_test``) over gloo and topocc, in this process: the worker
side of ``benchmarks/conformance.py``.

``distributed_test`` reads the backend from ``BACKEND`` when it is executed, as for PyTorch's own
``test_distributed_spawn.py``; this worker sets it and executes the module once per backend, so one
process (one import of torch's test harness) runs the cases of both.  ``WORLD_SIZE`` comes from the
environment; ``topocc`` also needs ``TOPOCC_PLAN``.  topocc is given gloo's feature set
(it is a CPU backend that delegates what its plans do not carry to gloo), so every case that gates on
gloo runs for topocc too:

* ``DistTestCases``' feature and skip sets get ``topocc`` wherever they hold ``gloo``, and its
  ``plugin`` set (what ``require_backend_is_available`` accepts) gets it as well;
* ``distributed_test``'s comparisons with the literal name (``BACKEND == "gloo"``,
  ``require_backend_is_available({"gloo"})``) are rewritten to test membership of :data:`GLOO_LIKE`
  before the module is executed (same lines, so tracebacks point at torch's file).

One feature of gloo's is not claimed: its profiling allow-lists (``PROFILING_SUPPORTED_BACKENDS`` and
kin) stay as torch wrote them.  C++ backends record an asynchronous profiler event ``gloo:all_reduce``
with the input shapes from their worker thread; a Python process group has no such hook, so with topocc
in those lists every collective case would fail on the missing event rather than on its results.

The rewrite is applied for gloo's runs too (a no-op for it) so both run the same module.  Ranks are
forked rather than spawned: the cases are the same, each starts in a fraction of the time.

    WORLD_SIZE=2 TOPOCC_PLAN=bundle python -m benchmarks.conformance_suite OUT.jsonl gloo,topocc [CASE ...]

writes one JSON line per case and backend to ``OUT.jsonl``: ``{"backend", "case", "outcome", "detail",
"seconds"}``, outcome ``passed``, ``failed`` or ``skipped``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
import types
import unittest
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing

import topocc.runtime.distributed  # noqa: F401  (registers the "topocc" backend in this process and its forks)

MODULE = "torch.testing._internal.distributed.distributed_test"
#: ``distributed_test`` executed for each backend so far.
_LOADED: dict[str, types.ModuleType] = {}
#: The environment this worker started with (what every backend's copy of the module is executed in).
_START_ENV = dict(os.environ)
#: The backends that share gloo's feature set in these cases.
GLOO_LIKE = frozenset({"gloo", "topocc"})
#: Source rewrites of ``distributed_test``: (pattern, replacement); each must match at least once, so a
#: torch release that words a gate differently fails here instead of silently skipping topocc's cases.
REWRITES: tuple[tuple[str, str], ...] = (
    (r'BACKEND != "gloo"', "BACKEND not in GLOO_LIKE"),
    (r'BACKEND == "gloo"', "BACKEND in GLOO_LIKE"),
    (r'require_backend_is_available\(\{"gloo"\}\)', "require_backend_is_available(GLOO_LIKE)"),
)


def _give_gloo_features() -> None:
    """Add the gloo-like names to every ``DistTestCases`` set that names gloo, and to the plugin set."""
    from torch.testing._internal.common_distributed import DistTestCases

    for table in (DistTestCases.backend_feature, DistTestCases.skip_collective):
        for names in table.values():
            if "gloo" in names:
                names.update(GLOO_LIKE)
    DistTestCases.backend_feature["plugin"].update(GLOO_LIKE - {"gloo"})


def load_distributed_test(backend: str) -> types.ModuleType:
    """``distributed_test`` for ``backend``, executed from its own file after :data:`REWRITES` and registered
    under its name (replacing the module of an earlier backend: its classes keep their own globals).

    The module reads the environment as it is executed (``INIT_METHOD``, which the cases then set for
    themselves), so each backend's copy is executed in the environment this process started with."""
    os.environ.clear()
    os.environ.update(_START_ENV, BACKEND=backend)
    if backend in _LOADED:
        sys.modules[MODULE] = _LOADED[backend]
        return _LOADED[backend]
    try:
        _give_gloo_features()
    except ModuleNotFoundError as exc:  # torch's test harness imports expecttest, a test extra of topocc's
        raise SystemExit(f"conformance: torch's testing package needs {exc.name}: pip install -e '.[test]'") from None
    spec = importlib.util.find_spec(MODULE)
    if spec is None or spec.origin is None:
        raise SystemExit(f"conformance: torch has no {MODULE}: install a torch wheel with its testing package")
    source = Path(spec.origin).read_text()
    for pattern, replacement in REWRITES:
        source, n = re.subn(pattern, replacement, source)
        if n == 0:
            raise SystemExit(f"conformance: {spec.origin} has no {pattern!r} any more: update REWRITES in {__file__}")
    module = importlib.util.module_from_spec(spec)
    module.__dict__["GLOO_LIKE"] = GLOO_LIKE
    sys.modules[MODULE] = module
    # dont_inherit: this module's ``from __future__ import annotations`` would turn the cases' annotations into
    # strings, which DDP's comm-hook check refuses
    exec(compile(source, spec.origin, "exec", dont_inherit=True), module.__dict__)
    _LOADED[backend] = module
    return module


def case_class(backend: str) -> type[unittest.TestCase]:
    """The test class of ``test_distributed_spawn.py`` for ``backend``, its ranks forked."""
    dt = load_distributed_test(backend)

    class TestDistBackendWithFork(dt.TestDistBackend, dt.DistributedTest._DistTestBase):  # type: ignore[name-defined]
        def setUp(self) -> None:
            super().setUp()
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

    return TestDistBackendWithFork


def all_cases() -> list[str]:
    """Every case name of ``distributed_test`` (``test_...``), sorted."""
    return sorted(unittest.TestLoader().getTestCaseNames(case_class("gloo")))


class _Recorder(unittest.TestResult):
    """Writes each case's outcome as one JSON line as soon as it ends (a killed run keeps what it finished)."""

    def __init__(self, out: Any, backend: str) -> None:
        super().__init__()
        self._out = out
        self._backend = backend
        self._start = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        self._start = time.monotonic()

    def _write(self, test: unittest.TestCase, outcome: str, detail: str) -> None:
        row = {"backend": self._backend, "case": test.id().rsplit(".", 1)[-1], "outcome": outcome,
               "detail": detail[-20000:],
               "seconds": round(time.monotonic() - self._start, 2)}
        self._out.write(json.dumps(row) + "\n")
        self._out.flush()

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self._write(test, "passed", "")

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self._write(test, "skipped", reason)

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self._write(test, "failed", self.failures[-1][1])

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self._write(test, "failed", self.errors[-1][1])

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._write(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self._write(test, "failed", "unexpected success")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit("usage: python -m benchmarks.conformance_suite OUT.jsonl BACKEND[,BACKEND] [CASE ...]")
    known = all_cases()
    names = argv[2:] or known
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"conformance: distributed_test has no case {', '.join(unknown)}")
    with open(argv[0], "a") as out:
        for backend in argv[1].split(","):
            cls = case_class(backend)
            unittest.TestSuite(cls(name) for name in names).run(_Recorder(out, backend))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
