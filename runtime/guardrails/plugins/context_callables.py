"""``context`` is the tool's state: it is committed as JSON after a successful run."""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator, Set

from pydantic import BaseModel, ConfigDict, Field

from sandforge.runtime.guardrails.plugins import register
from sandforge.runtime.guardrails.program import LAMBDA, Finding, Program

BUILTIN_CALLABLES = frozenset(name for name in dir(builtins) if callable(getattr(builtins, name)))
_ROOT_HOPS = 8
_REACHING = (ast.Name, ast.Subscript, ast.Attribute, ast.Call)
_MAX_VALUE_NODES = 256


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    roots: list[str] = Field(default_factory=lambda: ["context"], min_length=1)
    methods: list[str] = Field(
        default_factory=lambda: ["update", "setdefault", "append", "extend", "insert", "add", "__setitem__"]
    )
    factories: list[str] = Field(default_factory=lambda: ["tool", "delegate"])


@register("callable_in_context", options=Options, fields=("value",))
def callable_in_context(program: Program, options: Options) -> Iterator[Finding]:
    """Storing a callable or another object that is not JSON into ``context`` (or anything reached from
    it, such as ``context["tools"]``): lambdas, functions and classes defined by the program, builtins
    such as ``print``, generators, modules, and objects returned by ``tool(...)``/``delegate(...)``.
    Covers item and attribute assignment (``context["tools"]["x"] = f``), mutating methods
    (``context.update(f=f)``, ``context.setdefault("tools", {})``...) and aliases
    (``tools = context["tools"]; tools["x"] = f``).

    Context crosses the sandbox boundary as JSON and is committed as the tool's persistent state; a
    callable cannot be serialized, so the commit fails after the work was done, or tool definitions leak
    into state instead of going through ``tool()``/``delegate()``.
    """
    roots = frozenset(options.roots)
    if not any(root in program.refs for root in roots):
        return  # the program never touches context
    aliases = _context_aliases(program, roots)
    factories = frozenset(f"{factory}()" for factory in options.factories)
    methods = frozenset(options.methods)

    def rooted(node: ast.AST) -> bool:
        return _is_rooted(program, node, roots, aliases)

    for node in program.nodes(ast.Assign, ast.AugAssign, ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        stored: list[ast.expr] = [
            t for t in targets if isinstance(t, ast.Subscript | ast.Attribute) and rooted(t.value)
        ]
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id in roots:
            stored.append(node.target)
        if stored and node.value is not None:
            for value in _non_json(program, node.value, factories):
                yield Finding(value, {"value": program.construct(value)})
    for call in program.nodes(ast.Call):
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in methods and rooted(func.value):
            for arg in [*call.args, *(kw.value for kw in call.keywords)]:
                for value in _non_json(program, arg, factories):
                    yield Finding(value, {"value": program.construct(value)})


def _context_aliases(program: Program, roots: frozenset[str]) -> frozenset[str]:
    """Binding keys of variables assigned something reached from a root (``tools = context["tools"]``),
    up to `_ROOT_HOPS` assignments away. Each assigned value is traced to the name it is reached from
    once; the hops then only compare binding keys."""
    direct: set[str] = set()  # assigned something reached from a root name itself
    through: dict[str, set[str]] = {}  # assigned something reached from these variables
    for key, bindings in program.bindings_by_key().items():
        for binding in bindings:
            if binding.kind != "alias" or not isinstance(binding.value, _REACHING):
                continue
            base = _base_name(binding.value)
            if base is None:
                continue
            if base.id in roots:
                direct.add(key)
            else:
                through.setdefault(key, set()).add(program.binding_key(base))
    aliases: set[str] = set()
    for _ in range(_ROOT_HOPS):  # the same rounds as `_is_rooted` applied to every value with `aliases`
        grown = {key for key in direct if key not in aliases}
        grown.update(key for key, sources in through.items() if key not in aliases and not sources.isdisjoint(aliases))
        if not grown:
            break
        aliases |= grown
    return frozenset(aliases)


def _base_name(node: ast.AST) -> ast.Name | None:
    """The name `node` is reached from by items, attributes and ``.get``/``.setdefault`` (see
    `_is_rooted`), if it is reached from a name."""
    while True:
        if isinstance(node, ast.Subscript | ast.Attribute):
            node = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "setdefault")
        ):
            node = node.func.value
        else:
            return node if isinstance(node, ast.Name) else None


def _is_rooted(program: Program, node: ast.AST, roots: frozenset[str], aliases: Set[str]) -> bool:
    """Whether `node` is a root name (in any scope), an alias of one, or reached from one by items,
    attributes and ``.get``/``.setdefault``."""
    while True:
        if isinstance(node, ast.Subscript | ast.Attribute):
            node = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "setdefault")
        ):
            node = node.func.value
        else:
            return isinstance(node, ast.Name) and (node.id in roots or program.binding_key(node) in aliases)


def _non_json(program: Program, value: ast.AST, factories: frozenset[str]) -> Iterator[ast.AST]:
    """The parts of a stored value that certainly are not JSON, looking through container literals."""
    stack = [value]
    seen = 0
    while stack and seen < _MAX_VALUE_NODES:
        node = stack.pop()
        seen += 1
        if isinstance(node, ast.Dict):
            stack.extend(v for v in node.values if v is not None)
        elif isinstance(node, ast.List | ast.Tuple | ast.Set):
            stack.extend(node.elts)
        elif isinstance(node, ast.Starred):
            stack.append(node.value)
        elif isinstance(node, ast.IfExp):
            stack.extend((node.body, node.orelse))
        elif isinstance(node, ast.BoolOp):
            stack.extend(node.values)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("dict", "list"):
            stack.extend([*node.args, *(kw.value for kw in node.keywords)])
        elif isinstance(node, ast.Lambda | ast.GeneratorExp) or _is_callable(program, node, factories):
            yield node


def _is_callable(program: Program, node: ast.AST, factories: frozenset[str]) -> bool:
    if isinstance(node, ast.Call):
        return bool(factories.intersection(program.qualnames(node)))
    if not isinstance(node, ast.Name):
        return False
    bindings = program.bindings(node)
    if not bindings:
        return node.id in BUILTIN_CALLABLES
    qualnames = program.qualnames(node)
    return any(
        b.kind == "def" or (b.kind == "import" and b.target.partition(".")[0] == node.id) for b in bindings
    ) or bool({LAMBDA, *factories}.intersection(qualnames))
