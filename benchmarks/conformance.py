"""PyTorch's own distributed tests as a conformance test of the ``topocc`` backend: case by case against gloo.

``torch.testing._internal.distributed.distributed_test`` is what PyTorch's ``test_distributed_spawn.py``
runs for gloo, NCCL and UCC.  This script runs its cases on CPU ranks over gloo and over topocc (given
gloo's feature set, see ``benchmarks/conformance_suite.py``), with a plan bundle compiled by ``topocc
bundle`` for ``emu-uniform``'s first ranks, and compares: every case gloo passes, topocc must pass, or
:data:`EXPECTED_DIFFERENCES` must say why it cannot.  Prints, per world size, passed/failed/skipped for
each backend and every case where the two differ; exits 1 on an unexplained difference.

    python benchmarks/conformance.py                    # every case, 2 and 4 ranks (about an hour here)
    python benchmarks/conformance.py --cases ci --worlds 2   # the subset tests/runtime/distributed runs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

if str(Path(__file__).resolve().parent.parent) not in sys.path:  # run as a script: the repository's modules
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bundles import REPO, compile_bundle

BACKENDS = ("gloo", "topocc")
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall")

#: The cases CI runs, every one of which gloo passes on 2 and on 4 ranks: each collective and call form of
#: ``distributed_test`` that runs on CPU (sync and async, world and full-group, coalesced, complex and sparse
#: tensors, point-to-point, object collectives, DDP; re-initializing the world), about a second each.  Its
#: subgroup cases need 8 ranks (``skip_if_small_worldsize``); it has no CPU case for all-to-all,
#: reduce-scatter or the coalescing manager on gloo: ``tests/runtime/distributed/forms_job.py`` runs those.
CI_CASES = (
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_full_group_min", "test_all_reduce_product",
    "test_all_reduce_sum_complex", "test_sparse_all_reduce_sum", "test_all_reduce_coalesced_sum",
    "test_all_reduce_coalesced_full_group_max", "test_broadcast", "test_broadcast_full_group", "test_reduce_sum",
    "test_reduce_full_group_max", "test_all_gather", "test_all_gather_full_group", "test_all_gather_coalesced_simple",
    "test_all_gather_coalesced_with_empty", "test_gather", "test_scatter", "test_barrier",
    "test_barrier_timeout_global", "test_monitored_barrier_gloo_rank_0_timeout", "test_monitored_barrier_gloo",
    "test_send_recv_any_source", "test_batch_isend_irecv_gloo", "test_all_gather_object_default_pg",
    "test_DistributedDataParallelCPU",
)

_MONITORED = ("torch's dist.monitored_barrier refuses every backend but gloo by its name (distributed_c10d: "
              "get_backend(group) != 'gloo' raises ValueError); the group's own monitored_barrier method, "
              "which torch code holding the group calls, works (test_monitored_barrier_gloo_rank_0_timeout)")

#: Cases gloo passes that topocc cannot, and why: case -> (world size, or None for every size; reason).
EXPECTED_DIFFERENCES: dict[str, tuple[int | None, str]] = {
    "test_monitored_barrier_gloo": (None, _MONITORED),
    "test_monitored_barrier_gloo_subgroup": (None, _MONITORED),
}


@dataclass(frozen=True)
class Outcome:
    """One case's result on one backend: ``passed``, ``failed`` or ``skipped``, with the reason or error."""

    case: str
    outcome: str
    detail: str = ""
    seconds: float = 0.0

    @property
    def summary(self) -> str:
        """The error's last exception line (and the line after it), or the skip reason, on one line."""
        lines = [line.strip() for line in self.detail.splitlines() if line.strip()]
        errors = [i for i, line in enumerate(lines) if re.match(r"^([\w.]+(Error|Exception|Exit)|Timing out)\b", line)]
        if not errors:
            return lines[-1] if lines else ""
        i = errors[-1]
        follow = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("To execute") else ""
        return f"{lines[i]} {follow}".strip()[:300]


def bundle_for(world: int, folder: Path) -> Path:
    """The conformance bundle: every collective on the world (a full group made by ``new_group`` runs it too)."""
    return compile_bundle(world, folder, COLLECTIVES)


def run_cases(world: int, cases: Sequence[str], plan: Path, limit_s: float,
              case_timeout_s: int = 120) -> dict[str, dict[str, Outcome]]:
    """Run ``cases`` of ``distributed_test`` on ``world`` CPU ranks over each of :data:`BACKENDS` (one worker
    process, ranks forked per case), outcomes by backend and case; a case with no result (the worker was
    killed at ``limit_s``, or could not start) fails with the worker's last words."""
    with tempfile.TemporaryDirectory(prefix="topocc-conformance-") as tmp:
        out = Path(tmp) / "results.jsonl"
        # INIT_METHOD as PyTorch's run_test.py sets it for its file:// runs of the suite (the one case that
        # re-initializes the world needs it; the others initialize from their own file either way)
        env = {**os.environ, "WORLD_SIZE": str(world), "PYTHONPATH": str(REPO), "TOPOCC_PLAN": str(plan),
               "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTORCH_PRINT_REPRO_ON_FAILURE": "0",
               "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(case_timeout_s), "TMPDIR": tmp,
               "INIT_METHOD": f"file://{tmp}/shared_init_file"}
        env.pop("TOPOCC_TIMEOUT", None)
        cmd = [sys.executable, "-m", "benchmarks.conformance_suite", str(out), ",".join(BACKENDS), *cases]
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            _, err = proc.communicate()
            err = f"the worker ran past {limit_s:g} s and was killed\n{err}"
        rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    found: dict[str, dict[str, Outcome]] = {b: {} for b in BACKENDS}
    for r in rows:
        found[r["backend"]][r["case"]] = Outcome(r["case"], r["outcome"], r["detail"], r["seconds"])
    for backend in BACKENDS:
        for case in cases:
            found[backend].setdefault(case, Outcome(case, "failed", f"no result: {err.strip()[-2000:]}"))
    return found


def differences(gloo: dict[str, Outcome], topocc: dict[str, Outcome], world: int) -> tuple[list[str], list[str]]:
    """(unexplained, explained): cases gloo passed that topocc did not, without and with an entry in
    :data:`EXPECTED_DIFFERENCES` for this world size, one line each."""
    unexplained, explained = [], []
    for case, ref in sorted(gloo.items()):
        mine = topocc[case]
        if ref.outcome != "passed" or mine.outcome == "passed":
            continue
        sizes, why = EXPECTED_DIFFERENCES.get(case, (0, ""))
        line = f"{case}: {mine.outcome} ({mine.summary})"
        if why and sizes in (None, world):
            explained.append(f"{case}: {why}")
        else:
            unexplained.append(line)
    return unexplained, explained


def stale(gloo: dict[str, Outcome], topocc: dict[str, Outcome], world: int) -> list[str]:
    """Expected differences for this world that did not happen (topocc passed, or gloo did not pass)."""
    return [case for case, (sizes, _) in EXPECTED_DIFFERENCES.items()
            if case in gloo and sizes in (None, world)
            and (topocc[case].outcome == "passed" or gloo[case].outcome != "passed")]


def counts(results: dict[str, Outcome]) -> tuple[int, int, int]:
    """(passed, failed, skipped)."""
    outcomes = [o.outcome for o in results.values()]
    return outcomes.count("passed"), outcomes.count("failed"), outcomes.count("skipped")


def _select(names: Iterable[str]) -> list[str]:
    chosen = list(names)
    if chosen == ["ci"]:
        return list(CI_CASES)
    if chosen == ["all"]:
        env = {**os.environ, "WORLD_SIZE": "2", "PYTHONPATH": str(REPO)}
        listing = subprocess.run([sys.executable, "-c", "from benchmarks.conformance_suite import all_cases\n"
                                  "print('\\n'.join(all_cases()))"], capture_output=True, text=True, cwd=REPO,
                                 env=env, timeout=600, check=True)
        return listing.stdout.split()
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--cases", nargs="+", default=["all"], help="all, ci, or case names")
    p.add_argument("--bundles", type=Path, default=None, help="where to keep the compiled bundles (default: temp)")
    p.add_argument("--limit-s", type=float, default=7200, help="wall-clock limit of each world size's run")
    p.add_argument("--json", type=Path, default=None, help="also write every outcome here")
    args = p.parse_args(argv)
    cases = _select(args.cases)
    bundles = args.bundles or Path(tempfile.mkdtemp(prefix="topocc-conformance-bundles-"))
    rows, ok, dump = [], True, {}
    for world in args.worlds:
        plan = bundle_for(world, bundles / f"world{world}")
        start = time.monotonic()
        results = run_cases(world, cases, plan, args.limit_s)
        for backend in BACKENDS:
            seconds = sum(o.seconds for o in results[backend].values())
            rows.append((world, backend, *counts(results[backend]), seconds))
        print(f"{world} ranks: {time.monotonic() - start:.0f} s for both backends", flush=True)
        unexplained, explained = differences(results["gloo"], results["topocc"], world)
        ok &= not unexplained
        print(f"\n{world} ranks: {len(explained)} expected difference(s), {len(unexplained)} unexplained")
        for line in explained:
            print(f"  expected    {line}")
        for line in unexplained:
            print(f"  UNEXPLAINED {line}")
        for case in stale(results["gloo"], results["topocc"], world):
            print(f"  stale entry {case}: topocc passed or gloo did not")
        only_topocc = sorted(c for c, o in results["topocc"].items()
                             if o.outcome == "passed" and results["gloo"][c].outcome != "passed")
        for case in only_topocc:
            print(f"  topocc only {case}: gloo {results['gloo'][case].outcome} ({results['gloo'][case].summary})")
        dump[world] = {b: {c: vars(o) for c, o in r.items()} for b, r in results.items()}
    print(f"\n{'ranks':>5} {'backend':>8} {'passed':>7} {'failed':>7} {'skipped':>8} {'case s':>8}")
    for world, backend, passed, failed, skipped, seconds in rows:
        print(f"{world:>5} {backend:>8} {passed:>7} {failed:>7} {skipped:>8} {seconds:>8.0f}")
    if args.json is not None:
        args.json.write_text(json.dumps(dump, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
