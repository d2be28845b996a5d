"""Training on an emulated cluster of NCCL ranks: plain DDP, topocc's DDP hook, Prophet's blocks and DASO.

Every rank is a process on the one GPU, in its emulated host's network namespace (as
``benchmarks/gpu_bench.py`` sets them up: ``topocc.planner.testbed.emulation``, inter-host links shaped
to ``--scale`` of their bandwidth), with its own ``NCCL_HOSTID``.  Each trains the same randomly initialised transformer
language model on synthetic data (a fixed random token mapping to learn; nothing downloaded), one
configuration after another in the same processes:

* ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` over torch's NCCL (its default buckets);
* ``hook``: the same DDP with :func:`topocc.runtime.training.topocc_allreduce_hook`, the topology's shipped
  all-reduce schedule replayed over :class:`topocc.runtime.transports.nccl.NCCLTransport`;
* ``prophet``: :class:`topocc.runtime.training.BlockScheduler` with blocks that
  ``topocc.planner.gradblocks.block_plan`` plans from this run's own profile (``profile_model`` on the first
  batch) and the schedule's all-reduce time measured here
  at three sizes and for all the gradients at once, before any configuration is timed; its prediction, and
  DDP's default buckets' (the ``hook`` row), are printed beside the measurement;
* ``daso``: :class:`topocc.runtime.training.DASO` over the same global communicator and one per host; it trains
  until every rank's evaluation reaches DDP's final eval loss (at most ``--daso-factor`` x ``--steps``).

It prints, per configuration: the median iteration time after warm-up (rank 0's steps, which the
collectives keep in step), the GPU's idle fraction (1 - the time the same steps take without
communication, all ranks computing at once, over the iteration time), the last training loss and the
evaluation loss on held-out data, the largest loss difference from plain DDP, and the training time until an
evaluation (every ``--eval-every`` steps, off the clock) reached DDP's final eval loss.  ``--plot`` writes an
SVG of eval loss against training time (and a PNG beside it where matplotlib is installed).

    python benchmarks/train_gpu.py [--topologies emu-racks emu-uniform] [--steps 16] [--plot loss.svg]

``--backend gloo`` runs the same on CPU tensors without emulation (how the tests exercise it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from topocc.planner.routing.network import Network

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: the repository's modules
    sys.path.insert(0, str(REPO))

from benchmarks.gpu_bench import format_link_stats, gpu_waiter, rank_env, run_ranks  # noqa: E402

CONFIGS = ("ddp", "hook", "prophet", "daso")
TIMEOUT_S = 120.0
#: Held-out evaluation batches (each rank evaluates the same ones).
EVAL_BATCHES = 4


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topologies", nargs="+", default=["emu-racks", "emu-uniform"])
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    p.add_argument("--scale", type=float, default=1e-2, help="emulated link rates x this")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--warmup", type=int, default=4, help="steps not timed (DDP rebuilds its buckets after one)")
    p.add_argument("--width", type=int, default=384, help="the transformer's model dimension")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=16, help="sequences per rank and step")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--eval-every", type=int, default=2, help="steps between evaluations (off the clock)")
    p.add_argument("--daso-factor", type=int, default=4,
                   help="DASO trains until every rank's evaluation reaches DDP's final eval loss, at most this "
                        "many times --steps")
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--ranks", type=int, default=4, help="ranks without emulation (gloo)")
    p.add_argument("--plot", default=None, help="write eval loss against training time here (SVG)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds for the whole run: a topology's ranks still running then are stopped, and its row "
                        "says how far they got")
    args = p.parse_args(argv)
    if args.steps <= args.warmup + 1 or args.width % 8 or (args.time_limit is not None and args.time_limit <= 0):
        p.error("--steps must exceed --warmup by 2 or more, --width be a multiple of 8 (8 heads), and "
                "--time-limit be positive")
    return args


def run_topology(name: str, args: argparse.Namespace, deadline: float = float("inf")) -> dict[str, Any]:
    """Launch every rank of ``name`` (emulated unless gloo) and return rank 0's report; the ranks are stopped at
    ``deadline`` (``time.monotonic()``), and the error then ends with rank 0's last progress line."""
    from benchmarks.gpu_bench import schedule_for
    from topocc.planner.testbed.emulation import EmulatedCluster, emulation_available, plan_emulation
    from topocc.runtime.schedule import save_schedule

    emulated = args.backend == "nccl"
    if emulated:
        topology, schedule = schedule_for(name, 0)
        if (why := emulation_available()) is not None:
            raise RuntimeError(f"cannot emulate {name} here: {why}")
        sizes = {len(h.ranks) for h in plan_emulation(topology, scale=args.scale).hosts}
        if len(sizes) != 1:
            raise RuntimeError(f"DASO needs hosts of equal rank counts; {name} has {sorted(sizes)}")
        node = sizes.pop()  # DASO's node: an emulated host's ranks
    else:
        topology, schedule = schedule_for("plain", args.ranks)
        node = 2 if args.ranks % 2 == 0 else 1
    with tempfile.TemporaryDirectory(prefix="topocc-train-gpu-") as tmp:
        path = str(Path(tmp) / "schedule.json")
        save_schedule(schedule, path)
        world = schedule.ranks
        keys = ("configs", "steps", "warmup", "width", "layers", "vocab", "batch", "seq", "lr", "backend", "eval_every",
                "daso_factor")
        options = json.dumps({k: getattr(args, k) for k in keys} | {"node": node})

        def command(rank: int) -> list[str]:
            return [sys.executable, str(Path(__file__).resolve()), "rank", str(rank), str(world),
                    str(Path(tmp) / "store"), path, options]

        limit = min(60.0 + (len(args.configs) + args.daso_factor) * (args.steps + 4) * TIMEOUT_S / 8,
                    max(1.0, round(deadline - time.monotonic(), 1)))
        if emulated:
            with EmulatedCluster(topology, scale=args.scale) as cluster:
                report = run_ranks([(cluster.host_command(cluster.host_of(r), command(r)),
                                     rank_env(r, cluster.host_of(r).interface)) for r in range(world)], limit)
                try:  # a diagnostic: never lose the results to it
                    report["network"] = format_link_stats(name, cluster.link_stats())
                except Exception as exc:
                    report["network"] = f"# {name} network: no statistics ({exc})"
        else:
            report = run_ranks([(command(r), rank_env(r, None)) for r in range(world)], limit)
    report.update(topology=name, ranks=world, algorithm=schedule.metadata.algorithm)
    return report


def _evals(run: dict[str, Any]) -> list[tuple[float, float]]:
    """(training seconds, eval loss) of a run; Prophet's only at its end, since its updates wait for the next
    forward pass, which an evaluation in between would move off the clock."""
    return run["evals"] or [(run["times"][-1], run["eval_loss"])]


def _reached(run: dict[str, Any], target: float) -> float | None:
    """Training seconds until an evaluation reached ``target`` within 0.1% (None: never)."""
    return next((t for t, v in _evals(run) if v <= target * (1 + 1e-3)), None)  # as the DASO run stops


def format_report(report: dict[str, Any], args: argparse.Namespace) -> str:
    """One topology's table: iteration times against DDP and the block planner, idle GPU, losses, time to loss."""
    runs, predicted = report["runs"], report["predicted"]
    base = runs.get("ddp")
    target = base["eval_loss"] if base else None
    lines = [f"# {report['topology']}: {report['ranks']} ranks ({report['node']} per host), transformer "
             f"{report['params'] / 1e6:.1f} M parameters ({report['params'] * 4 / 2**20:.0f} MiB of gradients), "
             f"{args.steps} steps of {args.batch} x {args.seq} tokens per rank, inter-host links at {args.scale:g} x "
             f"bandwidth; per step alone: compute {report['compute_s'] * 1e3:.1f} ms, all gradients in one "
             f"all-reduce {report['native_s'] * 1e3:.1f} ms (NCCL), {report['replay_s'] * 1e3:.1f} ms (topocc)",
             f"#{'config':>8} | {'iter (ms)':>9} {'vs DDP':>6} {'predicted':>9} {'GPU idle':>8} | "
             f"{'train loss':>10} {'eval loss':>9} {'max |dloss|':>11} | {'wall (s)':>8} {'to DDP eval':>11}"]
    for name, r in runs.items():
        speed = f"{base['iter_s'] / r['iter_s']:6.2f}" if base else f"{'n/a':>6}"
        pred = f"{predicted[name] * 1e3:9.1f}" if name in predicted else f"{'n/a':>9}"
        diff = (f"{max(abs(a - b) for a, b in zip(r['losses'], base['losses'])):11.2e}" if base else f"{'n/a':>11}")
        idle = max(0.0, 1.0 - report["compute_s"] / r["iter_s"])
        reached = _reached(r, target) if target is not None else None
        lines.append(f" {name:>8} | {r['iter_s'] * 1e3:9.1f} {speed} {pred} {idle:8.0%} | {r['losses'][-1]:10.4f} "
                     f"{r['eval_loss']:9.4f} {diff} | {r['times'][-1]:8.2f} "
                     + (f"{reached:10.2f}s" if reached is not None else f"{'-':>11}"))
    if "block_plan" in report:
        b = report["block_plan"]
        cost = ", ".join(f"{n >> 10} KiB {t * 1e3:.1f} ms" for n, t in b["cost"])
        lines.append(f"# block plan: {b['blocks']} blocks ({b['strategy']}), from the profile of this run and the "
                     f"plan's all-reduce measured here ({cost}); 'predicted' is the block planner's iteration time")
    if "daso_syncs" in report:
        lines.append(f"# DASO: {report['daso_steps']} steps, global averages at steps {report['daso_syncs']}; 'to DDP "
                     "eval' is the training time until an evaluation (every --eval-every steps) reached DDP's final "
                     "eval loss within 0.1% (DASO stops there)")
    if "network" in report:
        lines.append(report["network"])
    return "\n".join(lines)


def svg_plot(reports: Sequence[dict[str, Any]]) -> str:
    """Evaluation loss against training wall time, one panel per topology, one line per configuration
    (Prophet's updates land in the next forward pass, so it is evaluated only at the end: a dot)."""
    colours = {"ddp": "#1f77b4", "hook": "#d62728", "prophet": "#9467bd", "daso": "#2ca02c"}
    w, h, pad = 460, 300, 50
    panels = []
    for k, rep in enumerate(reports):
        runs = rep["runs"]
        series = {name: _evals(r) for name, r in runs.items()}
        tmax = max(t for pts in series.values() for t, _ in pts) or 1.0
        values = [v for pts in series.values() for _, v in pts]
        lmin, span = min(values), (max(values) - min(values)) or 1.0
        x0 = k * (w + 20)

        def pt(t: float, v: float, x0: int = x0, tmax: float = tmax, lmin: float = lmin, span: float = span) -> str:
            return f"{x0 + pad + t / tmax * (w - 2 * pad):.1f},{h - pad - (v - lmin) / span * (h - 2 * pad):.1f}"

        items = [f'<text x="{x0 + w / 2}" y="20" text-anchor="middle" font-size="14">{rep["topology"]} '
                 f'({rep["ranks"]} ranks)</text>',
                 f'<rect x="{x0 + pad}" y="{pad}" width="{w - 2 * pad}" height="{h - 2 * pad}" fill="none" '
                 f'stroke="#888"/>',
                 f'<text x="{x0 + w / 2}" y="{h - 12}" text-anchor="middle" font-size="12">training wall time (s), '
                 f'0 to {tmax:.1f}</text>',
                 f'<text x="{x0 + 12}" y="{h / 2}" font-size="12" transform="rotate(-90 {x0 + 12} {h / 2})" '
                 f'text-anchor="middle">eval loss {lmin:.3f} to {lmin + span:.3f}</text>']
        for j, (name, pts) in enumerate(series.items()):
            colour = colours.get(name, "#7f7f7f")
            if len(pts) > 1:
                items.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
                             f'points="{" ".join(pt(t, v) for t, v in pts)}"/>')
            x, y = pt(*pts[-1]).split(",")
            items.append(f'<circle cx="{x}" cy="{y}" r="4" fill="{colour}"/>')
            items.append(f'<text x="{x0 + w - pad - 4}" y="{pad + 16 + 16 * j}" text-anchor="end" font-size="12" '
                         f'fill="{colour}">{name}: {runs[name]["iter_s"] * 1e3:.0f} ms/iter</text>')
        panels.append("\n".join(items))
    width = len(reports) * (w + 20)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" font-family="sans-serif">\n'
            + "\n".join(panels) + "\n</svg>\n")


def png_plot(reports: Sequence[dict[str, Any]], path: Path) -> None:
    """The same plot as a PNG where matplotlib is installed (it is not a dependency; the SVG always is written)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(reports), figsize=(6 * len(reports), 4), squeeze=False)
    for ax, rep in zip(axes[0], reports):
        for name, r in rep["runs"].items():
            pts = _evals(r)
            ax.plot([t for t, _ in pts], [v for _, v in pts], marker="o", markersize=3,
                    label=f"{name}: {r['iter_s'] * 1e3:.0f} ms/iter")
        ax.set(title=f"{rep['topology']} ({rep['ranks']} ranks)", xlabel="training wall time (s)", ylabel="eval loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    reports, status = [], 0
    deadline = time.monotonic() + (args.time_limit if args.time_limit is not None else float("inf"))
    for name in args.topologies if args.backend == "nccl" else ["plain"]:
        start = time.monotonic()
        try:
            report = run_topology(name, args, deadline)
        except RuntimeError as exc:
            print(f"# {name}: FAILED: {exc}", flush=True)
            status = 1
            continue
        reports.append(report)
        print(format_report(report, args) + f"\n# ({time.monotonic() - start:.0f} s)\n", flush=True)
        # written after each topology, so that a run stopped by its time limit keeps what it measured
        if args.plot:
            Path(args.plot).write_text(svg_plot(reports))
            png_plot(reports, Path(args.plot).with_suffix(".png"))
        if args.json:
            Path(args.json).write_text(json.dumps(reports, indent=1))
    return status


# --------------------------------------------------------------------------- one rank


def _model(args: dict[str, Any], device: Any) -> Any:
    import torch
    from torch import nn

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = args["width"]
            self.embed = nn.Embedding(args["vocab"], d)
            layer = nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0, batch_first=True)
            self.body = nn.TransformerEncoder(layer, args["layers"], enable_nested_tensor=False)
            self.head = nn.Linear(d, args["vocab"])

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.body(self.embed(tokens)))

    torch.manual_seed(0)
    return LM().to(device)


def _data(args: dict[str, Any], rank: int, world: int, device: Any) -> tuple[list[Any], list[Any]]:
    """Per step this rank's batch, and the held-out batches: tokens and their images under a fixed mapping."""
    import torch

    g = torch.Generator().manual_seed(7)
    mapping = torch.randperm(args["vocab"], generator=g)
    shape = (args["batch"], args["seq"])
    count = args["steps"] * (args["daso_factor"] if "daso" in args["configs"] else 1)
    steps = [torch.randint(args["vocab"], shape, generator=torch.Generator().manual_seed(1000 * k + rank))
             for k in range(count)]
    held = [torch.randint(args["vocab"], shape, generator=torch.Generator().manual_seed(10**6 + k))
            for k in range(EVAL_BATCHES)]
    return ([(x.to(device), mapping[x].to(device)) for x in steps], [(x.to(device), mapping[x].to(device))
                                                                     for x in held])


def _transport(nccl: bool, store: Any, rank: int, ranks: Sequence[int], prefix: str,
               others: Sequence[Sequence[int]] = ()) -> Any:
    """A transport over ``ranks`` (global ranks, this one among them): NCCL through the store, or gloo.

    gloo's groups are made by every rank of the world in the same order (torch's rule), so a rank also
    makes the groups of ``others`` (the other nodes), in rank order, without joining them.
    """
    import torch.distributed as dist

    if nccl:
        from topocc.runtime.transports.nccl import NCCLTransport
        from topocc.runtime.transports.store import StoreControl

        return NCCLTransport(StoreControl(dist.PrefixStore(prefix, store), ranks.index(rank), len(ranks)),
                             timeout=TIMEOUT_S)
    from topocc.runtime.transports.gloo import GlooTransport

    mine = None
    for group in sorted([list(ranks), *map(list, others)]):
        if group == list(ranks):  # GlooTransport makes its own group over the ranks of the one it is given
            mine = GlooTransport(dist.new_group(group, backend="gloo"), timeout=TIMEOUT_S)
        else:
            dist.new_group(group, backend="gloo")
            dist.new_group(group, backend="gloo")
    return mine


def _node_schedule(ranks: int) -> Any:
    """The all-reduce inside one host: the planner's ring on a host of ``ranks`` fully connected GPUs."""
    from topocc.planner.compiler.algorithms import ALGORITHMS
    from topocc.planner.compiler.options import Options
    from topocc.planner.topology.parse import parse_topology_text

    text = (f"name: node-{ranks}\ncluster:\n  hosts: 1\n  host:\n    gpus: {ranks}\n    fabric: fully-connected\n"
            "    gpu_link: {bandwidth: 10 GB/s, latency: 1 us, kind: shm}\n")
    return ALGORITHMS["ring"].load()(Network(parse_topology_text(text, f"node-{ranks}")), "allreduce",
                                     Options(size_bytes=1 << 20))


def _timed(call: Any, sync: Any, control: Any) -> float:
    """Seconds ``call`` takes with the GPU work it enqueues: median of 3, the slowest rank's."""
    times = []
    for _ in range(3):
        control.barrier(TIMEOUT_S)
        t = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t)
    return float(control.max_float(statistics.median(times)))


def _measured_cost(comm: Any, device: Any, sync: Any, control: Any) -> list[tuple[int, float]]:
    """The plan's all-reduce time here at a few sizes: the block planner's input."""
    import torch

    points = []
    for nbytes in (256 << 10, 2 << 20, 16 << 20):
        buf = torch.zeros(nbytes // 4, device=device)
        points.append((nbytes, _timed(lambda buf=buf: comm.allreduce(buf, op="avg"), sync, control)))
    return points


def rank_main(argv: Sequence[str]) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn

    from topocc.runtime.communicator import Communicator
    from topocc.runtime.errors import TopoccError
    from topocc.runtime.training import DASO, BlockScheduler, TopoccHookState, profile_model, topocc_allreduce_hook

    rank, world, store_path, schedule, args = int(argv[0]), int(argv[1]), argv[2], argv[3], json.loads(argv[4])
    nccl = args["backend"] == "nccl"
    device = torch.device("cuda", 0) if nccl else torch.device("cpu")
    if nccl:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group(args["backend"], store=dist.PrefixStore("torch", store), rank=rank, world_size=world,
                            device_id=device if nccl else None)
    node = args["node"]
    nodes = [list(range(n, n + node)) for n in range(0, world, node)]
    steps, held = _data(args, rank, world, device)
    loss_fn = nn.CrossEntropyLoss()

    # wait for the GPU by polling an event with short sleeps, never torch.cuda.synchronize: twelve ranks spinning
    # in it beside NCCL's proxy threads oversubscribe the machine's cores and stall every handshake (the
    # benchmark's 1 MiB emu-racks all-reduce: 999 ms spinning, 37 ms polling)
    sync = gpu_waiter("poll") if nccl else (lambda: None)

    def loss_of(model: Any, x: Any, y: Any) -> Any:
        return loss_fn(model(x).flatten(0, 1), y.flatten())

    def evaluate(model: Any) -> float:
        with torch.no_grad():
            return sum(float(loss_of(model, x, y)) for x, y in held) / len(held)

    def adamw(params: Any) -> Any:
        return torch.optim.AdamW(params, lr=args["lr"])

    began = time.monotonic()

    def progress(what: str) -> None:  # rank 0's stderr: the last line is how far a run stopped at its limit got
        if rank == 0:
            print(f"train_gpu: {what} ({time.monotonic() - began:.0f} s)", file=sys.stderr, flush=True)

    # compute alone: the same steps without communication, every rank at once (they share the GPU)
    model = _model(args, device)
    opt = adamw(model.parameters())
    durations = []
    for x, y in steps[: args["warmup"] + 4]:
        dist.barrier()
        sync()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_of(model, x, y).backward()
        opt.step()
        sync()
        durations.append(time.perf_counter() - t)
    report: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters()),
                              "compute_s": statistics.median(durations[args["warmup"]:]), "runs": {},
                              "predicted": {}, "node": node}
    progress(f"compute alone {report['compute_s'] * 1e3:.1f} ms a step")
    try:
        transport = _transport(nccl, store, rank, list(range(world)), "global")  # the default group (gloo)
        state = TopoccHookState(schedule, transport=transport, timeout=TIMEOUT_S)
        comm = state.comm
        # communication alone: every gradient in one all-reduce, NCCL's own (DDP's) and the plan's (the hook's)
        flat = torch.zeros(report["params"], device=device)
        report["native_s"] = _timed(lambda: dist.all_reduce(flat), sync, transport)
        report["replay_s"] = _timed(lambda: comm.allreduce(flat), sync, transport)
        progress(f"all gradients in one all-reduce: NCCL {report['native_s'] * 1e3:.1f} ms, "
                 f"topocc {report['replay_s'] * 1e3:.1f} ms")
        if "prophet" in args["configs"]:
            # the profile and the plan come first, from this run's own measurements (Prophet's profiling steps)
            probe = _model(args, device)
            dist.barrier()
            profile = profile_model(probe, lambda out, y: loss_fn(out.flatten(0, 1), y.flatten()), steps[0])
            # and all the gradients in one (no block is larger): on emu-racks (H100) a fit up to 16 MiB put the
            # 39 MiB all-reduce at 1573 ms where it took 1210 (with the point: 1255)
            points = [*_measured_cost(comm, device, sync, transport), (4 * report["params"], report["replay_s"])]
            if rank == 0:
                from topocc.planner.gradblocks.block_plan import plan_blocks
                from topocc.planner.gradblocks.cost import fit_cost

                plan = plan_blocks(profile, fit_cost(points))
                store.set("blocks", json.dumps({"blocks": [list(map(list, b.pieces)) for b in plan.blocks],
                                                "prophet": plan.predicted_time_s, "hook": plan.ddp_time_s,
                                                "strategy": plan.strategy, "cost": points}))
            shared = json.loads(store.get("blocks"))
            report["predicted"] = {"prophet": shared["prophet"], "hook": shared["hook"]}
            report["block_plan"] = {"blocks": len(shared["blocks"]), "strategy": shared["strategy"],
                                    "cost": shared["cost"]}
            progress(f"block plan: {len(shared['blocks'])} blocks")
        for name in args["configs"]:
            model = _model(args, device)
            evals: list[tuple[float, float]] = []
            finish: Any = None
            step: Callable[[Any, Any], Any]
            if name in ("ddp", "hook"):
                ddp = nn.parallel.DistributedDataParallel(model)
                if name == "hook":
                    ddp.register_comm_hook(state, topocc_allreduce_hook)
                opt = adamw(model.parameters())

                def step(x: Any, y: Any, ddp: Any = ddp, opt: Any = opt) -> Any:
                    opt.zero_grad(set_to_none=True)
                    loss = loss_of(ddp, x, y)
                    loss.backward()
                    opt.step()
                    return loss.detach()
            elif name == "prophet":
                blocks = [[tuple(p) for p in b] for b in shared["blocks"]]
                sched = BlockScheduler(model, blocks, comm, adamw, overlap_forward=True, timeout=TIMEOUT_S)

                def step(x: Any, y: Any, sched: Any = sched, model: Any = model) -> Any:
                    loss = loss_of(model, x, y)
                    loss.backward()
                    sched.step()
                    return loss.detach()

                def finish(sched: Any = sched) -> None:
                    sched.synchronize()
                    sched.close()
            else:
                mine = next(n for n in nodes if rank in n)
                others = [n for n in nodes if n != mine]
                local = Communicator(_node_schedule(node), transport=_transport(nccl, store, rank, mine,
                                                                               f"node{mine[0]}", others),
                                     timeout=TIMEOUT_S)
                opt = adamw(model.parameters())
                daso = DASO(model, opt, comm, group_size=node, local_plan=local, warmup_steps=args["warmup"],
                            max_skip=8, window=4, timeout=TIMEOUT_S)

                def step(x: Any, y: Any, daso: Any = daso, model: Any = model, opt: Any = opt) -> Any:
                    opt.zero_grad(set_to_none=True)
                    loss = loss_of(model, x, y)
                    loss.backward()
                    sync()  # so that reading the loss does not spin
                    daso.step(float(loss))
                    return loss.detach()

                def finish(daso: Any = daso, local: Any = local) -> None:
                    daso.finish()
                    local.close()
                    report["daso_syncs"] = daso.sync_steps
            losses, times = [], []
            paused = 0.0  # evaluation time, left out of the training clock
            dist.barrier()
            sync()
            # DASO runs until every rank's model reaches DDP's final eval loss (the ranks agree through the
            # control plane), the others a fixed number of steps
            target = report["runs"]["ddp"]["eval_loss"] * (1 + 1e-3) if "ddp" in report["runs"] else None
            until = len(steps) if name == "daso" and target is not None else args["steps"]
            start = time.perf_counter()
            for k, (x, y) in enumerate(steps[:until]):
                losses.append(step(x, y))
                sync()
                now = time.perf_counter()
                times.append(now - start - paused)
                if name != "prophet" and (k + 1) % args["eval_every"] == 0:
                    evals.append((times[-1], evaluate(model)))
                    reached = name == "daso" and target is not None and transport.max_float(evals[-1][1]) <= target
                    paused += time.perf_counter() - now
                    if reached:
                        break
            if finish is not None:
                finish()
            if name == "daso":
                report["daso_steps"] = len(times)
            gaps = [b - a for a, b in itertools.pairwise(times)][args["warmup"]:]
            mean = torch.stack(losses).float()
            dist.all_reduce(mean)
            report["runs"][name] = {"iter_s": statistics.median(gaps), "losses": (mean / world).tolist(),
                                    "times": times, "evals": evals, "eval_loss": evaluate(model)}
            progress(f"{name}: {len(times)} steps, {statistics.median(gaps) * 1e3:.1f} ms each")
        state.close()
    except TopoccError as err:
        print(f"topocc: {err.one_line()}", file=sys.stderr, flush=True)
        return err.exit_code
    dist.destroy_process_group()
    if rank == 0:
        print("RESULT " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        sys.exit(rank_main(sys.argv[2:]))
    from topocc.runtime.harness.launch import exit_on_sigterm

    exit_on_sigterm()  # a `timeout` on this launcher takes its ranks along
    sys.exit(main())
