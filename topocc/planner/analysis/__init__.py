"""What is true of a schedule: what it must compute, whether it does, how long it takes, how fast it could be.

``collectives`` (each collective's pre- and postconditions as data), ``verify`` (the proof by symbolic
execution), ``verify_lowered`` (the proof that NCCL runs a lowering to the end and computes the same),
``simulate`` with ``fairshare`` (discrete events, max-min fair link sharing; a calibrated topology's
costs), ``lowered`` (the program NCCL runs for a lowering, for the simulator), ``bounds`` (cut, partition
and latency bounds).  Imports topology and routing; never the compiler.
"""
