"""Bundled messages: one per group, peer and direction, of the same length at both ends, staged once."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from tests.runtime.test_mpi import S
from topocc.runtime.arrays import NUMPY_OPS
from topocc.runtime.executor import SEND, Program, message_tag_space
from topocc.runtime.group_executor import GroupProgram
from topocc.runtime.lowering import lower


def grouped(schedule: Any, block: int, cap: int) -> list[GroupProgram]:
    lowering = lower(schedule, cap)
    return [GroupProgram(Program(schedule, r, np.dtype(np.float32), block, tag_ub=1 << 30,
                                 channels=message_tag_space(schedule), ops=NUMPY_OPS), lowering.ranks[r])
            for r in range(schedule.ranks)]


def lengths(program: GroupProgram) -> dict[tuple[int, bool], list[int]]:
    """Per (peer, sends?), the elements of each bundle in posting order."""
    p = program.program
    out: dict[tuple[int, bool], list[int]] = defaultdict(list)
    for group in program.bundles.groups:
        for ks in group:
            peer = p.peers[ks[0]]
            assert peer is not None  # a bundle holds messages, each to or from a peer
            out[(peer, p.kinds[ks[0]] == SEND)].append(sum(p.msg_len[k] for k in ks))
    return out


CASES = {**S.every_collective(3), **{f"planner-{k}": v for k, v in S.planner_schedules(
    ("ring", "halving-doubling", "direct", "hierarchical", "multitree", "treepack"), 1 << 20).items()}}


@pytest.mark.parametrize("cap", [1, 3, 64])
@pytest.mark.parametrize("name", sorted(CASES))
def test_both_ends_of_every_bundle_agree(name: str, cap: int) -> None:
    """What a rank sends a peer, bundle by bundle, is what the peer receives from it, bundle by bundle."""
    schedule = CASES[name]
    programs = grouped(schedule, 1001, cap)
    seen = [lengths(p) for p in programs]
    for r, mine in enumerate(seen):
        for (peer, sends), sizes in mine.items():
            assert seen[peer][(r, not sends)] == sizes, (name, r, peer, sends)
        for group in programs[r].bundles.groups:
            keys = [(programs[r].program.peers[ks[0]], programs[r].program.kinds[ks[0]] == SEND) for ks in group]
            assert len(keys) == len(set(keys))  # one bundle per peer and direction in a group


def test_a_pipelined_ring_sends_one_message_per_step_from_the_buffer_itself() -> None:
    """16 pieces per block, whole steps per group: a step's pieces lie end to end, so nothing is staged."""
    p, q = 4, 16
    schedule = S.ring_allreduce(p, q)
    programs = grouped(schedule, 16 * 1000, 1 << 30)
    for gp in programs:
        groups = [g for g in gp.bundles.groups if g]
        assert len(groups) == 2 * (p - 1)
        assert all(len(g) == 2 and all(len(ks) == q for ks in g) for g in groups)
        sends = [ks[0] for g in groups for ks in g if gp.program.kinds[ks[0]] == SEND]
        assert all(k in gp.bundles.spans for k in sends)  # sent from the buffer, no packing


def test_received_operands_share_one_staging_buffer_per_bundle() -> None:
    """The pieces a reduce-scatter step receives to reduce land in one buffer, a slice per piece."""
    schedule = S.ring_allreduce(3, 8)
    gp = grouped(schedule, 8 * 100, 1 << 30)[0]
    assert gp.bundles.shared
    for first, buf in gp.bundles.shared.items():
        ks = next(ks for g in gp.bundles.groups for ks in g if ks[0] == first)
        views = [gp.program.staging[k] for k in ks]
        assert all(np.shares_memory(v, buf) for v in views)
        assert sum(v.size for v in views) == buf.size
