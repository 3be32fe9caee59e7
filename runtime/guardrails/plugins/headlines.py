"""The ``news_headline_extract`` capability: a loop that turns items into title-and-link records."""

from __future__ import annotations

import ast
from bisect import bisect_left
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field

from sandforge.runtime.guardrails.plugins import register
from sandforge.runtime.guardrails.program import Finding, Program, child_fields

_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_LOOPS = (ast.For, ast.AsyncFor, *_COMPREHENSIONS)
_LOOP_CLASSES = frozenset(_LOOPS)
_RECORDS = frozenset({ast.Dict, ast.Tuple, ast.List})
_STATEMENTS = frozenset(cls for cls in vars(ast).values() if isinstance(cls, type) and issubclass(cls, ast.stmt))
_MAX_RECORD_NODES = 200
_COLLECTING_METHODS = frozenset({"append", "extend", "insert", "add", "update", "setdefault"})


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    title_fields: list[str] = Field(default_factory=lambda: ["title", "headline"], min_length=1)
    link_fields: list[str] = Field(default_factory=lambda: ["link", "url", "href"], min_length=1)


@register("headline_extraction", options=Options, fields=("record",))
def headline_extraction(program: Program, options: Options) -> Iterator[Finding]:
    """Iterating items and pulling both a title and a link out of each into structured output: in the
    body of a ``for`` loop or comprehension, a dict, tuple or list literal, a ``dict(...)`` call or a
    collecting call (``out.append(...)``, ``.extend``, ``.add``, ``.update``...) that mentions a title
    field and a link field, as a string (``"title"``, ``item.find("link")``), an attribute
    (``entry.title``) or a keyword (``link=...``).

    Each loop body is searched down to its records and nested loops (searched on their own), so the check
    stays linear. Tags the program; it is not a prohibition.
    """
    fields = {f.casefold(): "title" for f in options.title_fields} | {f.casefold(): "link" for f in options.link_fields}
    found, where = _mentioned(program, fields)
    if found != {"title", "link"}:
        return  # cheap exit: the program never names both kinds of field
    positions: list[list[Position]] | None = where
    if program.nodes(ast.JoinedStr):
        positions = None  # before Python 3.12, nodes inside f-strings can carry positions outside their statement
    for loop in program.nodes(ast.For, ast.AsyncFor, *_COMPREHENSIONS):
        for record in _records(program, _loop_body(loop), positions):
            if _mentions(program, record, fields) == {"title", "link"}:
                yield Finding(record, {"record": program.construct(record)})


Position = tuple[int, int]


def _mentioned(program: Program, fields: dict[str, str]) -> tuple[set[str], list[list[Position]]]:
    """Which kinds of field the whole program mentions, from the indexes; and where the nodes `_mentions`
    counts start, title mentions then link mentions, each sorted."""
    found = {fields[name.casefold()] for name in program.attributes if name.casefold() in fields}
    where: dict[str, list[Position]] = {"title": [], "link": []}
    for name, facts in program.attributes.items():
        kind = fields.get(name.casefold())
        if kind is not None:
            where[kind] += [(f.node.lineno, f.node.col_offset) for f in facts if f.via == "attribute"]  # type: ignore[attr-defined]
    for keyword in program.nodes(ast.keyword):
        if keyword.arg and keyword.arg.casefold() in fields:
            found.add(kind := fields[keyword.arg.casefold()])
            where[kind].append((keyword.lineno, keyword.col_offset))
    for constant in program.nodes(ast.Constant):
        value = constant.value
        if isinstance(value, str) and len(value) < 32 and value.casefold() in fields:
            found.add(kind := fields[value.casefold()])
            where[kind].append((constant.lineno, constant.col_offset))
    return found, [sorted(where["title"]), sorted(where["link"])]


def _may_mention_both(node: ast.stmt, positions: list[list[Position]]) -> bool:
    """Whether a title mention and a link mention start inside `node`'s span (decorators, which come
    before a definition's own position, included). A record inside `node` mentions only nodes inside it,
    so when this is false, searching `node` finds nothing."""
    start = (node.lineno, node.col_offset)
    decorators = getattr(node, "decorator_list", None)
    if decorators:
        start = min(start, (decorators[0].lineno, decorators[0].col_offset))
    if node.end_lineno is None or node.end_col_offset is None:
        return True
    end = (node.end_lineno, node.end_col_offset)
    for starts in positions:
        index = bisect_left(starts, start)
        if index == len(starts) or starts[index] > end:
            return False
    return True


def _loop_body(loop: ast.AST) -> list[ast.AST]:
    if isinstance(loop, ast.For | ast.AsyncFor):
        return list(loop.body)
    if isinstance(loop, ast.DictComp):
        return [loop.key, loop.value]
    return [loop.elt]  # type: ignore[attr-defined]


def _records(program: Program, roots: list[ast.AST], positions: list[list[Position]] | None) -> Iterator[ast.AST]:
    """The outermost records under `roots`, not looking into nested loops or past a record, in source
    order (children are pushed as `Program.children` gives them, inline: this visits whole loop bodies).
    With `positions` (see `_mentioned`), statements that cannot hold a record mentioning both kinds of
    field are not searched."""
    stack = list(reversed(roots))
    push = stack.append
    while stack:
        node = stack.pop()
        cls = node.__class__
        if cls in _RECORDS or (cls is ast.Call and _collects(node)):  # type: ignore[arg-type]
            yield node
        elif cls not in _LOOP_CLASSES:
            if positions is not None and cls in _STATEMENTS and not _may_mention_both(node, positions):  # type: ignore[arg-type]
                continue
            for name in child_fields(cls):  # last field first
                value = getattr(node, name, None)
                if value.__class__ is list:
                    for item in reversed(value):
                        if isinstance(item, ast.AST):
                            push(item)
                elif isinstance(value, ast.AST):
                    push(value)


def _collects(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id == "dict"
    return isinstance(func, ast.Attribute) and func.attr in _COLLECTING_METHODS


def _mentions(program: Program, record: ast.AST, fields: dict[str, str]) -> set[str]:
    """Which of "title" and "link" `record` mentions (looking at a bounded number of its nodes)."""
    found: set[str] = set()
    stack = [record]
    for _ in range(_MAX_RECORD_NODES):
        if not stack:
            break
        node = stack.pop()
        word: str | None = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 32:
            word = node.value
        elif isinstance(node, ast.Attribute):
            word = node.attr
        elif isinstance(node, ast.keyword):
            word = node.arg
        if word is not None and word.casefold() in fields:
            found.add(fields[word.casefold()])
        stack.extend(program.children(node))
    return found
