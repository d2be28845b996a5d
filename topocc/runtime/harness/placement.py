"""Rank placement on a real cluster: every rank on the machine of the host the topology puts it on.

A topology numbers its ranks host by host (GPU ``i`` of host ``h`` is rank ``h*G + i``), and ``mpiexec``
places ranks by its host file, by default filling one machine's slots before the next.  When the two
disagree, a calibration measures other links than it names (two "hosts" on one machine talk through its
memory, not the network) and writes wrong figures without a word, so the probe checks the placement
first, by the machines' names (``MPI.Get_processor_name``):

* the ranks of one host must share one machine: a host split over machines is wrong;
* ranks of different hosts must not share a machine, except when every rank runs on one machine: a
  test run on a workstation (everything local, which the calibration then measures as such) is fine,
  but some hosts doubled up on a machine while others have their own is a host file with too many slots.
"""

from __future__ import annotations

from collections.abc import Sequence

from topocc.runtime.bundle import rank_ranges

__all__ = ["placement_error"]


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {rank_ranges(ranks)}"


def placement_error(hosts: Sequence[str], machines: Sequence[str]) -> str | None:
    """Why ranks placed on ``machines`` (per rank, its machine's name) do not match ``hosts`` (per rank, the
    topology's host for it), as one line with the fix; None where they match (or all share one machine)."""
    by_host: dict[str, dict[str, list[int]]] = {}  # host -> machine -> ranks
    for rank, (host, machine) in enumerate(zip(hosts, machines)):
        by_host.setdefault(host, {}).setdefault(machine, []).append(rank)
    slots = max(sum(len(r) for r in on.values()) for on in by_host.values()) if by_host else 0
    fix = (f"give mpiexec one machine per host, in host order, with {slots} slot{'s' if slots > 1 else ''} each "
           f"(MPICH: a host file of 'machine:{slots}' lines, or -ppn {slots})")
    for host, on in by_host.items():
        if len(on) > 1:
            where = " and ".join(f"{m} ({_ranks(r)})" for m, r in on.items())
            ranks = sorted(r for rs in on.values() for r in rs)
            return f"rank placement: {_ranks(ranks)} belong to host {host} but run on {where} (fix: {fix})"
    if len(set(machines)) <= 1:
        return None
    owner: dict[str, str] = {}
    for host, on in by_host.items():
        (machine,) = on
        if machine in owner:
            return (f"rank placement: hosts {owner[machine]} and {host} of the topology both run on {machine}, "
                    f"while other hosts have machines of their own (fix: {fix})")
        owner[machine] = host
    return None
