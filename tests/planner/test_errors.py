"""The exit-code table in topocc.planner.errors' docstring agrees with the error classes, the CLI and the README."""

from __future__ import annotations

import inspect
import re

import pytest

import topocc.planner.errors as errors
from tests.conftest import REPO
from topocc.planner.cli import main
from topocc.runtime.errors import TopoccError

#: Codes the CLI returns itself, not through an error class (topocc.planner.cli.main).
CLI_CODES = {0, 70, 130, 141}


def test_every_error_class_is_in_the_table_with_its_code() -> None:
    table = errors.exit_codes()
    by_name = {name: code for code, names, _ in table for name in names}
    classes = {name: obj for name, obj in vars(errors).items()
               if inspect.isclass(obj) and issubclass(obj, TopoccError)}
    assert set(by_name) == set(classes), "a class is missing from the table, or the table names one that is gone"
    for name, cls in classes.items():
        assert by_name[name] == cls.exit_code, name
    assert {code for code, names, _ in table if not names} == CLI_CODES
    assert [code for code, _, _ in table] == sorted({code for code, _, _ in table}), "one row per code, in order"


def test_help_and_readme_list_every_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    helptext = capsys.readouterr().out
    readme = (REPO / "README.md").read_text()
    listed = re.search(r"## Exit codes\n(.*?)\n## ", readme, re.S)
    assert listed, "README.md has an '## Exit codes' section"
    readme_codes = {int(c) for c in re.findall(r"^\| `(\d+)` \|", listed.group(1), re.M)}
    table = errors.exit_codes()
    assert readme_codes == {code for code, _, _ in table}
    for code, _, meaning in table:
        assert re.search(rf"^\s+{code}\s+{re.escape(meaning.replace('``', ''))}$", helptext, re.M), code


def test_an_internal_error_is_one_line_and_exit_70(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr("topocc.planner.report.summary.algorithms_table", broken)
    assert main(["algorithms"]) == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: RuntimeError: boom second line" in err
