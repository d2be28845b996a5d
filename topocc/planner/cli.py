"""The ``topocc`` command line: parse arguments, call the planner or runtime, print.

Every expected failure prints one line (``topocc: error: ...``) on stderr and
exits non-zero; set ``TOPOCC_DEBUG=1`` to see a traceback instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from topocc.planner.collector import rare_collections
from topocc.planner.errors import TopoccError, TopoccWarning, exit_codes
from topocc.planner.units import UnitError, parse_size, parse_size_range
from topocc.runtime.arrays import DTYPE_NAMES
from topocc.runtime.collective import closest_collective
from topocc.runtime.harness.torchbench.sweep import OPS
from topocc.runtime.schedule import COLLECTIVES, canonical_collective

__all__ = ["cli", "main"]


class SizeType(click.ParamType):
    """A byte count written as ``64MiB``, ``1GB`` or ``4096``."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except UnitError as exc:
            self.fail(str(exc), param, ctx)


class SizeRangeType(click.ParamType):
    """A size or a range of sizes, ``1KiB:1GiB``."""

    name = "size[:size]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, int]:
        if isinstance(value, tuple):
            return value
        try:
            return parse_size_range(value)
        except UnitError as exc:
            self.fail(str(exc), param, ctx)


class RanksType(click.ParamType):
    """Global ranks, in order: ``0-3``, ``0,1,2,3`` or ``8-11,20``."""

    name = "ranks"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        # loaded on use: the topology model (and networkx) only for the commands that take ranks
        from topocc.planner.topology.model import parse_rank_ranges

        try:
            return parse_rank_ranges(value)
        except TopoccError as exc:
            self.fail(exc.one_line(), param, ctx)


class CollectiveType(click.ParamType):
    """A collective in any common spelling (``allreduce``, ``all-reduce``, torch's ``all_reduce``, ``AllReduce``),
    given on as its stored name; a near miss is refused with a suggestion."""

    name = "collective"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return canonical_collective(str(value))
        except TopoccError:
            near = closest_collective(str(value))
            self.fail(f"{value!r} is not one of {', '.join(COLLECTIVES)}"
                      + (f" (did you mean {near}?)" if near else ""), param, ctx)

    def get_metavar(self, param: click.Parameter, *args: Any, **kwargs: Any) -> str:
        return "[" + "|".join(COLLECTIVES) + "]"


SIZE = SizeType()
SIZE_RANGE = SizeRangeType()
RANKS = RanksType()
DTYPE = click.Choice(DTYPE_NAMES)
PROGRESS_HELP = "Progress lines on stderr as the work goes (default: when stderr is a terminal)."
WHAT_IF_HELP = "Allow a --topology the schedule was not compiled for (the output says it is a what-if)."
COLLECTIVE = CollectiveType()


def _progress_echo(flag: bool | None) -> Callable[[str], None] | None:
    """Where progress lines go: stderr when ``--progress`` (by default when stderr is a terminal), else nowhere."""
    show = sys.stderr.isatty() if flag is None else flag
    return (lambda line: click.echo(line, err=True)) if show else None


def _emit(doc: Any, as_json: bool, text: str | None = None) -> None:
    if as_json:
        click.echo(json.dumps(doc, indent=2, default=str))
    else:
        # loaded on use: every command starts without the others' modules
        from topocc.planner.report.summary import format_summary

        click.echo(text if text is not None else format_summary(doc))


def _exit_code_epilog() -> str:
    """The exit-code table of :mod:`topocc.planner.errors`, for ``topocc --help`` (``\\b``: click keeps the lines)."""
    rows = [f"  {code:<4} {meaning.replace('``', '')}" for code, _, meaning in exit_codes()]
    head = "Exit codes (every failure is one line on stderr; TOPOCC_DEBUG=1 shows a traceback):"
    return head + "\n\n\b\n" + "\n".join(rows)


@contextlib.contextmanager
def _warnings_on_stderr() -> Iterator[None]:
    """Every :class:`TopoccWarning` raised while a command runs as one ``topocc: warning: ...`` line on stderr
    (each text once); other warnings as Python shows them."""
    shown: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("always", TopoccWarning)
        python_shows = warnings.showwarning

        def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
            if not issubclass(category, TopoccWarning):
                python_shows(message, category, *args, **kwargs)
            elif (line := " ".join(str(message).split())) not in shown:
                shown.add(line)
                click.echo(f"topocc: warning: {line}", err=True)

        warnings.showwarning = show
        yield


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=_exit_code_epilog())
@click.version_option(package_name="topocc")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """topocc: compile, verify, simulate and run topology-aware collective schedules."""
    ctx.with_resource(_warnings_on_stderr())


@cli.command("compile")
@click.argument("topology")
@click.option("-c", "--collective", type=COLLECTIVE, default="allreduce", show_default=True)
@click.option("-s", "--size", type=SIZE_RANGE, default="64MiB", show_default=True,
              help="Buffer size to tune for, or LOW:HIGH for a plan with one schedule per size bucket.")
@click.option("-a", "--algorithm", default="auto", show_default=True, help="An algorithm name, or auto.")
@click.option("--channels", type=click.IntRange(1, 64), default=None, help="Parallel rings/trees.")
@click.option("--pipeline", type=click.IntRange(1, 4096), default=None, help="Pieces per chunk.")
@click.option("--root", type=click.IntRange(0), default=0, show_default=True, help="Root of broadcast/reduce.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the schedule here.")
@click.option("--compress", "compression", default=None, metavar="POLICY",
              help="Encode the messages that cross chosen links: ENCODING@SCOPE, e.g. bf16@slow, "
                   "int8@links<=25Gb/s, topk:1%@inter-rack, fp16@host-switch (default: every byte exact).")
@click.option("--per-rank", is_flag=True,
              help="Write every rank's program (format versions 1-3), not the symmetric form that a file of 64 "
                   "or more ranks takes where it stores at most half the operations.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@click.option("--progress/--no-progress", default=None, help=PROGRESS_HELP)
def compile_cmd(topology: str, collective: str, size: tuple[int, int], algorithm: str, channels: int | None,
                pipeline: int | None, root: int, output: str | None, compression: str | None, per_rank: bool,
                as_json: bool, progress: bool | None) -> None:
    """Compile COLLECTIVE for TOPOLOGY (a YAML file or a shipped name), verify and simulate it."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.compiler.compile import compile_schedule
    from topocc.planner.compiler.options import Options
    from topocc.planner.compiler.size_buckets import compile_plan
    from topocc.planner.compiler.symmetrize import symmetric_form, symmetric_plan
    from topocc.planner.report.summary import compiled_summary, format_plan, model_note, plan_summary
    from topocc.planner.topology.catalogue import resolve_topology
    from topocc.runtime.plan import save_plan
    from topocc.runtime.schedule import save_schedule

    policy = _compression_policy(compression)
    topo = resolve_topology(topology)
    low, high = size
    options = Options(size_bytes=low, channels=channels, pipeline=pipeline, root=root)
    echo = _progress_echo(progress)
    report = (lambda event: echo(event.describe())) if echo else None
    if low != high:
        plan, results = compile_plan(topo, collective, low, high, algorithm, options, progress=report)
        reports = None
        if policy is not None:
            plan, results, reports = _compress_plan(topo, results, policy)
        if output:
            save_plan(plan.expanded() if per_rank else symmetric_plan(plan, topo), output)
        doc = plan_summary(results, output) | {"model": model_note(topo)}
        if reports is not None:
            doc["compression"] = reports
        _emit(doc, as_json, format_plan(doc) + "".join(f"\n{_compression_text(r)}" for r in reports or ()))
        return
    compiled = compile_schedule(topo, collective, algorithm, options, progress=report)
    extra: dict[str, Any] = {}
    if policy is not None:
        from topocc.planner.compiler.compress import compress  # loaded on use: only --compress needs it

        done = compress(topo, compiled, policy)
        compiled, extra = done.compiled, {"compression": done.report.to_json()}
    written = compiled.schedule.expanded() if per_rank else symmetric_form(compiled.schedule, topo)
    if output:
        save_schedule(written, output)
    doc = compiled_summary(compiled, output, written) | {"model": model_note(topo)} | extra
    _emit(doc, as_json, _summary_text(doc) + (f"\n{_compression_text(extra['compression'])}" if extra else ""))


def _compression_policy(text: str | None) -> Any:
    """``--compress``'s policy, parsed before anything is compiled (None: exact)."""
    if text is None:
        return None
    from topocc.planner.compiler.compress import parse_policy  # loaded on use: only --compress needs it

    return parse_policy(text)


def _compress_plan(topo: Any, results: Any, policy: Any) -> tuple[Any, list[Any], list[dict[str, Any]]]:
    """Every bucket of a plan compressed: the plan, its buckets' results and their compression reports."""
    # loaded on use: only --compress needs them
    from topocc.planner.compiler.compress import compress_all
    from topocc.runtime.plan import Plan

    done = compress_all(topo, results, policy)
    compiled = [d.compiled for d in done]
    return Plan(tuple(c.schedule for c in compiled)), compiled, [d.report.to_json() for d in done]


def _summary_text(doc: dict[str, Any]) -> str:
    from topocc.planner.report.summary import format_summary  # loaded on use: the text output only

    return format_summary(doc)


def _compression_text(doc: dict[str, Any]) -> str:
    from topocc.planner.report.compression import format_compression  # loaded on use: the text output only

    return format_compression(doc)


#: What DDP and FSDP issue: gradient all-reduce, sharded reduce-scatter and all-gather, the start's broadcast.
TRAINING_COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast")


@cli.command("bundle")
@click.argument("topology")
@click.option("-o", "--output", type=click.Path(file_okay=False), required=True, help="The bundle folder to write.")
@click.option("-c", "--collective", "collectives", type=COLLECTIVE, multiple=True,
              help="A collective to compile (repeatable; default: allreduce, reducescatter, allgather, broadcast).")
@click.option("-s", "--size", type=SIZE_RANGE, default=None, help="Sizes to plan for, LOW:HIGH (default: 1KiB:256MiB).")
@click.option("--group", "groups", type=RANKS, multiple=True,
              help="Also compile for this process group of global ranks, 0-3 or 8-11,20 (repeatable).")
@click.option("--root", type=click.IntRange(0), default=None,
              help="Root of broadcast/reduce, as a rank of each group (default: 0).")
@click.option("--calls", type=click.Path(dir_okay=False), default=None,
              help="Compile what a recorded job called (TOPOCC_RECORD's JSON lines) instead.")
@click.option("-a", "--algorithm", default="auto", show_default=True, help="An algorithm name, or auto.")
@click.option("--compress", "compression", default=None, metavar="POLICY",
              help="Compile every plan with this compression policy, as compile --compress (e.g. bf16@slow, "
                   "topk:budget=1%@inter-host); train with TOPOCC_ERROR_FEEDBACK=ef (default: every byte exact).")
@click.option("--compress-else", "compress_else", type=click.Choice(["refuse", "exact"]), default="refuse",
              show_default=True, help="With --compress, a plan the policy selects nothing of (a group without "
                                      "slow links): refuse the bundle, or keep that plan exact.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@click.option("--progress/--no-progress", default=None, help=PROGRESS_HELP)
def bundle_cmd(topology: str, output: str, collectives: tuple[str, ...], size: tuple[int, int] | None,
               groups: tuple[tuple[int, ...], ...], root: int | None, calls: str | None, algorithm: str,
               compression: str | None, compress_else: str, as_json: bool, progress: bool | None) -> None:
    """Compile a plan bundle for a training job on TOPOLOGY: a plan per collective, process group and root.

    By default, what DDP and FSDP issue on the world (and on each --group); with --calls, what a recorded
    job called.  A job loads the folder with TOPOCC_PLAN=OUTPUT and init_process_group("topocc").
    """
    # loaded on use: every command starts without the others' modules
    from topocc.planner.compiler.bundling import compile_bundle, requests_for, requests_from_calls
    from topocc.planner.report.summary import bundle_summary, format_bundle
    from topocc.planner.topology.catalogue import resolve_topology
    from topocc.runtime.bundle import save_bundle
    from topocc.runtime.calls import read_calls

    if calls is not None and (collectives or size or groups or root is not None):
        raise click.UsageError("--calls compiles what the record lists; leave out -c, -s, --group and --root with it")
    if compress_else != "refuse" and compression is None:
        raise click.UsageError("--compress-else says what --compress does where it selects nothing; give --compress")
    policy = _compression_policy(compression)
    topo = resolve_topology(topology)
    if calls is not None:
        requests = requests_from_calls(read_calls(calls), topo.size)
    else:
        low, high = size or (1 << 10, 256 << 20)
        requests = requests_for(topo.size, collectives or TRAINING_COLLECTIVES, low, high, groups, root or 0)
    echo = _progress_echo(progress)
    bundle, plans = compile_bundle(topo, requests, algorithm,
                                   progress=(lambda event: echo(event.describe())) if echo else None,
                                   compress=policy, exact_if_none=compress_else == "exact")
    doc = bundle_summary(topo, plans, save_bundle(bundle, output))
    text = format_bundle(doc)
    if policy is not None:
        for entry, compiled in zip(doc["plans"], plans):
            entry["compression"] = [r.to_json() for r in compiled.compression]
        encoded = sum(any(r.encoded_messages for r in c.compression) for c in plans)
        text += (f"\ncompressed with {policy.text}: {encoded} of {len(plans)} plans encode their slow hops "
                 f"(the rest exact); train with TOPOCC_ERROR_FEEDBACK=ef")
    _emit(doc, as_json, text)


@cli.command("verify")
@click.argument("schedule", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def verify_cmd(schedule: str, as_json: bool) -> None:
    """Prove that SCHEDULE implements its collective (exit 0 only if it does)."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.analysis.verify_symmetric import prove
    from topocc.planner.report.summary import verify_summary
    from topocc.runtime.schedule import load_schedule

    loaded = load_schedule(schedule)
    _emit(verify_summary(loaded, prove(loaded)), as_json)


@cli.command("simulate")
@click.argument("schedule", type=click.Path(dir_okay=False))
@click.option("-t", "--topology", default=None, help="Topology to simulate on (default: the one it was compiled for).")
@click.option("--what-if", "what_if", is_flag=True, help=WHAT_IF_HELP)
@click.option("-s", "--size", type=SIZE, default=None, help="Buffer size (default: the size it was compiled for).")
@click.option("--candidates", is_flag=True, help="Also race every algorithm at this size and show why the winner won.")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Write the simulated timeline as a Chrome trace (Perfetto, chrome://tracing).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def simulate_cmd(schedule: str, topology: str | None, what_if: bool, size: int | None, candidates: bool,
                 trace: str | None, as_json: bool) -> None:
    """Predict SCHEDULE's time on its topology, against the lower bound."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.report.summary import simulation_summary
    from topocc.planner.topology.catalogue import schedule_topology
    from topocc.runtime.plan import as_plan

    plan = as_plan(schedule)
    size = size or plan.schedules[0].metadata.size_bytes or (64 << 20)
    loaded = plan.select(size)
    topo = schedule_topology(loaded, schedule, topology, what_if=what_if)
    doc = simulation_summary(topo, loaded, size, candidates=candidates, trace=trace)
    _emit(doc, as_json)


@cli.group("topo")
def topo_group() -> None:
    """Inspect topologies."""


@topo_group.command("show")
@click.argument("topology")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--html", type=click.Path(dir_okay=False), default=None, help="Also draw it as a self-contained page.")
def topo_show(topology: str, as_json: bool, html: str | None) -> None:
    """Ranks, devices, links and cut bound of TOPOLOGY."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.report.summary import topology_summary
    from topocc.planner.topology.catalogue import resolve_topology

    topo = resolve_topology(topology)
    if html:
        # loaded on use: every command starts without the others' modules
        from topocc.planner.report import render_topology_html

        Path(html).write_text(render_topology_html(topo))
    _emit(topology_summary(topo) | ({"html": html} if html else {}), as_json)


@topo_group.command("import")
@click.argument("source", type=click.Path(dir_okay=False))
@click.option("--nvidia-smi", "nvidia_smi", is_flag=True, help="SOURCE is `nvidia-smi topo -m` output.")
@click.option("--name", default=None, help="Name of the imported topology.")
@click.option("--hosts", type=click.IntRange(1), default=None, help="Replicate the imported host this many times.")
@click.option("--network", default=None,
              help="With --hosts: the network joining them, as YAML text or a file, e.g. '{type: fat_tree}'.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the YAML here.")
def topo_import(source: str, nvidia_smi: bool, name: str | None, hosts: int | None, network: str | None,
                output: str | None) -> None:
    """Convert NCCL topology XML (or nvidia-smi topo -m output) into topology YAML."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.formats import combine_hosts, convert_nccl_topo, convert_nvidia_smi
    from topocc.planner.topology.parse import parse_topology_text

    imported = convert_nvidia_smi(source, name=name) if nvidia_smi else convert_nccl_topo(source, name=name)
    text = imported.yaml
    if hosts is not None:
        if network is not None and Path(network).is_file():
            network = Path(network).read_text()
        text = combine_hosts(text, hosts, network)
    topology = parse_topology_text(text, output or source)  # never write a file that would not load
    for note in imported.notes:
        click.echo(f"note: {note}", err=True)
    if output:
        Path(output).write_text(text)
        click.echo(f"wrote {output}: {topology.size} ranks, {len(topology.devices)} devices")
    else:
        click.echo(text, nl=False)


@cli.command("import")
@click.argument("source", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="Schedule JSON to write.")
def import_cmd(source: str, output: str) -> None:
    """Import an MSCCL XML algorithm as a topocc schedule (verified before it is written)."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.analysis.verify import verify
    from topocc.planner.formats import import_msccl
    from topocc.planner.report.summary import verify_summary
    from topocc.runtime.schedule import save_schedule

    schedule = import_msccl(source)
    proof = verify(schedule)
    save_schedule(schedule, output)
    _emit(verify_summary(schedule, proof) | {"output": output}, False)
    click.echo(f"wrote {output}")


@cli.command("export")
@click.argument("schedule", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["msccl-xml"]), default="msccl-xml", show_default=True)
@click.option("--proto", type=click.Choice(["Simple", "LL", "LL128"]), default="Simple", show_default=True)
@click.option("--name", default=None, help="Algorithm name in the XML.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write here (default: stdout).")
def export_cmd(schedule: str, fmt: str, proto: str, name: str | None, output: str | None) -> None:
    """Export SCHEDULE as MSCCL XML (loadable by MSCCL and RCCL)."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.analysis.verify_symmetric import prove
    from topocc.planner.formats import export_msccl
    from topocc.runtime.schedule import load_schedule

    loaded = load_schedule(schedule)
    prove(loaded)
    meta = loaded.metadata
    xml = export_msccl(loaded, proto=proto, name=name, min_bytes=meta.min_bytes, max_bytes=meta.max_bytes)
    if output:
        Path(output).write_text(xml)
        click.echo(f"wrote {output}")
    else:
        click.echo(xml, nl=False)


@cli.command("run")
@click.argument("schedule", type=click.Path(dir_okay=False))
@click.option("--np", "nprocs", type=click.IntRange(1), default=None, help="Ranks (default: the schedule's).")
@click.option("-s", "--size", type=SIZE, default="64MiB", show_default=True)
@click.option("--dtype", type=DTYPE, default="float32", show_default=True)
@click.option("--op", default="sum", show_default=True, type=click.Choice(["sum", "prod", "max", "min", "avg"]))
@click.option("--iters", type=click.IntRange(1), default=5, show_default=True, help="Timed calls, each checked.")
@click.option("--warmup", type=click.IntRange(0), default=1, show_default=True, help="Untimed calls first.")
@click.option("--timeout", type=click.FloatRange(0.1), default=30.0, show_default=True,
              help="Seconds a rank waits for a peer before failing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--progress/--no-progress", default=None, help=PROGRESS_HELP)
def run_cmd(schedule: str, nprocs: int | None, size: int, dtype: str, op: str, iters: int, warmup: int,
            timeout: float, as_json: bool, progress: bool | None) -> None:
    """Replay SCHEDULE on --np MPI ranks (mpiexec): PASS or FAIL against numpy, time, algbw and busbw."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.errors import CommunicatorError
    from topocc.planner.report.runs import format_run, run_summary, wrong_result
    from topocc.runtime.harness.launch import run_schedule

    result = run_schedule(schedule, nprocs, size, dtype=dtype, op=op, timeout=timeout, repeat=iters, warmup=warmup,
                          progress=_progress_echo(progress))
    if not result.ok:
        raise CommunicatorError(f"replay failed: {result.failure()}", where=schedule)
    doc = run_summary(result)
    _emit(doc, as_json, format_run(doc, warmup))
    if not result.passed:
        raise wrong_result([doc], schedule)


@cli.command("bench")
@click.argument("schedule", type=click.Path(dir_okay=False))
@click.option("--np", "nprocs", type=click.IntRange(1), default=None, help="Ranks (default: the schedule's).")
@click.option("--sizes", type=SIZE_RANGE, default="1KiB:64MiB", show_default=True)
@click.option("--factor", type=click.IntRange(2), default=4, show_default=True, help="Size step.")
@click.option("--iters", type=click.IntRange(1), default=20, show_default=True)
@click.option("--warmup", type=click.IntRange(0), default=5, show_default=True)
@click.option("--dtype", type=DTYPE, default="float32", show_default=True)
@click.option("--timeout", type=click.FloatRange(0.1), default=30.0, show_default=True)
@click.option("-t", "--topology", default=None, help="Topology for the prediction (default: the compiled one).")
@click.option("--what-if", "what_if", is_flag=True, help=WHAT_IF_HELP)
@click.option("--emulate", default=None, help="Run on an emulated cluster of this topology (needs root).")
@click.option("--scale", type=click.FloatRange(1e-6, 1.0), default=1e-3, show_default=True,
              help="With --emulate: emulated link rate = real bandwidth x scale.")
@click.option("--trace", type=click.Path(dir_okay=False), default=None,
              help="Record one measured call per size and write it as a Chrome trace.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON rows.")
@click.option("--progress/--no-progress", default=None, help=PROGRESS_HELP)
def bench_cmd(schedule: str, nprocs: int | None, sizes: tuple[int, int], factor: int, iters: int, warmup: int,
              dtype: str, timeout: float, topology: str | None, what_if: bool, emulate: str | None, scale: float,
              trace: str | None, as_json: bool, progress: bool | None) -> None:
    """Time SCHEDULE (or a plan) against the MPI's native collective, nccl-tests style."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.compiler.size_buckets import bucket_sizes
    from topocc.planner.report.runs import bench_progress, bench_rows, format_bench, predicted_times, wrong_result
    from topocc.runtime.harness.launch import BenchRequest, bench_schedule, bench_sizes, check_ranks
    from topocc.runtime.plan import load_any

    loaded = load_any(schedule)
    size_list = bucket_sizes(*sizes, factor=factor)
    echo = _progress_echo(progress)
    if emulate:
        # loaded on use: every command starts without the others' modules
        from topocc.planner.testbed.bench import bench_emulated, format_emulated_table
        from topocc.planner.topology.catalogue import resolve_topology

        cluster = resolve_topology(emulate)
        emulated = bench_emulated(cluster, schedule, size_list, scale=scale, np=nprocs, iters=iters, warmup=warmup,
                                  trace=trace, timeout=timeout, progress=echo)
        doc, text = [r.to_json() for r in emulated], format_emulated_table(emulated, cluster, scale)
    else:
        check_ranks(loaded.ranks, nprocs, schedule)
        predictions = predicted_times(loaded, bench_sizes(loaded.collective, loaded.ranks, size_list, dtype),
                                      schedule, topology, what_if=what_if)
        report = bench_progress(echo, len(size_list), loaded.ranks) if echo else None
        request = BenchRequest(tuple(size_list), iters, warmup, dtype, timeout=timeout, trace=trace)
        rows = bench_schedule(schedule, nprocs, request, progress=report)
        doc = bench_rows(rows, predictions)
        text = format_bench(doc, loaded.collective, loaded.ranks, predictions, iters=iters, warmup=warmup)
    _emit(doc, as_json, text)
    if any(r["wrong"] for r in doc):
        raise wrong_result(doc, schedule)


@cli.command("torchbench")
@click.option("-c", "--collective", type=COLLECTIVE, default="allreduce", show_default=True,
              help="torch's spellings too: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all.")
@click.option("-b", "--minbytes", type=SIZE, default="1K", show_default=True,
              help="Smallest size: bytes of the larger buffer (K, M, G: powers of 1024, as nccl-tests reads them).")
@click.option("-e", "--maxbytes", type=SIZE, default="16M", show_default=True, help="Largest size.")
@click.option("-f", "--stepfactor", type=click.IntRange(2), default=2, show_default=True, help="Size step.")
@click.option("-n", "--iters", type=click.IntRange(1), default=20, show_default=True, help="Timed calls per size.")
@click.option("-w", "--warmup_iters", "warmup", type=click.IntRange(0), default=5, show_default=True,
              help="Untimed calls per size first (they also carry topocc's measured trials against gloo).")
@click.option("-d", "--datatype", default="float", show_default=True,
              help="float, half, bfloat16, double, int8, uint8, int32, int64 (or torch's float32, float16, ...).")
@click.option("-o", "--op", type=click.Choice(OPS), default="sum", show_default=True, help="The reduction.")
@click.option("-r", "--root", type=click.IntRange(0), default=0, show_default=True, help="Root of broadcast/reduce.")
@click.option("--ranks", type=click.IntRange(2), default=2, show_default=True, help="torchrun's --nproc-per-node.")
@click.option("--backend", "backends", default="topocc,gloo", show_default=True,
              help="Backends to time side by side, comma-separated: topocc, gloo, nccl (nccl needs CUDA).")
@click.option("--bundle", type=click.Path(exists=True), default=None,
              help="topocc's plans: a folder from topocc bundle (default: compiled for --topology).")
@click.option("--topology", default=None,
              help="Compile topocc's plans for this topology, as topocc bundle does (default: the first --ranks "
                   "ranks of emu-uniform).")
@click.option("--force-plans", "force_plans", is_flag=True,
              help="Run topocc's plans at every size, also where the model or a measured trial picks gloo.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where topocc's and gloo's tensors live (nccl's are always on the GPU).")
@click.option("--timeout", type=click.FloatRange(1.0), default=300.0, show_default=True,
              help="Seconds one size of one backend may take, and a rank waits for its peers.")
@click.option("--torchrun", default=None, help="The torchrun to launch (default: the one beside this Python).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Also write the rows here.")
@click.option("--progress/--no-progress", default=None, help=PROGRESS_HELP)
def torchbench_cmd(collective: str, minbytes: int, maxbytes: int, stepfactor: int, iters: int, warmup: int,
                   datatype: str, op: str, root: int, ranks: int, backends: str, bundle: str | None,
                   topology: str | None, force_plans: bool, device: str, timeout: float, torchrun: str | None,
                   json_path: str | None, progress: bool | None) -> None:
    """Time a torch.distributed backend under torchrun, nccl-tests style: topocc beside gloo (or nccl)."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.report.torchbench_table import (
        format_torchbench,
        torchbench_json,
        torchbench_progress,
        torchbench_wrong,
    )
    from topocc.planner.testbed.torchbench import torchbench
    from topocc.runtime.harness.torchbench.sweep import make_sweep

    sweep = make_sweep(collective, minbytes, maxbytes, stepfactor, ranks=ranks, datatype=datatype, op=op, root=root,
                       iters=iters, warmup=warmup, backends=backends, device=device, timeout_s=timeout)
    echo = _progress_echo(progress)
    result = torchbench(sweep, bundle=bundle, topology=topology, force_plans=force_plans, torchrun=torchrun,
                        progress=echo, on_row=torchbench_progress(echo, sweep) if echo else None)
    click.echo(format_torchbench(result))
    if json_path:
        Path(json_path).write_text(json.dumps(torchbench_json(result), indent=1) + "\n")
    if (error := torchbench_wrong(result)) is not None:
        raise error


@cli.command("calibrate")
@click.argument("topology")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Write the calibrated topology here (the file with a calibration: block).")
@click.option("--emulate", is_flag=True, help="Measure an emulated cluster of TOPOLOGY (needs root).")
@click.option("--scale", type=click.FloatRange(1e-6, 1.0), default=1e-3, show_default=True,
              help="With --emulate: emulated link rate = real bandwidth x scale.")
@click.option("--mpiexec-arg", "mpiexec_args", multiple=True,
              help="Without --emulate: pass this to mpiexec (repeat it; e.g. -f hostfile on a real cluster).")
@click.option("--json", "as_json", is_flag=True, help="Print the fitted figures as JSON.")
@click.option("--progress/--no-progress", default=None, help=PROGRESS_HELP)
def calibrate_cmd(topology: str, output: str, emulate: bool, scale: float, mpiexec_args: tuple[str, ...],
                  as_json: bool, progress: bool | None) -> None:
    """Measure the cluster TOPOLOGY describes (one MPI rank per GPU) and write it calibrated to --output."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.testbed.calibrate import calibrate, calibration_json, format_calibration

    done = calibrate(topology, output, emulate=emulate, scale=scale, mpiexec_args=mpiexec_args,
                     progress=_progress_echo(progress))
    _emit(calibration_json(done), as_json, format_calibration(done) + f"\n  wrote {output}")


@cli.command("inspect")
@click.argument("schedule", type=click.Path(dir_okay=False))
@click.option("-t", "--topology", default=None, help="Topology (default: the one it was compiled for).")
@click.option("--what-if", "what_if", is_flag=True, help=WHAT_IF_HELP)
@click.option("-s", "--size", type=SIZE, default=None, help="Buffer size (default: the size it was compiled for).")
@click.option("--html", type=click.Path(dir_okay=False), default=None, help="Write a self-contained HTML report.")
@click.option("--dot", type=click.Path(dir_okay=False), default=None, help="Write Graphviz DOT with the plan.")
@click.option("--baselines", default="ring,tree", show_default=True,
              help="Algorithms to compare with in the HTML report (comma-separated; empty for none).")
def inspect_cmd(schedule: str, topology: str | None, what_if: bool, size: int | None, html: str | None,
                dot: str | None, baselines: str) -> None:
    """Show a plan: terminal tables, or an HTML report / DOT drawing of topology, structure and timeline."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.report.inspect import inspect_schedule

    click.echo(inspect_schedule(schedule, topology, size, html=html, dot=dot,
                                baselines=[b for b in baselines.split(",") if b], what_if=what_if))


@cli.command("emulate", context_settings={"ignore_unknown_options": True})
@click.argument("topology")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--scale", type=click.FloatRange(1e-6, 1.0), default=1e-3, show_default=True,
              help="Emulated link rate = real bandwidth x scale.")
@click.option("--timeout", type=click.FloatRange(1.0), default=600.0, show_default=True)
@click.option("--progress/--no-progress", default=None, help=PROGRESS_HELP)
def emulate_cmd(topology: str, command: tuple[str, ...], scale: float, timeout: float, progress: bool | None) -> None:
    """Run COMMAND as every rank of TOPOLOGY on an emulated cluster (network namespaces, tc; needs root)."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.errors import CommunicatorError
    from topocc.planner.testbed.bench import run_emulated

    result = run_emulated(topology, list(command), scale=scale, timeout_s=timeout, progress=_progress_echo(progress))
    click.echo(result.stdout, nl=False)
    click.echo(result.stderr, nl=False, err=True)
    if result.returncode != 0:
        raise CommunicatorError(f"the command failed on the emulated cluster (exit {result.returncode})")


@cli.command("plan-buckets")
@click.argument("profile", type=click.Path(dir_okay=False))
@click.option("--plan", "plan_path", type=click.Path(dir_okay=False), required=True,
              help="Compiled allreduce plan or schedule whose cost model to use.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the block plan (JSON).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def plan_buckets_cmd(profile: str, plan_path: str, output: str | None, as_json: bool) -> None:
    """Group gradients into blocks and order them (Prophet) against DDP's default and per-tensor priority."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.gradblocks.block_plan import block_plan_to_dict, format_block_plan, plan_blocks
    from topocc.planner.gradblocks.cost import plan_cost
    from topocc.planner.gradblocks.profile_file import load_profile
    from topocc.runtime.plan import as_plan

    loaded = load_profile(profile)
    result = plan_blocks(loaded, plan_cost(as_plan(plan_path), plan_path=plan_path))
    doc = block_plan_to_dict(result, loaded)
    if output:
        Path(output).write_text(json.dumps(doc, indent=1))
    _emit(doc, as_json, format_block_plan(result, loaded))


@cli.command("algorithms")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def algorithms_cmd(as_json: bool) -> None:
    """List the algorithms and the collectives each implements."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.report.summary import algorithms_table, format_algorithms

    rows = algorithms_table()
    _emit(rows, as_json, format_algorithms(rows))


@cli.command("compile-shipped")
@click.option("-o", "--output", type=click.Path(file_okay=False), default="schedules", show_default=True)
@click.option("-s", "--size", type=SIZE, default="64MiB", show_default=True)
@click.argument("names", nargs=-1)
def compile_shipped_cmd(output: str, size: int, names: tuple[str, ...]) -> None:
    """Recompile the allreduce schedules of the shipped topologies (those up to 4096 ranks, or NAMES) into OUTPUT."""
    # loaded on use: every command starts without the others' modules
    from topocc.planner.compiler.size_buckets import compile_shipped
    from topocc.planner.report.table import format_table
    from topocc.planner.units import format_time

    rows = []
    for path, compiled in compile_shipped(output, names or None, size_bytes=size):
        rows.append((path, compiled.schedule.metadata.algorithm, compiled.schedule.op_count,
                     format_time(compiled.sim.time_s), f"{100 * compiled.efficiency:.1f}%"))
    click.echo(format_table(rows, ("schedule", "algorithm", "ops", "predicted", "of bound")))


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning every failure into one line and an exit code."""
    debug = bool(os.environ.get("TOPOCC_DEBUG"))
    try:
        with rare_collections():
            cli.main(args=argv, prog_name="topocc", standalone_mode=False)
    except TopoccError as exc:
        if debug:
            raise
        click.echo(f"topocc: error: {exc.one_line()}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.Abort:
        click.echo("topocc: aborted", err=True)
        return 130
    except click.ClickException as exc:
        if debug:
            raise
        click.echo(f"topocc: error: {' '.join(exc.format_message().split())}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("topocc: interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 141
    except Exception as exc:  # a bug: still one line, with a way to see the traceback
        if debug:
            raise
        click.echo(f"topocc: internal error: {type(exc).__name__}: {' '.join(str(exc).split())} "
                   "(this is a bug; rerun with TOPOCC_DEBUG=1 for a traceback)", err=True)
        return 70
    return 0


if __name__ == "__main__":
    sys.exit(main())
