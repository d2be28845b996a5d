"""A calibration warns of a class measured far from its file's figure, or fitted poorly; not otherwise."""

from __future__ import annotations

from types import MappingProxyType

from topocc.planner.calibration.checks import surprises
from topocc.planner.topology.calibration import Calibration, ClassFigures, HostCosts


def calibration(figures: dict[str, ClassFigures], residuals: dict[str, float]) -> Calibration:
    return Calibration("now", "by hand", "MPI (test)", HostCosts(), MappingProxyType(figures),
                       MappingProxyType(residuals))


def test_near_the_file_and_well_fitted_is_quiet() -> None:
    cal = calibration({"host-switch": ClassFigures(10e9, 5e-6, file=12.5e9),
                       "switch-1": ClassFigures(13.7e9, 5e-6, file=12.5e9)}, {"host-switch": 0.2, "switch-1": 0.05})
    assert surprises(cal) == []


def test_far_from_the_file_or_a_poor_fit_is_one_line_each() -> None:
    cal = calibration({"host-switch": ClassFigures(5e9, 5e-6, file=12.5e9),
                       "host:shm": ClassFigures(30e9, 1e-6, file=10e9),
                       "switch-1": ClassFigures(6e9, 5e-6)},  # no file figure to compare with
                      {"host-switch": 0.05, "host:shm": 0.02, "switch-1": 0.35})
    lines = surprises(cal)
    assert lines == [
        "calibration: link class host-switch measured 5 GB/s for one flow under load, 0.40x the file's "
        "12.5 GB/s (outside 0.5x-1.1x): check the file's figure and its unit, and the ranks' placement",
        "calibration: link class host:shm measured 30 GB/s for one flow under load, 3.00x the file's 10 GB/s "
        "(outside 0.5x-1.1x): check the file's figure and its unit, and the ranks' placement",
        "calibration: link class switch-1's figures miss its own tests by up to 35% (over 20%): a noisy run, or "
        "links of unlike speeds in one class; run it again, or give the unlike links their own kind",
    ]
