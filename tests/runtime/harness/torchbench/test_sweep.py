"""nccl-tests' sweep options as ``topocc torchbench`` reads them: sizes, counts, names in every spelling, and
one-line refusals of bad input."""

from __future__ import annotations

import pytest

from topocc.runtime.errors import UsageError
from topocc.runtime.harness.torchbench.sweep import Sweep, make_sweep, parse_backends, parse_datatype, sweep_sizes


def test_sizes_grow_by_the_factor_and_end_at_the_maximum_only_if_it_is_hit() -> None:
    assert sweep_sizes(1024, 65536, 4) == [1024, 4096, 16384, 65536]
    assert sweep_sizes(1024, 60000, 4) == [1024, 4096, 16384]
    assert sweep_sizes(8, 8, 2) == [8]


@pytest.mark.parametrize(("collective", "counts", "sizes"), [
    ("allreduce", (256, 1024), (1024, 4096)),
    ("broadcast", (256, 1024), (1024, 4096)),
    ("all_gather", (128, 512), (1024, 4096)),  # count per rank, size of the whole (larger) buffer
    ("reduce-scatter", (128, 512), (1024, 4096)),
    ("AllToAll", (128, 512), (1024, 4096)),
])
def test_counts_and_sizes_are_nccl_tests(collective: str, counts: tuple[int, ...], sizes: tuple[int, ...]) -> None:
    sweep = make_sweep(collective, 1024, 4096, 4, ranks=2)
    assert (sweep.counts, sweep.sizes) == (counts, sizes)


def test_sizes_round_down_to_whole_elements_per_rank() -> None:
    sweep = make_sweep("allgather", 30, 120, 2, ranks=3, datatype="double")
    # 30 bytes: one double per rank (24 bytes); 60: two; 120: five
    assert sweep.counts == (1, 2, 5) and sweep.sizes == (24, 48, 120)
    assert make_sweep("allreduce", 5, 10, 2, ranks=2, datatype="int32").sizes == (4, 8)


def test_names_in_nccl_tests_and_torch_spellings() -> None:
    assert parse_datatype("float").torch == "float32" and parse_datatype("float32").nccl == "float"
    assert parse_datatype("half").torch == "float16" and parse_datatype("BFloat16").itemsize == 2
    assert parse_backends("topocc, gloo,topocc") == ("topocc", "gloo")
    sweep = make_sweep("all_reduce", 1024, 1024, 2, ranks=4, datatype="bfloat16", op="max", root=3)
    assert (sweep.collective, sweep.dtype, sweep.redop, sweep.shown_root) == ("allreduce", "bfloat16", "max", -1)
    rooted = make_sweep("broadcast", 1024, 1024, 2, ranks=4, root=3)
    assert (rooted.redop, rooted.shown_root) == ("none", 3)
    assert Sweep.from_json(rooted.to_json()) == rooted


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"collective": "allreduse"}, r"^-c/--collective 'allreduse' is not a collective \(did you mean allreduce\?\)"),
    ({"minbytes": 65536, "maxbytes": 1024}, r"^-b/--minbytes 65536 is larger than -e/--maxbytes 1024 \(fix: pass -b"),
    ({"minbytes": 0}, r"^-b/--minbytes 0 is not a size"),
    ({"factor": 1}, r"^-f/--stepfactor 1 does not grow the size"),
    ({"datatype": "floot"}, r"^-d/--datatype 'floot' is not a datatype \(did you mean float\?\) \(fix: pass one of"),
    ({"backends": "topocc,glo"}, r"^--backend 'glo' is not a backend \(did you mean gloo\?\)"),
    ({"backends": " , "}, r"^--backend names no backend"),
    ({"op": "avg"}, r"^-o/--op 'avg' is not a reduction"),
    ({"collective": "broadcast", "root": 2}, r"^-r/--root 2 is not one of the 2 ranks \(fix: pass a root from 0 "
                                             r"to 1\)"),
    ({"collective": "alltoall", "minbytes": 4}, r"^-b/--minbytes 4 holds no float element for each of 2 ranks "
                                                r"\(fix: pass -b 8 or more\)$"),
    ({"ranks": 1}, r"^--ranks 1: a collective on one rank moves no data"),
    ({"iters": 0}, r"at least one timed call is needed"),
])
def test_bad_input_is_refused_in_one_line(kwargs: dict[str, object], message: str) -> None:
    args = {"collective": "allreduce", "minbytes": 1024, "maxbytes": 4096, "factor": 2} | kwargs
    rest = {k: v for k, v in args.items() if k not in ("collective", "minbytes", "maxbytes", "factor")}
    with pytest.raises(UsageError, match=message) as caught:
        make_sweep(args["collective"], args["minbytes"], args["maxbytes"], args["factor"],  # type: ignore[arg-type]
                   **{"ranks": 2} | rest)  # type: ignore[arg-type]
    assert "\n" not in caught.value.one_line()
