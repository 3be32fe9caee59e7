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

Resolution is deliberately flow- and scope-insensitive: a name bound in several places resolves to the
union of what it is bound to (capped at `MAX_QUALNAMES`), plus itself unless every binding is an import.
That over-approximates, which is the safe direction for a guardrail.

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

_SKIP_FIELDS = frozenset({"ctx", "op", "ops"})
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
    return tuple(dict.fromkeys(_canonical(n) for n in names))[:MAX_QUALNAMES]


def _join(bases: tuple[str, ...], attr: str) -> tuple[str, ...]:
    out = []
    for base in bases:
        joined = f"{base}.{attr}"
        out.append(joined if len(joined) <= MAX_QUALNAME_LENGTH else f"{EXPR}.{attr}")
    return _unique(out)


def _child_fields(cls: type[ast.AST]) -> tuple[str, ...]:
    """The fields of `cls` that can hold child nodes, last first (see `Program._walk`)."""
    fields = _FIELDS.get(cls)
    if fields is None:
        fields = _FIELDS[cls] = tuple(f for f in reversed(cls._fields) if f not in _SKIP_FIELDS)
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
        self._parents: dict[ast.AST, ast.AST] = {}
        self._bindings: dict[str, list[Binding]] = {}
        self._order: list[ast.expr] = []
        self._memo: dict[object, tuple[str, ...]] = {}
        self._lines: list[str] | None = None
        self._walk()
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
        return self._parents.get(node)

    def bindings(self, name: str) -> list[Binding]:
        return self._bindings.get(name, [])

    def bound_names(self) -> list[str]:
        return list(self._bindings)

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

    def name_qualnames(self, name: str) -> tuple[str, ...]:
        """What a bare name resolves to."""
        found = self._memo.get(name)
        if found is None:
            found = self.qualnames(ast.Name(id=name, ctx=ast.Load()))
        return found

    def is_called(self, node: ast.AST) -> bool:
        """Whether `node` is the callee of a call expression."""
        parent = self._parents.get(node)
        return isinstance(parent, ast.Call) and parent.func is node

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
        """Pre-order, iterative, in source order: index nodes, bind names, record facts."""
        nodes, parents, handlers, limit = self._nodes, self._parents, _HANDLERS, self.max_depth
        stack: list[tuple[ast.AST, int]] = [(self.tree, 0)]
        while stack:
            node, depth = stack.pop()
            cls = type(node)
            bucket = nodes.get(cls)
            if bucket is None:
                bucket = nodes[cls] = []
            bucket.append(node)
            handler = handlers.get(cls)
            if handler is not None:
                handler(self, node)
            if depth > limit and self.too_deep is None:
                self.too_deep = node
            depth += 1
            for name in _child_fields(cls):  # reversed, so nodes pop in source order
                value = getattr(node, name, None)
                if isinstance(value, list):
                    for item in reversed(value):
                        if isinstance(item, ast.AST):
                            parents[item] = node
                            stack.append((item, depth))
                elif isinstance(value, ast.AST):
                    parents[value] = node
                    stack.append((value, depth))

    def _bind(self, name: str, binding: Binding) -> None:
        bucket = self._bindings.setdefault(name, [])
        if len(bucket) < MAX_BINDINGS:
            bucket.append(binding)
        elif bucket[-1].kind != "opaque":
            bucket[-1] = Binding("opaque")

    def _bind_target(self, target: ast.AST, value: ast.AST | None) -> None:
        """Bind the names in an assignment target; pairwise for ``a, b = x, y``."""
        if isinstance(target, ast.Name):
            self._bind(target.id, Binding("alias", value=value) if value is not None else Binding("opaque"))
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
            self._bind(target.id, Binding("opaque"))
        else:
            self._bind_target(target, None)

    def _bind_arguments(self, args: ast.arguments) -> None:
        positional = [*args.posonlyargs, *args.args]
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        pairs: list[tuple[ast.arg, ast.expr | None]] = list(zip(positional, defaults, strict=True))
        pairs += list(zip(args.kwonlyargs, args.kw_defaults, strict=True))
        for arg, default in pairs:
            self._bind(arg.arg, Binding("opaque"))
            if default is not None:
                self._bind(arg.arg, Binding("alias", value=default))
        for extra in (args.vararg, args.kwarg):
            if extra is not None:
                self._bind(extra.arg, Binding("opaque"))

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
        self._bind_target(node.target, node.value)

    def _on_for(self, node: ast.For | ast.AsyncFor | ast.comprehension) -> None:
        self._bind_loop(node.target, node.iter)

    def _on_with_item(self, node: ast.withitem) -> None:
        if node.optional_vars is not None:
            self._bind_target(node.optional_vars, None)

    def _on_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._bind(node.name, Binding("def", value=node))
        self._bind_arguments(node.args)

    def _on_lambda(self, node: ast.Lambda) -> None:
        self._bind_arguments(node.args)

    def _on_class(self, node: ast.ClassDef) -> None:
        self._bind(node.name, Binding("def", value=node))

    def _on_except(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self._bind(node.name, Binding("opaque"))

    def _on_match_capture(self, node: ast.MatchAs | ast.MatchStar) -> None:
        if node.name:
            self._bind(node.name, Binding("opaque"))

    def _on_match_mapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self._bind(node.rest, Binding("opaque"))

    def _on_match_class(self, node: ast.MatchClass) -> None:
        for name in node.kwd_attrs:
            self._attribute(normalize(name), node, "match pattern")

    def _on_attribute(self, node: ast.Attribute) -> None:
        self._attribute(node.attr, node, "attribute")
        self._order.append(node)

    def _on_reference(self, node: ast.Name | ast.Call) -> None:
        self._order.append(node)

    # ----------------------------------------------------------------------------- resolution

    def _deps(self, key: object) -> list[object]:
        if isinstance(key, str):
            return [b.value for b in self._bindings.get(key, ()) if b.kind == "alias"]
        cls = type(key)
        if cls is ast.Name:
            return [key.id]  # type: ignore[attr-defined]
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
            return memo.get(key.id, (key.id,))
        if isinstance(key, ast.Attribute):
            return _join(memo.get(key.value, (EXPR,)), key.attr)
        if isinstance(key, ast.Call):
            return self._combine_call(key)
        if isinstance(key, ast.Constant):
            return (type(key.value).__name__,)
        if isinstance(key, ast.IfExp | ast.BoolOp | ast.NamedExpr | ast.Starred | ast.Await):
            return _unique([q for dep in self._deps(key) for q in memo.get(dep, (EXPR,))])
        literal = _LITERAL_TYPES.get(type(key))  # type: ignore[arg-type]
        return (literal,) if literal else (EXPR,)

    def _combine_name(self, name: str) -> tuple[str, ...]:
        bindings = self._bindings.get(name)
        if not bindings:
            return (name,)
        out: list[str] = []
        itself = False
        for binding in bindings:
            if binding.kind == "import":
                out.append(binding.target)
            else:
                itself = True
                if binding.kind == "alias":
                    out.extend(self._memo.get(binding.value, ()))
        if itself:
            out.append(name)
        return _unique(out)

    def _combine_call(self, call: ast.Call) -> tuple[str, ...]:
        out: list[str] = []
        for callee in self._memo.get(call.func, (EXPR,)):
            if callee == "getattr" and len(call.args) >= 2 and (name := literal_string(call.args[1])):
                out.extend(_join(self._memo.get(call.args[0], (EXPR,)), name))
            elif callee in IMPORT_FUNCTIONS and call.args and (module := literal_string(call.args[0])):
                out.append(module)
            else:
                out.append(callee + "()")
        return _unique(out)

    def _resolve(self) -> None:
        memo = self._memo
        for node in reversed(self._order):
            if node not in memo:
                self.qualnames(node)
        for call in self.nodes(ast.Call):
            callees = self.qualnames(call.func)
            for callee in callees:
                self.calls.setdefault(callee, []).append(call)
            self._special_call(call, callees)
        refs = self.refs
        for node in self._order:
            if isinstance(node, ast.Attribute) or (isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store)):
                for qualname in memo[node]:
                    refs.setdefault(qualname, []).append(node)

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
                for b in self._bindings.get(node.id, ())
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
    ast.Attribute: Program._on_attribute,
    ast.Name: Program._on_reference,
    ast.Call: Program._on_reference,
}
