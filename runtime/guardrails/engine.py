"""`validate`: bounded input checks, one parse, one analysis, then every rule. It never raises.

The cyclic garbage collector is paused during a validation (``runtime.gc_pause``). Results are cached
by program text and effective policy (an LRU of `CACHE_SIZE` entries): tools persisted in the store are
validated before every run, and a repeat costs one sha256.

Order: size limit, decoding (UTF-8 only; a UTF-8 BOM is dropped from bytes; a coding declaration must
say UTF-8), NUL bytes, ``ast.parse`` (syntax errors are recoverable ``invalid_code``; the parser's own
recursion and stack limits become ``nesting_too_deep``), the AST depth limit, capability extraction,
rules. Memory is bounded by ``max_source_bytes`` (the AST of the worst-case program takes a few hundred
bytes per source byte); time is linear in the program's size.
"""

from __future__ import annotations

import ast
import codecs
import hashlib
import io
import logging
import threading
import tokenize
import warnings
from collections import OrderedDict
from collections.abc import Iterable

from sandforge.runtime.errors import ConfigError
from sandforge.runtime.gc_pause import gc_paused
from sandforge.runtime.guardrails.egress_literals import literal_fetches
from sandforge.runtime.guardrails.loader import default_policy
from sandforge.runtime.guardrails.matchers import Analysis
from sandforge.runtime.guardrails.policy import Policy, Rule
from sandforge.runtime.guardrails.program import MAX_SOURCE_LINE, Finding, Program
from sandforge.runtime.guardrails.results import (
    EGRESS_DENIED,
    GUARDRAIL_ERROR,
    INVALID_CODE,
    NESTING_TOO_DEEP,
    SANDBOX_RESTRICTION,
    SOURCE_TOO_LARGE,
    UNSUPPORTED_FETCH_API,
    Capability,
    Classification,
    Evidence,
    Location,
    ValidationResult,
    Violation,
    verdict_of,
)
from sandforge.sandbox.inside.compilation import parse as parse_program

log = logging.getLogger(__name__)

MAX_EVIDENCE = 20
CACHE_SIZE = 512
_CACHE: OrderedDict[tuple[str, str, str], ValidationResult] = OrderedDict()
_CACHE_LOCK = threading.Lock()

ENGINE_RULES: dict[str, tuple[Classification, str, str]] = {
    INVALID_CODE: (
        "recoverable",
        "The program is not valid Python source: it does not parse, is not UTF-8, contains NUL bytes, or "
        "declares an encoding other than UTF-8.",
        "Fix the syntax so the program parses as a Python function body (a top-level `return` is "
        "allowed); send plain UTF-8 text without a coding declaration or NUL bytes.",
    ),
    SOURCE_TOO_LARGE: (
        "recoverable",
        "The program is larger than the policy's `limits.max_source_bytes`.",
        "Shorten the program: drop unused code and embedded data; take large inputs from args, kwargs "
        "or context instead of the source.",
    ),
    NESTING_TOO_DEEP: (
        "recoverable",
        "The program nests deeper than the policy's `limits.max_ast_depth`, or deeper than the parser can handle.",
        "Flatten the deepest nesting: bind intermediate results to variables and move nested blocks into "
        "helper functions.",
    ),
    SANDBOX_RESTRICTION: (
        "recoverable",
        "The sandbox's restricted compiler refuses the program: the same RestrictedPython compilation the "
        "sandbox runs, checked at validation so the policy's verdict is the sandbox's verdict.",
        "Rewrite the refused construct: use public names for attributes (no leading `_` or `__`, except "
        "special methods such as `__init__` defined in a class and called through `super()`), no "
        "`exec`/`eval`, `except*` or metaclasses.",
    ),
    EGRESS_DENIED: (
        "terminal",
        "The program fetches a literal URL that the policy's egress rules deny (no allow entry admits it, or "
        "its address is on the platform's deny list): the host's broker would refuse the request at run time.",
        "No rewrite can reach this destination: what is reachable is the deployment's egress policy "
        "(`egress.allow` in its policy files). Fetch only the destinations it allows; retrying another way "
        "will not help.",
    ),
    UNSUPPORTED_FETCH_API: (
        "recoverable",
        "The program uses a part of urllib.request, urllib.error or requests that the sandbox's broker-backed "
        "stand-ins do not offer (sessions, openers, TLS or authentication options): it would fail at run time.",
        "Use the supported surface: fetch(url, method=, headers=, params=, body=, json=, timeout=); "
        "requests.get/post/put/patch/delete/head/options/request with params, headers, data, json, timeout and "
        "its Response (status_code, ok, text, content, json(), headers, url, raise_for_status()); "
        "urllib.request.urlopen(url or Request(url, data, headers, method), data, timeout).",
    ),
    GUARDRAIL_ERROR: (
        "terminal",
        "The guardrail itself failed while checking the program, so it cannot be approved.",
        "No rewrite is required by policy; report the guardrail failure to the runtime's operators.",
    ),
}


def validate(source: str | bytes, policy: Policy | None = None) -> ValidationResult:
    """Validate a tool program (a function body) against `policy` (default: the shipped default)."""
    if policy is None:
        try:
            policy = default_policy()
        except ConfigError as exc:
            violation = _engine_violation(GUARDRAIL_ERROR, f"the default policy does not load: {exc}")
            return ValidationResult(
                verdict="terminal", violations=[violation], policy_name="default", policy_fingerprint=""
            )
    key = _cache_key(source, policy)
    cached = _cached(key)
    if cached is not None:
        return cached
    try:
        with gc_paused():  # the AST and its indexes form no cycles: collections would find nothing
            result = _validate(source, policy)
    except Exception as exc:  # a bug must reject the program, never crash the caller
        log.exception("guardrail validation failed")
        violation = _engine_violation(GUARDRAIL_ERROR, f"internal error: {type(exc).__name__}")
        return _result(policy, [violation], [])
    if key is not None and not any(v.violation_type == GUARDRAIL_ERROR for v in result.violations):
        with _CACHE_LOCK:
            _CACHE[key] = result
            if len(_CACHE) > CACHE_SIZE:
                _CACHE.popitem(last=False)
    return result


def cached_verdict(source: str | bytes, policy: Policy) -> ValidationResult | None:
    """The verdict :func:`validate` would return from its cache, or None (it would have to validate: an event
    loop must not, a cold validation of a large program takes tens of milliseconds)."""
    return _cached(_cache_key(source, policy))


def _cached(key: tuple[str, str, str] | None) -> ValidationResult | None:
    if key is None:
        return None
    with _CACHE_LOCK:
        cached = _CACHE.get(key)
        if cached is not None:
            _CACHE.move_to_end(key)
        return cached


def clear_cache() -> None:
    """Forget cached verdicts (they are keyed by content, so this is only needed to measure cold runs)."""
    with _CACHE_LOCK:
        _CACHE.clear()


def _cache_key(source: object, policy: Policy) -> tuple[str, str, str] | None:
    """Same program text under the same effective policy (fingerprint and name) gives the same result;
    results are immutable, so a persisted tool re-validated on every run costs a hash. Oversized input is
    not hashed (it is refused at once anyway)."""
    if not isinstance(source, str | bytes) or len(source) > policy.limits.max_source_bytes:
        return None
    if isinstance(source, str):
        digest = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest() + "s"
    else:
        digest = hashlib.sha256(source).hexdigest() + "b"
    return digest, policy.fingerprint, policy.name


def _validate(source: str | bytes, policy: Policy) -> ValidationResult:
    limits = policy.limits
    text, problem = _decode(source, limits.max_source_bytes)
    if problem is not None:
        return _result(policy, [problem], [])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning/DeprecationWarning are not our verdict
            tree = parse_program(text)
    except SyntaxError as exc:
        return _result(policy, [_syntax_violation(text, exc)], [])
    except (RecursionError, MemoryError):
        message = "the program nests too deeply for the Python parser"
        return _result(policy, [_engine_violation(NESTING_TOO_DEEP, message)], [])
    except ValueError as exc:  # e.g. "source code string cannot contain null bytes" on older Pythons
        return _result(policy, [_engine_violation(INVALID_CODE, f"the program does not parse: {exc}")], [])

    program = Program(text, tree, max_depth=limits.max_ast_depth)
    found: list[tuple[int, int, int, Violation]] = []
    if program.too_deep is not None:
        message = f"the program nests deeper than {limits.max_ast_depth} levels"
        node = program.too_deep
        found.append((*_position(node), -1, _engine_violation(NESTING_TOO_DEEP, message, _location(program, node))))

    detected = _detect_capabilities(policy, program)
    analysis = Analysis(program, detected, policy.granted)
    for order, rule in enumerate(policy.active_rules):
        try:
            findings = _innermost(rule.matcher.find(analysis))
        except Exception as exc:
            log.exception("guardrail rule %s failed", rule.id)
            message = f"rule {rule.id} failed: {type(exc).__name__}"
            found.append((0, 0, order, _engine_violation(GUARDRAIL_ERROR, message)))
            continue
        for (line, column), finding in findings.items():
            found.append((line, column, order, _violation(rule, finding, program)))
    capabilities = _capabilities(program, detected, policy)
    capabilities = _judge_fetches(program, policy, capabilities, found)
    if program.too_deep is None:
        flagged = {v.location.line for *_, v in found if v.location is not None}
        found.extend(_restricted_compile(program, text, tree, flagged))  # last: it rewrites the tree
    found.sort(key=lambda item: item[:3])
    violations = [violation for *_, violation in found[: limits.max_violations]]
    return _result(policy, violations, capabilities, truncated=len(found) > len(violations))


def _judge_fetches(
    program: Program, policy: Policy, capabilities: list[Capability], found: list[tuple[int, int, int, Violation]]
) -> list[Capability]:
    """Literal URLs in fetching calls, judged by the egress rules: a denied one is a terminal violation (appended
    to ``found``); the allowed ones join ``http_fetch``'s evidence, so the report lists where the program goes.
    Without the grant there is nothing to judge: the ungranted capability is the verdict."""
    if "http_fetch" not in policy.granted:
        return capabilities
    fetches = literal_fetches(program, policy.egress)
    order = len(policy.active_rules)
    from sandforge.runtime.guardrails.fetch_surface import unsupported_uses  # only where http_fetch is granted

    for use in unsupported_uses(program):
        violation = _engine_violation(UNSUPPORTED_FETCH_API, use.message, _location(program, use.node))
        found.append((*_position(use.node), order, violation))
    for fetch in fetches:
        if fetch.denied:
            message = f"fetching a URL the egress policy denies: {fetch.denied}"
            violation = _engine_violation(EGRESS_DENIED, message, _location(program, fetch.node))
            found.append((*_position(fetch.node), order, violation))
    allowed = [Finding(fetch.node, {}) for fetch in fetches if not fetch.denied]
    if not allowed:
        return capabilities
    others = [c for c in capabilities if c.tag != "http_fetch"]
    current = next((c for c in capabilities if c.tag == "http_fetch"), None)
    evidence = {(e.line, e.column): e for e in (current.evidence if current else [])}
    evidence.update({(e.line, e.column): e for e in _evidence(program, allowed)})
    merged = Capability(tag="http_fetch", granted=True, evidence=[evidence[k] for k in sorted(evidence)][:MAX_EVIDENCE])
    return sorted([*others, merged], key=lambda c: c.tag)


def _restricted_compile(
    program: Program, text: str, tree: ast.Module, flagged: set[int]
) -> list[tuple[int, int, int, Violation]]:
    """What the sandbox's compiler refuses (``sandbox.inside.compilation.compile_checked``, the very function
    the runner compiles with), as recoverable violations; a line a policy rule already flagged is not reported
    twice (the rule's message and correction are the more specific ones)."""
    from sandforge.sandbox.inside.compilation import compile_checked  # the inside: stdlib and RestrictedPython only

    _, refusals = compile_checked(text, tree, remember=True)  # the exchange ships the code it compiled
    found: list[tuple[int, int, int, Violation]] = []
    for kind, line, message in refusals:
        if line is not None and line in flagged:
            continue
        location = None
        if line is not None and line >= 1:
            source_line = program.line_text(line)
            if len(source_line) > MAX_SOURCE_LINE:
                source_line = source_line[: MAX_SOURCE_LINE - 3] + "..."
            location = Location(line=line, column=1, source_line=source_line)
        if kind == INVALID_CODE:
            violation = _engine_violation(INVALID_CODE, f"the program does not compile: {message}", location)
        else:
            classification, _, correction = ENGINE_RULES[SANDBOX_RESTRICTION]
            violation = Violation(
                violation_type=SANDBOX_RESTRICTION,
                message=f"refused by the sandbox's compiler: {message}",
                location=location,
                classification=classification,
                required_correction=_restriction_correction(message) or correction,
            )
        found.append((line or 0, 0, 1 << 20, violation))
    return found


def _restriction_correction(message: str) -> str | None:
    """A correction specific to the refusal, where one is known."""
    if "invalid attribute name" in message:
        return (
            "Use public attribute names: store state as `self.balance`, not `self._balance` or "
            "`self.__balance`; read type names with `type(x) is int` instead of `__name__`/`__class__`."
        )
    if "invalid variable name" in message:
        return (
            "Rename it: names ending in `_`, dunder names outside a class's special methods, and names the "
            "runtime uses (`_print`, `_getattr_`...) are reserved; a plain name or `_helper` works."
        )
    if "String annotations" in message:
        return "Name the type itself in the annotation (`x: int`, `items: list[Item]`), or leave it out."
    if "TryStar" in message:
        return "Use a plain `except` clause; exception groups are not available in the sandbox."
    return None


def _result(
    policy: Policy, violations: list[Violation], capabilities: list[Capability], *, truncated: bool = False
) -> ValidationResult:
    return ValidationResult(
        verdict=verdict_of(violations),
        violations=violations,
        capabilities=capabilities,
        policy_name=policy.name,
        policy_fingerprint=policy.fingerprint,
        truncated=truncated,
    )


# ------------------------------------------------------------------------------------------- input


def source_text(data: bytes) -> str:
    """A program file's bytes as the text ``validate`` judges and the sandbox runs: a UTF-8 BOM dropped
    (as ``validate`` drops it from bytes), invalid UTF-8 kept as surrogates, which validation refuses with
    their line. ``policy check`` (bytes) and ``exec`` (this text) reach the same verdict."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    return data.decode("utf-8", "surrogateescape")


def _decode(source: str | bytes, limit: int) -> tuple[str, Violation | None]:
    """The program as text, or the violation that stops it before parsing."""
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        if len(data) > limit:
            return "", _too_large(len(data), limit)
        if data.startswith(codecs.BOM_UTF8):
            data = data[len(codecs.BOM_UTF8) :]
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            message = f"the program is not valid UTF-8 (byte 0x{data[exc.start]:02x} on line {line})"
            return "", _engine_violation(INVALID_CODE, message, Location(line=line, column=1))
    elif isinstance(source, str):
        text = source
        if len(text) > limit:  # characters: the UTF-8 size is at least this
            return "", _too_large(len(text), limit, at_least=True)
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            line = text[: exc.start].count("\n") + 1
            message = f"the program contains an unpaired surrogate (U+{ord(text[exc.start]):04X}) on line {line}"
            return "", _engine_violation(INVALID_CODE, message, Location(line=line, column=1))
        if len(data) > limit:
            return "", _too_large(len(data), limit)
    else:
        message = f"the program must be str or bytes, not {type(source).__name__}"
        return "", _engine_violation(INVALID_CODE, message)
    nul = text.find("\0")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        column = nul - (text.rfind("\n", 0, nul) + 1) + 1
        message = f"the program contains a NUL character (line {line}, column {column})"
        return "", _engine_violation(INVALID_CODE, message, Location(line=line, column=column))
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        return "", _engine_violation(INVALID_CODE, f"the program's coding declaration is invalid: {exc.msg}")
    if encoding not in ("utf-8", "utf-8-sig"):
        message = f"the program declares the encoding {encoding!r}; programs are UTF-8 text"
        return "", _engine_violation(INVALID_CODE, message)
    return text, None


def _too_large(size: int, limit: int, *, at_least: bool = False) -> Violation:
    size_text = f"at least {size}" if at_least else str(size)
    return _engine_violation(SOURCE_TOO_LARGE, f"the program is {size_text} bytes; the policy allows {limit}")


def _syntax_violation(text: str, exc: SyntaxError) -> Violation:
    location = None
    if exc.lineno:
        lines = text.splitlines()
        line = max(exc.lineno, 1)
        source_line = lines[line - 1] if line <= len(lines) else ""
        location = Location(
            line=line,
            column=max(exc.offset or 1, 1),
            source_line=source_line[:MAX_SOURCE_LINE],
        )
    kind = type(exc).__name__
    return _engine_violation(INVALID_CODE, f"the program does not parse: {kind}: {exc.msg}", location)


def _engine_violation(kind: str, message: str, location: Location | None = None) -> Violation:
    classification, _, correction = ENGINE_RULES[kind]
    return Violation(
        violation_type=kind,
        message=message,
        location=location,
        classification=classification,
        required_correction=correction,
    )


# ------------------------------------------------------------------------------------ rule findings


def _position(node: ast.AST) -> tuple[int, int]:
    return getattr(node, "lineno", 1), getattr(node, "col_offset", 0)


def _end(node: ast.AST) -> tuple[int, int]:
    return getattr(node, "end_lineno", None) or 1 << 30, getattr(node, "end_col_offset", None) or 0


def _innermost(findings: Iterable[Finding]) -> dict[tuple[int, int], Finding]:
    """One finding per start position; of findings starting together (``a.__class__.__base__``) the
    innermost, which is where the program first goes wrong."""
    kept: dict[tuple[int, int], Finding] = {}
    for finding in findings:
        start = _position(finding.node)
        current = kept.get(start)
        if current is None or _end(finding.node) < _end(current.node):
            kept[start] = finding
    return kept


def _location(program: Program, node: ast.AST) -> Location:
    line, offset = _position(node)
    end_line = getattr(node, "end_lineno", None)
    end_offset = getattr(node, "end_col_offset", None)
    source_line = program.line_text(line)
    if len(source_line) > MAX_SOURCE_LINE:
        source_line = source_line[: MAX_SOURCE_LINE - 3] + "..."
    return Location(
        line=line,
        column=program.column(line, offset),
        end_line=end_line,
        end_column=program.column(end_line, end_offset) if end_line and end_offset is not None else None,
        source_line=source_line,
    )


def _violation(rule: Rule, finding: Finding, program: Program) -> Violation:
    values = {"construct": program.construct(finding.node), **finding.fields}
    return Violation(
        violation_type=rule.id,
        message=rule.message.render(values),
        location=_location(program, finding.node),
        classification=rule.classification,
        required_correction=rule.correction.render(values),
    )


def _detect_capabilities(policy: Policy, program: Program) -> dict[str, list[Finding]]:
    analysis = Analysis(program, {}, policy.granted)
    detected: dict[str, list[Finding]] = {}
    for tag, definition in policy.capabilities.items():
        findings = [finding for matcher in definition.matchers for finding in matcher.find(analysis)]
        if findings:
            detected[tag] = findings
    return detected


def _capabilities(program: Program, detected: dict[str, list[Finding]], policy: Policy) -> list[Capability]:
    return [
        Capability(tag=tag, granted=tag in policy.granted, evidence=_evidence(program, findings))
        for tag, findings in sorted(detected.items())
    ]


def _evidence(program: Program, findings: Iterable[Finding]) -> list[Evidence]:
    positions = sorted({_position(finding.node): finding.node for finding in findings}.items())
    return [
        Evidence(line=line, column=program.column(line, offset), construct=program.construct(node))
        for (line, offset), node in positions[:MAX_EVIDENCE]
    ]
