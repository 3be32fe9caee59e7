"""The ``news_headline_extract`` capability: a loop that turns items into title-and-link records."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field

from runtime.guardrails.plugins import register
from runtime.guardrails.program import Finding, Program

_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_RECORDS = (ast.Dict, ast.Tuple, ast.List, ast.Call)
_MAX_RECORD_NODES = 200


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    title_fields: list[str] = Field(default_factory=lambda: ["title", "headline"], min_length=1)
    link_fields: list[str] = Field(default_factory=lambda: ["link", "url", "href"], min_length=1)


@register("headline_extraction", options=Options, fields=("record",))
def headline_extraction(program: Program, options: Options) -> Iterator[Finding]:
    """Iterating items and pulling both a title and a link out of each into structured output: inside a
    ``for`` loop or comprehension, a dict, tuple, list or call (``dict(...)``, ``out.append(...)``) that
    uses the loop variable and mentions a title field and a link field, as a string (``"title"``,
    ``item.find("link")``), an attribute (``entry.title``) or a keyword (``link=...``).

    Tags the program; it is not a prohibition.
    """
    titles = frozenset(f.casefold() for f in options.title_fields)
    links = frozenset(f.casefold() for f in options.link_fields)
    records = set()
    for record in program.nodes(*_RECORDS):
        loop_names = _enclosing_loop_targets(program, record)
        if loop_names and _mentions(record, titles, links, loop_names):
            records.add(record)
    for record in records:
        if not _has_ancestor_in(program, record, records):
            yield Finding(record, {"record": program.construct(record)})


def _has_ancestor_in(program: Program, node: ast.AST, nodes: set[ast.AST]) -> bool:
    parent = program.parent(node)
    while parent is not None:
        if parent in nodes:
            return True
        parent = program.parent(parent)
    return False


def _enclosing_loop_targets(program: Program, node: ast.AST) -> frozenset[str]:
    """Names bound by the loops whose body (not iterable) contains `node`."""
    names: set[str] = set()
    child, parent = node, program.parent(node)
    while parent is not None:
        if isinstance(parent, ast.For | ast.AsyncFor) and child is not parent.iter:
            names.update(n.id for n in ast.walk(parent.target) if isinstance(n, ast.Name))
        elif isinstance(parent, _COMPREHENSIONS) and not isinstance(child, ast.comprehension):
            for generator in parent.generators:
                names.update(n.id for n in ast.walk(generator.target) if isinstance(n, ast.Name))
        child, parent = parent, program.parent(parent)
    return frozenset(names)


def _mentions(record: ast.AST, titles: frozenset[str], links: frozenset[str], loop_names: frozenset[str]) -> bool:
    """Whether `record`'s subtree mentions a title field, a link field and a loop variable."""
    title = link = uses_item = False
    stack = [record]
    for _ in range(_MAX_RECORD_NODES):
        if not stack:
            break
        node = stack.pop()
        word: str | None = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            word = node.value
        elif isinstance(node, ast.Attribute):
            word = node.attr
        elif isinstance(node, ast.keyword):
            word = node.arg
        elif isinstance(node, ast.Name) and node.id in loop_names:
            uses_item = True
        if word is not None:
            folded = word.casefold()
            title = title or folded in titles
            link = link or folded in links
        stack.extend(ast.iter_child_nodes(node))
    return title and link and uses_item
