"""nccl-tests through ``torch.distributed``: ``topocc torchbench`` times a backend (``topocc``, gloo, NCCL) as a job
sees it, under ``torchrun``.

:mod:`~.sweep` holds what is measured (sizes, collective, datatype: the sweep a rank reads), :mod:`~.torchrun`
starts ``torchrun`` and reads the rows back (no torch in the launching process), and :mod:`~.timer` is the
program every rank runs (torch, and the ``topocc`` backend through torch's autoloading; never the planner).
"""
