"""MSCCL XML import/export: every reference file imports and verifies; our schedules round-trip."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from topocc.planner.analysis.verify import verify
from topocc.planner.compiler.builder import ScheduleBuilder
from topocc.planner.errors import ScheduleFormatError, VerificationError
from topocc.planner.formats.msccl_xml import export_msccl, import_msccl, parse_msccl
from topocc.planner.topology.parse import parse_topology_text
from topocc.runtime.schedule import Chunk, Schedule

REF = Path(__file__).resolve().parents[3].parent / "shared" / "reference" / "msccl"
FILES = sorted(p.name for p in REF.glob("*.xml")) if REF.is_dir() else []
needs_ref = pytest.mark.skipif(not REF.is_dir(), reason=f"reference MSCCL files not found at {REF}")


def switch_topology(n: int) -> str:
    """n GPUs on one NVSwitch, inline YAML."""
    devices = "\n".join(f"  - {{name: gpu{i}, type: gpu}}" for i in range(n))
    links = "\n".join(f"  - {{ends: [gpu{i}, nvs], bandwidth: 25 GB/s, latency: 0.7 us, count: 12}}" for i in range(n))
    return f"name: sw{n}\ndevices:\n{devices}\n  - {{name: nvs, type: nvswitch}}\nlinks:\n{links}\n"


def message_count(schedule: Schedule) -> int:
    return sum(op.kind == "send" for p in schedule.programs for op in p)


def check_round_trip(schedule: Schedule) -> Schedule:
    """Export, re-import and verify; the semantics (op and message counts) must be the same."""
    text = export_msccl(schedule, proto="LL")
    again = parse_msccl(text, "round-trip")
    report = verify(again)
    assert report.messages == message_count(schedule)
    assert again.op_count == schedule.op_count
    assert (again.collective, again.ranks, again.inplace) == (schedule.collective, schedule.ranks, schedule.inplace)
    assert (again.input_chunks, again.output_chunks) == (schedule.input_chunks, schedule.output_chunks)
    return again


@needs_ref
def test_all_reference_files_present() -> None:
    assert len(FILES) == 8


@needs_ref
@pytest.mark.parametrize("name", FILES)
def test_reference_file_imports_verifies_and_round_trips(name: str) -> None:
    schedule = import_msccl(REF / name)
    root = ET.parse(REF / name).getroot()
    assert schedule.ranks == int(root.attrib["ngpus"])
    report = verify(schedule)
    # one message per send step (s, rcs, rrs, rrcs) of the file
    sends = sum(st.get("type") in ("s", "rcs", "rrs", "rrcs") for st in root.iter("step"))
    assert report.messages == sends
    again = check_round_trip(schedule)
    try:
        from topocc.planner.analysis.simulate import simulate
    except ImportError:
        return
    topo = parse_topology_text(switch_topology(schedule.ranks))
    t1 = simulate(topo, schedule, 1 << 20).time_s
    t2 = simulate(topo, again, 1 << 20).time_s
    assert t1 > 0
    assert t2 == pytest.approx(t1, rel=1e-6)


@needs_ref
def test_reference_details() -> None:
    ring = import_msccl(REF / "ndv4-r48ll.xml")
    assert ring.collective == "allreduce" and ring.inplace and ring.metadata.min_bytes == 266240
    assert {op.channel for p in ring.programs for op in p if op.peer is not None} == set(range(32))
    a2a = import_msccl(REF / "ndv4-a2a2ll.xml")
    assert (a2a.collective, a2a.input_chunks, a2a.output_chunks, a2a.inplace) == ("alltoall", 16, 16, False)
    ag = import_msccl(REF / "ncv4-ag_hier_4_Simple.xml")
    assert (ag.input_chunks, ag.output_chunks) == (4, 16)
    teccl = import_msccl(REF / "teccl-amd_32-allgather.xml")
    # TE-CCL's <copy> of each input chunk onto itself (in place) is no operation at all
    assert not any(op.kind == "copy" for p in teccl.programs for op in p)
    assert any(op.count == 4 for p in teccl.programs for op in p)  # cnt > 1 is a multi-chunk reference
    tree = import_msccl(REF / "ncv4-ar_tree_12_LL.xml")
    # rrs reduces into a private scratch temporary and sends it: the destination is not written
    assert tree.scratch_chunks > 0


def algo(body: str, coll: str = "allreduce", ngpus: int = 2, chunks: int = 1, inplace: int = 0,
         s_chunks: int = 0) -> str:
    gpus = body
    return (f'<algo name="t" proto="Simple" nchannels="1" nchunksperloop="{chunks}" ngpus="{ngpus}" coll="{coll}" '
            f'inplace="{inplace}" outofplace="{1 - inplace}" minBytes="0" maxBytes="1024">{gpus}</algo>')


def step(s: int, kind: str, src: str = "i", so: int = 0, dst: str = "o", do: int = 0, cnt: int = 1,
         depid: int = -1, deps: int = -1) -> str:
    return (f'<step s="{s}" type="{kind}" srcbuf="{src}" srcoff="{so}" dstbuf="{dst}" dstoff="{do}" cnt="{cnt}" '
            f'depid="{depid}" deps="{deps}" hasdep="0"/>')


def exchange_allreduce() -> str:
    """2-rank allreduce where each thread block sends then receives from a peer doing the same."""
    gpus = ""
    for g in range(2):
        gpus += (f'<gpu id="{g}" i_chunks="1" o_chunks="1" s_chunks="0">'
                 f'<tb id="0" send="{1 - g}" recv="{1 - g}" chan="0">'
                 + step(0, "s") + step(1, "rrc", "i", 0, "o", 0) + "</tb></gpu>")
    return algo(gpus)


def test_buffered_sends_do_not_deadlock() -> None:
    schedule = parse_msccl(exchange_allreduce())
    verify(schedule)
    # the receive does not wait for the send of its own thread block (MSCCL sends are buffered)
    assert all(not op.deps for p in schedule.programs for op in p)


def test_out_of_place_file_writing_its_input_gets_a_scratch_copy() -> None:
    # reduce-scatter whose receive-reduce writes the input buffer, then copies the result out
    gpus = ""
    for g in range(2):
        gpus += (f'<gpu id="{g}" i_chunks="2" o_chunks="1" s_chunks="0">'
                 f'<tb id="0" send="{1 - g}" recv="{1 - g}" chan="0">'
                 + step(0, "s", "i", 1 - g, "i", 1 - g) + step(1, "rrc", "i", g, "i", g) + "</tb>"
                 + '<tb id="1" send="-1" recv="-1" chan="0">' + step(0, "cpy", "i", g, "o", 0, depid=0, deps=1)
                 + "</tb></gpu>")
    schedule = parse_msccl(algo(gpus, coll="reduce_scatter", chunks=2))
    assert not schedule.inplace and schedule.scratch_chunks == 2
    assert not any(op.dst is not None and op.dst.buffer == "i" for p in schedule.programs for op in p)
    verify(schedule)


def test_race_between_thread_blocks_is_reported_in_msccl_terms() -> None:
    gpus = ""
    for g in range(2):
        gpus += (f'<gpu id="{g}" i_chunks="1" o_chunks="1" s_chunks="0">'
                 f'<tb id="0" send="{1 - g}" recv="-1" chan="0">' + step(0, "s", "o", 0) + "</tb>"
                 '<tb id="1" send="-1" recv="-1" chan="0">' + step(0, "cpy", "i", 0, "o", 0) + "</tb>"
                 f'<tb id="2" send="-1" recv="{1 - g}" chan="0">' + step(0, "r", "o", 0, "o", 0) + "</tb></gpu>")
    with pytest.raises(VerificationError, match=r"gpu 0 tb 1 step 0 .*gpu 0 tb 0 step 0"):
        parse_msccl(algo(gpus, coll="allgather", ngpus=2, chunks=2).replace('o_chunks="1"', 'o_chunks="2"'))


@pytest.mark.parametrize(("text", "pattern"), [
    ('<!DOCTYPE x [<!ENTITY a "b">]><algo/>', "DOCTYPE"),
    ("<algo", "invalid XML"),
    ("<system/>", "not <algo>"),
    (algo("", coll="alltoallv"), "unsupported collective 'alltoallv'"),
    (algo("", chunks=3, coll="allgather"), "not a multiple of ngpus"),
    (algo('<gpu id="0" i_chunks="1" o_chunks="1" s_chunks="0"/>'), "gpu 1 is missing"),
    (exchange_allreduce().replace('type="rrc"', 'type="rrx"'), r"gpu 0 tb 0 step 1: unknown step type 'rrx'"),
    (exchange_allreduce().replace('<step s="1"', '<step s="3"', 1), "gpu 0 tb 0 step 1: step s=3 is out of order"),
    (exchange_allreduce().replace('srcoff="0"', 'srcoff="5"', 1), r"gpu 0 tb 0 step 0: chunks 5..5"),
    (exchange_allreduce().replace('send="1"', 'send="-1"', 1), "step type s sends but the thread block"),
    (exchange_allreduce().replace('depid="-1" deps="-1"', 'depid="4" deps="0"', 1), "depid=4 names no other"),
])
def test_malformed_files_give_one_line_errors(text: str, pattern: str) -> None:
    with pytest.raises(ScheduleFormatError, match=pattern) as info:
        parse_msccl(text, "bad.xml")
    assert "\n" not in str(info.value) and str(info.value).startswith("bad.xml")


def test_cyclic_dependencies_are_rejected() -> None:
    gpus = ""
    for g in range(2):
        gpus += (f'<gpu id="{g}" i_chunks="1" o_chunks="1" s_chunks="0">'
                 f'<tb id="0" send="-1" recv="-1" chan="0">' + step(0, "cpy", "i", 0, "o", 0, 1, 1, 0) + "</tb>"
                 '<tb id="1" send="-1" recv="-1" chan="0">' + step(0, "nop", depid=0, deps=0) + "</tb></gpu>")
    with pytest.raises(ScheduleFormatError, match="cyclic"):
        parse_msccl(algo(gpus))


def three_rank_allreduce() -> Schedule:
    """Direct allreduce where one local reduction waits for receives of two thread blocks (needs a nop)."""
    b = ScheduleBuilder("allreduce", 3, 1, 1, scratch_chunks=2)
    for r in range(3):
        b.copy(r, Chunk("i", 0), Chunk("o", 0))
    for r in range(3):
        for p in (q for q in range(3) if q != r):
            slot = [q for q in range(3) if q != p].index(r)
            b.transfer(r, p, Chunk("i", 0), Chunk("s", slot))
    for r in range(3):
        b.reduce(r, Chunk("s", 0), Chunk("s", 1))
        b.reduce(r, Chunk("s", 1), Chunk("o", 0))
    return b.build("direct-test")


def test_export_expresses_several_cross_dependencies_with_nops() -> None:
    schedule = three_rank_allreduce()
    verify(schedule)
    text = export_msccl(schedule, name="x", min_bytes=0, max_bytes=4096)
    root = ET.fromstring(text)
    assert root.get("coll") == "allreduce" and root.get("name") == "x" and root.get("maxBytes") == "4096"
    assert any(st.get("type") == "nop" for st in root.iter("step"))
    for gpu in root.iter("gpu"):
        seen: set[tuple[str | None, str | None, str | None]] = set()
        for tb in gpu.iter("tb"):
            for role in ("send", "recv"):
                if tb.get(role) != "-1":
                    key = (role, tb.get(role), tb.get("chan"))
                    assert key not in seen  # one thread block per connection
                    seen.add(key)
        # every depid/deps names an existing step, and that step is marked hasdep
        tbs = {tb.get("id"): tb for tb in gpu.iter("tb")}
        for st in gpu.iter("step"):
            if st.get("depid") != "-1":
                target = tbs[st.get("depid")].findall("step")[int(st.attrib["deps"])]
                assert target.get("hasdep") == "1"
    check_round_trip(schedule)


def test_export_round_trips_rooted_and_gathers() -> None:
    b = ScheduleBuilder("broadcast", 3, 2, 2, root=1)
    for p in (0, 2):
        for c in range(2):
            b.transfer(1, p, Chunk("i", c), Chunk("o", c), channel=c)
    b.copy(1, Chunk("i", 0, 2), Chunk("o", 0, 2))
    again = check_round_trip(b.build("bcast"))
    assert again.root == 1
    g = ScheduleBuilder("allgather", 2, 1, 2, inplace=True)
    g.transfer(0, 1, Chunk("i", 0), Chunk("o", 0))
    g.transfer(1, 0, Chunk("i", 0), Chunk("o", 1))
    check_round_trip(g.build("ag"))


def test_export_rejects_unknown_protocol() -> None:
    with pytest.raises(ScheduleFormatError, match="protocol"):
        export_msccl(three_rank_allreduce(), proto="LL64")
