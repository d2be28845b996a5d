"""Chrome traces of simulated and measured runs: valid, complete, and flat (no overlapping slices per track)."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path

import pytest

from topocc.planner.analysis.simulate import simulate
from topocc.planner.compiler.compile import compile_schedule
from topocc.planner.compiler.options import Options
from topocc.planner.report.simulated_trace import simulated_trace
from topocc.planner.topology.catalogue import resolve_topology
from topocc.runtime.chrome_trace import Slice, TraceWriter, chrome_trace, write_trace

SIZE = 64 << 20


def check_trace(doc: dict) -> dict[tuple[int, int], list[dict]]:
    """The checks every trace passes; returns the slices per (pid, tid)."""
    json.loads(json.dumps(doc, allow_nan=False))  # plain JSON, finite numbers
    events = doc["traceEvents"]
    names: dict[tuple[int, int], str] = {}
    processes: set[int] = set()
    tracks: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for e in events:
        assert {"name", "ph", "pid", "tid"} <= e.keys(), e
        if e["ph"] == "M":
            if e["name"] == "process_name":
                processes.add(e["pid"])
            elif e["name"] == "thread_name":
                names[(e["pid"], e["tid"])] = e["args"]["name"]
            continue
        assert e["ph"] == "X"
        assert {"cat", "ts", "dur", "args"} <= e.keys()
        assert e["ts"] >= 0 and e["dur"] >= 0
        tracks[(e["pid"], e["tid"])].append(e)
    for key, slices in tracks.items():
        assert key in names and key[0] in processes, key
        slices.sort(key=lambda e: (e["ts"], e["dur"]))
        for a, b in itertools.pairwise(slices):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3, (names[key], a, b)  # rounding to 0.1 ns
    return tracks


@pytest.fixture(scope="module")
def ring8():
    topo = resolve_topology("dgx1-v100")
    schedule = compile_schedule(topo, "allreduce", "ring", Options(size_bytes=SIZE)).schedule
    return topo, schedule, simulate(topo, schedule, SIZE, record=True)


def test_simulated_trace(ring8, tmp_path: Path) -> None:
    topo, schedule, result = ring8
    doc = simulated_trace(topo, schedule, result)
    path = tmp_path / "trace.json"
    write_trace(path, doc)
    tracks = check_trace(json.loads(path.read_text()))
    ops = [e for t in tracks.values() for e in t if e["cat"] != "link"]
    links = [e for t in tracks.values() for e in t if e["cat"] == "link"]
    assert len(ops) == schedule.op_count  # every operation, once
    # a slice per operation, ending when the simulation said; none beyond the predicted time
    end = max(e["ts"] + e["dur"] for e in ops + links)
    assert end == pytest.approx(result.time_s * 1e6, rel=1e-6)
    # the link slices account for every byte the links carried
    assert sum(e["args"]["bytes"] for e in links) == pytest.approx(sum(result.link_bytes.values()), rel=1e-6)
    # a link is busy for at most the whole run, and the busiest NVLinks nearly all of it
    busy: dict[str, float] = defaultdict(float)
    for e in links:
        busy[e["name"].split(": ", 1)[1]] += e["dur"]
    assert max(busy.values()) <= result.time_s * 1e6 * (1 + 1e-6)
    assert max(busy.values()) >= 0.9 * result.time_s * 1e6
    send = next(e for e in ops if e["args"]["kind"] == "send" and e["args"]["step"] == 3)
    assert send["name"] == f"step 3 send {send['args']['chunk']} -> r{send['args']['peer']}"
    assert send["ts"] >= send["args"]["posted_us"]
    # one process per host, rank tracks named, overlapping ops split into lanes of one track
    meta = doc["traceEvents"]
    assert [e["args"]["name"] for e in meta if e["name"] == "process_name"] == ["host h0"]
    threads = [e["args"]["name"] for e in meta if e["name"] == "thread_name"]
    assert "rank 0" in threads and "rank 0 (lane 2)" in threads
    assert "link h0.gpu0 -> h0.gpu1 (nvlink)" in threads
    assert doc["otherData"]["links_left_out"] == 0


def test_link_budget(ring8) -> None:
    topo, schedule, result = ring8
    doc = simulated_trace(topo, schedule, result, max_link_slices=50)
    tracks = check_trace(doc)
    links = [e for t in tracks.values() for e in t if e["cat"] == "link"]
    assert 0 < len(links) <= 50 and doc["otherData"]["links_left_out"] > 0


def test_measured_records_become_lanes(tmp_path: Path) -> None:
    # what the runtime records: OpEvent's fields, here as mappings (e.g. read back from a JSON log)
    records = [
        {"rank": 0, "index": 0, "kind": "send", "peer": 1, "step": 0, "channel": 0, "chunk": "o[0]",
         "start_s": 0.0, "end_s": 3e-6},
        {"rank": 0, "index": 1, "kind": "recv", "peer": 1, "step": 0, "channel": 0, "chunk": "o[1]",
         "start_s": 1e-6, "end_s": 2e-6},
        {"rank": 0, "index": 2, "kind": "send", "peer": 1, "step": 1, "channel": 0, "chunk": "o[1]",
         "start_s": 3e-6, "end_s": 5e-6},
        {"rank": 1, "index": 0, "kind": "copy", "peer": None, "step": 0, "channel": 0, "chunk": "i[0]->o[0]",
         "start_s": 0.0, "end_s": 0.0},
    ]
    path = tmp_path / "measured.json"
    write_trace(path, records, process_of=lambda r: f"host {r // 2}")
    doc = json.loads(path.read_text())
    tracks = check_trace(doc)
    threads = {e["args"]["name"]: (e["pid"], e["tid"]) for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert set(threads) == {"rank 0", "rank 0 (lane 2)", "rank 1"}
    assert [e["name"] for e in tracks[threads["rank 0"]]] == ["step 0 send o[0] -> r1", "step 1 send o[1] -> r1"]
    assert [e["dur"] for e in tracks[threads["rank 0 (lane 2)"]]] == [1.0]
    assert chrome_trace(records) == chrome_trace(list(records))  # deterministic


def test_lanes_are_minimal() -> None:
    w = TraceWriter()
    pid = w.process("p")
    # three slices overlapping pairwise at different instants need only two lanes
    tids = w.track(pid, "t", [Slice("a", 0, 2), Slice("b", 1, 3), Slice("c", 2, 4), Slice("d", 3.5, 5)])
    assert len(tids) == 2
    check_trace(w.to_dict())
