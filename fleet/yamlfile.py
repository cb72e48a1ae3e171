"""Load a YAML file into plain data, remembering each key's line so errors can point at it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Where = tuple[str | int, ...]


@dataclass(frozen=True)
class YamlDoc:
    """Plain data (dicts, lists, scalars) plus the line of every mapping key and list item."""

    path: Path
    data: Any
    lines: dict[Where, int] = field(default_factory=dict)

    def at(self, where: Where) -> str:
        """`inventory.yaml:12: all.children.gpu.hosts` for an error message."""
        line = None
        probe = where
        while probe and line is None:
            line = self.lines.get(probe)
            probe = probe[:-1]
        dotted = ".".join(str(p) for p in where) or "(top level)"
        return f"{self.path}:{line}: {dotted}" if line else f"{self.path}: {dotted}"


class YamlFileError(Exception):
    """The file cannot be read or is not valid YAML; message names file and line."""


def _construct(node: yaml.Node, where: Where, lines: dict[Where, int], path: Path) -> Any:
    """Turn a composed node into plain data, refusing duplicate keys (YAML keeps the last)."""
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise YamlFileError(
                    f"{path}:{key_node.start_mark.line + 1}: '<<' merge keys are not supported"
                )
            key = _construct(key_node, where, lines, path)
            if isinstance(key, (dict, list)):
                raise YamlFileError(
                    f"{path}:{key_node.start_mark.line + 1}: a key must be a plain value"
                )
            if key in out:
                first = lines.get((*where, key))
                raise YamlFileError(
                    f"{path}:{key_node.start_mark.line + 1}: duplicate key '{key}'"
                    + (f" (first defined on line {first})" if first else "")
                )
            lines[(*where, key)] = key_node.start_mark.line + 1
            out[key] = _construct(value_node, (*where, key), lines, path)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            lines[(*where, index)] = item.start_mark.line + 1
            items.append(_construct(item, (*where, index), lines, path))
        return items
    return _scalar(node) if isinstance(node, yaml.ScalarNode) else None


def _scalar(node: yaml.ScalarNode) -> Any:
    """Resolve a scalar with the safe loader's rules (ints, bools, nulls, strings)."""
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def load(path: Path) -> YamlDoc:
    """Read and parse `path`; every failure is a YamlFileError naming the file (and line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise YamlFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise YamlFileError(f"{path}: is a directory, not a YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise YamlFileError(f"{path}: cannot read: {exc}") from None
    return loads(text, path)


def loads(text: str, path: Path) -> YamlDoc:
    """Parse YAML text attributed to `path`."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise YamlFileError(f"{where}: invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise YamlFileError(f"{path}: invalid YAML: {exc}") from None
    lines: dict[Where, int] = {}
    if node is None:
        return YamlDoc(path, None, lines)
    try:
        data = _construct(node, (), lines, path)
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise YamlFileError(f"{where}: invalid YAML: {exc.problem}") from None
    return YamlDoc(path, data, lines)
