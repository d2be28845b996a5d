"""What a calibration should say out loud: a class measured far from its file's figure, or fitted poorly.

Either may be the truth (a congested fabric, a noisy run), but each is also what a wrong unit in the file,
a wrong rank placement or a link class that mixes unlike links looks like, so ``topocc calibrate`` warns of
each in one line (:class:`~topocc.planner.errors.TopoccWarning`) and writes the block all the same.
"""

from __future__ import annotations

from topocc.planner.topology.calibration import Calibration
from topocc.planner.units import format_bandwidth

__all__ = ["HIGH", "LOW", "RESIDUAL", "surprises"]

#: A class's measured bandwidth (one flow under load) outside these multiples of its file's figure is a
#: surprise: below half, the fabric or the file is off; above 1.1x, the file undersells it or the ranks
#: did not cross the links the class names (two "hosts" on one machine).
LOW, HIGH = 0.5, 1.1
#: A class whose figures miss one of its own tests by more than this explains its measurements poorly.
RESIDUAL = 0.2


def surprises(cal: Calibration) -> list[str]:
    """One line per measured class outside :data:`LOW`..:data:`HIGH` of its file's figure, and per class with a
    residual over :data:`RESIDUAL`."""
    lines = []
    for name, f in cal.links.items():
        if f.file and not LOW <= f.bandwidth / f.file <= HIGH:
            lines.append(f"calibration: link class {name} measured {format_bandwidth(f.bandwidth)} for one flow "
                         f"under load, {f.bandwidth / f.file:.2f}x the file's {format_bandwidth(f.file)} (outside "
                         f"{LOW:g}x-{HIGH:g}x): check the file's figure and its unit, and the ranks' placement")
    for name, residual in cal.residuals.items():
        if residual > RESIDUAL:
            lines.append(f"calibration: link class {name}'s figures miss its own tests by up to {residual:.0%} "
                         f"(over {RESIDUAL:.0%}): a noisy run, or links of unlike speeds in one class; run it "
                         "again, or give the unlike links their own kind")
    return lines
