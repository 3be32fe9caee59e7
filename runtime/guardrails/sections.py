"""The policy sections beside rules and capabilities (``egress``, ``dependencies``), first-class: each is in the
JSON Schema, shown by ``policy list``, explained by ``policy explain``, has examples ``policy test`` runs, and is
checked against a program by ``policy check`` (literal URLs, declared packages) before anything runs.

A section is one `Section` entry in `SECTIONS`; a later capability setting adds an entry here (its model lives
with its owner and is embedded in ``policy_model.PolicyFile``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sandforge.runtime.egress.addresses import classify, networks, parse_address
from sandforge.runtime.egress.config import EgressPolicy
from sandforge.runtime.egress.errors import FetchError
from sandforge.runtime.egress.rules import compile_allow, match_rule
from sandforge.runtime.egress.urls import parse_url
from sandforge.runtime.environments.errors import EnvironmentFailure
from sandforge.runtime.environments.manifest import Manifest, manifest_of, normalise
from sandforge.runtime.guardrails.policy import Origin, Policy
from sandforge.runtime.guardrails.results import Location, Violation


@dataclass(frozen=True)
class SectionExample:
    """One example of a section: a request (egress) or a manifest (dependencies) and what the policy must do."""

    section: str
    expectation: str  # egress: allow | deny; dependencies: accept | refuse
    index: int
    value: str | tuple[str, ...]
    origin: Origin
    layer: int

    @property
    def name(self) -> str:
        return f"{self.section} {self.expectation}[{self.index}]"

    @property
    def source(self) -> str:
        return self.value if isinstance(self.value, str) else "\n".join(self.value)


def collect_examples(name: str, section: Any, origin: Origin, layer: int) -> list[SectionExample]:
    examples = getattr(section, "examples", None)
    if examples is None:
        return []
    out: list[SectionExample] = []
    for expectation in SECTIONS[name].expectations:
        for index, value in enumerate(getattr(examples, expectation)):
            frozen = value if isinstance(value, str) else tuple(value)
            out.append(SectionExample(name, expectation, index, frozen, origin, layer))
    return out


# --------------------------------------------------------------------------------------------- egress


def egress_verdict(egress: EgressPolicy, request: str) -> str:
    """Why the broker would refuse ``METHOD URL`` (empty when it would send it): the allow entries, then the
    platform deny list for an address literal or a host ``resolve`` names. No DNS lookup is made."""
    method, _, url = request.partition(" ") if " " in request else ("GET", "", request)
    try:
        target = parse_url(url)
        match_rule(compile_allow(egress), target, method)
    except FetchError as exc:
        return exc.message
    address = target.ip
    if address is None and target.host in egress.resolve:
        address = parse_address(egress.resolve[target.host])
    if address is not None:
        verdict = classify(address, networks(egress.allow_ranges))
        if not verdict.allowed:
            return f"{method} {target.url} is denied: {verdict.reason}"
    return ""


def _judge_egress(policy: Policy, expectation: str, source: str) -> tuple[bool, str]:
    denied = egress_verdict(policy.egress, source)
    if expectation == "allow":
        return (not denied, "allowed" if not denied else f"denied: {denied}")
    return (bool(denied), f"denied: {denied}" if denied else "allowed (an allow entry admits it)")


def _egress_lines(policy: Policy) -> list[str]:
    egress = policy.egress
    lines = [f"  allow: {entry.label()} [{', '.join(entry.methods)}]" for entry in egress.allow] or [
        "  allow: nothing (every request is egress_denied)"
    ]
    lines += [f"  allow_ranges: {', '.join(egress.allow_ranges)}"] if egress.allow_ranges else []
    lines += [f"  resolve: {host} -> {address}" for host, address in sorted(egress.resolve.items())]
    lines += [f"  credentials: {c.header} for {c.host}" for c in egress.credentials]
    limits = egress.limits
    lines.append(
        f"  limits: {limits.max_requests} requests, {limits.max_response_bytes} B per body, "
        f"{limits.max_total_bytes} B in all, {limits.timeout_s:g} s per request, {limits.max_redirects} redirects"
    )
    return lines


def _explain_egress(policy: Policy) -> str:
    granted = "granted" if "http_fetch" in policy.granted else "NOT granted: programs cannot fetch at all"
    return "\n".join(
        [
            "# egress - what brokered requests may reach",
            "",
            f"Programs fetch through the host's broker (`fetch()`, `requests`, `urllib.request`); http_fetch is "
            f"{granted}. A request is sent only when an allow entry admits its method, scheme, port, host and "
            "path, and the address is not on the platform deny list (loopback, private, link-local, ...; "
            "`allow_ranges` exempts ranges). Literal URLs in a program are judged before it runs "
            "(`egress_denied`, terminal). See docs/policies.md, 'Egress'.",
            "",
            "## Effective settings",
            *_egress_lines(policy),
            "",
            "## Examples",
            "`egress: {examples: {allow: [URL, ...], deny: ['POST URL', ...]}}`: `policy test` runs them.",
        ]
    )


# --------------------------------------------------------------------------------------- dependencies


def manifest_from(source: str) -> Manifest:
    """A manifest example: a program with a ``# /// script`` block, else requirements one a line."""
    if "# /// script" in source:
        return manifest_of(source)
    return normalise(line.strip() for line in source.splitlines() if line.strip())


def _judge_dependencies(policy: Policy, expectation: str, source: str) -> tuple[bool, str]:
    try:
        manifest = manifest_from(source)
        policy.dependencies.check(manifest.names)
    except EnvironmentFailure as exc:
        refused = f"refused ({exc.kind}): {exc.message}"
        return (expectation == "refuse", refused)
    return (expectation == "accept", f"accepted: {', '.join(manifest.names) or 'nothing declared'}")


def _dependency_lines(policy: Policy) -> list[str]:
    deps = policy.dependencies
    return [
        f"  allow: {', '.join(deps.allowed) or 'nothing'}",
        *([f"  block: {', '.join(deps.block)}"] if deps.block else []),
        f"  source: {deps.sources.describe()}",
        f"  max_env_mb: {deps.max_env_mb}",
    ]


def _explain_dependencies(policy: Policy) -> str:
    return "\n".join(
        [
            "# dependencies - third-party distributions programs may declare",
            "",
            "A program declares distributions in a PEP 723 `# /// script` block; each declared name must be "
            "allowed and not blocked, and so must everything it pulls in (checked when the environment is "
            "built). HTTP client libraries are never installed. A refused manifest is "
            "`dependency_policy_violation` (recoverable: the feedback lists what is allowed). See "
            "docs/environments.md.",
            "",
            "## Effective settings",
            *_dependency_lines(policy),
            "",
            "## Examples",
            "`dependencies: {examples: {accept: ['pandas>=2'], refuse: [requests, [numpy, left-pad]]}}`: "
            "`policy test` runs them.",
        ]
    )


# ----------------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Section:
    name: str
    expectations: tuple[str, str]
    judge: Callable[[Policy, str, str], tuple[bool, str]]
    """(policy, expectation, example source) -> (passed, detail)"""
    lines: Callable[[Policy], list[str]]
    explain: Callable[[Policy], str]


SECTIONS: dict[str, Section] = {
    "egress": Section("egress", ("allow", "deny"), _judge_egress, _egress_lines, _explain_egress),
    "dependencies": Section(
        "dependencies", ("accept", "refuse"), _judge_dependencies, _dependency_lines, _explain_dependencies
    ),
}


def section_examples(policy: Policy) -> Iterator[SectionExample]:
    yield from (example for example in policy.section_examples if isinstance(example, SectionExample))


def judge_section_example(policy: Policy, section: str, expectation: str, source: str) -> tuple[bool, str]:
    return SECTIONS[section].judge(policy, expectation, source)


# ---------------------------------------------------------------------------------- program checks

INVALID_MANIFEST = "invalid_dependency_manifest"
DEPENDENCY_REFUSED = "dependency_policy_violation"


def dependency_violations(source: str, policy: Policy) -> tuple[list[Violation], Manifest]:
    """The program's declared packages against the dependency section, as `policy check` reports them before
    anything is resolved: a malformed block or a refused name is a recoverable violation at the block's line."""
    location = _block_location(source)
    try:
        manifest = manifest_of(source)
        if manifest:
            policy.dependencies.check(manifest.names)
    except EnvironmentFailure as exc:
        correction = f"Fix the program's `# /// script` dependencies block: {exc.hint or 'see the message'}."
        violation = Violation(
            violation_type=exc.kind,
            message=exc.message,
            location=location,
            classification="recoverable",
            required_correction=correction,
        )
        return [violation], Manifest()
    return [], manifest


def _block_location(source: str) -> Location | None:
    for number, line in enumerate(source.splitlines(), start=1):
        if line.rstrip() == "# /// script":
            return Location(line=number, column=1, end_line=number, end_column=len(line) + 1, source_line=line)
    return None
