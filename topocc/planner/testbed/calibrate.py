"""``topocc calibrate``: measure the cluster a topology describes and write the topology calibrated.

:func:`measure` runs :mod:`topocc.runtime.harness.probe` on one rank per GPU (on an emulated cluster of the
topology, or under ``mpiexec`` on the real one), :func:`~topocc.planner.calibration.fit.fit_calibration`
turns the measurements into figures, and :func:`calibrate` writes the user's file with a ``calibration:``
block (:mod:`topocc.planner.topology.calibration`) that every command then reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topocc.planner.calibration.checks import surprises
from topocc.planner.calibration.fit import fit_calibration
from topocc.planner.calibration.probes import LOAD_REPS, REPS, probe_budget_s, probe_tests
from topocc.planner.errors import TopoccWarning, UsageError
from topocc.planner.report.table import format_table, opt_cell
from topocc.planner.routing.network import Network
from topocc.planner.testbed.emulation import DEFAULT_SCALE, EmulatedCluster, emulation_available, scaled_topology
from topocc.planner.topology.calibration import (
    Calibration,
    calibration_yaml,
    datasheet_topology,
    strip_calibration,
)
from topocc.planner.topology.catalogue import resolve_topology, split_ranks
from topocc.planner.topology.model import Topology
from topocc.planner.topology.parse import parse_topology_text
from topocc.planner.units import format_bandwidth, format_time
from topocc.runtime.bundle import rank_ranges
from topocc.runtime.errors import TopoccError
from topocc.runtime.harness.launch import RANK_WRAPPER, find_mpiexec, summarize_failures, worker_env

__all__ = ["Calibrated", "calibrate", "calibration_json", "format_calibration", "measure"]


@dataclass(frozen=True)
class Calibrated:
    """What :func:`calibrate` wrote: the calibrated topology (as read back from the file) and its block."""

    topology: Topology
    calibration: Calibration


def calibrate(topology_arg: str, output: str | Path, *, emulate: bool, scale: float = DEFAULT_SCALE,
              mpiexec_args: Sequence[str] = (), progress: Callable[[str], None] | None = None) -> Calibrated:
    """Measure the cluster of ``topology_arg`` (a file or a shipped name) and write it calibrated to ``output``.

    ``emulate``: on an emulated cluster (root), inter-host links at ``scale`` times the file's; else on
    one rank per GPU under ``mpiexec`` here (``mpiexec_args``: a host file, on a real cluster), each rank
    checked to run on its host's machine.  ``topology_arg`` may end in ranks, as other commands read it
    (``cluster.yaml[0-1,4-5]``): one process per rank named, in that order, measures the classes their paths
    cross, and the whole file is written with the block.  A class measured far from its file's figure or
    fitted poorly is a :class:`~topocc.planner.errors.TopoccWarning` (:mod:`~topocc.planner.calibration.checks`).
    """
    file_arg, ranks = split_ranks(topology_arg)
    whole = datasheet_topology(resolve_topology(file_arg))
    if whole.source is None or not Path(whole.source).is_file():
        raise UsageError(f"cannot read the file of topology {topology_arg!r}", fix="pass a topology file or name")
    topology = whole if ranks is None else whole.subset(ranks)
    if not (0 < scale <= 1):
        raise UsageError(f"scale must be in (0, 1], got {scale:g}")
    # the cluster as it runs (an emulated one: scaled), its routes found once for the tests, their bound and the fit
    ran_on = Network(scaled_topology(topology, scale) if emulate else topology)
    tests = probe_tests(ran_on)
    rows = measure(topology, tests, emulate=emulate, scale=scale, limit_s=probe_budget_s(tests, ran_on),
                   mpiexec_args=mpiexec_args, progress=progress)
    library = " ".join(next((r["library"] for r in rows if r["id"] == "transport"), "MPI").split())
    transport = f"MPI ({library})" + (f", emulated cluster at x{scale:g}" if emulate else "")
    on = "" if ranks is None else f" on ranks {rank_ranges(ranks)}"
    cal = fit_calibration(ran_on, topology, tests, [r for r in rows if r["id"] != "transport"],
                          scale=scale if emulate else 1.0,
                          how=f"topocc calibrate{on}: medians of {REPS} repetitions, {LOAD_REPS} under load",
                          transport=transport)
    for line in surprises(cal):
        warnings.warn(TopoccWarning(line), stacklevel=2)
    text = strip_calibration(Path(whole.source).read_text()) + "\n" + calibration_yaml(cal)
    out = Path(output)
    with warnings.catch_warnings():  # the file's figures were warned of as it was read: once is enough
        warnings.simplefilter("ignore", TopoccWarning)
        calibrated = parse_topology_text(text, str(out))  # what every command will read back
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return Calibrated(calibrated, cal)


def format_calibration(done: Calibrated) -> str:
    """The fitted figures beside the file's, per link class, and the host costs, as text."""
    cal = done.calibration
    rows = [(name, opt_cell(f.file, format_bandwidth), opt_cell(f.alone, format_bandwidth),
             format_bandwidth(f.bandwidth),
             f"{f.shared:.2f}", format_bandwidth(f.under(8)), f"{f.bandwidth / f.file:.2f}" if f.file else "-",
             format_time(f.latency)) for name, f in cal.links.items()]
    lines = [f"# calibrated {done.topology.name}: {cal.transport}" + (
        f"; the file's inter-host figures x{cal.scale:g} as emulated" if cal.scale != 1 else ""),
        format_table(rows, ("link class", "file", "alone", "one flow", "shared", "8 flows", "one flow/file",
                            "latency"), "<>>>>>>>"),
        f"# message cost {format_time(cal.host.message_s)}; copy {format_bandwidth(cal.host.copy_Bps)}; reduce "
        + ", ".join(f"{k} {format_bandwidth(v)}" for k, v in cal.host.reduce_Bps.items())]
    if cal.residuals:
        lines.append("# fit residuals (largest error of a class's figures on its tests): "
                     + ", ".join(f"{name} {err:.1%}" for name, err in cal.residuals.items()))
    for why in dict.fromkeys(cal.kept.values()):
        lines.append(f"# kept at the file's figures ({why}): "
                     + ", ".join(name for name, reason in cal.kept.items() if reason == why))
    return "\n".join(lines)


def calibration_json(done: Calibrated) -> dict[str, Any]:
    """``topocc calibrate --json``: the fitted figures in base units (bytes/s, seconds)."""
    cal = done.calibration
    return {"topology": done.topology.name, "measured": cal.measured, "transport": cal.transport, "scale": cal.scale,
            "message_cost_s": cal.host.message_s, "copy_Bps": cal.host.copy_Bps,
            "reduce_Bps": dict(cal.host.reduce_Bps),
            "links": {name: {"bandwidth_Bps": f.bandwidth, "latency_s": f.latency, "shared": f.shared,
                             "alone_Bps": f.alone, "file_Bps": f.file} for name, f in cal.links.items()},
            "residuals": dict(cal.residuals), "kept": dict(cal.kept)}


def measure(topology: Topology, tests: list[dict[str, Any]], *, emulate: bool, limit_s: float,
            scale: float = DEFAULT_SCALE, mpiexec_args: Sequence[str] = (),
            progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run the probe ``tests`` on one rank per GPU of ``topology``; returns rank 0's result rows.

    ``emulate``: on an emulated cluster of the topology (root), its inter-host links ``scale`` times the
    file's (the tests are for that scaled cluster); else under ``mpiexec -n N`` here, with ``mpiexec_args``.
    The job is killed after ``limit_s`` (:func:`~topocc.planner.calibration.probes.probe_budget_s`).
    """
    say = progress or (lambda _line: None)
    where = f"emulated {topology.name} (inter-host bandwidth x{scale:g})" if emulate else topology.name
    host_of = {rank: host for host, ranks in topology.hosts.items() for rank in ranks}
    with tempfile.TemporaryDirectory(prefix="topocc-calibrate-") as tmp:
        # a real cluster's ranks check their machines; an emulated one's hosts share this machine's name
        spec = _write(tmp, tests, None if emulate else [host_of[r] for r in range(topology.size)])
        argv = ["-m", "topocc.runtime.harness.probe", spec]
        say(f"calibrate: {len(tests)} tests on {where}, {topology.size} ranks, at most {limit_s:.0f} s")
        if emulate:
            why = emulation_available()
            if why is not None:
                raise TopoccError(f"cannot emulate a cluster here: {why}", fix="run as root on Linux with iproute2")
            with EmulatedCluster(topology, scale=scale) as cluster:
                proc = _run(cluster.mpiexec_command(argv), limit_s, say)
        else:
            proc = _run([find_mpiexec(), "-disable-auto-cleanup", *mpiexec_args, "-n", str(topology.size),
                         *RANK_WRAPPER, sys.executable, *argv], limit_s, say)
    if proc.returncode != 0:
        raise TopoccError("the calibration job failed: " + summarize_failures(proc.stderr.splitlines(), topology.size,
                                                                               proc.returncode))
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _write(folder: str, tests: list[dict[str, Any]], hosts: list[str] | None) -> str:
    """The probe's input file: the tests and, on a real cluster, each rank's host (to check the placement)."""
    path = Path(folder) / "tests.json"
    path.write_text(json.dumps({"tests": tests, "timeout_s": 120.0, "hosts": hosts}))
    path.chmod(0o644)
    Path(folder).chmod(0o755)
    return str(path)


def _run(cmd: list[str], limit_s: float, say: Callable[[str], None]) -> subprocess.CompletedProcess[str]:
    """Run the job, passing its progress lines on; killed past ``limit_s``."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=worker_env(),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += f"\ntopocc: the calibration ran past {limit_s:.0f} s and was killed\n"
    for line in err.splitlines():
        if line.startswith("progress: "):
            say("calibrate: " + line[len("progress: "):])
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
