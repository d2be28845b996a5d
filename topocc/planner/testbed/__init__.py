"""An emulated cluster on one Linux machine, and the benchmark that runs plans on it.

``emulation`` (a network namespace per host, veth links shaped by ``tc``), ``bench`` (a plan beside MPI's
and gloo's own collectives, measured against the simulator's prediction), ``calibrate`` (``topocc
calibrate``: the probe run on a cluster, fitted, written as a calibrated topology), ``torchbench``
(``topocc torchbench``'s plans: a bundle given, or compiled for a topology).  Uses the compiler and the
runtime's launcher; nothing in the compiler imports it.
"""
