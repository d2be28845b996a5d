"""PyTorch's own distributed tests as the ``topocc`` backend's conformance test: what gloo passes, topocc passes.

``benchmarks/conformance.py`` runs cases of ``torch.testing._internal.distributed.distributed_test`` (what
PyTorch's ``test_distributed_spawn.py`` runs for gloo) on CPU ranks over gloo and over topocc, topocc
given gloo's feature set and a bundle compiled by ``topocc bundle``; here the CI subset
(:data:`~benchmarks.conformance.CI_CASES`) on 2 and 4 ranks.  Every case gloo passes must pass over
topocc or be listed, with the reason, in :data:`~benchmarks.conformance.EXPECTED_DIFFERENCES`.  The call
forms ``distributed_test`` has no CPU case for (all-to-all, reduce-scatter, the coalescing manager's, the
functional collectives) run in ``forms_job.py`` against gloo.  The full suite is the benchmark's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from benchmarks.conformance import (  # noqa: E402
    BACKENDS,
    CI_CASES,
    EXPECTED_DIFFERENCES,
    bundle_for,
    differences,
    run_cases,
    stale,
)
from benchmarks.conformance_suite import MODULE  # noqa: E402
from tests.conftest import REPO, run_bounded  # noqa: E402

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def conformance_bundle(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], Path]:
    """The conformance bundle for a world size, compiled by ``topocc bundle`` once per test session."""
    root = tmp_path_factory.mktemp("conformance-bundles")
    return lambda world: bundle_for(world, root / f"world{world}")


@pytest.mark.parametrize("world", [2, 4])
def test_topocc_passes_the_cases_gloo_passes(conformance_bundle: Callable[[int], Path], world: int) -> None:
    results = run_cases(world, CI_CASES, conformance_bundle(world), limit_s=600)
    gloo, topocc = results["gloo"], results["topocc"]
    assert set(results) == set(BACKENDS)
    unexplained, _ = differences(gloo, topocc, world)
    assert unexplained == [], "\n".join(unexplained)
    assert stale(gloo, topocc, world) == []
    # the subset runs, none of it skipped: gloo passes every case
    assert {c: o.summary for c, o in gloo.items() if o.outcome != "passed"} == {}
    # a case topocc fails is failed for its own reason, never for the harness's
    assert all(not o.detail.startswith("no result") for o in topocc.values())


def test_every_expected_difference_is_a_case_of_torchs_suite() -> None:
    """Read from the suite's source (executing it would set ``BACKEND`` in this process)."""
    spec = importlib.util.find_spec(MODULE)
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).read_text()
    for case, (world, why) in EXPECTED_DIFFERENCES.items():
        assert f"def {case}(self" in source and world in (None, 2, 4) and len(why) > 20, case


def test_every_call_form_equals_gloo(conformance_bundle: Callable[[int], Path]) -> None:
    world = 4
    # every form runs its plan (no trials against gloo, which would send a form's first call to gloo)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
           "TOPOCC_PLAN": str(conformance_bundle(world)), "TOPOCC_TUNE": "off"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           str(HERE / "forms_job.py")]
    done = run_bounded(cmd, 300, "torchrun forms_job.py", env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    res = json.loads(lines[-1].removeprefix("RESULT "))
    assert res["wrong"] == [] and len(res["forms"]) >= 17
    counters = res["counters"]
    # the coalesced and functional forms of the planned collectives ran plans
    for collective in ("allreduce", "allgather", "reducescatter", "broadcast"):
        assert counters[collective]["planned"] > 0, counters
