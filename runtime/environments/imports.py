"""Which third-party modules a program imports, and which of them no declared distribution provides: the
pieces of the guardrail "importing a third-party module that no declared distribution provides is a
recoverable violation (declare it)", which the next round wires into validation once the environment's record
(`EnvironmentRecord.provides`) is known. Also the sentence the provider prompt adds about declaring packages."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping

from sandforge.runtime.environments.policy import DependencyPolicy
from sandforge.sandbox.inside.compilation import parse as parse_program

_STDLIB = frozenset(sys.stdlib_module_names)


def imported_top_level(source: str) -> list[str]:
    """Top-level module names the program imports (``import a.b``, ``from a import b``), in order of first
    appearance; relative imports and ``__future__`` excluded. A syntax error yields nothing (validation
    reports it)."""
    try:
        tree = parse_program(source)
    except SyntaxError:
        return []
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, node.col_offset, alias.name.split(".", 1)[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.col_offset, node.module.split(".", 1)[0]))
    seen = dict.fromkeys(name for _line, _col, name in sorted(found))
    seen.pop("__future__", None)
    return list(seen)


def third_party(modules: Iterable[str]) -> list[str]:
    """The names among ``modules`` that are not the standard library's."""
    return [name for name in modules if name not in _STDLIB]


def undeclared_imports(source: str, provides: Mapping[str, Iterable[str]]) -> list[str]:
    """Third-party modules the program imports that no distribution of its environment provides
    (``provides``: distribution -> top-level modules, an `EnvironmentRecord`'s). Empty: nothing to declare."""
    available = {module for modules in provides.values() for module in modules}
    return [name for name in third_party(imported_top_level(source)) if name not in available]


def declare_hint(missing: Iterable[str], policy: DependencyPolicy) -> str:
    """The feedback for undeclared imports: what to declare, and what the policy allows."""
    names = ", ".join(sorted(missing))
    allowed = ", ".join(policy.allowed) or "none"
    return (
        f"the program imports {names} but declares no distribution that provides it; declare it in a "
        f'`# /// script` block (dependencies = ["..."]) with a distribution the policy allows: {allowed}'
    )


def prompt_note(policy: DependencyPolicy) -> str:
    """What the provider prompt tells the model about third-party packages under ``policy``."""
    if not policy.allowed:
        return "Use only the standard library: this deployment allows no third-party packages."
    return (
        "You may use these third-party distributions, and only these, by declaring them at the top of the "
        'program in a PEP 723 block (# /// script / # dependencies = ["python-dateutil>=2.8"] / # ///): '
        f"{', '.join(policy.allowed)}. HTTP client libraries are never installed; fetch with requests or "
        "fetch() as documented, which the host brokers."
    )
