"""The house rules, checked on the source: import direction and no cycles, imports at the top, short functions.

docs/architecture.md draws the folders and the direction data and imports flow; this reads every module of
the product (``topocc/``) with :mod:`ast` and holds the code to it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO
from topocc.runtime.collective import DESCRIPTIONS

#: What each part of the product may import (itself, and the parts listed; shared modules of the planner are
#: open to every planner package).  Read top to bottom, it is the order data flows in.
ALLOWED: dict[str, tuple[str, ...]] = {
    "topocc.runtime": (),
    "topocc.runtime.harness": ("topocc.runtime",),
    "topocc.planner.topology": ("topocc.runtime",),
    "topocc.planner.routing": ("topocc.planner.topology", "topocc.runtime"),
    "topocc.planner.analysis": ("topocc.planner.topology", "topocc.planner.routing", "topocc.planner.solvers",
                                "topocc.runtime"),
    "topocc.planner.solvers": (),
    "topocc.planner.compiler": ("topocc.planner.topology", "topocc.planner.routing", "topocc.planner.analysis",
                                "topocc.planner.solvers", "topocc.runtime"),
    "topocc.planner.formats": ("topocc.planner.topology", "topocc.planner.analysis", "topocc.runtime"),
    "topocc.planner.report": ("topocc.planner.topology", "topocc.planner.routing", "topocc.planner.analysis",
                              "topocc.planner.compiler", "topocc.runtime", "topocc.runtime.harness"),
    "topocc.planner.gradblocks": ("topocc.planner.topology", "topocc.planner.analysis", "topocc.runtime"),
    "topocc.planner.calibration": ("topocc.planner.topology", "topocc.planner.routing", "topocc.runtime"),
    "topocc.planner.testbed": ("topocc.planner.topology", "topocc.planner.routing", "topocc.planner.analysis",
                               "topocc.planner.compiler", "topocc.planner.report", "topocc.planner.calibration",
                               "topocc.runtime", "topocc.runtime.harness"),
}
#: The runtime modules the planner reads (besides the harness, which only report and testbed run): the formats
#: both halves share and the rules the simulator and verifier apply as the replay does.
PLANNER_READS = frozenset({
    "topocc.runtime", "topocc.runtime.schedule", "topocc.runtime.collective", "topocc.runtime.plan",
    "topocc.runtime.bundle", "topocc.runtime.calls", "topocc.runtime.errors", "topocc.runtime.encoding",
    "topocc.runtime.matching", "topocc.runtime.lowering", "topocc.runtime.bandwidth", "topocc.runtime.arrays",
    "topocc.runtime.chrome_trace", "topocc.runtime.training.profile", "topocc.runtime.symmetric",
})
#: Modules every planner package may import.
SHARED = ("topocc.planner.errors", "topocc.planner.units", "topocc.planner._yaml", "topocc.planner.collector")
#: Optional dependencies (and the accelerated parts of required ones), loaded when used: an import inside a
#: function may load one, or a module of the product that loads one when it is loaded.
OPTIONAL = ("torch", "cupy", "ortools", "pulp", "highspy", "jinja2", "mpi4py", "ml_dtypes")
#: Where imports inside functions keep a program's start-up fast (each with its reason): the CLI's, and a
#: training job's ``init_process_group("topocc")``, whose replay loads at the first planned call and the
#: schedule format with the first schedule a plan parses; and the format, whose symmetric form (a module
#: built on it) loads with the first symmetric schedule.
LAZY_MODULES = ("topocc.planner.cli", "topocc.runtime.distributed.process_group", "topocc.runtime.plan",
                "topocc.runtime.schedule")
#: No function of the product is longer than this.
MAX_FUNCTION_LINES = 100


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module

    @property
    def package(self) -> str:
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]


def _modules() -> dict[str, Module]:
    found = {}
    for path in sorted((REPO / "topocc").rglob("*.py")):
        parts = [p for p in path.relative_to(REPO).with_suffix("").parts if p != "__init__"]
        name = ".".join(parts)
        found[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    return found


MODULES = _modules()


def _top_level_imports(module: Module) -> Iterator[tuple[ast.stmt, str]]:
    """Every import the module runs when it is loaded (not those under ``if TYPE_CHECKING:``), resolved."""

    def walk(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    yield from walk(node.body)
                yield from walk(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                    yield from walk(block)

    for node in walk(module.tree.body):
        for target in _targets(node, module):
            yield node, target


def _targets(node: ast.Import | ast.ImportFrom, module: Module) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per dot after the first
        package = module.package.split(".")
        base = ".".join([*package[: len(package) - node.level + 1], base])
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]


def _graph() -> dict[str, set[str]]:
    return {name: {t for _, t in _top_level_imports(m) if t in MODULES and t != name} for name, m in MODULES.items()}


def _part(name: str) -> str:
    """The part of the product a module belongs to (a key of :data:`ALLOWED`), or the module itself."""
    best = max((key for key in ALLOWED if name == key or name.startswith(key + ".")), key=len, default=name)
    return best


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` with more than one member: its import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return cycles


def _wrong_way(modules: dict[str, Module]) -> list[str]:
    """Load-time imports of one part of the product by a part that may not import it (:data:`ALLOWED`)."""
    wrong = []
    for name, module in modules.items():
        part = _part(name)
        if part not in ALLOWED:
            continue
        for node, target in _top_level_imports(module):
            if not target.startswith("topocc.") or target in SHARED or _part(target) == part:
                continue
            if target == "topocc" or _part(target) not in ALLOWED[part]:
                wrong.append(f"{module.path.relative_to(REPO)}:{node.lineno} imports {target}")
    return wrong


def test_the_planner_reads_only_the_runtimes_formats_and_rules() -> None:
    """Outside the harness, the planner loads only :data:`PLANNER_READS` of the runtime (docs/architecture.md)."""
    wrong = [f"{m.path.relative_to(REPO)}:{node.lineno} imports {target}"
             for name, m in MODULES.items() if name.startswith("topocc.planner.")
             for node, target in _top_level_imports(m)
             if target.startswith("topocc.runtime") and _part(target) == "topocc.runtime"
             and target not in PLANNER_READS]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles() -> None:
    assert not _cycles(_graph()), f"import cycles: {_cycles(_graph())}"


def test_imports_flow_one_way() -> None:
    """Each part imports only the parts before it (:data:`ALLOWED`); the runtime never imports the planner."""
    wrong = _wrong_way(MODULES)
    assert not wrong, "\n".join(wrong)


def test_the_checks_see_a_cycle_and_a_wrong_way_import() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    runtime = MODULES["topocc.runtime.schedule"]
    wrong = ast.parse("from topocc.planner.compiler.compile import compile_schedule\n")
    spoiled = Module(runtime.name, runtime.path, ast.Module(body=[*wrong.body, *runtime.tree.body], type_ignores=[]))
    assert _wrong_way({runtime.name: spoiled}) == [
        "topocc/runtime/schedule.py:1 imports topocc.planner.compiler.compile"]


def _inner_imports(module: Module) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(module.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    yield inner


def _loads_optional(target: str) -> bool:
    """Whether importing ``target`` loads an optional dependency (it is one, or a module that imports one)."""
    if target.split(".")[0] in OPTIONAL:
        return True
    module = MODULES.get(target)
    return module is not None and any(t.split(".")[0] in OPTIONAL for _, t in _top_level_imports(module))


def _block_start(lines: list[str], lineno: int) -> int:
    """The first line of the run of import lines (and blank lines) that ends at ``lineno`` (1-based)."""
    while lineno > 1:
        above = lines[lineno - 2].strip()
        if not (above.startswith(("import ", "from ")) or above == "" or above.endswith((",", "(")) or above == ")"):
            break
        lineno -= 1
    return lineno


def test_imports_inside_functions_load_optional_dependencies_or_keep_the_cli_fast() -> None:
    """An import inside a function loads an optional dependency (:data:`OPTIONAL`), or keeps the CLI's
    start-up fast; either way a comment on its line or the line above says why."""
    wrong = []
    for name, module in MODULES.items():
        lines = module.path.read_text().splitlines()
        for node in _inner_imports(module):
            targets = _targets(node, module)
            optional = all(_loads_optional(t) for t in targets)
            if not optional and name not in LAZY_MODULES:
                wrong.append(f"{module.path.relative_to(REPO)}:{node.lineno} imports {', '.join(targets)}")
                continue
            said = "#" in lines[node.lineno - 1] or "#" in lines[_block_start(lines, node.lineno) - 2]
            if not said:
                wrong.append(f"{module.path.relative_to(REPO)}:{node.lineno}: say why it is imported here")
    assert not wrong, "\n".join(wrong)


def test_functions_are_short() -> None:
    long = []
    for module in MODULES.values():
        for node in ast.walk(module.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{module.path.relative_to(REPO)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, "\n".join(long)


@pytest.mark.parametrize("name", sorted(n for n, m in MODULES.items() if m.path.name == "__init__.py"))
def test_every_package_says_what_lives_there(name: str) -> None:
    assert ast.get_docstring(MODULES[name].tree), f"{name} has no docstring"


#: The one module that may compare collective names: the descriptions every other layer asks instead.
DESCRIPTIONS_MODULE = "topocc.runtime.collective"
#: Every spelling of a collective's name.
COLLECTIVE_SPELLINGS = frozenset(n for c in DESCRIPTIONS for n in (c.name, *c.aliases))


def _spelling(node: ast.expr) -> str | None:
    """The collective name ``node`` is a string constant of, if it is one."""
    return node.value if isinstance(node, ast.Constant) and node.value in COLLECTIVE_SPELLINGS else None


def _asks_an_operation(node: ast.expr) -> bool:
    """Whether ``node`` reads an operation's kind (``op.kind``, ``kind``, ``op_kind(op)``, ``row["op"]``), which
    "reduce" names too: comparing it with "reduce" asks about an operation, not a collective."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "op"
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name in ("kind", "op_kind")


def _names_compared(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, name) of each comparison with a collective's name: ``==``/``!=``/``is`` with one, ``in`` a
    literal tuple, list or set of them, and ``case "allreduce":``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.MatchValue) and (name := _spelling(node.value)):
            yield node.lineno, name
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if isinstance(op, (ast.In, ast.NotIn)):
                pairs = [(e, left) for e in right.elts] if isinstance(right, (ast.Tuple, ast.List, ast.Set)) else []
            else:
                pairs = [(left, right), (right, left)]
            for side, other in pairs:
                name = _spelling(side)
                if name and not (name == "reduce" and _asks_an_operation(other)):
                    yield node.lineno, name


def test_collective_names_are_compared_only_by_their_descriptions() -> None:
    """What a collective means lives in :mod:`topocc.runtime.collective`; every other module asks its
    description (``c.rooted``, ``c.reduces``, ``c is ALLGATHER``) and never compares names."""
    found = [f"{m.path.relative_to(REPO)}:{line} compares the name {name!r}"
             for m in MODULES.values() if m.name != DESCRIPTIONS_MODULE for line, name in _names_compared(m.tree)]
    assert not found, "\n".join(found)


def test_the_name_check_sees_each_form_of_comparison() -> None:
    code = ('if c == "allgather" or "broadcast" != c or c.name in ("all_reduce", x) or c not in {"alltoall"}:\n'
            '    pass\n'
            'match c:\n'
            '    case "reducescatter":\n'
            '        pass\n'
            'ok = op.kind == "reduce" or kind in ("copy", "reduce") or row["op"] == "reduce" or "reduce" in top\n')
    assert sorted(_names_compared(ast.parse(code))) == [
        (1, "all_reduce"), (1, "allgather"), (1, "alltoall"), (1, "broadcast"), (4, "reducescatter")]
