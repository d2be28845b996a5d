"""The distribution ships one import name, ``topocc``, whose folders are its import paths.

``topocc/planner/`` and ``topocc/runtime/`` are the user's two halves; setuptools finds every package by
discovery, so an installed topocc puts nothing named ``planner`` or ``runtime`` on anyone's path, and a
checkout holds nothing else importable under the name ``topocc``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 has no tomllib: tomli is the same parser
    tomllib = pytest.importorskip("tomli", reason="tomli is not installed (Python 3.10 has no tomllib)")

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def test_every_folder_of_the_package_is_found_by_discovery_and_nothing_else() -> None:
    from setuptools import find_packages  # type: ignore[import-untyped]  # this setuptools ships no types

    found = set(find_packages(str(REPO), **SETUPTOOLS["packages"]["find"]))
    on_disk = {".".join(init.parent.relative_to(REPO).parts) for init in (REPO / "topocc").rglob("__init__.py")}
    assert found == on_disk
    assert "topocc.planner.compiler" in found and "topocc.runtime.distributed" in found


def test_a_module_is_where_its_name_says() -> None:
    code = ("import topocc.planner.compiler, topocc.runtime.schedule, topocc; "
            "print(topocc.planner.compiler.__file__); print(topocc.runtime.schedule.__file__); "
            "print(list(topocc.__path__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    compiler, schedule, path = out.stdout.splitlines()
    assert Path(compiler) == REPO / "topocc" / "planner" / "compiler" / "__init__.py"
    assert Path(schedule) == REPO / "topocc" / "runtime" / "schedule.py"
    assert path == repr([str(REPO / "topocc")])


@pytest.mark.parametrize("name", ["topocc.tests", "topocc.benchmarks", "topocc.examples", "topocc.topocc"])
def test_nothing_outside_the_package_imports_under_its_name(name: str) -> None:
    out = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=60,
                         cwd=REPO)
    assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr


def test_the_console_script_and_the_worker_live_in_topocc() -> None:
    assert PYPROJECT["project"]["scripts"] == {"topocc": "topocc.planner.cli:main"}


def test_importing_topocc_loads_nothing_until_a_name_is_used() -> None:
    code = ("import sys, topocc; before = {m for m in sys.modules if m.startswith('topocc.')}; "
            "topocc.load_topology; after = {m for m in sys.modules if m.startswith('topocc.')}; "
            "print(sorted(before), 'topocc.planner.topology.parse' in after, len(topocc.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("] ")[0] == "[" and out.stdout.split("] ")[1].split()[0] == "True"


def test_every_public_name_loads() -> None:
    import topocc

    for name in topocc.__all__:
        assert getattr(topocc, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        topocc.nosuch  # noqa: B018


@pytest.mark.slow
def test_the_wheel_holds_topocc_only_and_works_installed(tmp_path: Path) -> None:
    """Built without network (the build runs in this environment), installed into a folder of its own, and
    imported from outside the repository: ``topocc`` and its parts import, ``planner`` and ``runtime`` do not."""
    wheels = tmp_path / "wheels"
    source = tmp_path / "source"  # a copy: building writes build/ and *.egg-info beside the sources
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "out", "*.egg-info",
                                                                  "__pycache__", ".*_cache", ".hypothesis"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "--no-index", "-q", "-w", str(wheels)], capture_output=True, text=True, timeout=300)
    if built.returncode != 0 and "No module named pip" in built.stderr:
        pytest.skip("pip is not installed in this environment")
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("topocc-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"topocc", wheel.name.split("-py3")[0] + ".data",
                                                 wheel.name.split("-py3")[0] + ".dist-info"}
    assert "topocc/planner/report/templates/report.html.j2" in names and "topocc/runtime/py.typed" in names
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                                str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    # this interpreter's own editable install of the checkout is switched off, so only the wheel is seen
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in str(f)]; "
            "sys.path[:] = [p for p in sys.path if 'editable' not in p]; sys.path.insert(0, sys.argv[1]); "
            "import topocc, topocc.runtime, topocc.planner, topocc.planner.compiler.compile; "
            "print(topocc.__file__.startswith(sys.argv[1]), topocc.planner.__file__.startswith(sys.argv[1]))\n"
            "for name in ('planner', 'runtime'):\n"
            "    try:\n"
            "        __import__(name)\n"
            "    except ModuleNotFoundError:\n"
            "        print('no', name)\n")
    out = subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True", "no", "planner", "no", "runtime"]
