"""Compiled matchers: one small class per declarative kind. Each reads `Program`'s resolved facts; none
walks the AST itself, so every rule costs about the number of distinct names it could match.

The class docstrings are what ``sandforge policy explain`` shows under "How it matches".
"""

from __future__ import annotations

import ast
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ValidationError

from sandforge.runtime.guardrails import policy_model as pm
from sandforge.runtime.guardrails.globs import GlobSet
from sandforge.runtime.guardrails.plugins import Plugin, builtin_plugins, get_plugin
from sandforge.runtime.guardrails.program import Finding, Program, argument, literal_string


@dataclass(frozen=True, slots=True)
class Analysis:
    """What a matcher sees: the program, and (for rules) the capabilities it was found to use."""

    program: Program
    capabilities: Mapping[str, list[Finding]]
    granted: frozenset[str]


class Matcher(ABC):
    """A compiled matcher. `fields` are the message-template fields its findings provide."""

    kind: ClassVar[str]
    fields: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    def find(self, analysis: Analysis) -> Iterator[Finding]: ...

    @abstractmethod
    def describe(self) -> str:
        """One line for ``policy explain``: what this matcher looks for."""

    def template_fields(self) -> frozenset[str]:
        return self.fields | {"construct"}

    @classmethod
    def documentation(cls) -> str:
        return inspect.getdoc(cls) or ""


def _listing(globs: GlobSet, limit: int = 12) -> str:
    shown = ", ".join(globs.patterns[:limit])
    return shown + (f", ... ({len(globs.patterns)} in all)" if len(globs.patterns) > limit else "")


def _except(globs: GlobSet) -> str:
    return f" (except {_listing(globs, 6)})" if globs else ""


def _packages(module: str) -> list[str]:
    """``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``; a relative ``..x`` stays whole."""
    if module.startswith("."):
        return [module]
    parts = module.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts) + 1)]


def _member(module: str, name: str) -> str:
    return module + name if module.endswith(".") else f"{module}.{name}"


class ImportMatcher(Matcher):
    """Imports of a module or of anything inside it: ``os`` matches ``import os``, ``import os.path as p``,
    ``from os import path`` and ``__import__("os")``. ``except`` works the same way; a ``from a import b, c``
    is exempt when ``a`` is, or when ``a.b`` and ``a.c`` all are. Relative imports are ``.name``."""

    kind = "import"
    fields = frozenset({"module"})

    def __init__(self, spec: pm.ImportMatch) -> None:
        self.modules = GlobSet(spec.modules)
        self.exempt = GlobSet(spec.except_)
        self.spec_except = list(spec.except_)
        self.granted_exempt = {tag: list(globs) for tag, globs in spec.except_granted.items()}

    def describe(self) -> str:
        granted = "".join(
            f" (and, where {tag} is granted, {', '.join(globs)})" for tag, globs in sorted(self.granted_exempt.items())
        )
        return f"imports of {_listing(self.modules)}{_except(self.exempt)}{granted}"

    def find(self, analysis: Analysis) -> Iterator[Finding]:
        exempt = self.exempt
        extra = [glob for tag, globs in self.granted_exempt.items() if tag in analysis.granted for glob in globs]
        if extra:
            exempt = GlobSet([*self.spec_except, *extra])
        for fact in analysis.program.imports:
            members = [_member(fact.module, name) for name in fact.names if name != "*"]
            matched = self._covers(self.modules, fact.module, members, any)
            if matched and not (exempt and self._covers(exempt, fact.module, members, all)):
                shown = members[0] if fact.module.endswith(".") and members else fact.module
                yield Finding(fact.node, {"module": shown})

    @staticmethod
    def _covers(globs: GlobSet, module: str, members: list[str], combine: Callable[[Iterable[bool]], bool]) -> bool:
        """Whether `globs` covers the module itself, else `combine` (any/all) of its imported members."""
        if any(globs.matches(package) for package in _packages(module)):
            return True
        return bool(members) and combine(any(globs.matches(p) for p in _packages(m)) for m in members)


class NameMatcher(Matcher):
    """References (not only calls) whose qualified name matches, after import and assignment aliases are
    resolved: ``eval`` matches ``f = eval``; ``os.system`` matches ``o.system`` after ``import os as o``."""

    kind = "name"
    fields = frozenset({"name"})

    def __init__(self, spec: pm.NameMatch) -> None:
        self.names = GlobSet(spec.names)
        self.exempt = GlobSet(spec.except_)

    def describe(self) -> str:
        return f"references to {_listing(self.names)}{_except(self.exempt)}"

    def find(self, analysis: Analysis) -> Iterator[Finding]:
        for name, nodes in self.names.select(analysis.program.refs):
            if not self.exempt.matches(name):
                for node in nodes:
                    yield Finding(node, {"name": name})


class AttributeMatcher(Matcher):
    """Attribute accesses by attribute name, whatever the object, including reads without an attribute
    node: literal names given to getattr/setattr/delattr/hasattr/attrgetter/methodcaller, replacement
    fields of literal format strings, and keyword attributes of ``match`` class patterns."""

    kind = "attribute"
    fields = frozenset({"attribute"})

    def __init__(self, spec: pm.AttributeMatch) -> None:
        self.names = GlobSet(spec.names)
        self.exempt = GlobSet(spec.except_)
        self.exempt_super = GlobSet(spec.except_super)
        self.exempt_then = GlobSet(spec.except_then)

    def describe(self) -> str:
        return f"attributes named {_listing(self.names)}{_except(self.exempt)}"

    def find(self, analysis: Analysis) -> Iterator[Finding]:
        program = analysis.program
        for name, facts in self.names.select(program.attributes):
            if not self.exempt.matches(name):
                super_exempt = self.exempt_super.matches(name)
                for fact in facts:
                    if super_exempt and _reads_super(fact.node):
                        continue
                    if self.exempt_then and self._read_only_for_exempt(program, fact.node):
                        continue
                    yield Finding(fact.node, {"attribute": name})

    def _read_only_for_exempt(self, program: Program, node: ast.AST) -> bool:
        """``x.__class__.__name__``: an attribute node whose value is only read for an ``except_then`` name."""
        parent = program.parent(node)
        return (
            isinstance(node, ast.Attribute)
            and isinstance(parent, ast.Attribute)
            and parent.value is node
            and isinstance(parent.ctx, ast.Load)
            and self.exempt_then.matches(parent.attr)
        )


def _reads_super(node: ast.AST) -> bool:
    """``super().name`` or ``super(C, self).name``: an attribute read from a ``super()`` call."""
    value = getattr(node, "value", None) if isinstance(node, ast.Attribute) else None
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


class CallMatcher(Matcher):
    """Calls whose callee's qualified name matches (aliases resolved), optionally only with at least
    ``min_args`` positional arguments, or when one argument is a string literal matching ``values``
    (an absent argument tests ``missing``; a computed one matches only with ``match_computed``)."""

    kind = "call"
    fields = frozenset({"function"})

    def __init__(self, spec: pm.CallMatch) -> None:
        self.functions = GlobSet(spec.functions)
        self.argument = spec.argument
        self.values = GlobSet(spec.argument.values) if spec.argument else None
        self.min_args = spec.min_args
        self.unless = spec.unless
        self.unless_values = GlobSet(spec.unless.values) if spec.unless else None

    def describe(self) -> str:
        text = f"calls of {_listing(self.functions)}"
        if self.min_args:
            text += f" with at least {self.min_args} arguments"
        if self.argument is not None and self.values is not None:
            where = " / ".join(
                part
                for part in (
                    f"argument {self.argument.position}" if self.argument.position is not None else "",
                    f"keyword {self.argument.keyword}" if self.argument.keyword else "",
                )
                if part
            )
            text += f" where {where} matches {_listing(self.values, 6)}"
        if self.unless_values is not None:
            text += f", unless it opens {_listing(self.unless_values, 6)}"
        return text

    def find(self, analysis: Analysis) -> Iterator[Finding]:
        program = analysis.program
        for function, calls in self.functions.select(program.calls):
            for call in calls:
                if isinstance(call.func, ast.Name) and _program_defined(program, call.func):
                    continue  # the program's own ``def fetch(...)``, not the builtin of that name
                if self._accepts(call):
                    yield Finding(call, {"function": function})

    def _accepts(self, call: ast.Call) -> bool:
        starred = any(isinstance(a, ast.Starred) for a in call.args)
        if self.min_args is not None and len(call.args) < self.min_args and not starred:
            return False
        if self.unless is not None and self.unless_values is not None:
            exempt = argument(call, self.unless.position, self.unless.keyword)
            if exempt is not None and (text := literal_string(exempt)) is not None and self.unless_values.matches(text):
                return False
        condition = self.argument
        if condition is None or self.values is None:
            return True
        node = argument(call, condition.position, condition.keyword)
        if node is None:
            return condition.missing is not None and self.values.matches(condition.missing)
        value = literal_string(node)
        if value is None:
            return condition.match_computed
        return self.values.matches(value)


class DynamicMatcher(Matcher):
    """Dynamic evaluation: every reference to an evaluator (calls, but also ``f = eval`` or ``@exec``),
    and every use of an attribute-by-name function (``getattr``...) whose name argument is not a string
    literal, or that is referenced without being called (so its arguments cannot be seen)."""

    kind = "dynamic"
    fields = frozenset({"name"})

    def __init__(self, spec: pm.DynamicMatch) -> None:
        self.evaluators = GlobSet(spec.evaluators)
        self.computed_names = dict(spec.computed_names)

    def describe(self) -> str:
        parts = [f"references to {_listing(self.evaluators)}"] if self.evaluators else []
        if self.computed_names:
            parts.append(f"{', '.join(self.computed_names)} with a computed name")
        return "; ".join(parts)

    def find(self, analysis: Analysis) -> Iterator[Finding]:
        program = analysis.program
        for name, nodes in self.evaluators.select(program.refs):
            for node in nodes:
                yield Finding(node, {"name": name})
        for function, index in self.computed_names.items():
            for call in program.calls.get(function, ()):
                if literal_string(argument(call, index, None)) is None:
                    yield Finding(call, {"name": function})
            for node in program.refs.get(function, ()):
                if not program.is_called(node):
                    yield Finding(node, {"name": function})


class DecoratorMatcher(Matcher):
    """Decorators: ``@d`` calls ``d`` with the decorated function or class, with no call node. A decorator
    is named by its qualified name (``@f(...)`` by ``f``'s); other expressions are ``<expr>``."""

    kind = "decorator"
    fields = frozenset({"decorator"})

    def __init__(self, spec: pm.DecoratorMatch) -> None:
        self.names = GlobSet(spec.names)
        self.exempt = GlobSet(spec.except_)
        self.exempt_defined = spec.except_defined

    def describe(self) -> str:
        defined = " and those the program defines" if self.exempt_defined else ""
        return f"decorators {_listing(self.names)}{_except(self.exempt)}{defined}"

    def find(self, analysis: Analysis) -> Iterator[Finding]:
        program = analysis.program
        for definition in program.nodes(ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef):
            for decorator in definition.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if self.exempt_defined and _program_defined(program, target):
                    continue
                names = program.qualnames(target)
                if any(self.exempt.matches(n) for n in names):
                    continue
                matched = self.names.first_match(names)
                if matched is not None:
                    yield Finding(decorator, {"decorator": matched})


def _program_defined(program: Program, target: ast.expr) -> bool:
    """A decorator the program defines itself: a name bound only by its own ``def``/``class`` statements
    (``@memoize``), or an attribute of such a class (``@Registry.register``). Calling one runs the program's
    own restricted code, nothing a library does implicitly. A method must be defined in the class's own
    body (``@R.register`` of an ``abc.ABC`` subclass is ``ABCMeta.register``, the library's)."""
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
        bindings = program.bindings(target.value)
        return bool(bindings) and all(
            isinstance(b.value, ast.ClassDef)
            and any(isinstance(s, ast.FunctionDef) and s.name == target.attr for s in b.value.body)
            for b in bindings
        )
    if isinstance(target, ast.Name):
        bindings = program.bindings(target)
        return bool(bindings) and all(b.kind == "def" for b in bindings)
    return False


class DefinitionMatcher(Matcher):
    """Names the program defines with ``def``, ``class`` or an assignment (``__match_args__ = ...`` in a
    class body defines a hook as surely as ``def __getattr__``)."""

    kind = "definition"
    fields = frozenset({"name"})

    def __init__(self, spec: pm.DefinitionMatch) -> None:
        self.names = GlobSet(spec.names)
        self.exempt = GlobSet(spec.except_)
        self.of = frozenset(spec.of)

    def describe(self) -> str:
        return f"{'/'.join(sorted(self.of))} definitions named {_listing(self.names)}{_except(self.exempt)}"

    def find(self, analysis: Analysis) -> Iterator[Finding]:
        program = analysis.program
        candidates: list[tuple[str, ast.AST]] = []
        if "function" in self.of:
            candidates += [(n.name, n) for n in program.nodes(ast.FunctionDef, ast.AsyncFunctionDef)]
        if "class" in self.of:
            candidates += [(n.name, n) for n in program.nodes(ast.ClassDef)]
        if "assignment" in self.of:
            candidates += [(n.id, n) for n in program.stores]
        for name, node in candidates:
            if self.names.matches(name) and not self.exempt.matches(name):
                yield Finding(node, {"name": name})


class UngrantedCapabilityMatcher(Matcher):
    """Capability tags found in the program (by the policy's capability table) that the policy does not
    grant; one finding per tag, at its first evidence."""

    kind = "ungranted_capability"
    fields = frozenset({"capability", "evidence"})

    def __init__(self, spec: pm.UngrantedCapabilityMatch) -> None:
        self.tags = GlobSet(spec.tags)

    def describe(self) -> str:
        return f"use of ungranted capabilities {_listing(self.tags)}"

    def find(self, analysis: Analysis) -> Iterator[Finding]:
        for tag, findings in sorted(analysis.capabilities.items()):
            if tag not in analysis.granted and self.tags.matches(tag) and findings:
                first = min(findings, key=lambda f: (getattr(f.node, "lineno", 0), getattr(f.node, "col_offset", 0)))
                evidence = analysis.program.construct(first.node) or tag
                yield Finding(first.node, {"capability": tag, "evidence": evidence})


class PluginMatcher(Matcher):
    """A Python check; see its own documentation below."""

    kind = "plugin"

    def __init__(self, plugin: Plugin, options: BaseModel) -> None:
        self.plugin = plugin
        self.options = options

    def template_fields(self) -> frozenset[str]:
        return self.plugin.fields | {"construct"}

    def describe(self) -> str:
        return f"plugin {self.plugin.name}: {self.plugin.summary}"

    def find(self, analysis: Analysis) -> Iterator[Finding]:
        yield from self.plugin.check(analysis.program, self.options)


class MatcherError(ValueError):
    """A matcher that cannot be compiled; `path` locates the problem inside the matcher mapping."""

    def __init__(self, message: str, path: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.path = path


_DECLARATIVE: Mapping[type[BaseModel], Callable[[Any], Matcher]] = {
    pm.ImportMatch: ImportMatcher,
    pm.NameMatch: NameMatcher,
    pm.AttributeMatch: AttributeMatcher,
    pm.CallMatch: CallMatcher,
    pm.DynamicMatch: DynamicMatcher,
    pm.DecoratorMatch: DecoratorMatcher,
    pm.DefinitionMatch: DefinitionMatcher,
    pm.UngrantedCapabilityMatch: UngrantedCapabilityMatcher,
}


def compile_matcher(spec: BaseModel) -> Matcher:
    """Compile one matcher spec; a plugin is looked up and its options validated here."""
    if isinstance(spec, pm.PluginMatch):
        try:
            plugin = get_plugin(spec.plugin)
        except Exception as exc:  # a third-party entry point failed to import
            raise MatcherError(f"plugin {spec.plugin!r} failed to load: {exc}", ("plugin",)) from None
        if plugin is None:
            known = ", ".join(sorted(builtin_plugins()))
            raise MatcherError(f"unknown plugin {spec.plugin!r} (built in: {known})", ("plugin",))
        try:
            options = plugin.options.model_validate(spec.options)
        except ValidationError as exc:
            error = exc.errors()[0]
            raise MatcherError(error["msg"], ("options", *error["loc"])) from None
        return PluginMatcher(plugin, options)
    return _DECLARATIVE[type(spec)](spec)


__all__ = [
    "Analysis",
    "AttributeMatcher",
    "CallMatcher",
    "DecoratorMatcher",
    "DefinitionMatcher",
    "DynamicMatcher",
    "ImportMatcher",
    "Matcher",
    "MatcherError",
    "NameMatcher",
    "PluginMatcher",
    "UngrantedCapabilityMatcher",
    "compile_matcher",
]
