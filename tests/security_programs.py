"""Programs the default policy approves that end on a security event inside the sandbox (issue 36), shared by
the tests of every place the event is recorded: call log, outcome metadata, OpenTelemetry, CLI, HTTP, MCP and
the dashboard. ``VIOLATING`` ends on the inner wall's event; ``TRIPPING`` on the tripwire's, which approved
code reaches only with a fix reverted through the tests' seam (``TRIPWIRE_SEAM``): every hole found is closed."""

from __future__ import annotations

from sandforge.runtime.guardrails import default_policy, validate
from sandforge.sandbox.protocol import BootSeam

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


#: Writes context, stages a tool contract (``delegate``), then injects code through a dataclass field name
#: (issue 36 item 1). With ``TRIPWIRE_SEAM`` (the fix reverted: the real ``dataclass``/``TypedDict`` and no
#: name check), ``dataclasses`` compiles text from that name and the tripwire ends the run at that
#: ``compile`` event: ``security_event == (tripwire, compile)``. Nothing may be committed.
TRIPPING = (
    "context['leak'] = 'written before the trip'\n"
    "delegate('helper', purpose='staged with the attempt')\n"
    "import dataclasses, typing\n"
    'T = typing.TypedDict(\'T\', {\'q"\\n__import__("os").system("id")\\ndef k():\\n return "\': int})\n'
    "dataclasses.dataclass(T, init=False, eq=False)\n"
    "return 'escaped'\n"
)
TRIPWIRE_SEAM = BootSeam(unwrapped=("dataclasses.dataclass", "typing.TypedDict", "generators.check_generated_names"))
TRIP_SOURCE, TRIP_EVENT = "tripwire", "compile"


def assert_policy_approves_tripping() -> None:
    result = validate(TRIPPING, default_policy())
    assert result.verdict == "approved", result.violations
