"""The planner: topology YAML in, a verified and timed schedule out (offline; never imported by the runtime).

Data flows one way, and each folder imports only the folders before it (and :mod:`topocc.runtime`'s
schedule format, the contract both sides share):

* :mod:`~topocc.planner.topology`: the cluster as written: devices, links, ranks (frozen data), parsed
  from YAML, expanded from ``cluster:`` templates, and the shipped catalogue;
* :mod:`~topocc.planner.routing`: the :class:`~topocc.planner.routing.network.Network`, a topology's
  routes built once and passed explicitly; source-routed paths and GPU relays;
* :mod:`~topocc.planner.analysis`: what a schedule must compute (collectives as data), the verifier and
  the lowering's proof, the simulator and its fair sharing, lower bounds;
* :mod:`~topocc.planner.compiler`: the algorithms and the front door that builds, races, proves and
  times them (with :mod:`~topocc.planner.solvers` for the LP-based ones);
* :mod:`~topocc.planner.formats`, :mod:`~topocc.planner.report`: other systems' formats, and the HTML,
  Graphviz and text views of a plan;
* :mod:`~topocc.planner.gradblocks`: Prophet-style planning of which gradients travel together;
* :mod:`~topocc.planner.calibration`: which rank pairs measure which link class, and the fit of their
  measurements into a topology's ``calibration:`` block;
* :mod:`~topocc.planner.testbed`: an emulated cluster on one machine (namespaces, shaped links), the
  benchmark that runs plans on it, and ``topocc calibrate``; the compiler never imports it;
* :mod:`~topocc.planner.cli`: the ``topocc`` command: parses arguments, delegates, prints.

``errors``, ``units``, ``_yaml`` and ``collector`` are shared by all of them.
"""
