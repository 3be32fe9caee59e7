"""A real store filled by real calls: the programs a scripted model writes, in the order it is asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from tests.security_programs import VIOLATING

#: what the scripted provider answers, request after request (see CALLS for who asks)
PROGRAMS = [
    "return 10 // args[0]\n",  # calc.div(2): generation 1
    "if args[0] == 0:\n    return 0\nreturn 10 // args[0]\n",  # calc.div(0): gen 1 fails, the repair is gen 2
    "import os\nreturn os.getcwd()\n",  # calc.double(4): refused by the policy ...
    "return args[0] * 2\n",  # ... and regenerated
    "return tool('calc').div(args[0])\n",  # report.run(5): a nested call of calc.div
    "raise ValueError('boom')\n",  # broken.go(): fails, and the script has nothing left to repair it with
]

#: (role, method, args) in order; the comment in PROGRAMS says which program each one uses
CALLS: list[tuple[str, str, list[Any]]] = [
    ("calc", "div", [2]),
    ("calc", "div", [5]),
    ("calc", "div", [0]),
    ("calc", "double", [4]),
    ("report", "run", [5]),
    ("broken", "go", []),
]


def tenant_config(root: Path, tenant: str = "alpha", programs: list[str] = PROGRAMS) -> dict[str, Any]:
    """``tenant``, whose scripted model answers ``programs`` in order, and ``beta``, with no model."""
    (root / f"{tenant}_programs.json").write_text(json.dumps(programs))
    return {
        "state_dir": "state",
        "tenants": [
            {"name": tenant, "provider": {"kind": "scripted", "programs": f"{tenant}_programs.json"}},
            {"name": "beta"},
        ],
    }


def fill(client: httpx.Client, calls: list[tuple[str, str, list[Any]]] = CALLS) -> list[dict[str, Any]]:
    """Make every call of ``calls`` through the HTTP API; the outcomes, in order."""
    outcomes = []
    for role, method, args in calls:
        response = client.post(f"/v1/agents/{role}/{method}", json={"args": args})
        assert response.status_code == 200, response.text
        outcomes.append(response.json())
    return outcomes


#: a tenant whose tools' programs end on security events (issue 36): what the security page shows
SECURITY_PROGRAMS = [
    VIOLATING,  # vault.peek(): ends on a security event, rolled back ...
    "return context.get('leak', 'nothing committed')\n",  # ... and repaired: ok, and it proves nothing was committed
    "return 10 // args[0]\n",  # calc.div(2): no event
    VIOLATING,  # vault.open(): ends on one ...
    VIOLATING,  # ... and on one again: the call fails (sandbox_violation) with two events
]
SECURITY_CALLS: list[tuple[str, str, list[Any]]] = [("vault", "peek", []), ("calc", "div", [2]), ("vault", "open", [])]

