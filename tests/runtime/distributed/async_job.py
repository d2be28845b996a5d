"""A torchrun worker for the ``topocc`` backend's progress thread, thresholds and debug lines.

``async_job.py late``: rank 1 comes to a planned all_reduce a second late; rank 0's ``async_op`` call must
return at once, its work stay incomplete until rank 1 arrives, and rank 0's own Python code keep running
meanwhile (the replay waits without holding the GIL).  ``async_job.py sizes N...``: one all_reduce of each
size (float32 elements), twice, so that each distinct call is seen twice; ``async_job.py burst N...``: the same
calls all issued with ``async_op`` before any is waited on (as DDP's backward issues its buckets), each checked;
``async_job.py first N``: two all_reduces of N elements, noting after each whether the schedule format is loaded.
Rank 0 prints ``RESULT {json}``.
The script imports nothing of topocc: the backend comes from torch's autoloading of installed entry points.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist


def spin(seconds: float) -> int:
    """Iterations of a pure-Python loop in ``seconds`` (a measure of how much of the GIL this thread gets)."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


def late() -> dict[str, object]:
    x = torch.full((4096,), float(dist.get_rank() + 1))
    dist.all_reduce(x)  # the first call makes the plan's communicator; the next one is timed
    if dist.get_rank() == 1:
        time.sleep(1.0)
    baseline = spin(0.3) if dist.get_rank() == 0 else 0
    start = time.perf_counter()
    work = dist.all_reduce(x, async_op=True)
    returned = time.perf_counter() - start
    done_at_once = work.is_completed()
    during = spin(0.3) if dist.get_rank() == 0 else 0
    work.wait()
    return {"returned_s": returned, "completed_at_once": done_at_once, "completed_after": work.is_completed(),
            "waited_s": time.perf_counter() - start, "baseline": baseline, "during": during,
            "result": float(x[0]), "expected": dist.get_world_size() * sum(range(1, dist.get_world_size() + 1)),
            "future": float(work.get_future().wait()[0][0])}


def sizes(counts: list[int]) -> dict[str, object]:
    for _ in range(2):
        for n in counts:
            x = torch.ones(n)
            dist.all_reduce(x)
            assert float(x[0]) == dist.get_world_size()
    return {}


def burst(counts: list[int]) -> dict[str, object]:
    calls = [torch.full((n,), float(dist.get_rank() + i)) for _ in range(2) for i, n in enumerate(counts)]
    works = [dist.all_reduce(x, async_op=True) for x in calls]
    in_flight = sum(not w.is_completed() for w in works)
    for w in works:
        w.wait()
    w_ = dist.get_world_size()
    wrong = [i for i, x in enumerate(calls)
             if not bool((x == sum(r + i % len(counts) for r in range(w_))).all())]
    return {"wrong": wrong, "in_flight": in_flight}


def first(counts: list[int]) -> dict[str, object]:
    """With trials on, a class's first call is gloo's: the schedule format loads at the second, the plan's."""
    loaded = []
    for _ in range(2):
        dist.all_reduce(torch.ones(counts[0]))
        loaded.append("topocc.runtime.schedule" in sys.modules)
    return {"format_loaded": loaded}


def main() -> None:
    mode = sys.argv[1]
    loaded_before = any(name.startswith("topocc.runtime") for name in sys.modules)
    dist.init_process_group("topocc")
    counts = [int(n) for n in sys.argv[2:]]
    modes = {"burst": burst, "first": first, "sizes": sizes}
    out = late() if mode == "late" else modes[mode](counts)
    stats = sys.modules["topocc.runtime.distributed"].counters()  # loaded by init_process_group, not by us
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({**out, "counters": stats.as_dict(), "loaded_before_init": loaded_before}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
