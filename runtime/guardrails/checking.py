"""``sandforge policy check``: a program against every part of the policy before anything runs: the rules and
capabilities (``validate``; literal URLs against the egress rules where ``http_fetch`` is granted), and the
packages its ``# /// script`` block declares against the dependency rules, with third-party imports judged as
the agent judges them (pending until the environment exists when the manifest declares something)."""

from __future__ import annotations

from dataclasses import dataclass

from sandforge.runtime.guardrails.dependencies import judge_imports
from sandforge.runtime.guardrails.engine import validate
from sandforge.runtime.guardrails.policy import Policy
from sandforge.runtime.guardrails.results import ValidationResult, verdict_of
from sandforge.runtime.guardrails.sections import dependency_violations


@dataclass(frozen=True)
class ProgramCheck:
    result: ValidationResult
    declared: tuple[str, ...]
    """Distributions the program declares (normalised names), all allowed when the result has no violation
    about them."""
    pending: tuple[str, ...]
    """Third-party modules checked against the environment once it is built (the agent's `pending_imports`)."""


def check_program(source: str | bytes, policy: Policy) -> ProgramCheck:
    result = validate(source, policy)
    text = source.decode("utf-8", errors="replace") if isinstance(source, bytes) else source
    refused, manifest = dependency_violations(text, policy)
    declared = bool(manifest) or bool(refused)  # a refused block is reported once, not again per import
    result, pending = judge_imports(result, policy.dependencies, declared=declared, provided=None)
    if refused:
        violations = [*result.violations, *refused]
        result = result.model_copy(update={"violations": violations, "verdict": verdict_of(violations)})
    return ProgramCheck(result, manifest.names, pending)
