"""The cluster as the user wrote it: devices, links and ranks, as frozen data.

``model`` (:class:`~topocc.planner.topology.model.Topology` and its parts), ``parse`` (YAML in, every
error naming the file, the line and the fix), ``templates`` (``cluster:`` expanded into devices and
links), ``_fields`` (the checks every section shares), ``catalogue`` (the shipped topologies by name, and
the topology a schedule was compiled for).  Imports nothing of the planner but errors, units and the safe
YAML loader.
"""
