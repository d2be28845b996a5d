"""The process group's counters: planned and native calls, and of the planned calls whose plan names encodings,
how many ran encoded and how many exact (and the first reason), in the table only where some plan encodes."""

from __future__ import annotations

from topocc.runtime.distributed.counters import TRIALS_ONLY, Counters
from topocc.runtime.encoding import why_exact


def test_encoded_and_exact_calls_are_counted_with_the_reason() -> None:
    stats = Counters((0, 1))
    stats.count("allreduce", 1 << 20, None)
    stats.count("allgather", 4096, None)
    plain = str(stats)
    assert "encoded" not in plain  # no plan encodes: the table as it always was
    stats.encoding("allreduce", None)
    stats.encoding("allreduce", why_exact(["topk:0.01"], "int32", 4))
    stats.encoding("allreduce", why_exact(["topk:0.01"], "float32", 4, "max"))
    tally = stats.by_collective["allreduce"]
    assert (tally.encoded, tally.exact) == (1, 2)
    assert tally.why_exact == "int32 data (encodings carry float data they make smaller)"  # the first reason
    assert stats.as_dict()["allreduce"]["why_exact"] == tally.why_exact
    table = str(stats).splitlines()
    assert table[1].split() == ["collective", "planned", "MiB", "native", "MiB", "why", "native", "encoded", "exact",
                                "why", "exact"]
    assert table[2].split() == ["allgather", "1", "0.0", "0", "0.0", "-", "0", "0", "-"]
    assert table[3].split()[:9] == ["allreduce", "1", "1.0", "0", "0.0", "-", "1", "2", "int32"]


def test_why_a_call_runs_exact() -> None:
    assert why_exact(["bf16"], "float32", 4) is None and why_exact(["bf16"], "float32", 4, "avg") is None
    assert why_exact(["bf16"], "float32", 4, "min") == "op min (encodings carry sums and moved data)"
    assert why_exact(["bf16"], "float16", 2) == "float16 data (encodings carry float data they make smaller)"
    assert why_exact(["bf16", "int8"], "float16", 2) is None  # int8 makes float16 smaller


def test_native_calls_that_were_all_trials_say_so() -> None:
    """A trial's reason is not kept (the measured choice replaces it); a collective whose native calls were all
    trials says that in the table, not a bare dash, and its reason stays empty for the measured choice's."""
    stats = Counters((0, 1))
    stats.count("allgather", 4096, "a trial against the plan", provisional=True)
    stats.count("broadcast", 4096, "model predicts no gain", provisional=False)
    assert stats.as_dict()["allgather"]["why"] == ""
    rows = {line.split()[0]: line for line in str(stats).splitlines()[2:]}
    assert rows["allgather"].endswith(TRIALS_ONLY)
    assert rows["broadcast"].endswith("model predicts no gain")
