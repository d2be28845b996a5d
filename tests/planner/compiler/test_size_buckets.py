"""Compiling the shipped schedules."""

from __future__ import annotations

from pathlib import Path

from topocc.planner.compiler.size_buckets import compile_shipped


def test_compile_shipped_replaces_the_other_spelling(tmp_path: Path) -> None:
    """A schedule that moves between plain and gzipped JSON leaves no stale copy behind."""
    stale = tmp_path / "emu-uniform-allreduce.json.gz"
    stale.write_bytes(b"old")
    (path, compiled), = compile_shipped(tmp_path, ["emu-uniform"], size_bytes=1 << 20)
    assert path.name == "emu-uniform-allreduce.json" and compiled.schedule.op_count < 50_000
    assert not stale.exists()
