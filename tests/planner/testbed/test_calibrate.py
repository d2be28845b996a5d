"""``topocc calibrate`` end to end: over mpiexec here, and on an emulated cluster; what it writes, every
command reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from topocc.planner.cli import cli, main
from topocc.planner.testbed.emulation import emulation_available
from topocc.planner.topology.parse import load_topology

SMALL = """\
# two hosts of two GPUs
name: small
cluster:
  hosts: 2
  host:
    gpus: 2
    fabric: fully-connected
    gpu_link: {bandwidth: 20 GB/s, latency: 1 us, kind: shm}
    nics: 1
    nic: {bandwidth: 8 Gbit/s, latency: 5 us, kind: ethernet, attach_bandwidth: 16 GB/s}
  network: {type: single-switch}
"""


def _check_written(path: Path, source: str | None = None) -> None:
    """The calibrated file: the user's text first, one block after it, read back with measured figures."""
    text = path.read_text()
    if source is not None:
        assert text.startswith(source.rstrip("\n"))
    assert text.count("\ncalibration:") == 1
    topology = load_topology(path)
    cal = topology.calibration
    assert cal is not None and set(cal.residuals) == set(cal.links)
    assert {"host:shm", "host-switch"} <= set(cal.links)
    for figures in cal.links.values():
        assert figures.bandwidth > 0 and 0 < figures.shared <= 1 and figures.latency >= 0
    assert cal.host.reduce_rate() > 0 and cal.host.copy_Bps > 0


@pytest.mark.mpi
def test_calibrate_over_mpiexec_writes_a_topology_every_command_reads(tmp_path: Path) -> None:
    source = tmp_path / "small.yaml"
    source.write_text(SMALL)
    out = tmp_path / "small.cal.yaml"
    runner = CliRunner()
    done = runner.invoke(cli, ["calibrate", str(source), "-o", str(out), "--json"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    doc = json.loads(done.stdout)
    # loopback is far from the file's NIC: said in a line per class on stderr, the block written all the same
    assert all(line.startswith("topocc: warning: calibration: link class ") for line in done.stderr.splitlines())
    assert set(doc["links"]) >= {"host:shm", "host-switch"} and doc["scale"] == 1.0
    _check_written(out, SMALL)
    again = tmp_path / "again.yaml"  # calibrating a calibrated file keeps one block
    assert runner.invoke(cli, ["calibrate", str(out), "-o", str(again)]).exit_code == 0
    _check_written(again, SMALL)
    compiled = runner.invoke(cli, ["compile", str(again), "-s", "1MiB:4MiB", "-o", str(tmp_path / "plan.json")])
    assert compiled.exit_code == 0, compiled.output
    assert "model: calibrated" in compiled.output
    schedule = str(tmp_path / "ring.json")
    for command in (["compile", str(again), "-s", "1MiB", "-a", "ring", "-o", schedule], ["verify", schedule],
                    ["topo", "show", str(again)], ["simulate", schedule, "-t", str(again)]):
        result = runner.invoke(cli, command)
        assert result.exit_code == 0, (command, result.output)


@pytest.mark.mpi
def test_calibrate_measures_the_ranks_named_and_keeps_the_gpu_fabric(tmp_path: Path) -> None:
    """``FILE[ranks]`` as other commands read it: those ranks run the probe, the whole file is written with the
    block; NVLink, which MPI between CPU processes never crosses, keeps the file's figures and says why."""
    source = tmp_path / "nvlink.yaml"
    text = SMALL.replace("kind: shm", "kind: nvlink")
    source.write_text(text)
    out = tmp_path / "nvlink.cal.yaml"
    done = CliRunner().invoke(cli, ["calibrate", f"{source}[0-2]", "-o", str(out)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert "# kept at the file's figures (not measurable over MPI between CPU processes): host:nvlink" in done.stdout
    written = out.read_text()
    assert written.startswith(text.rstrip("\n")) and "on ranks 0-2:" in written
    assert 'host:nvlink: {source: "file (not measurable over MPI between CPU processes)"}' in written
    calibrated = load_topology(out)
    cal = calibrated.calibration
    assert calibrated.size == 4 and cal is not None and "host-switch" in cal.links and "host:nvlink" in cal.kept
    plain = load_topology(source)
    assert [lk for lk in calibrated.links if lk.kind == "nvlink"] == [lk for lk in plain.links if lk.kind == "nvlink"]


def test_calibrate_refuses_what_it_cannot_measure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["calibrate", "no-such-topology", "-o", str(tmp_path / "x.yaml")])
    out, err = capsys.readouterr()
    assert code != 0 and out == "" and "no-such-topology" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.root
@pytest.mark.mpi
@pytest.mark.skipif(emulation_available() is not None, reason=str(emulation_available()))
def test_calibrate_an_emulated_cluster_then_bench_by_its_model(tmp_path: Path) -> None:
    out = tmp_path / "emu-uniform.cal.yaml"
    runner = CliRunner()
    done = runner.invoke(cli, ["calibrate", "emu-uniform", "--emulate", "-o", str(out)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert "host-switch" in done.output and "fit residuals" in done.output
    _check_written(out)
    cal = load_topology(out).calibration
    assert cal is not None and cal.scale == pytest.approx(1e-3)
    # the shaped NIC: what one flow gets is near the file's figure at the emulated scale
    shaped = cal.links["host-switch"]
    assert shaped.file is not None and 0.5 < shaped.bandwidth / shaped.file < 1.1
    plan = tmp_path / "plan.json"
    assert runner.invoke(cli, ["compile", str(out), "-s", "1MiB", "-a", "ring", "-o", str(plan)]).exit_code == 0
    bench = runner.invoke(cli, ["bench", str(plan), "--emulate", str(out), "--sizes", "1MiB", "--iters", "1",
                                "--warmup", "0", "--json"], catch_exceptions=False)
    assert bench.exit_code == 0, bench.output
    (row,) = json.loads(bench.output)
    assert row["wrong"] == 0 and row["predicted_time_s"] > 0
    assert abs(row["error"]) < 0.5  # the calibrated model is near: the benchmark measures how near
