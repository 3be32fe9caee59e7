"""Third-party imports against a program's declared environment (issue 19).

The policy's ``module_not_allowed`` rule refuses every module outside the sandbox's standard-library list.
A third-party module is different: a program may import it when a distribution it declares (PEP 723, or the
provider's structured field) provides it. :func:`judge_imports` rewrites a validation result accordingly:

- a third-party import the prepared environment's declared distributions provide is no violation;
- before the environment exists (the manifest declares something), such imports are set aside as *pending*:
  they are checked against the environment's record once it is ready (:func:`undeclared_violation`);
- otherwise it is ``undeclared_import``, recoverable: the feedback says to declare it and lists what the
  policy allows. HTTP clients stay ``module_not_allowed`` (never installed: the broker serves ``requests``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from sandforge.runtime.environments.imports import declare_hint, third_party
from sandforge.runtime.environments.policy import HTTP_CLIENTS, DependencyPolicy
from sandforge.runtime.guardrails.results import Location, ValidationResult, Violation, verdict_of

MODULE_NOT_ALLOWED = "module_not_allowed"
UNDECLARED_IMPORT = "undeclared_import"
_NOT_AVAILABLE = " is not available in the sandbox"


def refused_module(violation: Violation) -> str | None:
    """The top-level module a ``module_not_allowed`` violation refuses, or None for any other violation."""
    if violation.violation_type != MODULE_NOT_ALLOWED or not violation.message.endswith(_NOT_AVAILABLE):
        return None
    module = violation.message.removesuffix(_NOT_AVAILABLE).strip()
    top = module.split(".", 1)[0]
    return top if top.isidentifier() else None


def _declarable(module: str | None) -> bool:
    return module is not None and bool(third_party([module])) and module not in HTTP_CLIENTS


def undeclared_violation(
    modules: Iterable[str], policy: DependencyPolicy, location: Location | None = None
) -> Violation:
    """The recoverable "declare it" violation for third-party ``modules`` no declared distribution provides."""
    missing = sorted(set(modules))
    return Violation(
        violation_type=UNDECLARED_IMPORT,
        message=declare_hint(missing, policy),
        location=location,
        classification="recoverable",
        required_correction=(
            f"Declare a distribution that provides {', '.join(missing)} in the program's `# /// script` block "
            "(only ones the policy allows), or rewrite the program without it."
        ),
    )


def judge_imports(
    result: ValidationResult, policy: DependencyPolicy, *, declared: bool, provided: Collection[str] | None
) -> tuple[ValidationResult, tuple[str, ...]]:
    """``result`` with third-party imports judged against the environment (see the module docstring), and the
    modules pending until the environment is prepared (``provided`` None and ``declared``)."""
    kept: list[Violation] = []
    pending: list[str] = []
    undeclared: dict[str, Location | None] = {}
    for violation in result.violations:
        module = refused_module(violation)
        if module is None or not _declarable(module):
            kept.append(violation)
        elif provided is not None and module in provided:
            continue
        elif provided is None and declared:
            pending.append(module)
        else:
            undeclared.setdefault(module, violation.location)
    if undeclared:
        first = next(iter(undeclared.values()))
        kept.append(undeclared_violation(undeclared, policy, first))
    if len(kept) == len(result.violations) and not pending and not undeclared:
        return result, ()
    changed = result.model_copy(update={"violations": kept, "verdict": verdict_of(kept)})
    return changed, tuple(dict.fromkeys(pending))
