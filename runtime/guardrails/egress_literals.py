"""Literal URLs a program fetches, judged by the policy's egress rules before anything runs.

A program granted ``http_fetch`` can still name a destination no deployment lets it reach
(``requests.get("http://169.254.169.254/")``). Running it only to have the broker refuse the request costs a
sandbox and a model round, and no rewrite can fix it: that is a *terminal* violation, reported here, with the
reason the broker would give. The URLs that are allowed are the capability's evidence of where the program
goes (``Capability.hosts``). Only literal URLs in the calls that fetch count (``fetch``, ``urlopen``,
``Request``, ``requests.<verb>``, ``requests.request``): a URL computed at run time is the broker's to judge,
and so is everything resolution decides (a name whose addresses are denied).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from sandforge.runtime.egress.addresses import IPNetwork, classify, networks
from sandforge.runtime.egress.config import EgressPolicy
from sandforge.runtime.egress.errors import FetchError
from sandforge.runtime.egress.rules import CompiledAllow, compile_allow, match_rule
from sandforge.runtime.egress.urls import parse_url
from sandforge.runtime.guardrails.program import Program

#: ``requests`` verbs whose first argument is the URL.
_VERBS = frozenset({"get", "post", "put", "patch", "delete", "head", "options"})
#: Calls whose first argument (or ``url=``) is the URL: a bare name or the last part of a dotted one.
_URL_FIRST = frozenset({"fetch", "urlopen", "Request"})


@dataclass(frozen=True)
class LiteralFetch:
    """One literal URL in a fetching call, with the method the call uses and the broker's verdict."""

    node: ast.Call
    url: str
    method: str
    denied: str  # why the egress rules refuse it; empty when an allow entry admits it
    host: str  # the normalised host, for the capability's evidence


def literal_fetches(program: Program, egress: EgressPolicy) -> list[LiteralFetch]:
    """Every literal URL in a fetching call, judged in source order."""
    rules = compile_allow(egress)
    exempt = networks(egress.allow_ranges)
    found: list[LiteralFetch] = []
    for call in program.nodes(ast.Call):
        for url, method in _urls(call):
            denied, host = _judge(url, method, rules, exempt)
            found.append(LiteralFetch(call, url, method, denied, host))
    return found


def _judge(url: str, method: str, rules: tuple[CompiledAllow, ...], exempt: tuple[IPNetwork, ...]) -> tuple[str, str]:
    """Why the broker would refuse ``method url`` on the URL alone (empty if not), and the normalised host."""
    try:
        target = parse_url(url)
        match_rule(rules, target, method)
    except FetchError as exc:
        return exc.message, ""
    if target.ip is not None:  # an address literal: the deny list applies without resolution
        verdict = classify(target.ip, exempt)
        if not verdict.allowed:
            return f"{method} {target.url} is denied: {verdict.reason}", target.host_text
    return "", target.host_text


def _urls(call: ast.Call) -> Iterator[tuple[str, str]]:
    name = _callee(call.func)
    if name is None:
        return
    *owner, last = name.split(".")
    if owner == ["requests"] and last in _VERBS:
        url = _argument(call, 0, "url")
        method = last.upper()
    elif owner == ["requests"] and last == "request":
        url = _argument(call, 1, "url")
        method = (_argument(call, 0, "method") or "").upper()
        if not method:
            return  # the method is computed: the broker decides at run time
    elif last in _URL_FIRST:
        url = _argument(call, 0, "url")
        method = (_keyword(call, "method") or ("POST" if _has_data(call, last) else "GET")).upper()
    else:
        return
    if url is not None and url[:8].lower().startswith(("http://", "https://")):
        yield url, method


def _has_data(call: ast.Call, name: str) -> bool:
    """``urlopen(url, data)`` and ``Request(url, data)`` post when they carry a body."""
    if name == "fetch":
        return False
    return len(call.args) > 1 or any(k.arg == "data" for k in call.keywords)


def _callee(func: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    parts.append(func.id)
    return ".".join(reversed(parts[:2])) if len(parts) > 1 else parts[0]


def _argument(call: ast.Call, position: int, keyword: str) -> str | None:
    if len(call.args) > position:
        node: ast.expr | None = call.args[position]
    else:
        node = next((k.value for k in call.keywords if k.arg == keyword), None)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _keyword(call: ast.Call, keyword: str) -> str | None:
    node = next((k.value for k in call.keywords if k.arg == keyword), None)
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
