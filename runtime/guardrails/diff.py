"""What changes between two effective policies, for the review of a policy change (``sandforge policy diff``).

Every change is classified: ``permissive`` (something refused before may now pass: a rule removed or disabled, a
pattern dropped from a matcher or added to its exemptions, a capability granted, an egress destination or a
distribution allowed, a limit raised), ``restrictive`` (the reverse), ``neutral`` (wording, classification:
the program is refused either way) or ``unknown`` (a matcher or plugin changed in a way that cannot be ordered;
a reviewer must read it). The exit status treats ``unknown`` as permissive: fail closed. As evidence, every example
program of either policy that one approves and the other refuses is listed (area ``program``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sandforge.runtime.guardrails.policy import Policy, Rule

Effect = Literal["permissive", "restrictive", "neutral", "unknown"]
#: Matcher fields listing what is refused (fewer entries: more permissive) and what is exempt (the reverse).
_MATCHED = ("modules", "names", "functions", "evaluators", "tags", "computed_names")
_EXEMPT = ("except", "except_super", "except_granted")
#: Limits under which a larger value lets more through.
_LOOSER_WHEN_LARGER = {"max_source_bytes", "max_ast_depth"}


@dataclass(frozen=True)
class Change:
    area: str  # rule | grant | capability | limits | egress | dependencies
    subject: str
    what: str
    effect: Effect

    def to_json(self) -> dict[str, str]:
        return {"area": self.area, "subject": self.subject, "change": self.what, "effect": self.effect}


def diff_policies(old: Policy, new: Policy) -> list[Change]:
    """Every change from ``old`` to ``new``, rules first, then grants, capabilities, limits and sections, then the
    example programs whose verdict changes between approved and refused."""
    return [
        *_rules(old, new),
        *_grants(old, new),
        *_capabilities(old, new),
        *_limits(old, new),
        *_egress(old, new),
        *_dependencies(old, new),
        *program_evidence(old, new),
    ]


def loosens(changes: list[Change]) -> bool:
    """Whether anything became (or may have become) more permissive."""
    return any(change.effect in ("permissive", "unknown") for change in changes)


# ---------------------------------------------------------------------------------------------- rules


def _rules(old: Policy, new: Policy) -> Iterator[Change]:
    before = {rule.id: rule for rule in old.rules}
    after = {rule.id: rule for rule in new.rules}
    for rule_id, rule in before.items():
        if rule_id not in after:
            yield Change("rule", rule_id, "removed", "permissive" if rule.enabled else "neutral")
    for rule_id, rule in after.items():
        if rule_id not in before:
            yield Change("rule", rule_id, "added", "restrictive" if rule.enabled else "neutral")
        else:
            yield from _rule_changes(before[rule_id], rule)


def _rule_changes(old: Rule, new: Rule) -> Iterator[Change]:
    if old.enabled != new.enabled:
        effect: Effect = "restrictive" if new.enabled else "permissive"
        yield Change("rule", new.id, "enabled" if new.enabled else "disabled", effect)
    if not (old.enabled or new.enabled):
        return
    if old.classification != new.classification:
        what = f"reclassified {old.classification} -> {new.classification} (refused either way)"
        yield Change("rule", new.id, what, "neutral")
    before, after = _dump(old.spec.match), _dump(new.spec.match)
    if before != after:
        effect, detail = _matcher_effect(before, after)
        yield Change("rule", new.id, f"matcher changed: {detail}", effect)
    for field in ("message", "required_correction"):
        if getattr(old.spec, field) != getattr(new.spec, field):
            yield Change("rule", new.id, f"{field} reworded", "neutral")


def _dump(model: Any) -> dict[str, Any]:
    data: dict[str, Any] = model.model_dump(mode="json", by_alias=True)
    return data


def _matcher_effect(old: dict[str, Any], new: dict[str, Any]) -> tuple[Effect, str]:
    """How a matcher changed: patterns dropped from what it matches, or added to what it exempts, loosen it."""
    if old.get("kind") != new.get("kind"):
        return "unknown", f"kind {old.get('kind')} -> {new.get('kind')}"
    looser: list[str] = []
    tighter: list[str] = []
    other: list[str] = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) == new.get(key) or key == "kind":
            continue
        a, b = _items(old.get(key)), _items(new.get(key))
        if key in _MATCHED:
            looser += [f"{key} -{x}" for x in sorted(a - b)]
            tighter += [f"{key} +{x}" for x in sorted(b - a)]
        elif key in _EXEMPT:
            looser += [f"{key} +{x}" for x in sorted(b - a)]
            tighter += [f"{key} -{x}" for x in sorted(a - b)]
        else:
            other.append(key)
    detail = ", ".join([*looser, *tighter, *(f"{key} changed" for key in other)])
    if other:
        return "unknown", detail
    return ("permissive" if looser else "restrictive"), detail


def _items(value: Any) -> set[str]:
    """A matcher field as comparable entries: a list's items; a mapping's ``key:item`` (or ``key=value``)."""
    if value is None:
        return set()
    if isinstance(value, Mapping):
        out: set[str] = set()
        for key, inner in value.items():
            if isinstance(inner, list):
                out |= {f"{key}:{item}" for item in inner}
            else:
                out.add(f"{key}={json.dumps(inner, sort_keys=True)}")
        return out
    if isinstance(value, list):
        return {item if isinstance(item, str) else json.dumps(item, sort_keys=True) for item in value}
    return {json.dumps(value, sort_keys=True)}


# ---------------------------------------------------------------------------------- grants, capabilities


def _grants(old: Policy, new: Policy) -> Iterator[Change]:
    for tag in sorted(new.granted - old.granted):
        where = new.grant_origins.get(tag)
        yield Change("grant", tag, f"granted{f' ({where})' if where else ''}", "permissive")
    for tag in sorted(old.granted - new.granted):
        yield Change("grant", tag, "no longer granted", "restrictive")


def _capabilities(old: Policy, new: Policy) -> Iterator[Change]:
    for tag in sorted(set(old.capabilities) | set(new.capabilities)):
        before = _specs(old, tag)
        after = _specs(new, tag)
        if before == after:
            continue
        # detecting less of a capability the new policy does not grant lets its use go unnoticed
        effect: Effect = "neutral" if tag in new.granted else "permissive"
        if before - after:
            yield Change("capability", tag, f"{len(before - after)} detection matcher(s) removed", effect)
        if after - before:
            added: Effect = "neutral" if tag in new.granted else "restrictive"
            yield Change("capability", tag, f"{len(after - before)} detection matcher(s) added", added)


def _specs(policy: Policy, tag: str) -> set[str]:
    definition = policy.capabilities.get(tag)
    return {json.dumps(_dump(spec), sort_keys=True) for spec in definition.specs} if definition else set()


def _limits(old: Policy, new: Policy) -> Iterator[Change]:
    a, b = old.limits.model_dump(), new.limits.model_dump()
    for key in sorted(a):
        if a[key] != b[key]:
            effect: Effect = "neutral"
            if key in _LOOSER_WHEN_LARGER:
                effect = "permissive" if b[key] > a[key] else "restrictive"
            yield Change("limits", key, f"{a[key]} -> {b[key]}", effect)


# ------------------------------------------------------------------------------------------- sections


def _egress(old: Policy, new: Policy) -> Iterator[Change]:
    a, b = old.egress, new.egress
    before = {json.dumps(_dump(e), sort_keys=True): e.label() for e in a.allow}
    after = {json.dumps(_dump(e), sort_keys=True): e.label() for e in b.allow}
    yield from (Change("egress", "allow", f"+ {after[k]}", "permissive") for k in after.keys() - before.keys())
    yield from (Change("egress", "allow", f"- {before[k]}", "restrictive") for k in before.keys() - after.keys())
    for cidr in sorted(set(b.allow_ranges) - set(a.allow_ranges)):
        yield Change("egress", "allow_ranges", f"+ {cidr} (exempt from the platform deny list)", "permissive")
    for cidr in sorted(set(a.allow_ranges) - set(b.allow_ranges)):
        yield Change("egress", "allow_ranges", f"- {cidr}", "restrictive")
    for host in sorted(set(a.resolve) | set(b.resolve)):
        if a.resolve.get(host) != b.resolve.get(host):
            yield Change("egress", "resolve", f"{host}: {a.resolve.get(host)} -> {b.resolve.get(host)}", "unknown")
    yield from _credentials(old, new)
    if a.ca_file != b.ca_file:
        yield Change("egress", "ca_file", f"{a.ca_file} -> {b.ca_file}", "unknown")
    la, lb = a.limits.model_dump(), b.limits.model_dump()
    for key in sorted(k for k in la if la[k] != lb[k]):
        effect: Effect = "permissive" if lb[key] > la[key] else "restrictive"
        yield Change("egress", f"limits.{key}", f"{la[key]} -> {lb[key]}", effect)


def _credentials(old: Policy, new: Policy) -> Iterator[Change]:
    before = {(c.host, c.header.lower()): c for c in old.egress.credentials}
    after = {(c.host, c.header.lower()): c for c in new.egress.credentials}
    for host, header in sorted(after.keys() - before.keys()):
        yield Change("egress", "credentials", f"+ {header} sent to {host}", "permissive")
    for host, header in sorted(before.keys() - after.keys()):
        yield Change("egress", "credentials", f"- {header} for {host}", "restrictive")
    for host, header in sorted(before.keys() & after.keys()):
        if before[(host, header)] != after[(host, header)]:
            yield Change("egress", "credentials", f"{header} for {host} changed", "unknown")


def _dependencies(old: Policy, new: Policy) -> Iterator[Change]:
    a, b = old.dependencies, new.dependencies
    for name in sorted(set(b.allowed) - set(a.allowed)):
        yield Change("dependencies", "allow", f"+ {name}", "permissive")
    for name in sorted(set(a.allowed) - set(b.allowed)):
        yield Change("dependencies", "allow", f"- {name}", "restrictive")
    if a.sources != b.sources:
        yield Change("dependencies", "source", f"{a.sources.describe()} -> {b.sources.describe()}", "unknown")
    if a.max_env_mb != b.max_env_mb:
        effect: Effect = "permissive" if b.max_env_mb > a.max_env_mb else "restrictive"
        yield Change("dependencies", "max_env_mb", f"{a.max_env_mb} -> {b.max_env_mb}", effect)


# ------------------------------------------------------------------------------------------- evidence


def program_evidence(old: Policy, new: Policy) -> Iterator[Change]:
    """The example programs of both policies (rules' and capabilities') that one refuses and the other
    approves: concrete evidence of what a change lets through (``permissive``) or stops (``restrictive``)."""
    from sandforge.runtime.guardrails.engine import validate
    from sandforge.runtime.guardrails.selftest import examples

    seen: dict[str, str] = {}
    for policy in (old, new):
        for example in examples(policy):
            if example.subject in ("rule", "capability"):
                seen.setdefault(example.source, example.name)
    for source, name in seen.items():
        before, after = validate(source, old).verdict, validate(source, new).verdict
        if (before == "approved") != (after == "approved"):
            effect: Effect = "permissive" if after == "approved" else "restrictive"
            first = source.strip().splitlines()[0] if source.strip() else ""
            yield Change("program", name, f"{before} -> {after}: {first[:80]}", effect)
