"""Rank placement on a real cluster: a host's ranks on one machine, hosts on machines of their own, or all on one."""

from __future__ import annotations

import pytest

from topocc.runtime.harness.placement import placement_error

HOSTS = ["h0", "h0", "h1", "h1", "h2", "h2"]
FIX = "(fix: give mpiexec one machine per host, in host order, with 2 slots each (MPICH: a host file of " \
      "'machine:2' lines, or -ppn 2))"


@pytest.mark.parametrize("machines", [
    ["node-a", "node-a", "node-b", "node-b", "node-c", "node-c"],  # as the topology has it
    ["node-c", "node-c", "node-a", "node-a", "node-b", "node-b"],  # machine names need not sort with the hosts
    ["laptop"] * 6,  # one machine: a test run, everything local
])
def test_a_placement_that_keeps_hosts_apart_or_all_together_is_accepted(machines: list[str]) -> None:
    assert placement_error(HOSTS, machines) is None


def test_a_host_split_over_machines_is_refused_in_one_line() -> None:
    """mpiexec's round robin (-ppn 1) puts rank r on machine r % 3: every host split."""
    wrong = placement_error(HOSTS, ["node-a", "node-b", "node-c", "node-a", "node-b", "node-c"])
    assert wrong == f"rank placement: ranks 0-1 belong to host h0 but run on node-a (rank 0) and node-b (rank 1) {FIX}"


def test_hosts_doubled_up_on_a_machine_while_others_have_their_own_are_refused() -> None:
    """A host file with 4 slots on the first machine: hosts h0 and h1 share it, h2 has node-b."""
    wrong = placement_error(HOSTS, ["node-a"] * 4 + ["node-b"] * 2)
    assert wrong == ("rank placement: hosts h0 and h1 of the topology both run on node-a, while other hosts have "
                     f"machines of their own {FIX}")
    assert "\n" not in wrong
