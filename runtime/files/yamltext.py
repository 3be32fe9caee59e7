"""Bounded YAML: plain data from YAML text with a node budget, a depth limit, no custom tags, string keys and no
duplicates, each problem one ConfigError naming the file and line. The policy loader and every data file a
user hands to a command (``structured``) read YAML through it."""

from __future__ import annotations

from typing import Any

import yaml

from sandforge.runtime.errors import ConfigError

#: A key/item path into composed data (the policy loader maps pydantic errors back to lines with it).
YamlPath = tuple[str | int, ...]

MAX_YAML_NODES = 200_000
MAX_YAML_DEPTH = 64
_COLLECTION_TAGS = frozenset({"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"})
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def compose_yaml(name: str, text: str) -> Any:
    """Plain data from YAML text with this loader's bounds (node budget, depth, tags, string keys, no
    duplicates); ConfigError naming ``name`` and the line otherwise. Shared by every YAML input."""
    return compose_with_lines(name, text)[0]


def compose_with_lines(name: str, text: str) -> tuple[Any, dict[YamlPath, int]]:
    """Parse YAML into plain data plus a map from each key/item path to its 1-based line."""
    loader = _Loader(text)
    lines: dict[YamlPath, int] = {(): 1}
    budget = [MAX_YAML_NODES]
    try:
        root = loader.get_single_node()
        if root is None:
            return None, lines
        return _convert(name, loader, root, (), lines, budget, frozenset()), lines
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        problem = exc.problem or exc.context or "malformed YAML"
        raise ConfigError(f"{name}:{line}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: malformed YAML: {' '.join(str(exc).split())}") from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit integer, a scalar the constructor refuses
        raise ConfigError(f"{name}: unusable YAML value: {' '.join(str(exc).split())[:200]}") from None
    finally:
        loader.dispose()


def _convert(
    name: str,
    loader: yaml.SafeLoader,
    node: yaml.Node,
    path: YamlPath,
    lines: dict[YamlPath, int],
    budget: list[int],
    active: frozenset[int],
) -> Any:
    line = node.start_mark.line + 1
    lines.setdefault(path, line)
    budget[0] -= 1
    if budget[0] < 0:
        raise ConfigError(f"{name}:{line}: too many YAML nodes (alias expansion?)")
    if len(path) > MAX_YAML_DEPTH or id(node) in active:
        raise ConfigError(f"{name}:{line}: YAML nested too deeply or refers to itself")
    inner = active | {id(node)}
    if isinstance(node, yaml.MappingNode | yaml.SequenceNode) and node.tag not in _COLLECTION_TAGS:
        raise ConfigError(f"{name}:{line}: unsupported YAML tag {node.tag!r}")
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node) if isinstance(key_node, yaml.ScalarNode) else None
            key_line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise ConfigError(f"{name}:{key_line}: mapping keys must be strings; quote {key_node.value!r}")
            if key in out:
                raise ConfigError(f"{name}:{key_line}: duplicate key {key!r}")
            lines[(*path, key)] = key_line
            out[key] = _convert(name, loader, value_node, (*path, key), lines, budget, inner)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [
            _convert(name, loader, item, (*path, index), lines, budget, inner) for index, item in enumerate(node.value)
        ]
    return loader.construct_object(node)
