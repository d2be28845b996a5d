"""``TOPOCC_DEBUG`` lines and the last line of an uncaught topocc failure, without launching ranks."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from topocc.runtime.distributed import debug
from topocc.runtime.errors import CommunicatorError
from topocc.runtime.schedule import Metadata


class _Schedule:
    metadata = Metadata(algorithm="hierarchical", min_bytes=1 << 20, max_bytes=16 << 20, size_bytes=4 << 20,
                        predicted_time_s=0.00098)


def test_each_distinct_call_is_reported_once(capsys: pytest.CaptureFixture[str]) -> None:
    report = debug.CallReport(3, "ranks 0-3", enabled=True)
    for _ in range(3):
        report.planned("allreduce", 4 << 20, "float32", "cpu", _Schedule(), 1, 3)
        report.native("allreduce", 1024, "float32", "cpu", "gloo", "model predicts no gain at 1024 bytes")
    report.native("allreduce", 2048, "float32", "cpu", "gloo", "model predicts no gain at 2048 bytes")
    assert capsys.readouterr().err.splitlines() == [
        "topocc INFO rank 3 ranks 0-3: allreduce 4 MiB float32 on cpu: plan bucket 2/3 (1 MiB to 16 MiB), "
        "hierarchical, predicted 980 us at 4 MiB",
        "topocc INFO rank 3 ranks 0-3: allreduce 1 KiB float32 on cpu: native gloo: model predicts no gain at "
        "1024 bytes",
        "topocc INFO rank 3 ranks 0-3: allreduce 2 KiB float32 on cpu: native gloo: model predicts no gain at "
        "2048 bytes"]
    quiet = debug.CallReport(0, "world", enabled=False)
    quiet.native("allreduce", 1024, "float32", "cpu", "gloo", "why")
    assert capsys.readouterr().err == ""


def test_the_level_is_info_or_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOPOCC_DEBUG", raising=False)
    assert debug.debug_level() == "WARN"
    monkeypatch.setenv("TOPOCC_DEBUG", "info")
    assert debug.debug_level() == "INFO"
    monkeypatch.setenv("TOPOCC_DEBUG", "verbose")
    with pytest.raises(CommunicatorError, match=r"TOPOCC_DEBUG='verbose' is not a level \(fix: set TOPOCC_DEBUG="):
        debug.debug_level()


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """The excepthook installed over one that records what it is handed."""
    handed: list[BaseException] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, exc, tb: handed.append(exc))
    monkeypatch.setattr(debug, "_FAILURES", [])
    monkeypatch.delenv("TOPOCC_DEBUG", raising=False)
    debug.install_excepthook()
    debug.install_excepthook()  # twice: still one hook
    return handed


def test_a_topocc_failure_ends_with_its_line(hook: list[BaseException], capsys: pytest.CaptureFixture[str]) -> None:
    err = CommunicatorError("timed out waiting for rank(s) 1", where="rank 0: allreduce", fix="check rank 1")
    wrapped = RuntimeError("DDP reducer failed")
    wrapped.__cause__ = err
    debug.note_failure(err)
    retold = RuntimeError(f"c10d wrapped: {err.message} and more")  # torch re-raised it by its text
    for exc in (err, wrapped, retold):
        sys.excepthook(type(exc), exc, None)
        lines = capsys.readouterr().err.splitlines()
        assert lines[-1] == "topocc: rank 0: allreduce: timed out waiting for rank(s) 1 (fix: check rank 1)"
        assert "traceback left out; TOPOCC_DEBUG=INFO prints it" in lines[0]
    assert hook == []  # none of them reached the traceback printer
    other = ValueError("not ours")
    sys.excepthook(ValueError, other, None)
    assert hook == [other] and capsys.readouterr().err == ""


def test_under_info_the_traceback_comes_first(hook: list[BaseException], monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TOPOCC_DEBUG", "INFO")
    err = CommunicatorError("the plan bundle is for 2 ranks but this job has 4")
    sys.excepthook(type(err), err, None)
    assert hook == [err] and capsys.readouterr().err.splitlines()[-1].startswith("topocc: the plan bundle is for 2")
