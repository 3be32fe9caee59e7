"""Matching a normalised request against the policy's allow entries (no network involved).

`match_rule` is also what ``policy check`` can use on literal URLs before anything runs."""

from __future__ import annotations

from dataclasses import dataclass

from sandforge.runtime.egress.config import AllowEntry, EgressPolicy, normal_host_glob
from sandforge.runtime.egress.errors import EgressDenied
from sandforge.runtime.egress.urls import DEFAULT_PORTS, Target, host_matches, parse_url, path_matches


@dataclass(frozen=True, slots=True)
class CompiledAllow:
    entry: AllowEntry
    scheme: str | None  # url entries
    host: str
    port: int | None
    path: str
    schemes: frozenset[str]
    ports: frozenset[int] | None

    @classmethod
    def of(cls, entry: AllowEntry) -> CompiledAllow:
        if entry.url is not None:
            scheme, _, rest = entry.url.partition("://")
            authority, slash, path = rest.partition("/")
            if authority.endswith("]") or ":" not in authority:
                host, port = authority, DEFAULT_PORTS[scheme]
            else:
                host, _, port_text = authority.rpartition(":")
                port = int(port_text)
            return cls(entry, scheme, normal_host_glob(host), port, "/" + path if slash else "/**", frozenset(), None)
        assert entry.host is not None
        return cls(
            entry,
            None,
            entry.host,
            None,
            "/**",
            frozenset(entry.schemes or ["https"]),
            frozenset(entry.ports) if entry.ports else None,
        )

    def matches(self, target: Target, method: str) -> bool:
        if method not in self.entry.methods:
            return False
        if self.scheme is not None:
            if target.scheme != self.scheme or target.port != self.port:
                return False
        else:
            if target.scheme not in self.schemes:
                return False
            if target.port not in (self.ports or {DEFAULT_PORTS[target.scheme]}):
                return False
        return host_matches(self.host, target) and path_matches(self.path, target.path)


def compile_allow(policy: EgressPolicy) -> tuple[CompiledAllow, ...]:
    return tuple(CompiledAllow.of(entry) for entry in policy.allow)


def match_rule(rules: tuple[CompiledAllow, ...], target: Target, method: str) -> AllowEntry:
    """The first allow entry that admits `method` on `target`; `EgressDenied` naming why otherwise."""
    for rule in rules:
        if rule.matches(target, method):
            return rule.entry
    if not rules:
        raise EgressDenied(
            f"{method} {target.url} is denied: the egress policy allows no destination (egress.allow is empty)",
            reason="no_allow_entries",
            hint="a deployment grants destinations in its policy's egress.allow; retrying will not help",
        )
    same_place = [rule for rule in rules if host_matches(rule.host, target)]
    if same_place and not any(method in rule.entry.methods for rule in same_place):
        why, reason = f"method {method} is not allowed for {target.host_text}", "method"
    elif same_place:
        why, reason = f"no allow entry covers {target.scheme}, port {target.port} and path {target.path}", "not_allowed"
    else:
        why, reason = f"no allow entry covers host {target.host_text}", "not_allowed"
    raise EgressDenied(
        f"{method} {target.url} is denied: {why}",
        reason=reason,
        hint="the egress policy decides what is reachable; retrying another way will not help",
    )


def static_check(policy: EgressPolicy, url: str, method: str = "GET") -> str | None:
    """For ``policy check``: why a literal URL would be denied before any resolution (None when an allow
    entry admits it; the address checks still apply at run time)."""
    try:
        match_rule(compile_allow(policy), parse_url(url), method.upper())
    except EgressDenied as exc:
        return exc.message
    except Exception as exc:
        return str(exc)
    return None
