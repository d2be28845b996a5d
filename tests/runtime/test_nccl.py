"""The NCCL transport: refused cleanly without CUDA; on a GPU, every collective, the planner, DDP and failures.

The CUDA cases run wherever one GPU, torch and CuPy's NCCL bindings are present: the ranks share the GPU,
each with its own ``NCCL_HOSTID`` (tests/runtime/mpi_scripts/nccl_check.py launches them and judges what
they report; benchmarks/gpu_check.sh runs the same cases without pytest).  CI has no GPU: they skip.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from topocc.runtime.errors import CommunicatorError

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("runtime_test_nccl_check", HERE / "mpi_scripts" / "nccl_check.py")
assert _spec is not None and _spec.loader is not None
N = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(N)


def _gpu_missing() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU here (CI has none): the NCCL cases run on a GPU machine (benchmarks/gpu_check.sh)"
    try:
        from cupy.cuda import nccl  # noqa: F401
    except ImportError:
        return "CuPy's NCCL bindings (cupy.cuda.nccl) are not installed"
    return None


GPU = pytest.mark.skipif(_gpu_missing() is not None, reason=_gpu_missing() or "")


def passes(mode: str, world: int, *args: str) -> None:
    problems = N.verdict(mode, N.launch(mode, world, *args))
    assert not problems, "\n".join(problems)


@pytest.mark.skipif(_gpu_missing() is None, reason="a GPU with CuPy is here: the transport is built, not refused")
def test_refused_in_one_line_without_a_gpu() -> None:
    from topocc.runtime.transports.nccl import NCCLTransport

    with pytest.raises(CommunicatorError) as info:
        NCCLTransport(object())
    text = str(info.value)
    assert "\n" not in text and ("CuPy's NCCL bindings" in text or "needs a CUDA device" in text)


def test_the_verdicts_judge_what_ranks_report() -> None:
    """The harness the GPU session relies on: a failure run passes only with rank 0 naming rank 1 in time."""
    good = ("topocc: rank 0: allreduce (ring, 65536 x float32): timed out after 3 s waiting for rank(s) 1 "
            "(op 2: send to rank 1)")
    assert N.verdict("hang", [(5, 'RESULT {"elapsed": 3.1}', good + "\n" + good), (0, "", "")]) == []
    assert N.verdict("die", [(5, 'RESULT {"elapsed": 9.5}', good), (9, "", "")])  # too late
    assert N.verdict("die", [(5, 'RESULT {"elapsed": 3.1}', good.replace("rank(s) 1 ", "rank(s) 2 ")), (9, "", "")])
    assert N.verdict("hang", [(0, 'RESULT {"elapsed": 3.1}', ""), (0, "", "")])  # no failure reported
    ok = 'RESULT {"cases": 400, "wrong": [], "wrong_count": 0, "native_checked": 8, "wrong_total": 0}'
    assert N.verdict("check", [(0, ok, ""), (0, "", "")]) == []
    assert N.verdict("check", [(0, ok.replace('"wrong_total": 0', '"wrong_total": 2'), ""), (0, "", "")])
    assert N.verdict("check", [(0, ok, ""), (1, "", "boom")])


@pytest.mark.skipif(_gpu_missing() is None, reason="a GPU with CuPy is here: the launch succeeds")
def test_the_launcher_reports_a_refusal_from_every_rank() -> None:
    problems = N.verdict("check", N.launch("check", 2, "float32", "7", "1", limit=120))
    assert len(problems) == 3  # both ranks' exits, and no RESULT line
    assert all("topocc:" in p for p in problems[:2]), problems


@GPU
@pytest.mark.parametrize(("mode", "world", "args"), N.SUITE,
                         ids=[f"{m}-{w}-ranks" + (f"-{a[2]}-bytes" if a else "") for m, w, a in N.SUITE])
def test_gpu_suite(mode: str, world: int, args: tuple[str, ...]) -> None:
    """Every collective on 2-4 ranks, the planner's algorithms, the DDP hook, a hung and a dead peer."""
    passes(mode, world, *args)


def test_the_ddp_verdict_wants_the_same_losses_and_a_bucket_a_step() -> None:
    """The DDP case's judgement on what rank 0 reports (run on CPU: the GPU run reports the same fields)."""
    import json

    def outputs(**changes: float) -> list[tuple[int, str, str]]:
        res = {"calls": 23, "bytes": 1 << 20, "steps": 12, "max_diff": 1.5e-8, "scale": 0.16, "loss_diff": 1.2e-7,
               "losses": [0.86, 0.76, 0.76], **changes}
        return [(0, "RESULT " + json.dumps(res), ""), *[(0, "", "")] * 3]

    assert N.verdict("ddp", outputs()) == []  # as measured on the H200 (23 calls: one bucket, then two a step)
    assert N.verdict("ddp", outputs(loss_diff=1e-3))        # the losses part
    assert N.verdict("ddp", outputs(max_diff=1e-3))         # the weights part
    assert N.verdict("ddp", outputs(calls=11))              # the hook was not called every step
