"""AST guardrail policy engine: declarative rules, recoverable vs terminal verdicts (ADR 0016), and
capability extraction, driven by the policy files in ``policies/``.

```python
from sandforge.runtime.guardrails import default_policy, validate

result = validate(source, default_policy())
if result.verdict != "approved":
    feedback = [v.model_dump(mode="json") for v in result.violations]
```

See ``docs/policies.md`` for the policy format and the ``sandforge policy`` commands.
"""

from __future__ import annotations

from sandforge.runtime.guardrails.engine import ENGINE_RULES, cached_verdict, clear_cache, validate
from sandforge.runtime.guardrails.loader import default_policy, default_policy_dir, layered_policy, load_policy
from sandforge.runtime.guardrails.policy import ENGINE_VERSION, CapabilityDefinition, Origin, Policy, PolicySource, Rule
from sandforge.runtime.guardrails.policy_model import policy_json_schema
from sandforge.runtime.guardrails.results import (
    Capability,
    Classification,
    Evidence,
    Location,
    ValidationResult,
    Verdict,
    Violation,
)

__all__ = [
    "ENGINE_RULES",
    "ENGINE_VERSION",
    "Capability",
    "CapabilityDefinition",
    "Classification",
    "Evidence",
    "Location",
    "Origin",
    "Policy",
    "PolicySource",
    "Rule",
    "ValidationResult",
    "Verdict",
    "Violation",
    "cached_verdict",
    "clear_cache",
    "default_policy",
    "default_policy_dir",
    "layered_policy",
    "load_policy",
    "policy_json_schema",
    "validate",
]
