"""Programs the default policy approves that end on a security event inside the sandbox (issue 36), shared by
the tests of every place the event is recorded: call log, outcome metadata, OpenTelemetry, CLI, HTTP, MCP and
the dashboard. The tripwire's events flow through the same field; these use the inner wall's, which every
backend raises today."""

from __future__ import annotations

from sandforge.runtime.guardrails import default_policy, validate

#: Writes context, then reaches a withheld name through a parameter (the policy cannot see which module it
#: is): ``sandbox_violation`` with ``security_event == (inner_wall, withheld_name)``. Nothing may be committed.
VIOLATING = (
    "context['leak'] = 'written before the violation'\n"
    "import functools\n"
    "def reach(module):\n"
    "    return module.update_wrapper\n"
    "return reach(functools)\n"
)
SOURCE, EVENT = "inner_wall", "withheld_name"


def assert_policy_approves() -> None:
    """The tests rely on the policy letting VIOLATING run: fail loudly (not obscurely) if that changes."""
    result = validate(VIOLATING, default_policy())
    assert result.verdict == "approved", result.violations
