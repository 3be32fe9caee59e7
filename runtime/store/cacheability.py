"""Cacheability gate of ADR 0013: may a persisted artifact be *reused* for the next call?

Persisting and reusing are separate questions. Every successful artifact is persisted (observability,
evolution history); only cacheable ones are executed again without generation. The runtime decides:

1. dynamic dispatch methods (``ask``, ``chat``, ``discuss``, ``host``; configurable) are never reusable:
   their code was written for one request;
2. code written for a call with arguments that never reads ``args`` or ``kwargs`` (directly or through a
   name derived from them) answered that one call: not reusable (``arg_ignored_code``, see
   :func:`reads_arguments`), e.g. ``return 3`` for ``math_helper.sqrt(9)``;
3. code with the call's argument values baked in is never reusable. Found on the AST, not by substring
   search of the source: string/number *literals* of the program (including dict keys, f-string parts,
   constant concatenations such as URLs built from pieces, ``"...".format(...)`` of constants) compared
   with the argument values (exact match, input embedded in a literal, or a phrase of two or more content
   words shared by both, e.g. "Google News"; URL-encoded forms too). An exact match counts whatever the
   size of the value; skipped are docstrings, booleans, None, empty strings, the structural numbers 0, 1
   and -1, integer subscript indexes and slice bounds (``args[0]``, ``s[:3]``), and literals that also
   appear in the method's contract (purpose, deliverable, acceptance, failure_policy). The fuzzy matches
   (embedded, phrase) still need values of 4+ characters (3+ digits for numbers);
4. a model hint may veto (``cacheable=False``), never force;
5. delegated contract tools and other stable methods are cacheable.

False positives only cost a regeneration; false negatives replay one query's answer for another (the
Google/Yahoo News bug), so the heuristics lean to "not cacheable".
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import quote, quote_plus, unquote_plus

from pydantic import BaseModel, ConfigDict

from sandforge.sandbox.inside.compilation import parse as parse_program

DEFAULT_DYNAMIC_METHODS: frozenset[str] = frozenset({"ask", "chat", "discuss", "host"})

MIN_STRING_CHARS = 3
MIN_EMBEDDED_CHARS = 4
TRIVIAL_INT_RANGE = 10
MAX_INPUT_VALUES = 256
MAX_CODE_LITERALS = 4096
MAX_DEPTH = 12
_WORD = re.compile(r"\w+")


class CacheabilityReason(StrEnum):
    DYNAMIC_DISPATCH = "dynamic_dispatch"
    ARG_IGNORED_CODE = "arg_ignored_code"
    INPUT_BAKED = "input_baked"
    UNPARSEABLE = "unparseable"
    MODEL_VETO = "model_veto"
    DELEGATED_CONTRACT = "delegated_contract"
    STABLE_METHOD = "stable_method"


class CacheabilityHint(BaseModel):
    """What the model said about its own code. Only ``cacheable=False`` has an effect (a veto)."""

    model_config = ConfigDict(frozen=True)

    cacheable: bool
    reason: str | None = None


class Cacheability(BaseModel):
    """The runtime's verdict, stored on the artifact as ``cacheable``/``cacheability_reason``/``input_sensitive``."""

    model_config = ConfigDict(frozen=True)

    cacheable: bool
    reason: CacheabilityReason
    detail: str
    #: The code is tied to this call's inputs: argument values baked in, or a dynamic dispatch method.
    input_sensitive: bool
    #: Evidence for INPUT_BAKED, e.g. ``"exact: 'Google News' == args[0]"`` (truncated).
    baked_literals: tuple[str, ...] = ()

    @property
    def reason_text(self) -> str:
        return f"{self.reason.value}: {self.detail}"


def is_dynamic_method(method_name: str, dynamic_methods: Iterable[str] = DEFAULT_DYNAMIC_METHODS) -> bool:
    return method_name in frozenset(dynamic_methods)


# --- inputs ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Input:
    where: str
    value: str | int | float


#: Numbers that are structure, not data: never evidence of a baked input, even on an exact match.
STRUCTURAL_NUMBERS: frozenset[float] = frozenset({0.0, 1.0, -1.0})


def _is_structural_number(value: int | float) -> bool:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return True
    return float(value) in STRUCTURAL_NUMBERS


def _is_small_number(value: int | float) -> bool:
    """Small integers are only compared exactly, never searched for inside other literals."""
    return float(value).is_integer() and abs(value) <= TRIVIAL_INT_RANGE


def _walk_input(value: object, where: str, depth: int) -> Iterator[_Input]:
    if depth > MAX_DEPTH or value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        if value.strip():
            yield _Input(where, value)
    elif isinstance(value, int | float):
        if not _is_structural_number(value):
            yield _Input(where, value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _walk_input(key, f"{where} key", depth + 1)
            yield from _walk_input(item, f"{where}[{key!r}]", depth + 1)
    elif isinstance(value, Sequence | set | frozenset) and not isinstance(value, bytes | bytearray):
        for i, item in enumerate(value):
            yield from _walk_input(item, f"{where}[{i}]", depth + 1)


def _inputs(args: Sequence[object], kwargs: Mapping[str, object]) -> list[_Input]:
    found: list[_Input] = []
    for i, arg in enumerate(args):
        found.extend(_walk_input(arg, f"args[{i}]", 0))
    for key, arg in kwargs.items():  # top-level keys are parameter names, not input
        found.extend(_walk_input(arg, f"kwargs[{key!r}]", 0))
    return found[:MAX_INPUT_VALUES]


@dataclass(frozen=True)
class _ContractLiterals:
    """Strings and numbers of the method's contract: a literal found there is the tool's, not the call's."""

    strings: frozenset[str] = frozenset()
    numbers: frozenset[float] = frozenset()

    @classmethod
    def of(cls, contract: object) -> _ContractLiterals:
        strings: set[str] = set()
        numbers: set[float] = set()
        stack: list[tuple[object, int]] = [(contract, 0)]
        while stack:
            item, depth = stack.pop()
            if depth > MAX_DEPTH or item is None or isinstance(item, bool):
                continue
            if isinstance(item, str):
                if item.strip() and len(strings) < MAX_INPUT_VALUES:
                    strings.add(_norm(item))
            elif isinstance(item, int | float):
                numbers.add(float(item))
            elif isinstance(item, Mapping):
                stack.extend((k, depth + 1) for k in item)
                stack.extend((v, depth + 1) for v in item.values())
            elif isinstance(item, Sequence | set | frozenset) and not isinstance(item, bytes | bytearray):
                stack.extend((v, depth + 1) for v in item)
        return cls(frozenset(strings), frozenset(numbers))

    def has_string(self, literal: str) -> bool:
        lit = _norm(literal)
        return bool(lit) and any(lit == s or (len(lit) >= MIN_STRING_CHARS and lit in s) for s in self.strings)

    def has_number(self, number: int | float) -> bool:
        return float(number) in self.numbers


# --- code literals --------------------------------------------------------------------------------------


class _Literals(ast.NodeVisitor):
    """String and number literals of a program, plus constant-folded strings (concatenations, f-strings)."""

    def __init__(self) -> None:
        self.strings: list[str] = []
        self.numbers: list[int | float] = []

    def _add(self, text: str | None) -> None:
        if text is not None and len(self.strings) < MAX_CODE_LITERALS:
            self.strings.append(text)

    def visit_Expr(self, node: ast.Expr) -> None:
        # A bare string statement (docstring, comment-like) does not affect behaviour.
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str | bytes):
            return
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, str):
            self._add(value)
        elif isinstance(value, bytes):
            self._add(value.decode("utf-8", "replace"))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            self.numbers.append(value)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            value = node.operand.value
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.numbers.append(-value)
                return
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self.visit(node.value)
        self._visit_index(node.slice)

    def _visit_index(self, node: ast.AST) -> None:
        """Integer indexes and slice bounds (``args[0]``, ``s[:3]``) are structure: not collected."""
        if _int_constant(node):
            return
        if isinstance(node, ast.Slice):
            for part in (node.lower, node.upper, node.step):
                if part is not None:
                    self._visit_index(part)
        elif isinstance(node, ast.Tuple):
            for element in node.elts:
                self._visit_index(element)
        else:
            self.visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        parts = [_fold(v) for v in node.values]
        # static text of the f-string; non-constant holes become a separator that matches nothing
        self._add("\x00".join(p if p is not None else "" for p in parts))
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        self._add(_fold(node))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self._add(_fold(node))
        self.generic_visit(node)


def _int_constant(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool)


def _fold(node: ast.AST) -> str | None:
    """The string value of a constant string expression, else None."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            return node.value
        if isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return str(node.value)
        return None
    if isinstance(node, ast.FormattedValue):
        return _fold(node.value) if node.format_spec is None else None
    if isinstance(node, ast.JoinedStr):
        parts = [_fold(v) for v in node.values]
        return None if any(p is None for p in parts) else "".join(p or "" for p in parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _fold(node.left), _fold(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant):
        return _fold_percent(node.left.value, node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.keywords:
        return _fold_str_method(node.func, node.args)
    return None


def _fold_percent(fmt: object, right: ast.expr) -> str | None:
    """``"..." % x`` with a constant format and a constant ``x``."""
    arg = _fold(right)
    if not isinstance(fmt, str) or arg is None:
        return None
    try:
        return fmt % arg
    except (TypeError, ValueError):
        return None


def _fold_str_method(func: ast.Attribute, args: list[ast.expr]) -> str | None:
    """``"...".format(...)`` and ``"...".join([...])`` over constants."""
    base = _fold(func.value)
    if base is None:
        return None
    if func.attr == "format":
        folded = [_fold(a) for a in args]
        if any(a is None for a in folded):
            return None
        try:
            return base.format(*folded)
        except (IndexError, KeyError, ValueError):
            return None
    if func.attr == "join" and len(args) == 1 and isinstance(args[0], ast.List | ast.Tuple):
        items = [_fold(e) for e in args[0].elts]
        return None if any(i is None for i in items) else base.join(i or "" for i in items)
    return None


# --- matching -------------------------------------------------------------------------------------------


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


def _words(text: str) -> list[str]:
    return _WORD.findall(text.casefold())


_STOPWORDS = frozenset(
    {
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "for",
        "from",
        "has",
        "have",
        "how",
        "i",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "that",
        "the",
        "this",
        "to",
        "was",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
    }
)
MAX_WORDS = 64


def _shared_phrase(a: list[str], b: list[str]) -> bool:
    """Do ``a`` and ``b`` share a run of consecutive words with at least two content words (8+ chars)?"""
    a, b = a[:MAX_WORDS], b[:MAX_WORDS]
    run = [0] * (len(b) + 1)
    for i in range(1, len(a) + 1):
        prev = 0
        for j in range(1, len(b) + 1):
            keep = run[j]
            run[j] = prev + 1 if a[i - 1] == b[j - 1] else 0
            if run[j] >= 2:
                phrase = a[i - run[j] : i]
                content = [w for w in phrase if w not in _STOPWORDS]
                if len(content) >= 2 and sum(map(len, content)) >= 8:
                    return True
            prev = keep
    return False


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _match_string(value: str, where: str, literals: list[str], contract: _ContractLiterals) -> str | None:
    target = _norm(value)
    encoded = {quote_plus(value).casefold(), quote(value, safe="").casefold()}
    value_words = _words(value)
    fuzzy = len(target) >= MIN_STRING_CHARS
    for literal in literals:
        lit = _norm(literal)
        if not lit or contract.has_string(literal):
            continue
        if lit == target:
            return f"exact: {_short(literal)} == {where}"
        if not fuzzy:
            continue
        if len(target) >= MIN_EMBEDDED_CHARS:
            lowered = literal.casefold()
            if target in lit or any(e in lowered for e in encoded if len(e) >= MIN_EMBEDDED_CHARS):
                return f"embedded: {where} inside {_short(literal)}"
        if _shared_phrase(value_words, _words(unquote_plus(literal))):
            return f"phrase: {_short(literal)} shares words with {where}"
    return None


def _match_number(
    value: int | float, where: str, numbers: list[int | float], literals: list[str], contract: _ContractLiterals
) -> str | None:
    if contract.has_number(value):
        return None
    for number in numbers:
        if number == value and not _is_structural_number(number):
            return f"exact: {number!r} == {where}"
    text = str(value)
    if isinstance(value, int) and not _is_small_number(value) and len(text.lstrip("-")) >= 3:
        pattern = re.compile(rf"(?<!\d){re.escape(text)}(?!\d)")
        for literal in literals:
            if pattern.search(literal) and not contract.has_string(literal):
                return f"embedded: {where} inside {_short(literal)}"
    return None


def _parse(code: str) -> ast.Module | None:
    try:
        return parse_program(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _baked(tree: ast.Module, args: Sequence[object], kwargs: Mapping[str, object], contract: object) -> list[str]:
    visitor = _Literals()
    try:
        visitor.visit(tree)
    except RecursionError:
        return ["the program is nested too deeply to inspect"]
    known = _ContractLiterals.of(contract)
    evidence: list[str] = []
    for item in _inputs(args, kwargs):
        if isinstance(item.value, str):
            hit = _match_string(item.value, item.where, visitor.strings, known)
        else:
            hit = _match_number(item.value, item.where, visitor.numbers, visitor.strings, known)
        if hit is not None:
            evidence.append(hit)
    return evidence


def find_baked_inputs(
    code: str, args: Sequence[object], kwargs: Mapping[str, object], contract: object = None
) -> list[str] | None:
    """Evidence that argument values of this call are literals of ``code``; None if it does not parse.

    ``contract`` is the method's contract (any JSON value, e.g. ``ToolContract.model_dump()``): its
    literals are not evidence."""
    tree = _parse(code)
    return None if tree is None else _baked(tree, args, kwargs, contract)


# --- does the program read its arguments? --------------------------------------------------------------

ARGUMENT_NAMES: frozenset[str] = frozenset({"args", "kwargs"})


def _target_names(target: ast.AST) -> list[str] | None:
    """The names a plain-name target binds (``a``, ``a, (b, *c)``); None for attribute/subscript targets."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    if isinstance(target, ast.Tuple | ast.List):
        names: list[str] = []
        for element in target.elts:
            inner = _target_names(element)
            if inner is None:
                return None
            names.extend(inner)
        return names
    return None


def _propagations(nodes: list[ast.AST]) -> list[tuple[list[str], set[str], set[int]]]:
    """Each assignment to plain names only: (the names bound, the names its value uses, those uses' ids)."""
    propagations: list[tuple[list[str], set[str], set[int]]] = []
    for node in nodes:
        targets: list[ast.AST] = []
        value: ast.AST | None = None
        if isinstance(node, ast.Assign):
            targets, value = list(node.targets), node.value
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
            targets, value = [node.target], node.value
        if value is None:
            continue
        bound: list[str] = []
        for target in targets:
            names = _target_names(target)
            if names is None:
                break
            bound.extend(names)
        else:
            used = [n for n in ast.walk(value) if isinstance(n, ast.Name)]
            propagations.append((bound, {n.id for n in used}, {id(n) for n in used}))
    return propagations


def reads_arguments(tree: ast.AST) -> bool:
    """Does the program use ``args``/``kwargs``, directly or through a name derived from them?

    Derived names are found by propagation to a fixed point: ``x = args[0]`` makes ``x`` derived. A
    statement ``name = <expr>`` (or ``name += <expr>``, or with a type annotation) whose targets are all
    plain names only *propagates*; a derived name used anywhere else (returned, tested, passed to a call,
    written into ``context``, iterated over, read by a nested function...) is a read. So ``n = args[0]`` with
    ``n`` never used afterwards still ignores the arguments."""
    nodes = list(ast.walk(tree))
    loads = [n for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    if not any(n.id in ARGUMENT_NAMES for n in loads):
        return False
    propagations = _propagations(nodes)
    derived = set(ARGUMENT_NAMES)
    changed = True
    while changed:
        changed = False
        for bound, used_names, _ in propagations:
            if used_names & derived and not set(bound) <= derived:
                derived.update(bound)
                changed = True
    propagating: set[int] = set().union(*(inside for _, _, inside in propagations))
    return any(n.id in derived and id(n) not in propagating for n in loads)


def assess_cacheability(
    method_name: str,
    code: str,
    args: Sequence[object] = (),
    kwargs: Mapping[str, object] | None = None,
    *,
    is_delegated_contract: bool = False,
    model_hint: CacheabilityHint | bool | None = None,
    dynamic_methods: Iterable[str] = DEFAULT_DYNAMIC_METHODS,
    contract: object = None,
) -> Cacheability:
    """Decide at generation/repair time whether this code may be reused for later calls (ADR 0013 sec. 2, 7).

    ``contract`` is the method's contract as JSON (its literals are not evidence of baked inputs)."""
    kwargs = kwargs or {}
    tree = _parse(code)
    baked = None if tree is None else _baked(tree, args, kwargs, contract)
    ignored = tree is not None and bool(args or kwargs) and not reads_arguments(tree)
    dynamic = is_dynamic_method(method_name, dynamic_methods)
    evidence = tuple(baked or ())
    sensitive = dynamic or bool(evidence) or ignored
    if dynamic:
        return Cacheability(
            cacheable=False,
            reason=CacheabilityReason.DYNAMIC_DISPATCH,
            detail=f"{method_name!r} is a dynamic dispatch method; its code answers one request",
            input_sensitive=sensitive,
            baked_literals=evidence,
        )
    if baked is None:
        return Cacheability(
            cacheable=False,
            reason=CacheabilityReason.UNPARSEABLE,
            detail="the program does not parse, so it cannot be checked for baked-in inputs",
            input_sensitive=False,
        )
    if evidence:
        return Cacheability(
            cacheable=False,
            reason=CacheabilityReason.INPUT_BAKED,
            detail="argument values are literals of the code: " + "; ".join(evidence[:3]),
            input_sensitive=True,
            baked_literals=evidence,
        )
    if ignored:
        return Cacheability(
            cacheable=False,
            reason=CacheabilityReason.ARG_IGNORED_CODE,
            detail="the call had arguments but the code never reads args or kwargs: it answers that one call",
            input_sensitive=True,
            baked_literals=evidence,
        )
    hint = CacheabilityHint(cacheable=model_hint) if isinstance(model_hint, bool) else model_hint
    if hint is not None and not hint.cacheable:
        return Cacheability(
            cacheable=False,
            reason=CacheabilityReason.MODEL_VETO,
            detail="the model declared its code non-cacheable" + (f": {hint.reason}" if hint.reason else ""),
            input_sensitive=False,
        )
    if is_delegated_contract:
        return Cacheability(
            cacheable=True,
            reason=CacheabilityReason.DELEGATED_CONTRACT,
            detail="method of a delegated tool with a contract; inputs arrive as arguments",
            input_sensitive=False,
        )
    return Cacheability(
        cacheable=True,
        reason=CacheabilityReason.STABLE_METHOD,
        detail="stable method; no argument value found in the code",
        input_sensitive=False,
    )
