"""The proof of a compiled schedule, run in a forked process beside the simulations where it is large.

The verifier (:func:`~topocc.planner.analysis.verify.verify`) costs about as much as a simulation on a
large schedule; ``auto`` starts the proof of its likeliest winner in a child while it simulates the others,
on the machine's other core, and waits for it only if that candidate wins.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection

from topocc.planner.analysis.verify import VerifyReport, verify
from topocc.planner.analysis.verify_symmetric import verify_by_class
from topocc.planner.errors import VerificationError
from topocc.runtime.schedule import Schedule

__all__ = ["PARALLEL_VERIFY_OPS", "Proof", "forks"]


#: Schedules with at least this many operations are verified in a forked process while the planner
#: simulates, on the machine's other core: from about this size a proof costs more than forking does.
PARALLEL_VERIFY_OPS = 20_000


def forks(schedule: Schedule) -> bool:
    """Whether :class:`Proof` verifies ``schedule`` in a forked child (a large one, where the platform forks)."""
    return schedule.op_count >= PARALLEL_VERIFY_OPS and "fork" in multiprocessing.get_all_start_methods()


class Proof:
    """``verify(schedule)``, started in a forked child for large schedules where the platform forks.

    The child inherits the schedule (nothing is pickled but the small report or
    the error's text); :meth:`result` waits for it, and verifies in this process
    when there is no child or it died.  ``built`` is the schedule as its algorithm built it, where
    ``schedule`` is its symmetric form: proved rank by rank where the form cannot be proved by class, its
    programs at hand where the form's would be built anew.
    """

    def __init__(self, schedule: Schedule, built: Schedule | None = None) -> None:
        self.schedule = schedule
        self.built = built
        self._child: multiprocessing.process.BaseProcess | None = None
        if forks(schedule):
            context = multiprocessing.get_context("fork")
            self._conn, sender = context.Pipe(duplex=False)
            self._child = context.Process(target=_prove_to, args=(sender, self), daemon=True)
            self._child.start()
            sender.close()

    def result(self) -> VerifyReport:
        if self._child is None:
            return self.prove()
        try:
            outcome = self._conn.recv()
        except EOFError:  # the child died (killed, out of memory): prove it here
            outcome = (True, self.prove())
        finally:
            self.cancel()
        if outcome[0]:
            return outcome[1]
        _, message, where, fix = outcome
        raise VerificationError(message, where=where, fix=fix)

    def cancel(self) -> None:
        if self._child is not None:
            if self._child.is_alive():
                self._child.terminate()
            self._child.join()
            self._conn.close()
            self._child = None


    def prove(self) -> VerifyReport:
        """The proof, in this process: by class where the symmetric form allows, else rank by rank."""
        found = verify_by_class(self.schedule)
        return found if found is not None else verify(self.schedule if self.built is None else self.built)


def _prove_to(conn: multiprocessing.connection.Connection, proof: Proof) -> None:
    try:
        conn.send((True, proof.prove()))
    except VerificationError as exc:
        conn.send((False, exc.message, exc.where, exc.fix))
    finally:
        conn.close()
