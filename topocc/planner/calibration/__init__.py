"""Calibration: what ``topocc calibrate`` measures and how it turns measurements into figures.

``classes`` (which rank pair stands for which link class), ``probes`` (the tests the runtime's probe runs),
``fit`` (measurements to a :class:`~topocc.planner.topology.calibration.Calibration`).  The block itself,
and how it changes a topology, is :mod:`topocc.planner.topology.calibration`'s; running the probe on a
cluster is :mod:`topocc.planner.testbed.calibrate`'s.
"""
