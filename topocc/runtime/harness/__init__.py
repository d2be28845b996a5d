"""The harness: what runs plans outside a training job, for ``topocc run``, ``bench``, ``calibrate`` and
``torchbench``.

A training job loads the replay (:mod:`topocc.runtime.communicator`, the executor, the transports, the
``topocc`` backend) and nothing here.  These modules start ranks and time them: :mod:`~.launch` starts
``mpiexec`` over :mod:`~.worker` (each rank's program for run and bench) and reads their rows back,
:mod:`~.probe` is what ``topocc calibrate`` measures on each rank pair, :mod:`~.baselines` the native
collectives (MPI's, gloo's, NCCL's) a bench compares with, :mod:`~.placement` which rank runs on which host,
and :mod:`~.torchbench` nccl-tests' sweep through ``torch.distributed`` under ``torchrun``.
"""
