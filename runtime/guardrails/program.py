"""Program analysis: the AST is walked once and every name is resolved once; rules only read the facts.

A tool program is a function body, parsed as a module. `Program` indexes it in one iterative walk (no
recursion anywhere, so nesting depth cannot crash the validator) and then resolves each name, attribute
chain and call to *qualified names*:

- import aliases: ``import os as o; o.system`` is ``os.system``; ``from os import path as p`` binds ``p`` to
  ``os.path``; ``import builtins as b; b.eval`` is ``eval``.
- assignment aliases: ``g = getattr`` makes ``g(...)`` a call of ``getattr``; ``t = tool("x")`` makes
  ``t`` a ``tool()`` (a trailing ``()`` means "the result of calling"); ``p = pathlib.Path(x)`` makes
  ``p.write_text`` ``pathlib.Path().write_text``.
- dynamic lookups with literal names: ``getattr(os, "system")`` is ``os.system``; ``__import__("os")`` and
  ``importlib.import_module("os")`` are the module ``os`` (and count as imports).
- literals resolve to their type: ``"".join`` is ``str.join``, ``().__class__`` is ``tuple.__class__``.
  Anything else resolves to ``<expr>``.

Names follow Python's scoping rules (function, class and comprehension scopes, ``global`` and
``nonlocal``), but resolution is deliberately flow-insensitive: a name bound in several places of its scope
resolves to the union of what it is bound to (capped at `MAX_QUALNAMES`), plus itself unless every binding
is an import. That over-approximates, which is the safe direction for a guardrail.

Besides attribute nodes, attribute *reads without an attribute node* are recorded as attribute facts:
literal names given to ``getattr``/``setattr``/``delattr``/``hasattr``/``operator.attrgetter``/
``operator.methodcaller``, replacement fields of literal format strings (``"{0.__class__}".format(x)``)
and keyword attributes of ``match`` class patterns (``case object(__class__=c)``). String literal names
are NFKC-normalized like identifiers (the parser already normalizes identifiers).
"""

from __future__ import annotations

import ast
import string
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload

EXPR = "<expr>"
LAMBDA = "<lambda>"
MAX_QUALNAMES = 16
MAX_QUALNAME_LENGTH = 512
MAX_BINDINGS = 64
MAX_CONSTRUCT = 80
MAX_SOURCE_LINE = 240

#: Functions whose argument at the given index names an attribute of their first argument.
ATTRIBUTE_FUNCTIONS: Mapping[str, int] = {"getattr": 1, "setattr": 1, "delattr": 1, "hasattr": 1}
#: Functions whose string arguments are attribute names (``attrgetter("a.b")`` reads ``a`` then ``b``).
ATTRIBUTE_NAME_FUNCTIONS = frozenset({"operator.attrgetter", "operator.methodcaller"})
#: Functions that import the module named by their first argument.
IMPORT_FUNCTIONS = frozenset({"__import__", "importlib.import_module", "importlib.__import__"})
#: Methods whose literal format string can read attributes through replacement fields.
FORMAT_METHODS = frozenset({"format", "format_map", "vformat"})
_SPECIAL_CALLEES = frozenset(ATTRIBUTE_FUNCTIONS) | ATTRIBUTE_NAME_FUNCTIONS | IMPORT_FUNCTIONS

#: Fields that never hold child nodes: expression contexts, operators, and strings/ints/flags.
_SKIP_FIELDS = frozenset(
    {"ctx", "op", "ops", "id", "attr", "arg", "asname", "module", "level", "kind", "type_comment", "kwd_attrs"}
    | {"rest", "conversion", "is_async", "simple"}
)
_SKIP_FIELDS_OF: Mapping[type[ast.AST], frozenset[str]] = {
    **dict.fromkeys(
        (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.alias, ast.ExceptHandler, ast.MatchAs, ast.MatchStar),
        frozenset({"name"}),
    ),
    **dict.fromkeys((ast.Global, ast.Nonlocal), frozenset({"names"})),
    **dict.fromkeys((ast.Constant, ast.MatchSingleton), frozenset({"value"})),
}
_FIELDS: dict[type[ast.AST], tuple[str, ...]] = {}
_FORMATTER = string.Formatter()
_LITERAL_TYPES: Mapping[type[ast.AST], str] = {
    ast.JoinedStr: "str",
    ast.List: "list",
    ast.ListComp: "list",
    ast.Tuple: "tuple",
    ast.Dict: "dict",
    ast.DictComp: "dict",
    ast.Set: "set",
    ast.SetComp: "set",
    ast.GeneratorExp: "<generator>",
    ast.Lambda: LAMBDA,
}

BindingKind = Literal["import", "alias", "opaque", "def"]
#: `Program._walk`'s dispatch entry for a node class: bucket, flags, handler, child fields.
_ClassInfo = tuple[list[ast.AST], int, "Callable[[Program, Any], None] | None", tuple[str, ...]]
N1 = TypeVar("N1", bound=ast.AST)
N2 = TypeVar("N2", bound=ast.AST)
N3 = TypeVar("N3", bound=ast.AST)


@dataclass(frozen=True, slots=True)
class Binding:
    """How a name gets a value. ``import``: `target` is the qualified name; ``alias``: `value` is the bound
    expression; ``def``: `value` is the function or class definition; ``opaque``: anything else."""

    kind: BindingKind
    target: str = ""
    value: ast.AST | None = None


_OPAQUE = Binding("opaque")


@dataclass(frozen=True, slots=True)
class ImportFact:
    """One imported module. ``names`` holds the names of a ``from`` import (``("*",)`` for a star)."""

    module: str
    names: tuple[str, ...]
    node: ast.AST
    via: str


@dataclass(frozen=True, slots=True)
class AttributeFact:
    """One attribute access by name; ``via`` says how (``attribute``, ``getattr``, ``format string``...)."""

    name: str
    node: ast.AST
    via: str


@dataclass(frozen=True, slots=True)
class Finding:
    """What a matcher reports: where, and the values for the rule's message template."""

    node: ast.AST
    fields: Mapping[str, str] = field(default_factory=dict)


def normalize(name: str) -> str:
    """NFKC-normalize a name given as a string, the way the parser normalizes identifiers."""
    return name if name.isascii() else unicodedata.normalize("NFKC", name)


def _canonical(qualname: str) -> str:
    return qualname[9:] if qualname.startswith("builtins.") else qualname


def _unique(names: list[str]) -> tuple[str, ...]:
    """Canonical and deduplicated, in order; over the cap, the shortest names are kept."""
    if len(names) == 1:
        return (_canonical(names[0]),)
    out = tuple(dict.fromkeys([n[9:] if n.startswith("builtins.") else n for n in names]))  # `_canonical`
    return out if len(out) <= MAX_QUALNAMES else tuple(sorted(out, key=lambda q: (len(q), q))[:MAX_QUALNAMES])


def _join(bases: tuple[str, ...], attr: str) -> tuple[str, ...]:
    if len(bases) == 1:  # the common case, kept cheap
        base = bases[0]
        if base == "builtins":
            return (attr,)
        joined = f"{base}.{attr}"
        return (joined,) if len(joined) <= MAX_QUALNAME_LENGTH else (f"{EXPR}.{attr}",)
    out = []
    for base in bases:
        joined = f"{base}.{attr}"
        out.append(joined if len(joined) <= MAX_QUALNAME_LENGTH else f"{EXPR}.{attr}")
    return _unique(out)


#: Expression types whose qualified names depend on other nodes; all others are fixed by their type.
_DEPENDENT = frozenset(
    {ast.Name, ast.Attribute, ast.Call, ast.IfExp, ast.BoolOp, ast.NamedExpr, ast.Starred, ast.Await}
)


def _static_qualnames(node: ast.AST) -> tuple[str, ...]:
    if isinstance(node, ast.Constant):
        return (type(node.value).__name__,)
    literal = _LITERAL_TYPES.get(type(node))
    return (literal,) if literal else (EXPR,)


def child_fields(cls: type[ast.AST]) -> tuple[str, ...]:
    """The fields of `cls` that can hold child nodes, last first (see `Program._walk`; cached)."""
    fields = _FIELDS.get(cls)
    if fields is None:
        skip = _SKIP_FIELDS | _SKIP_FIELDS_OF.get(cls, frozenset())
        fields = _FIELDS[cls] = tuple(f for f in reversed(cls._fields) if f not in skip)
    return fields


def literal_string(node: ast.AST | None) -> str | None:
    """The value of a ``str`` constant node, NFKC-normalized; ``None`` for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return normalize(node.value)
    return None


def argument(call: ast.Call, position: int | None, keyword: str | None) -> ast.expr | None:
    """The expression passed at `position` or as `keyword`; ``None`` when absent or hidden by ``*``/``**``."""
    if position is not None:
        for index, arg in enumerate(call.args):
            if isinstance(arg, ast.Starred):
                return arg
            if index == position:
                return arg
    if keyword is not None:
        for kw in call.keywords:
            if kw.arg == keyword or kw.arg is None:
                return kw.value
    return None


def format_field_attributes(field_name: str) -> Iterator[str]:
    """Attribute names read by one replacement field: ``0.__class__[1].x`` reads ``__class__`` and ``x``.

    Mirrors CPython's ``formatter_field_name_split``: an attribute name ends at ``.`` or ``[``, an index
    at ``]``.
    """
    rest = field_name
    cut = min((i for i in (rest.find("."), rest.find("[")) if i >= 0), default=-1)
    if cut < 0:
        return
    rest = rest[cut:]
    while rest:
        if rest[0] == ".":
            body = rest[1:]
            end = min((i for i in (body.find("."), body.find("[")) if i >= 0), default=len(body))
            yield normalize(body[:end])
            rest = body[end:]
        elif rest[0] == "[":
            close = rest.find("]")
            if close < 0:
                return
            rest = rest[close + 1 :]
        else:
            return


class Program:
    """A parsed tool program with its facts indexed. Build one per validation; it is not thread-safe."""

    def __init__(self, source: str, tree: ast.Module, *, max_depth: int) -> None:
        self.source = source
        self.tree = tree
        self.max_depth = max_depth
        #: the first node found deeper than `max_depth`, if any
        self.too_deep: ast.AST | None = None
        self.imports: list[ImportFact] = []
        #: attribute facts by (normalized) attribute name
        self.attributes: dict[str, list[AttributeFact]] = {}
        #: name and attribute-chain references by qualified name
        self.refs: dict[str, list[ast.expr]] = {}
        #: calls by the qualified name of the callee
        self.calls: dict[str, list[ast.Call]] = {}
        self._nodes: dict[type[ast.AST], list[ast.AST]] = {}
        self._parents: dict[ast.AST, ast.AST] | None = None  # built on first use, see `parent`
        self._callees: set[ast.AST] = set()  # the `func` of every call
        self._first_generators: set[ast.AST] = set()
        #: assignment targets (``Name`` nodes in a store context), in walk order
        self.stores: list[ast.Name] = []
        self._bindings: dict[str, list[Binding]] = {}  # by binding key, see `binding_key`
        self._raw: dict[tuple[int, str], list[Binding]] = {}  # by (scope, name), during the walk
        self._declared: dict[tuple[int, str], str] = {}  # (scope, name) -> "global" | "nonlocal"
        self._scope_parent: list[int] = [-1]  # scope 0 is the program itself
        self._scope_kind: list[ScopeKind] = ["module"]
        self._inner_scope: dict[ast.AST, int] = {}  # scope-opening node -> the scope it opens
        self._name_scope: dict[ast.AST, int] = {}  # Name node -> the scope it appears in
        self._keys: dict[tuple[int, str], str] = {}
        self._scope = 0  # the scope of the node whose handler runs
        self._order: list[ast.expr] = []  # names, attributes and calls, in pre-order
        self._segments: list[int] = [0]  # where each statement's stretch of `_order` starts
        self._memo: dict[object, tuple[str, ...]] = {}
        self._lines: list[str] | None = None
        self._walk()
        self._finish_bindings()
        self._resolve()

    # ----------------------------------------------------------------- queries used by matchers/plugins

    @overload
    def nodes(self, kind: type[N1], /) -> list[N1]: ...
    @overload
    def nodes(self, kind: type[N1], kind2: type[N2], /) -> list[N1 | N2]: ...
    @overload
    def nodes(self, kind: type[N1], kind2: type[N2], kind3: type[N3], /) -> list[N1 | N2 | N3]: ...
    @overload
    def nodes(self, *kinds: type[ast.AST]) -> list[ast.AST]: ...
    def nodes(self, *kinds: type[ast.AST]) -> list[Any]:
        """Every node of the given types (exact types, not subclasses), in walk order."""
        if len(kinds) == 1:
            return self._nodes.get(kinds[0], [])
        return [node for cls in kinds for node in self._nodes.get(cls, ())]

    def parent(self, node: ast.AST) -> ast.AST | None:
        """The parent of `node`. The map is built by one extra walk the first time a check asks."""
        if self._parents is None:
            parents: dict[ast.AST, ast.AST] = {}
            stack: list[ast.AST] = [self.tree]
            while stack:
                current = stack.pop()
                for child in self.children(current):
                    parents[child] = current
                    stack.append(child)
            self._parents = parents
        return self._parents.get(node)

    def children(self, node: ast.AST) -> list[ast.AST]:
        """The direct child nodes of `node`, in source order (a faster ``ast.iter_child_nodes``)."""
        cls = node.__class__
        fields = _FIELDS.get(cls)
        if fields is None:
            fields = child_fields(cls)
        out: list[ast.AST] = []
        for name in fields:  # last field first
            value = getattr(node, name, None)
            if value.__class__ is list:
                for item in reversed(value):
                    if isinstance(item, ast.AST):
                        out.append(item)
            elif isinstance(value, ast.AST):
                out.append(value)
        out.reverse()
        return out

    def binding_key(self, node: ast.Name) -> str:
        """Which variable a name node refers to under Python's scoping rules: the bare name for the
        program's own (top-level) variables, globals and builtins, ``"<scope>:<name>"`` for locals."""
        return self._key(self._name_scope.get(node, 0), node.id)

    def bindings(self, name: str | ast.Name) -> list[Binding]:
        """How a variable gets its values: by name node, or by binding key (a bare name is top-level)."""
        key = self.binding_key(name) if isinstance(name, ast.Name) else name
        return self._bindings.get(key, [])

    def bindings_by_key(self) -> Mapping[str, list[Binding]]:
        """Every variable's bindings, by binding key (read only)."""
        return self._bindings

    def qualnames(self, node: ast.AST) -> tuple[str, ...]:
        """The qualified names `node` may evaluate to (see the module docstring); never empty."""
        memo = self._memo
        found = memo.get(node)
        if found is not None:
            return found
        stack: list[object] = [node]
        opened: set[object] = set()
        while stack:
            key = stack[-1]
            if key in memo:
                stack.pop()
                continue
            opened.add(key)
            pending = [d for d in self._deps(key) if d not in memo and d not in opened]
            if pending:
                stack.extend(pending)
                continue
            memo[key] = self._combine(key)
            stack.pop()
        return memo[node]

    def is_called(self, node: ast.AST) -> bool:
        """Whether `node` is the callee of a call expression."""
        return node in self._callees

    @property
    def lines(self) -> list[str]:
        if self._lines is None:
            self._lines = self.source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        return self._lines

    def line_text(self, lineno: int) -> str:
        lines = self.lines
        return lines[lineno - 1] if 0 < lineno <= len(lines) else ""

    def column(self, lineno: int, col_offset: int) -> int:
        """The 1-based character column of a UTF-8 byte offset on a line."""
        text = self.line_text(lineno)
        if text.isascii():
            return col_offset + 1
        return len(text.encode("utf-8")[:col_offset].decode("utf-8", "replace")) + 1

    def construct(self, node: ast.AST) -> str:
        """The source text of `node` (first line only), shortened to `MAX_CONSTRUCT` characters."""
        lineno = getattr(node, "lineno", None)
        if lineno is None:
            return ""
        raw = self.line_text(lineno).encode("utf-8")
        start = getattr(node, "col_offset", 0)
        end = getattr(node, "end_col_offset", None) if getattr(node, "end_lineno", None) == lineno else None
        text = raw[start:end].decode("utf-8", "replace").strip()
        if end is None and getattr(node, "end_lineno", lineno) != lineno:
            text += " ..."
        return text if len(text) <= MAX_CONSTRUCT else text[: MAX_CONSTRUCT - 3] + "..."

    # ----------------------------------------------------------------------------------- the walk

    def _walk(self) -> None:
        """Pre-order, iterative, in source order: index nodes, bind names, record facts.

        The hot loop of the engine: one dictionary lookup per node gives everything its class needs (its
        bucket in `_nodes`, what to record, its handler, its child fields; see `_class_info`). After
        `_SKIP_FIELDS`, a field holds a node, a list of nodes (with ``None`` holes in ``Dict.keys`` and
        ``kw_defaults``) or ``None``."""
        infos: dict[type[ast.AST], _ClassInfo] = {}
        limit, order = self.max_depth, self._order
        segments, name_scope, stores, attributes = self._segments, self._name_scope, self.stores, self.attributes
        stack: list[tuple[ast.AST, int, int]] = [(self.tree, 0, 0)]
        push, pop = stack.append, stack.pop
        while stack:
            node, depth, scope = pop()
            cls = node.__class__
            info = infos.get(cls)
            if info is None:
                info = infos[cls] = self._class_info(cls)
            bucket, kind, handler, fields = info
            bucket.append(node)
            if kind:
                if kind & _NAME:
                    name_scope[node] = scope
                    if node.ctx.__class__ is ast.Store:  # type: ignore[attr-defined]
                        stores.append(node)  # type: ignore[arg-type]  # a binding, not a reference
                    else:
                        order.append(node)  # type: ignore[arg-type]
                elif kind & _REFERENCE:
                    order.append(node)  # type: ignore[arg-type]
                    if kind & _ATTRIBUTE:  # an attribute fact, inline (`_attribute`)
                        attr = node.attr  # type: ignore[attr-defined]
                        facts = attributes.get(attr)
                        if facts is None:
                            attributes[attr] = [AttributeFact(attr, node, "attribute")]
                        else:
                            facts.append(AttributeFact(attr, node, "attribute"))
                elif kind & _STATEMENT:
                    segments.append(len(order))
                if kind & _SCOPE:
                    self._open_scope(node, scope)
            if handler is not None:
                self._scope = scope
                handler(self, node)
            if depth > limit and self.too_deep is None:
                self.too_deep = node
            if not fields:  # a leaf (Name, Constant...)
                continue
            depth += 1
            if kind & _EDGE:
                self._push_scoped(node, fields, depth, scope, push)
                continue
            for name in fields:  # reversed, so nodes pop in source order
                value = getattr(node, name, None)
                if value is None:
                    continue
                if value.__class__ is list:
                    for item in reversed(value):
                        if item is not None:
                            push((item, depth, scope))
                else:
                    push((value, depth, scope))

    def _class_info(self, cls: type[ast.AST]) -> _ClassInfo:
        """What `_walk` does with nodes of `cls`: its bucket in `_nodes`, flags, handler, child fields."""
        bucket = self._nodes.setdefault(cls, [])
        kind = 0
        if cls is ast.Name:
            kind |= _NAME
        elif cls in _REFERENCES:
            kind |= _REFERENCE | (_ATTRIBUTE if cls is ast.Attribute else 0)
        elif cls in _STATEMENTS:
            kind |= _STATEMENT
        if cls in _SCOPES:
            kind |= _SCOPE
        if cls in _SCOPE_EDGES:
            kind |= _EDGE
        fields = _FIELDS.get(cls)
        if fields is None:
            fields = child_fields(cls)
        return bucket, kind, _HANDLERS.get(cls), fields

    def _push_scoped(
        self, node: ast.AST, fields: tuple[str, ...], depth: int, scope: int, push: Callable[[Any], None]
    ) -> None:
        """`_walk`'s child loop for nodes whose fields are evaluated in different scopes: a function's body
        and parameters in its own scope, its decorators and defaults outside; a comprehension's first
        iterable outside."""
        cls = node.__class__
        if cls is ast.arguments:
            special, special_scope = _DEFAULT_FIELDS, self._scope_parent[scope]
        elif cls is ast.comprehension:
            special = _ITER_FIELD if node in self._first_generators else frozenset()
            special_scope = self._scope_parent[scope]
        else:  # a scope-opening node: the fields evaluated inside it go to its own scope
            special, special_scope = _SCOPES[cls][1], self._inner_scope[node]
        for name in fields:
            value = getattr(node, name, None)
            if value is None:
                continue
            inner = special_scope if name in special else scope
            if value.__class__ is list:
                if name == "generators" and value:
                    self._first_generators.add(value[0])
                for item in reversed(value):
                    if item is not None:
                        push((item, depth, inner))
            else:
                push((value, depth, inner))

    def _open_scope(self, node: ast.AST, scope: int) -> None:
        self._inner_scope[node] = len(self._scope_parent)
        self._scope_parent.append(scope)
        self._scope_kind.append(_SCOPES[type(node)][0])  # type: ignore[arg-type]

    def _bind(self, name: str, binding: Binding, scope: int | None = None) -> None:
        key = (self._scope if scope is None else scope, name)
        bucket = self._raw.get(key)
        if bucket is None:
            self._raw[key] = [binding]
        elif len(bucket) < MAX_BINDINGS:
            bucket.append(binding)
        elif bucket[-1].kind != "opaque":
            bucket[-1] = _OPAQUE

    def _bind_target(self, target: ast.AST, value: ast.AST | None) -> None:
        """Bind the names in an assignment target; pairwise for ``a, b = x, y``."""
        if isinstance(target, ast.Name):
            self._bind(target.id, Binding("alias", value=value) if value is not None else _OPAQUE)
        elif isinstance(target, ast.Tuple | ast.List):
            pairs = (
                isinstance(value, ast.Tuple | ast.List)
                and len(value.elts) == len(target.elts)
                and not any(isinstance(e, ast.Starred) for e in (*value.elts, *target.elts))
            )
            for index, element in enumerate(target.elts):
                paired = value.elts[index] if pairs and isinstance(value, ast.Tuple | ast.List) else None
                self._bind_target(element, paired)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value, None)

    def _bind_loop(self, target: ast.AST, iterable: ast.AST) -> None:
        """``for m in (a, b)`` binds ``m`` to each element of a literal sequence."""
        if isinstance(target, ast.Name) and isinstance(iterable, ast.Tuple | ast.List | ast.Set):
            for element in iterable.elts:
                if not isinstance(element, ast.Starred):
                    self._bind(target.id, Binding("alias", value=element))
            self._bind(target.id, _OPAQUE)
        else:
            self._bind_target(target, None)

    def _bind_arguments(self, args: ast.arguments, scope: int) -> None:
        positional = [*args.posonlyargs, *args.args]
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        pairs: list[tuple[ast.arg, ast.expr | None]] = list(zip(positional, defaults, strict=True))
        pairs += list(zip(args.kwonlyargs, args.kw_defaults, strict=True))
        for arg, default in pairs:
            self._bind(arg.arg, _OPAQUE, scope)
            if default is not None:
                self._bind(arg.arg, Binding("alias", value=default), scope)
        for extra in (args.vararg, args.kwarg):
            if extra is not None:
                self._bind(extra.arg, _OPAQUE, scope)

    def _attribute(self, name: str, node: ast.AST, via: str) -> None:
        self.attributes.setdefault(name, []).append(AttributeFact(name, node, via))

    def _on_import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.imports.append(ImportFact(alias.name, (), node, "import"))
            if alias.asname:
                self._bind(alias.asname, Binding("import", alias.name))
            else:
                top = alias.name.partition(".")[0]
                self._bind(top, Binding("import", top))

    def _on_import_from(self, node: ast.ImportFrom) -> None:
        module = "." * node.level + (node.module or "")
        names = tuple(alias.name for alias in node.names)
        self.imports.append(ImportFact(module, names, node, "from"))
        for alias in node.names:
            if alias.name != "*":
                base = module if module.endswith(".") else module + "."
                self._bind(alias.asname or alias.name, Binding("import", base + alias.name))

    def _on_assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._bind_target(target, node.value)

    def _on_ann_assign(self, node: ast.AnnAssign) -> None:
        self._bind_target(node.target, node.value)

    def _on_aug_assign(self, node: ast.AugAssign) -> None:
        self._bind_target(node.target, None)

    def _on_named_expr(self, node: ast.NamedExpr) -> None:
        scope = self._scope  # PEP 572: a walrus in a comprehension binds in the enclosing scope
        while self._scope_kind[scope] == "comprehension":
            scope = self._scope_parent[scope]
        self._bind(node.target.id, Binding("alias", value=node.value), scope)

    def _on_for(self, node: ast.For | ast.AsyncFor | ast.comprehension) -> None:
        self._bind_loop(node.target, node.iter)

    def _on_with_item(self, node: ast.withitem) -> None:
        if node.optional_vars is not None:
            self._bind_target(node.optional_vars, None)

    def _on_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._bind(node.name, Binding("def", value=node))
        self._bind_arguments(node.args, self._inner_scope[node])

    def _on_lambda(self, node: ast.Lambda) -> None:
        self._bind_arguments(node.args, self._inner_scope[node])

    def _on_declaration(self, node: ast.Global | ast.Nonlocal) -> None:
        kind = "global" if isinstance(node, ast.Global) else "nonlocal"
        for name in node.names:
            self._declared[(self._scope, name)] = kind

    def _on_class(self, node: ast.ClassDef) -> None:
        self._bind(node.name, Binding("def", value=node))

    def _on_except(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self._bind(node.name, _OPAQUE)

    def _on_match_capture(self, node: ast.MatchAs | ast.MatchStar) -> None:
        if node.name:
            self._bind(node.name, _OPAQUE)

    def _on_match_mapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self._bind(node.rest, _OPAQUE)

    def _on_match_class(self, node: ast.MatchClass) -> None:
        for name in node.kwd_attrs:
            self._attribute(normalize(name), node, "match pattern")

    # ----------------------------------------------------------------------------- resolution

    def _key(self, scope: int, name: str) -> str:
        """The binding key of `name` used or bound in `scope` (cached)."""
        cached = self._keys.get((scope, name))
        if cached is None:
            cached = self._keys[(scope, name)] = self._lookup(scope, name)
        return cached

    def _lookup(self, scope: int, name: str) -> str:
        declared = self._declared.get((scope, name))
        if scope == 0 or declared == "global":
            return name
        if declared is None and (scope, name) in self._raw:
            return f"{scope}:{name}"
        outer = self._scope_parent[scope]
        while outer > 0:  # enclosing functions and comprehensions; class bodies are not visible
            if self._scope_kind[outer] != "class":
                declared = self._declared.get((outer, name))
                if declared == "global":
                    return name
                if declared is None and (outer, name) in self._raw:
                    return f"{outer}:{name}"
            outer = self._scope_parent[outer]
        return name

    def _node_key(self, node: ast.Name) -> str:
        return self._key(self._name_scope.get(node, 0), node.id)

    def _finish_bindings(self) -> None:
        """Group the bindings found during the walk by binding key (``global``/``nonlocal`` applied)."""
        bindings = self._bindings
        for (scope, name), found in self._raw.items():
            key = self._key(scope, name)
            if key in bindings:
                bindings[key] = (bindings[key] + found)[:MAX_BINDINGS]
            else:
                bindings[key] = found

    def _deps(self, key: object) -> list[object]:
        if isinstance(key, str):
            return [b.value for b in self._bindings.get(key, ()) if b.kind == "alias"]
        cls = type(key)
        if cls is ast.Name:
            return [self._node_key(key)]  # type: ignore[arg-type]
        if cls is ast.Attribute:
            return [key.value]  # type: ignore[attr-defined]
        if cls is ast.Call:
            call: ast.Call = key  # type: ignore[assignment]
            if call.func not in self._memo:
                return [call.func]
            if call.args and self._is_getattr(call):
                return [call.args[0]]
            return []
        if cls is ast.IfExp:
            return [key.body, key.orelse]  # type: ignore[attr-defined]
        if cls is ast.BoolOp:
            return list(key.values)  # type: ignore[attr-defined]
        if cls in (ast.NamedExpr, ast.Starred, ast.Await):
            return [key.value]  # type: ignore[attr-defined]
        return []

    def _is_getattr(self, call: ast.Call) -> bool:
        return "getattr" in self._memo[call.func] and len(call.args) >= 2

    def _combine(self, key: object) -> tuple[str, ...]:
        memo = self._memo
        if isinstance(key, str):
            return self._combine_name(key)
        if isinstance(key, ast.Name):
            return memo.get(self._node_key(key), (key.id,))
        if isinstance(key, ast.Attribute):
            return _join(self._known(key.value), key.attr)
        if isinstance(key, ast.Call):
            return self._combine_call(key)
        if isinstance(key, ast.IfExp | ast.BoolOp | ast.NamedExpr | ast.Starred | ast.Await):
            return _unique([q for dep in self._deps(key) for q in self._known(dep)])
        assert isinstance(key, ast.AST)
        return _static_qualnames(key)

    def _known(self, node: object) -> tuple[str, ...]:
        """What `node` resolves to, if resolved or fixed by its type; ``<expr>`` otherwise (a cycle)."""
        found = self._memo.get(node)
        if found is not None:
            return found
        if isinstance(node, ast.AST) and type(node) not in _DEPENDENT:
            return _static_qualnames(node)
        return (EXPR,)

    def _combine_name(self, key: str) -> tuple[str, ...]:
        name = key.rpartition(":")[2]
        bindings = self._bindings.get(key)
        if not bindings:
            return (name,)
        out: list[str] = []
        itself = False
        for binding in bindings:
            if binding.kind == "import":
                out.append(binding.target)
            else:
                itself = True
                value = binding.value
                if binding.kind == "alias" and value is not None:
                    found = self._memo.get(value)
                    if found is None and type(value) not in _DEPENDENT:
                        found = _static_qualnames(value)
                    out.extend(found or ())
        if itself:
            out.append(name)
        return _unique(out)

    def _combine_name_now(self, key: str) -> tuple[str, ...] | None:
        """`_combine_name`, or ``None`` while an expression assigned to the name is not resolved yet, in
        one pass over its bindings: the hot path of `_resolve`."""
        bindings = self._bindings.get(key)
        if not bindings:
            return (key.rpartition(":")[2],)
        memo = self._memo
        out: list[str] = []
        itself = False
        for binding in bindings:
            kind = binding.kind
            if kind == "import":
                out.append(binding.target)
                continue
            itself = True
            value = binding.value
            if kind == "alias" and value is not None:
                found = memo.get(value)
                if found is None:
                    cls = value.__class__
                    if cls in _DEPENDENT:
                        return None
                    found = (type(value.value).__name__,) if cls is ast.Constant else _static_qualnames(value)  # type: ignore[attr-defined]
                out.extend(found)
        if itself:
            out.append(key.rpartition(":")[2])
        return _unique(out)

    def _combine_call(self, call: ast.Call) -> tuple[str, ...]:
        callees = self._known(call.func)
        if len(callees) == 1 and callees[0] not in _SPECIAL_CALLEES:
            return (callees[0] + "()",)
        out: list[str] = []
        for callee in callees:
            if callee == "getattr" and len(call.args) >= 2 and (name := literal_string(call.args[1])):
                out.extend(_join(self._known(call.args[0]), name))
            elif callee in IMPORT_FUNCTIONS and call.args and (module := literal_string(call.args[0])):
                out.append(module)
            else:
                out.append(callee + "()")
        return _unique(out)

    def _resolve(self) -> None:
        """Resolve every reference and index it: calls by callee, names and attributes by qualified name.

        Statement by statement in source order, and within a statement children before parents (its
        reversed pre-order), so each node combines already-resolved parts in constant time; a name is
        resolved once all the expressions assigned to it are. What is left (names used before one of
        their assignments, and cycles) is resolved by `_resolve_names`, then finished."""
        memo, order, refs = self._memo, self._order, self.refs
        keys, name_scope, key_of = self._keys, self._name_scope, self._key
        calls, callee_nodes = self.calls, self._callees
        pending: list[ast.expr] = []
        ends = [*self._segments[1:], len(order)]
        for start, end in zip(self._segments, ends, strict=True):
            for index in range(end - 1, start - 1, -1):
                node = order[index]
                cls = node.__class__
                if cls is ast.Name:
                    scope, name = name_scope[node], node.id  # type: ignore[attr-defined]
                    key = name if scope == 0 else keys.get((scope, name)) or key_of(scope, name)  # see `_lookup`
                    found = memo.get(key)
                    if found is None:
                        found = self._combine_name_now(key)
                        if found is None:
                            pending.append(node)
                            continue
                        memo[key] = found
                    memo[node] = found
                elif cls is ast.Attribute:
                    value = node.value  # type: ignore[attr-defined]
                    base = memo.get(value)
                    if base is None:
                        if value.__class__ in _DEPENDENT:
                            pending.append(node)
                            continue
                        base = _static_qualnames(value)
                    if len(base) == 1 and base[0] != "builtins":
                        joined = f"{base[0]}.{node.attr}"  # type: ignore[attr-defined]
                        found = (joined,) if len(joined) <= MAX_QUALNAME_LENGTH else _join(base, node.attr)  # type: ignore[attr-defined]
                    else:
                        found = _join(base, node.attr)  # type: ignore[attr-defined]
                    memo[node] = found
                elif cls is ast.Call:
                    func = node.func  # type: ignore[attr-defined]
                    callees = memo.get(func)
                    if (
                        callees is not None
                        and len(callees) == 1
                        and callees[0] not in _SPECIAL_CALLEES
                        and not (func.__class__ is ast.Attribute and func.attr in FORMAT_METHODS)
                    ):  # the common case of `_combine_call_now`, inline: one plain callee
                        callee = callees[0]
                        memo[node] = (callee + "()",)
                        callee_nodes.add(func)
                        same_callee = calls.get(callee)
                        if same_callee is None:
                            calls[callee] = [node]  # type: ignore[list-item]
                        else:
                            same_callee.append(node)  # type: ignore[arg-type]
                    elif not self._combine_call_now(node):  # type: ignore[arg-type]
                        pending.append(node)
                    continue
                else:  # IfExp, BoolOp, NamedExpr, Starred, Await: the union of their parts (`_combine`)
                    if not self._combine_union_now(node):
                        pending.append(node)
                    continue
                for qualname in found:  # index a name or attribute reference
                    bucket = refs.get(qualname)
                    if bucket is None:
                        refs[qualname] = [node]
                    else:
                        bucket.append(node)
        if pending:
            self._resolve_pending(pending)

    def _combine_union_now(self, node: ast.expr) -> bool:
        """Resolve ``node`` (a rare kind: IfExp, BoolOp, ...) to the union of its parts if they are resolved."""
        memo = self._memo
        parts: list[str] = []
        for dep in self._deps(node):
            part = memo.get(dep)
            if part is None:
                if dep.__class__ in _DEPENDENT:
                    return False
                part = _static_qualnames(dep)  # type: ignore[arg-type]
            parts.extend(part)
        memo[node] = _unique(parts)
        return True

    def _resolve_pending(self, pending: list[ast.expr]) -> None:
        """Finish what one pass of `_resolve` left: names used before an assignment, and cycles."""
        self._resolve_names()
        for node in pending:
            found = self.qualnames(node)
            if isinstance(node, ast.Call):
                self._index_call(node, self.qualnames(node.func))
            elif isinstance(node, ast.Attribute) or (isinstance(node, ast.Name) and type(node.ctx) is not ast.Store):
                self._index_reference(node, found)

    def _combine_call_now(self, call: ast.Call) -> bool:
        memo, func = self._memo, call.func
        callees = memo.get(func)
        if callees is None:
            if func.__class__ in _DEPENDENT:
                return False
            callees = memo[func] = _static_qualnames(func)
        if call.args and call.args[0] not in memo and self._is_getattr(call):
            return False
        memo[call] = self._combine_call(call)
        self._index_call(call, callees)
        return True

    def _index_reference(self, node: ast.expr, qualnames: tuple[str, ...]) -> None:
        refs = self.refs
        for qualname in qualnames:
            bucket = refs.get(qualname)
            if bucket is None:
                refs[qualname] = [node]
            else:
                bucket.append(node)

    def _index_call(self, call: ast.Call, callees: tuple[str, ...]) -> None:
        self._callees.add(call.func)
        calls = self.calls
        for callee in callees:
            bucket = calls.get(callee)
            if bucket is None:
                calls[callee] = [call]
            else:
                bucket.append(call)
        if not _SPECIAL_CALLEES.isdisjoint(callees) or (
            call.func.__class__ is ast.Attribute and call.func.attr in FORMAT_METHODS
        ):
            self._special_call(call, callees)

    def _resolve_names(self) -> None:
        """Resolve names assigned from other names, dependencies first. Names that depend on each other
        (``a = b; b = a.x``) form a strongly connected component, resolved together to a fixpoint, so the
        result does not depend on the order the program is read in."""
        aliased = {
            name: self._name_dependencies(name)
            for name, bindings in self._bindings.items()
            if name not in self._memo and any(b.kind == "alias" and type(b.value) in _DEPENDENT for b in bindings)
        }
        for component in _components(aliased):
            if len(component) == 1 and component[0] not in aliased[component[0]]:
                self._resolve_name(component[0])
            else:
                self._resolve_cycle(component)

    def _name_dependencies(self, name: str) -> set[str]:
        """The names whose resolution the expressions assigned to `name` depend on."""
        found: set[str] = set()
        stack = [b.value for b in self._bindings[name] if b.kind == "alias" and b.value is not None]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Name):
                found.add(self._node_key(node))
            elif isinstance(node, ast.Attribute | ast.NamedExpr | ast.Starred | ast.Await):
                stack.append(node.value)
            elif isinstance(node, ast.Call):
                stack.append(node.func)
                stack.extend(node.args[:1])  # getattr(x, "name") resolves through x
            elif isinstance(node, ast.IfExp):
                stack.extend((node.body, node.orelse))
            elif isinstance(node, ast.BoolOp):
                stack.extend(node.values)
        return found

    def _resolve_name(self, name: str) -> None:
        for binding in self._bindings[name]:
            if binding.kind == "alias" and binding.value is not None:
                self.qualnames(binding.value)  # every name it depends on is resolved: no cycle here
        self._memo[name] = self._combine_name(name)

    def _resolve_cycle(self, names: list[str]) -> None:
        memo = self._memo
        for name in names:
            bare = name.rpartition(":")[2]
            memo[name] = _unique([b.target for b in self._bindings[name] if b.kind == "import"] + [bare])
        values = [b.value for name in names for b in self._bindings[name] if b.kind == "alias" and b.value]
        for _ in range(MAX_QUALNAMES * len(names) + 1):  # each round adds a name somewhere, or stops
            before = set(memo)
            for value in values:
                self.qualnames(value)
            updated = {name: self._combine_name(name) for name in names}
            for key in set(memo) - before:  # expressions computed from provisional names
                del memo[key]
            if all(set(updated[name]) == set(memo[name]) for name in names):
                break
            memo.update(updated)
        for value in values:
            self.qualnames(value)

    def _special_call(self, call: ast.Call, callees: tuple[str, ...]) -> None:
        """Record attribute reads and imports that happen through a call rather than syntax."""
        for callee in callees:
            if callee in ATTRIBUTE_FUNCTIONS:
                name = literal_string(argument(call, ATTRIBUTE_FUNCTIONS[callee], None))
                if name is not None:
                    self._attribute(name, call, callee)
            elif callee in ATTRIBUTE_NAME_FUNCTIONS:
                literals = call.args if callee == "operator.attrgetter" else call.args[:1]
                for arg in literals:
                    text = literal_string(arg)
                    for part in text.split(".") if text is not None else ():
                        self._attribute(part, call, callee)
            elif callee in IMPORT_FUNCTIONS:
                module = literal_string(argument(call, 0, "name"))
                if module is not None:
                    self.imports.append(ImportFact(module, (), call, callee))
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr in FORMAT_METHODS:
            templates = self._string_values(func.value)
            if not templates and call.args:
                templates = self._string_values(call.args[0])
            for template in templates:
                self._format_fields(template, call, 0)

    def _string_values(self, node: ast.AST) -> list[str]:
        """String literals `node` may be: itself, or what a name is assigned."""
        if isinstance(node, ast.Constant):
            return [node.value] if isinstance(node.value, str) else []
        if isinstance(node, ast.Name):
            return [
                b.value.value
                for b in self._bindings.get(self._node_key(node), ())
                if b.kind == "alias" and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)
            ]
        return []

    def _format_fields(self, template: str, node: ast.AST, depth: int) -> None:
        try:
            parsed = list(_FORMATTER.parse(template))
        except ValueError:
            return  # str.format would raise too
        for _literal, field_name, spec, _conversion in parsed:
            if field_name:
                for name in format_field_attributes(field_name):
                    self._attribute(name, node, "format string")
            if spec and depth < 2 and "{" in spec:
                self._format_fields(spec, node, depth + 1)


_HANDLERS: Mapping[type[ast.AST], Callable[[Program, Any], None]] = {
    ast.Import: Program._on_import,
    ast.ImportFrom: Program._on_import_from,
    ast.Assign: Program._on_assign,
    ast.AnnAssign: Program._on_ann_assign,
    ast.AugAssign: Program._on_aug_assign,
    ast.NamedExpr: Program._on_named_expr,
    ast.For: Program._on_for,
    ast.AsyncFor: Program._on_for,
    ast.comprehension: Program._on_for,
    ast.withitem: Program._on_with_item,
    ast.FunctionDef: Program._on_function,
    ast.AsyncFunctionDef: Program._on_function,
    ast.Lambda: Program._on_lambda,
    ast.ClassDef: Program._on_class,
    ast.ExceptHandler: Program._on_except,
    ast.MatchAs: Program._on_match_capture,
    ast.MatchStar: Program._on_match_capture,
    ast.MatchMapping: Program._on_match_mapping,
    ast.MatchClass: Program._on_match_class,
    ast.Global: Program._on_declaration,
    ast.Nonlocal: Program._on_declaration,
}
#: What `_resolve` resolves: references, and the expressions whose value is one of several references.
_REFERENCES = frozenset(
    {ast.Name, ast.Attribute, ast.Call, ast.IfExp, ast.BoolOp, ast.NamedExpr, ast.Starred, ast.Await}
)
#: Nodes that open a scope, its kind, and the fields evaluated inside it (the others are evaluated outside).
_SCOPES: Mapping[type[ast.AST], tuple[str, frozenset[str]]] = {
    ast.FunctionDef: ("function", frozenset({"args", "body"})),
    ast.AsyncFunctionDef: ("function", frozenset({"args", "body"})),
    ast.Lambda: ("function", frozenset({"args", "body"})),
    ast.ClassDef: ("class", frozenset({"body"})),
    ast.ListComp: ("comprehension", frozenset({"elt", "generators"})),
    ast.SetComp: ("comprehension", frozenset({"elt", "generators"})),
    ast.GeneratorExp: ("comprehension", frozenset({"elt", "generators"})),
    ast.DictComp: ("comprehension", frozenset({"key", "value", "generators"})),
}
_DEFAULT_FIELDS = frozenset({"defaults", "kw_defaults"})
_ITER_FIELD = frozenset({"iter"})
#: Nodes some of whose fields are evaluated in the enclosing scope (see `Program._push_scoped`).
_SCOPE_EDGES = frozenset({*_SCOPES, ast.arguments, ast.comprehension})
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
ScopeKind = Literal["module", "function", "class", "comprehension"]
_STATEMENTS = frozenset(cls for cls in vars(ast).values() if isinstance(cls, type) and issubclass(cls, ast.stmt))
#: `Program._walk`'s per-class flags.
_NAME, _REFERENCE, _STATEMENT, _SCOPE, _EDGE, _ATTRIBUTE = 1, 2, 4, 8, 16, 32


def _components(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of `graph` (edges to unknown nodes ignored), dependencies first
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(sorted(component))
    return out
