"""How messages cross a topology: routes, paths a sender may choose, and relays through GPUs.

``network`` (:class:`~topocc.planner.routing.network.Network`: a topology's routes under its routing
mode, computed once and kept while the network lives; the tables layers above keep per network),
``route_trees`` (the shortest-path searches routes are read from), ``paths`` (source routing and ECMP
channel spreading for a built schedule), ``relay`` (chains of GPUs for pairs without a GPU-free route).
Imports the topology package only.
"""
