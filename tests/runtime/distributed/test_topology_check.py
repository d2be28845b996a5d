"""``TOPOCC_TOPOLOGY`` names the cluster by its name, fingerprint or file (with the ranks of a group), and the
refusal's fix, followed, gives a bundle the check accepts."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from topocc.planner.cli import main
from topocc.runtime.bundle import load_bundle
from topocc.runtime.distributed.topology_check import check_topology, compiled_from
from topocc.runtime.errors import CommunicatorError

CLUSTER = """\
name: {name}
cluster:
  hosts: 2
  host:
    gpus: 2
    fabric: fully-connected
    gpu_link: {{bandwidth: 10 GB/s, latency: 1 us, kind: shm}}
    nics: 1
    nic: {{bandwidth: 100 Gbit/s, latency: 5 us}}
  network: {{type: single-switch}}
"""


def bundle(topology: str, folder: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["bundle", topology, "-o", str(folder), "-c", "allreduce", "-s", "4KiB"]) == 0, capsys.readouterr()
    capsys.readouterr()
    return folder


def test_the_name_fingerprint_file_and_file_with_ranks_are_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cluster.yaml").write_text(CLUSTER.format(name="racks"))
    whole = load_bundle(bundle("cluster.yaml", tmp_path / "whole", capsys))
    assert compiled_from(whole) == "cluster.yaml"
    for expected in ("racks", whole.fingerprint, "cluster.yaml", str(tmp_path / "cluster.yaml"), "./cluster.yaml"):
        check_topology(whole, str(expected))
    part = load_bundle(bundle("cluster.yaml[0,2]", tmp_path / "part", capsys))
    assert part.world == 2 and compiled_from(part) == "cluster.yaml[0,2]"
    for expected in ("racks[0,2]", "racks", "cluster.yaml[0,2]", f"{tmp_path}/cluster.yaml[0, 2]", "cluster.yaml"):
        check_topology(part, expected)
    with pytest.raises(CommunicatorError, match=r"compiled for racks\[0,2\] .*names cluster.yaml\[0-1\]"):
        check_topology(part, "cluster.yaml[0-1]")  # other ranks of the same file
    monkeypatch.chdir(tmp_path / "part")  # the bundle's folder beside the file: the recorded path still resolves
    check_topology(part, str(tmp_path / "cluster.yaml[0,2]"))


def test_another_file_is_refused_and_the_fix_works_when_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cluster.yaml").write_text(CLUSTER.format(name="racks"))
    (tmp_path / "other.yaml").write_text(CLUSTER.format(name="racks").replace("100 Gbit/s", "25 Gbit/s"))
    compiled = load_bundle(bundle("cluster.yaml", tmp_path / "b", capsys))
    with pytest.raises(CommunicatorError) as refused:
        check_topology(compiled, "other.yaml[0-3]")
    line = str(refused.value)
    assert "\n" not in line
    assert "compiled for racks (from cluster.yaml) but TOPOCC_TOPOLOGY names other.yaml[0-3]" in line
    assert "set TOPOCC_TOPOLOGY=racks or cluster.yaml" in line
    command = re.search(r"topocc bundle (.*?) -o FOLDER", line)
    assert command is not None
    fixed = load_bundle(bundle(shlex.split(command[1])[0], tmp_path / "fixed", capsys))
    check_topology(fixed, "other.yaml[0-3]")
    with pytest.raises(CommunicatorError, match=r"names cluster\.yaml"):
        check_topology(fixed, "cluster.yaml")  # same name, another file
