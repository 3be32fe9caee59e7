"""Uses of ``urllib.request``/``urllib.error``/``requests`` beyond what the sandbox's broker-backed stand-ins
offer (``sandbox/inside/standins.py``'s ``SURFACE``, read here so the two cannot drift apart).

A program granted ``http_fetch`` imports these modules and gets the stand-ins; ``requests.Session()`` or
``urlopen(url, context=ctx)`` would fail at run time with ``NotSupported``. Flagging them before anything runs
saves a sandbox and says what is supported: a recoverable violation (a rewrite with the supported surface
works).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from sandforge.runtime.guardrails.program import Program
from sandforge.sandbox.inside.standins import REQUESTS_KEYWORDS, SURFACE, URLOPEN_KEYWORDS

#: Calls whose keyword arguments are bounded, by qualified name.
_KEYWORDS: dict[str, frozenset[str]] = {
    **{f"requests.{verb}": REQUESTS_KEYWORDS for verb in ("get", "post", "put", "patch", "delete", "head", "options")},
    "requests.request": REQUESTS_KEYWORDS | {"method", "url"},
    "urllib.request.urlopen": URLOPEN_KEYWORDS | {"url"},
    "urllib.request.Request": frozenset({"url", "data", "headers", "method"}),
}


@dataclass(frozen=True)
class Unsupported:
    node: ast.AST
    message: str


def _standin_of(qualname: str) -> tuple[str, str] | None:
    """The stand-in module a qualified name is inside and the name read from it (``requests.get().json``
    -> ``("requests", "get")``), or None."""
    best = None
    for module in SURFACE:
        if qualname.startswith(module + ".") and (best is None or len(module) > len(best)):
            best = module
    if best is None:
        return None
    name = qualname[len(best) + 1 :].split(".", 1)[0].split("(", 1)[0]
    return best, name


def _describe(module: str, name: str) -> str:
    return (
        f"{module}.{name} is not supported in the sandbox: the {module} stand-in (the host's broker makes the "
        f"requests) offers {', '.join(sorted(SURFACE[module]))}"
    )


def unsupported_uses(program: Program) -> Iterator[Unsupported]:
    """Every reference, import and keyword argument outside the stand-ins' surface."""
    yield from _references(program)
    yield from _imports(program)
    yield from _keywords(program)


def _references(program: Program) -> Iterator[Unsupported]:
    for qualname, nodes in program.refs.items():
        found = _standin_of(qualname)
        if found is not None and found[1] not in SURFACE[found[0]]:
            yield Unsupported(nodes[0], _describe(*found))


def _imports(program: Program) -> Iterator[Unsupported]:
    for fact in program.imports:
        if fact.module in SURFACE:
            for name in fact.names:
                if name != "*" and name not in SURFACE[fact.module]:
                    yield Unsupported(fact.node, _describe(fact.module, name))
        elif (found := _standin_of(fact.module)) is not None and found[1] not in SURFACE[found[0]]:
            yield Unsupported(fact.node, _describe(*found))


def _keywords(program: Program) -> Iterator[Unsupported]:
    for function, allowed in _KEYWORDS.items():
        for call in program.calls.get(function, []):
            for keyword in call.keywords:
                if keyword.arg is not None and keyword.arg not in allowed:
                    message = (
                        f"{function}({keyword.arg}=...) is not supported in the sandbox: it takes "
                        f"{', '.join(sorted(allowed))} (redirects, TLS and credentials are the host's broker's)"
                    )
                    yield Unsupported(keyword.value, message)
