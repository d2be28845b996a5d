"""Safe YAML loading that remembers line numbers, for errors that point at the place.

Mappings load as :class:`YDict` and sequences as :class:`YList`, which carry the
line of each key or item.  Only YAML's safe tags are constructed: loading never
runs code.  Duplicate keys are an error rather than a silent overwrite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from topocc.planner.errors import TopologyError

__all__ = ["Source", "YDict", "YList", "load_yaml"]


class YDict(dict[Any, Any]):
    """A mapping that knows its own line and the line of each key."""

    line: int = 0
    lines: dict[Any, int]


class YList(list[Any]):
    """A sequence that knows its own line and the line of each item."""

    line: int = 0
    lines: list[int]


class _Loader(yaml.SafeLoader):
    pass


def _mapping(loader: _Loader, node: yaml.MappingNode) -> YDict:
    loader.flatten_mapping(node)
    result = YDict()
    result.line = node.start_mark.line + 1
    result.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            duplicate = key in result
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a key must be a plain value", key_node.start_mark
            ) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {result.lines[key]})", key_node.start_mark
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.lines[key] = line
    return result


def _sequence(loader: _Loader, node: yaml.SequenceNode) -> YList:
    result = YList(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.lines = [child.start_mark.line + 1 for child in node.value]
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)


class Source:
    """A file name for messages: ``source.at(obj, key)`` gives ``file:line``; given the document it was
    loaded from, ``source.path(obj, key)`` gives the field's place in it (``links[3].bandwidth``)."""

    def __init__(self, name: str, root: Any = None) -> None:
        self.name = name
        self._root = root  # held, so that the ids the paths are kept by stay its objects'
        self._paths: dict[int, str] | None = None

    def path(self, obj: Any, key: Any = None) -> str:
        """Where ``obj[key]`` (or ``obj``) sits in the document: ``links[3].bandwidth``, ``cluster.host.nic``;
        just ``key`` where the document is unknown."""
        if self._paths is None:
            self._paths = {}
            stack: list[tuple[Any, str]] = [(self._root, "")]
            while stack:  # an object reached twice (a YAML alias) keeps the first path found
                node, where = stack.pop()
                if isinstance(node, (dict, list)) and id(node) not in self._paths:
                    self._paths[id(node)] = where
                    items = node.items() if isinstance(node, dict) else enumerate(node)
                    stack.extend((child, f"{where}[{k}]" if isinstance(node, list) else f"{where}.{k}".lstrip("."))
                                 for k, child in items)
        base = self._paths.get(id(obj), "")
        if key is None:
            return base
        return f"{base}[{key}]" if isinstance(obj, list) else f"{base}.{key}".lstrip(".")

    def at(self, obj: Any = None, key: Any = None) -> str:
        line = 0
        if isinstance(obj, YDict):
            line = obj.lines.get(key, obj.line) if key is not None else obj.line
        elif isinstance(obj, YList):
            line = obj.lines[key] if isinstance(key, int) and 0 <= key < len(obj.lines) else obj.line
        return f"{self.name}:{line}" if line else self.name

    def error(self, obj: Any, key: Any, message: str, fix: str | None = None) -> TopologyError:
        return TopologyError(message, where=self.at(obj, key), fix=fix)


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file safely; any failure is a one-line :class:`TopologyError` naming the place."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TopologyError("no such file", where=str(path), fix="check the path") from None
    except IsADirectoryError:
        raise TopologyError("is a directory, not a topology file", where=str(path)) from None
    except UnicodeDecodeError as exc:
        raise TopologyError(f"not UTF-8 text (byte {exc.start})", where=str(path)) from None
    except OSError as exc:
        raise TopologyError(f"cannot read: {exc.strerror}", where=str(path)) from None
    return parse_yaml(text, str(path))


def parse_yaml(text: str, name: str) -> Any:
    """Parse YAML text; ``name`` is used in error messages."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise TopologyError(f"invalid YAML: {problem}", where=f"{name}{line}",
                            fix="check indentation, colons and quotes") from None
    except yaml.YAMLError as exc:
        raise TopologyError(f"invalid YAML: {exc}", where=name) from None
    except RecursionError:
        raise TopologyError("YAML nested too deeply", where=name) from None
    except (ValueError, OverflowError) as exc:  # a constructor's own check, e.g. the date 2001-13-01
        raise TopologyError(f"invalid YAML value: {exc}", where=name, fix="quote it if it is meant as text") from None
