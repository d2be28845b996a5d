"""Other systems' formats: MSCCL XML schedules, NCCL topology XML, ``nvidia-smi topo -m``.

Importers of topologies return YAML text in the explicit ``devices:``/``links:``
form (``convert_*`` also return the notes: defaults used, what the source
lacked); :func:`combine_hosts` joins copies of one host into a cluster.
"""

from topocc.planner.formats._emit import ImportedTopology as ImportedTopology
from topocc.planner.formats.combine import combine_hosts as combine_hosts
from topocc.planner.formats.msccl_xml import export_msccl as export_msccl
from topocc.planner.formats.msccl_xml import import_msccl as import_msccl
from topocc.planner.formats.msccl_xml import parse_msccl as parse_msccl
from topocc.planner.formats.nccl_topo import convert_nccl_topo as convert_nccl_topo
from topocc.planner.formats.nccl_topo import import_nccl_topo as import_nccl_topo
from topocc.planner.formats.nvidia_smi import convert_nvidia_smi as convert_nvidia_smi
from topocc.planner.formats.nvidia_smi import import_nvidia_smi as import_nvidia_smi

__all__ = [
    "ImportedTopology",
    "combine_hosts",
    "convert_nccl_topo",
    "convert_nvidia_smi",
    "export_msccl",
    "import_msccl",
    "import_nccl_topo",
    "import_nvidia_smi",
    "parse_msccl",
]
