"""The README is executable documentation: its commands run as written and print what it shows.

* The set-up's compile, verify and simulate (everything after the install) exit 0.
* Every ```` ```console ```` block runs in a temporary folder, in README order, with ``.venv/bin/`` read as the
  folder of this interpreter: a line ``$ CMD`` is a command, the lines after it are output it must print
  (blank lines ignored, runs of spaces and of dashes compared as one, numbers within :data:`REL_TOL`).
  A line ``...`` stands for any number of lines, ``...`` inside a line for any text; a command shown with
  no output is only checked to exit 0.
* The Python block of "At training time" is saved as the script its console block starts under ``mpiexec``,
  beside the plan the worked example wrote; the one of "With torchrun" as the script its torchrun command
  starts, beside the bundle its first command compiled.

The figures are the README's own: when an algorithm changes what a command prints, this test fails until
the README quotes the new output.
"""

from __future__ import annotations

import functools
import math
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, run_bounded
from topocc.planner.cli import cli
from topocc.planner.testbed.emulation import emulation_available
from topocc.planner.topology.parse import load_topology
from topocc.runtime.harness.launch import find_mpiexec

README = REPO / "README.md"

#: Relative tolerance for a number the README quotes against the one the command prints.
REL_TOL = 0.02
#: Seconds one README command may run (the slowest take a few seconds).
COMMAND_LIMIT_S = 240.0

WORKED_EXAMPLE = "Worked example"
TRAINING = "At training time"
TORCHRUN = "With torchrun"
CALIBRATE = "Calibrate your cluster"

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Command:
    """A ``$ `` line of a console block, with the output lines shown under it (each with its README line)."""

    line: int
    text: str
    expected: tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class Block:
    """A fenced block: its language, its first line's number in the README, its text and its ``##`` section."""

    lang: str
    line: int
    text: str
    section: str


@functools.cache
def blocks() -> tuple[Block, ...]:
    text = README.read_text()
    headings = [(m.start(), m.group(1)) for m in re.finditer(r"^## (.+)$", text, re.M)]
    found = []
    for m in FENCE.finditer(text):
        section = next((title for start, title in reversed(headings) if start < m.start()), "")
        found.append(Block(m.group(1), text.count("\n", 0, m.start(2)) + 1, m.group(2), section))
    return tuple(found)


def commands(block: Block) -> list[Command]:
    """The commands of a console block, each with the output lines that follow it."""
    found: list[Command] = []
    for n, line in enumerate(block.text.splitlines(), start=block.line):
        if line.startswith("$ "):
            found.append(Command(n, line[2:], ()))
        elif found and line.strip():
            last = found[-1]
            found[-1] = Command(last.line, last.text, (*last.expected, (n, line)))
        elif line.strip():
            raise AssertionError(f"README.md:{n}: output before any '$ ' command in a console block")
    return found


def console_commands(section: str) -> list[Command]:
    return [c for b in blocks() if b.lang == "console" and b.section == section for c in commands(b)]


def resolve(match: re.Match[str]) -> str:
    """``.venv/bin/NAME`` as this interpreter's: the program beside it, else its equivalent."""
    name = match.group(1)
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return shlex.quote(str(beside))
    if name in ("python", "python3"):
        return shlex.quote(sys.executable)
    if name == "topocc":
        return f"{shlex.quote(sys.executable)} -m topocc.planner.cli"
    if name == "mpiexec":
        return shlex.quote(find_mpiexec())
    return shlex.quote(str(beside))


def localize(command: str) -> str:
    return re.sub(r"\.venv/bin/(\S+)", resolve, command)


def run(command: Command, folder: Path, limit_s: float = COMMAND_LIMIT_S) -> subprocess.CompletedProcess[str]:
    """Run the README command under bash in ``folder`` (this checkout importable); kill it past ``limit_s``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.pop("TOPOCC_DEBUG", None)
    return run_bounded(["bash", "-c", localize(command.text)], limit_s, f"README.md:{command.line}: `{command.text}`",
                       cwd=folder, env=env, stdin=subprocess.DEVNULL)


def normal(line: str) -> str:
    """A line with runs of spaces and of table-rule dashes made one, so column widths do not matter."""
    return re.sub(r"-{3,}", "---", " ".join(line.split()))


@functools.cache
def pattern(expected: str) -> re.Pattern[str]:
    """``expected`` as a regex: its numbers captured, ``...`` matching any text, the rest literal."""
    parts = []
    for i, piece in enumerate(normal(expected).split("...")):
        if i:
            parts.append(".*?")
        at = 0
        for m in NUMBER.finditer(piece):
            parts.append(re.escape(piece[at:m.start()]) + f"({NUMBER.pattern})")
            at = m.end()
        parts.append(re.escape(piece[at:]))
    return re.compile("".join(parts))


def line_matches(expected: str, actual: str) -> bool:
    """Same text, and each number within :data:`REL_TOL` of the README's."""
    m = pattern(expected).fullmatch(normal(actual))
    if m is None:
        return False
    shown = [float(x) for x in NUMBER.findall(normal(expected).replace("...", " "))]
    return all(math.isclose(float(got), want, rel_tol=REL_TOL) for got, want in zip(m.groups(), shown))


def mismatch(expected: tuple[tuple[int, str], ...], output: str) -> tuple[int, str] | None:
    """The README line the output fails to match (the furthest one reached), or None when all of it does."""
    wanted = [(n, line.strip()) for n, line in expected]
    got = [line for line in output.splitlines() if line.strip()]
    furthest = [0]

    @functools.cache
    def match(i: int, j: int) -> bool:
        furthest[0] = max(furthest[0], i)
        if i == len(wanted):
            return j == len(got)
        if wanted[i][1] == "...":
            return any(match(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and line_matches(wanted[i][1], got[j]) and match(i + 1, j + 1)

    if match(0, 0):
        return None
    if furthest[0] == len(wanted):
        return wanted[-1][0], "(the command printed more lines after this one; end with '...' to allow them)"
    return wanted[furthest[0]]


def check(command: Command, folder: Path) -> str | None:
    """Run ``command``; what went wrong, naming its README line, or None."""
    proc = run(command, folder)
    where = f"README.md:{command.line}: `{command.text}`"
    if proc.returncode != 0:
        return f"{where} exited {proc.returncode}:\n{proc.stderr[-2000:]}"
    if command.expected and (bad := mismatch(command.expected, proc.stdout)):
        return (f"{where}: its output does not match README.md:{bad[0]}: {bad[1].strip()!r} "
                f"(numbers within {REL_TOL:.0%}, '...' skips)\nit printed:\n{proc.stdout[-4000:]}")
    return None


# -- the set-up ------------------------------------------------------------------------------------------------


def setup_commands() -> list[Command]:
    """The topocc parts of the set-up's chained install command (not the venv nor the pip install)."""
    (block,) = [b for b in blocks() if b.section.startswith("Set-up") and b.lang == "sh"]
    found = []
    for n, line in enumerate(block.text.splitlines(), start=block.line):
        if line.startswith("#") or "topocc" not in line:
            continue
        parts = (part.strip() for part in line.split("&&"))
        found += [Command(n, part, ()) for part in parts if part.startswith(".venv/bin/topocc")]
    return found


def test_the_setup_compiles_verifies_and_simulates(tmp_path: Path) -> None:
    found = setup_commands()
    assert [c.text.split()[1] for c in found] == ["compile", "verify", "simulate"], found
    for command in found:
        if problem := check(command, tmp_path):
            pytest.fail(problem, pytrace=False)


# -- console blocks --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def worked_example(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The folder the worked example ran in, and what went wrong (README lines named)."""
    folder = tmp_path_factory.mktemp("worked-example")
    found = console_commands(WORKED_EXAMPLE)
    assert found, f"README.md has a console block under '## {WORKED_EXAMPLE}'"
    return folder, [p for c in found if (p := check(c, folder)) is not None]


def test_the_worked_example_prints_what_the_readme_shows(worked_example: tuple[Path, list[str]]) -> None:
    _, problems = worked_example
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.mark.mpi
def test_the_training_snippet_runs_on_the_worked_examples_plan(worked_example: tuple[Path, list[str]]) -> None:
    folder, _ = worked_example
    # the section's MPI snippet (the GPU one needs CUDA and CuPy)
    (snippet,) = [b for b in blocks() if b.lang == "python" and b.section == TRAINING and "NCCL" not in b.text]
    (launch,) = console_commands(TRAINING)
    assert "mpiexec -n" in launch.text and launch.expected, f"README.md:{launch.line}: mpiexec, and what it prints"
    plans = re.findall(r'"([^"]+\.json)"', snippet.text)
    assert plans and all((folder / p).is_file() for p in plans), (
        f"README.md:{snippet.line}: the snippet reads {plans}, which the worked example did not write")
    script = re.search(r"python (\S+\.py)", launch.text)
    assert script, f"README.md:{launch.line}: the command runs a .py file, the snippet"
    (folder / script.group(1)).write_text(snippet.text)
    if problem := check(launch, folder):
        pytest.fail(problem, pytrace=False)


def test_the_torchrun_section_trains_over_the_bundle_it_compiles(tmp_path: Path) -> None:
    """"With torchrun": its script saved as the file its torchrun command runs, beside the bundle it compiled."""
    pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    (script,) = [b for b in blocks() if b.lang == "python" and b.section == TORCHRUN]
    compile_, launch = console_commands(TORCHRUN)
    name = re.search(r"(\S+\.py)$", launch.text)
    assert "topocc bundle" in compile_.text and name, f"README.md:{launch.line}: compile a bundle, then run a .py"
    (tmp_path / name.group(1)).write_text(script.text)
    problems = [p for c in (compile_, launch) if (p := check(c, tmp_path)) is not None]
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.mark.root
@pytest.mark.mpi
@pytest.mark.skipif(emulation_available() is not None, reason=str(emulation_available()))
def test_the_calibrate_section_calibrates_compiles_and_benches_by_the_calibrated_model(tmp_path: Path) -> None:
    """"Calibrate your cluster": its commands, in order (as root, so without ``sudo``), each exit 0; the file it
    writes is calibrated, and the bench predicts by it."""
    (block,) = [b for b in blocks() if b.lang == "sh" and b.section == CALIBRATE]
    commands = [Command(n, line.removeprefix("sudo "), ())
                for n, line in enumerate(block.text.splitlines(), start=block.line) if line.strip()]
    assert [c.text.split()[1] for c in commands] == ["calibrate", "compile", "bench"]
    outputs = []
    for command in commands:
        proc = run(command, tmp_path)
        assert proc.returncode == 0, f"README.md:{command.line}: `{command.text}` exited {proc.returncode}:\n" \
                                     f"{proc.stderr[-2000:]}"
        outputs.append(proc.stdout)
    written = re.search(r"-o (\S+\.yaml)", commands[0].text)
    assert written is not None
    assert load_topology(tmp_path / written.group(1)).calibration is not None
    assert "model: calibrated" in outputs[1] and "model: calibrated" in outputs[2]


OTHER_SECTIONS = sorted({b.section for b in blocks() if b.lang == "console"} - {WORKED_EXAMPLE, TRAINING, TORCHRUN})


@pytest.mark.parametrize("section", OTHER_SECTIONS)
def test_other_console_blocks_print_what_the_readme_shows(section: str, tmp_path: Path) -> None:
    problems = [p for c in console_commands(section) if (p := check(c, tmp_path)) is not None]
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


# -- the matcher itself and the commands table -----------------------------------------------------------------


def test_the_matcher_allows_widths_rounding_and_ellipses_and_nothing_more() -> None:
    assert line_matches("  algbw / busbw:  24.83 GB/s", "algbw / busbw:     24.9 GB/s")
    assert not line_matches("  algbw / busbw:  24.83 GB/s", "algbw / busbw: 27.3 GB/s")
    assert not line_matches("  algbw / busbw:  24.83 GB/s", "algbw / busbw: 24.83 MB/s")
    assert line_matches("  ring  -  30736  ...  cannot win", "  ring  -  30736  0.35s  cannot win")
    assert line_matches("------  ----", "--------  ------")
    assert line_matches("every element is [8.]", "every element is [8.]")
    assert not line_matches("every element is [8.]", "every element is [1. 8.]")
    shown = ((1, "a 1"), (2, "..."), (3, "c 3"))
    assert mismatch(shown, "a 1\nb\nb\nc 3\n") is None
    assert mismatch(shown, "a 1\nb\n") == (3, "c 3")
    assert mismatch(shown, "a 1\nc 3\nd\n")[0] == 3  # type: ignore[index]
    assert mismatch(((1, "a 1"),), "a 1.5\n") == (1, "a 1")


def test_the_commands_table_names_real_commands_and_options() -> None:
    text = README.read_text()
    table = re.search(r"^## Commands\n(.*?)^## ", text, re.M | re.S)
    assert table, "README.md has a '## Commands' section"
    usages = re.findall(r"^\| `topocc ([^`]+)` \|", table.group(1), re.M)
    listed = set()
    for usage in usages:
        words = usage.split()
        command = cli.commands.get(words[0])
        assert command is not None, f"README's Commands table: `topocc {usage}`: no such command"
        if words[0] == "topo":
            command = command.commands.get(words[1])  # type: ignore[attr-defined]
            assert command is not None, f"README's Commands table: `topocc {usage}`: no such command"
        listed.add(" ".join(words[:2]) if words[0] == "topo" else words[0])
        options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        unknown = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", usage)) - options
        assert not unknown, f"README's Commands table: `topocc {usage}`: {sorted(unknown)} not options of it"
    topo = cli.commands["topo"].commands  # type: ignore[attr-defined]
    real = {name for name in cli.commands if name != "topo"} | {f"topo {name}" for name in topo}
    assert listed == real, f"commands missing from the README's table: {sorted(real - listed)}"
