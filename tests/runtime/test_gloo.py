"""The dataflow replay over gloo: every collective vs a torch reference on CPU tensors, and failures.

Each test starts one process per rank (mpi_scripts/torch_check.py) that meet through a
``file://`` rendezvous in the test's temporary folder (no port to race for); gloo's pairs use
loopback.  Every process is killed if the test's time limit passes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from topocc.runtime.errors import CommunicatorError  # noqa: E402
from topocc.runtime.harness.launch import spawn_ranks  # noqa: E402

SCRIPT = Path(__file__).parent / "mpi_scripts" / "torch_check.py"
REPO = Path(__file__).resolve().parent.parent.parent
ALL_DTYPES = "float32,float64,float16,bfloat16,int32,int64,int8,uint8"


def spawn(world: int, mode: str, tmp_path: Path, *extra: str, limit: float = 240) -> list[tuple[int, str, str]]:
    """Run ``world`` ranks of the script; (exit code, stdout, stderr) per rank, all killed after ``limit`` s."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    init = f"file://{tmp_path / 'rendezvous'}"
    done = spawn_ranks([([sys.executable, str(SCRIPT), str(r), str(world), init, mode, *extra], env)
                        for r in range(world)], limit_s=limit)
    return [(p.returncode, p.stdout, p.stderr) for p in done]


def result(outputs: list[tuple[int, str, str]]) -> dict:
    lines = [line for line in outputs[0][1].splitlines() if line.startswith("RESULT ")]
    assert lines, outputs[0][2][-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.parametrize(("world", "dtypes", "counts"), [
    (2, ALL_DTYPES, "1,7,1001"),
    (3, "float32,bfloat16,int8,float64", "1,7,1001"),
    (4, "bfloat16,float16,int32,uint8", "1,7,65537"),
])
def test_every_collective_matches_torch_on_gloo(tmp_path: Path, world: int, dtypes: str, counts: str) -> None:
    outputs = spawn(world, "check", tmp_path, dtypes, counts)
    for code, _, err in outputs:
        assert code == 0, err[-3000:]
    res = result(outputs)
    assert res["wrong_total"] == 0, res["wrong"]
    assert res["cases"] > 100 and res["native_checked"] > 0


@pytest.mark.parametrize("mode", ["hang", "die"])
def test_a_failed_peer_gives_one_line_naming_it(tmp_path: Path, mode: str) -> None:
    outputs = spawn(2, mode, tmp_path, limit=60)
    code, _, err = outputs[0]
    assert code == CommunicatorError.exit_code, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("topocc:")]
    assert len(lines) == 1, err[-2000:]
    assert "waiting for rank(s) 1" in lines[0] and "rank 0: allreduce (ring" in lines[0]
    if mode == "hang":
        assert "timed out after 2 s" in lines[0]
        assert 1.9 < result(outputs)["elapsed"] < 6.0
    else:
        assert "gloo:" in lines[0] and "\n" not in lines[0]


def test_torch_ops_refuse_what_they_cannot_replay() -> None:
    from topocc.runtime.transports.torch_ops import TorchOps

    ops = TorchOps(torch.device("cpu"))
    with pytest.raises(CommunicatorError, match="torch tensor"):
        ops.check([1.0, 2.0], "buffer")
    with pytest.raises(CommunicatorError, match="not contiguous"):
        ops.check(torch.ones(4, 4).t(), "buffer")
    with pytest.raises(CommunicatorError, match="requires grad"):
        ops.check(torch.ones(4, requires_grad=True), "buffer")
    with pytest.raises(CommunicatorError, match="unsupported dtype"):
        ops.dtype_of(torch.ones(2, dtype=torch.complex64))
    a, b = torch.tensor([1.0, 5.0], dtype=torch.bfloat16), torch.tensor([3.0, 2.0], dtype=torch.bfloat16)
    ops.reductions["max"](a, b, out=a)
    assert a.tolist() == [3.0, 5.0] and a.dtype == torch.bfloat16
    assert ops.dtype_name(a.dtype) == "bfloat16" and ops.is_integer(torch.int8) and not ops.is_integer(a.dtype)
