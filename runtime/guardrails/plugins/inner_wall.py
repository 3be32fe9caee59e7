"""The outer wall's view of the runner's inner wall (``sandbox/inside/``: ``world`` and ``compilation``,
docs/security.md "The inner wall's real guarantees"): what the runner withholds or refuses, flagged before
anything runs, from the same tables and the same annotation check, so the two walls cannot drift apart."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field

from sandforge.runtime.guardrails.globs import GlobSet
from sandforge.runtime.guardrails.plugins import register
from sandforge.runtime.guardrails.program import Finding, Program, normalize
from sandforge.sandbox.inside import compilation, lowering, world


class DunderOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    names: list[str] = Field(default_factory=lambda: ["__*__"], description="string values to flag (globs)")
    allowed: list[str] = Field(
        default_factory=lambda: sorted(lowering.READ_ONLY_NAMES),
        description="string values never flagged (by default the names the runner lets programs read and "
        "never set: getattr(f, '__name__', '?'))",
    )


@register("dunder_string_argument", options=DunderOptions, fields=("value",))
def dunder_string_argument(program: Program, options: DunderOptions) -> Iterator[Finding]:
    """A string constant naming a double-underscore attribute (``"__globals__"``) anywhere in a call's
    arguments: positional or keyword, inside tuples, lists, dicts and expressions, at any depth
    (``update_wrapper(f, g, updated=("__globals__",))``, ``f(**{"__class__": c})``).

    Standard-library helpers read, copy and set attributes by names given as data (``functools.update_wrapper``
    copied a module's ``__globals__`` into the program's, outside RestrictedPython's attribute guard). A
    dunder name is never data a tool needs to pass, so every one in a call is refused, not only ``getattr``'s.
    """
    flagged = GlobSet(options.names)
    allowed = GlobSet(options.allowed)
    default = options.names == ["__*__"]
    if default and program.source.isascii() and "__" not in program.source:
        return  # the common case: no dunder-looking string can be in the program at all
    for node in program.nodes(ast.Constant):
        raw = node.value
        if type(raw) is not str or (default and raw.isascii() and not (raw.startswith("__") and raw.endswith("__"))):
            continue
        value = normalize(raw)
        if not flagged.matches(value) or allowed.matches(value):
            continue
        child: ast.AST = node
        parent = program.parent(node)
        while parent is not None and not isinstance(parent, ast.stmt):
            if isinstance(parent, ast.Call) and child is not parent.func:
                yield Finding(node, {"value": value})
                break
            child, parent = parent, program.parent(parent)


@register("private_attribute", fields=("attribute",))
def private_attribute(program: Program, options: BaseModel) -> Iterator[Finding]:
    """A single-underscore attribute (``_name``) of an imported module or of an object a library made:
    ``random._os``, ``getattr(random, "_os")``, ``random.Random()._randbelow``, and any in a format
    string's replacement field. Not the program's own objects and classes (``self._balance``,
    ``cls._registry``) nor namedtuple's documented API (``p._asdict()``, ``urlparse(u)._replace(...)``).

    The runner decides each ``_name`` read and write at run time by the object's class
    (``sandbox.inside.guards.private_allowed``): allowed on the program's own objects and classes, refused
    on everything else (modules keep dangerous objects under such names: ``random._os`` is ``os``). This
    check flags ahead of time the reads whose object the program imported or got from a library call.
    """
    imported = {fact.module.lstrip(".").split(".")[0] for fact in program.imports}
    for name, facts in program.attributes.items():
        if not lowering.is_private(name):
            continue
        for fact in facts:
            if fact.via == "format string":
                yield Finding(fact.node, {"attribute": name})
                continue
            node = fact.node
            receiver = node.value if isinstance(node, ast.Attribute) else node.args[0] if (
                isinstance(node, ast.Call) and node.args) else None  # fmt: skip
            if receiver is None or name in lowering.NAMEDTUPLE_API:
                continue
            roots = {qualname.split(".")[0].split("(")[0] for qualname in program.qualnames(receiver)}
            if roots & imported:
                yield Finding(node, {"attribute": name})


@register("string_annotation")
def string_annotation(program: Program, options: BaseModel) -> Iterator[Finding]:
    """A string (or f-string) in an annotation: ``def f(x: "Node")``, ``items: list["Item"]``, a return
    annotation. ``Literal[...]`` values and ``Annotated[type, ...]`` metadata are data and not flagged.

    Not in the default policy (issue 38): the runner keeps string annotations as strings, and the helpers
    that evaluate them with ``eval()`` (``typing.get_type_hints``, ``ForwardRef``, ``functools.singledispatch``;
    one reached ``os`` that way) are withheld. A deployment that wants forward references refused anyway
    adds a rule with this plugin (the check is ``sandbox.inside.compilation.string_in_annotation``).
    """
    for node in program.nodes(ast.FunctionDef, ast.AsyncFunctionDef, ast.AnnAssign):
        if isinstance(node, ast.AnnAssign):
            annotations: list[ast.expr | None] = [node.annotation]
        else:
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            annotations = [a.annotation for a in every if a is not None] + [node.returns]
        for annotation in annotations:
            part = compilation.string_in_annotation(annotation)
            if part is not None:
                yield Finding(part, {})


class FileOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    keywords: dict[str, list[str]] = Field(
        default_factory=lambda: {"xml.etree.ElementTree.canonicalize": ["from_file"]},
        description="qualified function -> keyword arguments that name a file to open",
    )


@register("file_argument", options=FileOptions, fields=("function", "keyword"))
def file_argument(program: Program, options: FileOptions) -> Iterator[Finding]:
    """A path or descriptor given where a function would open it: ``ET.canonicalize(from_file="/etc/passwd")``
    or ``from_file=3``. Anything but a reader object built by a call (``from_file=csv.StringIO(text)``) or a
    name bound only to such calls is flagged.

    The real ``canonicalize`` opens any path or descriptor it is given (a program read ``/etc/passwd`` and
    closed the result channel with ``from_file=3``); the runner's version takes only objects with a
    ``read()`` method. Pass the text itself (``canonicalize(xml_data=text)``).
    """
    for function, keywords in options.keywords.items():
        for call in program.calls.get(function, []):
            for kw in call.keywords:
                if kw.arg in keywords and not _reader(program, kw.value):
                    yield Finding(kw.value, {"function": function, "keyword": kw.arg})


def _reader(program: Program, value: ast.expr) -> bool:
    if isinstance(value, ast.Call):
        return True
    if isinstance(value, ast.Name):
        bindings = program.bindings(value)
        return bool(bindings) and all(b.kind == "alias" and isinstance(b.value, ast.Call) for b in bindings)
    return False


class WithheldOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    extra: list[str] = Field(default_factory=list, description="more qualified names to treat as withheld")


def withheld_qualnames() -> dict[str, str]:
    """Every name the runner withholds, as ``module.name`` -> the reason the runner gives."""
    names: dict[str, str] = {}
    for module in world.ALLOWED_MODULES:
        for name, reason in world.withheld(module).items():
            names[f"{module}.{name}"] = reason
    return names


@register("withheld_import", options=WithheldOptions, fields=("name", "reason"))
def withheld_import(program: Program, options: WithheldOptions) -> Iterator[Finding]:
    """Imports of and references to names the sandbox runner withholds from an allowed module
    (``from functools import update_wrapper``, ``functools.singledispatch``, ``json.load``,
    ``xml.etree.ElementTree.parse``...), read from the runner's own tables (``ALLOWED_MODULES``,
    ``WITHHELD_NAMES``), and ``functools.wraps`` given ``assigned=`` or ``updated=``.

    The runner's module proxies do not carry these names: each was withheld by the audit in
    docs/security.md because it reads or sets attributes by caller-chosen names, evaluates strings,
    opens files or descriptors, or changes process-wide state. Using one ends the run as a sandbox
    violation, even when the program catches the error.
    """
    withheld = withheld_qualnames()
    for name in options.extra:
        withheld.setdefault(name, "withheld by the policy")
    for name, reason in withheld.items():
        for node in program.refs.get(name, []):
            yield Finding(node, {"name": name, "reason": reason})
    for fact in program.imports:
        for imported in fact.names:
            name = f"{fact.module}.{imported}"
            if name in withheld:
                yield Finding(fact.node, {"name": name, "reason": withheld[name]})
    for call in program.calls.get("functools.wraps", []):
        for kw in call.keywords:
            if kw.arg in ("assigned", "updated"):
                yield Finding(
                    kw.value, {"name": f"functools.wraps({kw.arg}=...)", "reason": "it copies attributes by name"}
                )
