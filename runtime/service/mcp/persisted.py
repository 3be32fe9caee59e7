"""Persisted tool methods as MCP tools of their own: which ones, under what name, with what schemas.

A method is exposed when its current artifact is healthy, reusable (cacheable, not a dynamic method) and
its checksum holds: the tools earlier sessions forged and proved, callable directly. The name is
``role.method`` when MCP accepts it (SEP-986: ``[A-Za-z0-9._-]{1,128}``) and no other method maps to it;
otherwise a readable slug with a digest. The mapping is rebuilt from the store on every listing and call,
so a tool that turns unhealthy stops being callable this way at once.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from sandforge.runtime.agent.contracts import InvalidContract, deliverable_validator, to_json_schema
from sandforge.runtime.service.mcp.models import CallOutcome
from sandforge.runtime.store import ToolStore
from sandforge.runtime.store.models import RegistryEntry
from sandforge.runtime.store.selection import HealthStatus
from sandforge.runtime.store.toolstore import LookupStatus

MCP_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
#: The fixed tools; a persisted name never takes one (theirs have no dot, ``role.method`` always does).
RESERVED = frozenset({"run_tool_code", "validate_code", "list_tools", "get_tool", "call_stored_tool", "explain_policy"})

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "args": {"type": "array", "description": "positional arguments (JSON values)", "default": []},
        "kwargs": {"type": "object", "description": "keyword arguments (JSON values)", "default": {}},
    },
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Exposed:
    """One persisted method exposed as an MCP tool."""

    name: str
    role: str
    method: str
    entry: RegistryEntry

    @property
    def description(self) -> str:
        e = self.entry
        lines = [f"{self.role}.{self.method}: a stored sandforge tool method (runs sandboxed, no model call)."]
        lines.append(f"Purpose: {e.purpose}" if e.purpose else "No contract was recorded for this tool.")
        for label, value in (("Deliverable", e.deliverable), ("Acceptance", e.acceptance)):
            if value is not None:
                lines.append(f"{label}: {json.dumps(value, ensure_ascii=False)[:2000]}")
        lines.append("Call with {\"args\": [...], \"kwargs\": {...}}.")
        return "\n".join(lines)

    @property
    def output_schema(self) -> dict[str, Any]:
        schema = CallOutcome.model_json_schema()
        value_schema = _deliverable_schema(self.entry.deliverable)
        if value_schema is not None:
            schema["properties"]["value"] = value_schema
        return schema


def _deliverable_schema(deliverable: Any) -> dict[str, Any] | None:
    """The contract's deliverable as the value's schema, when it is one the lifecycle enforces."""
    try:
        if deliverable_validator(deliverable) is None:
            return None
        return to_json_schema(deliverable)
    except InvalidContract:
        return None


def _slug(role: str, method: str) -> str:
    digest = hashlib.sha256(f"{role}\0{method}".encode("utf-8", "surrogatepass")).hexdigest()[:10]
    base = _UNSAFE.sub("_", f"{role}.{method}").strip("_")[:100] or "tool"
    return f"{base}-{digest}"


def _eligible(store: ToolStore) -> list[tuple[RegistryEntry, str]]:
    registry = store.registry()
    found: list[tuple[RegistryEntry, str]] = []
    for row in store.health_report():
        if (
            row.status is LookupStatus.FOUND
            and row.health is HealthStatus.HEALTHY
            and row.reusable
            and row.checksum_ok
            and row.role in registry
        ):
            found.append((registry[row.role], row.method_name))
    return found


def exposed(store: ToolStore) -> dict[str, Exposed]:
    """MCP name -> exposed method, for every healthy reusable method of ``store``."""
    eligible = _eligible(store)
    plain: dict[str, list[tuple[RegistryEntry, str]]] = {}
    for entry, method in eligible:
        plain.setdefault(f"{entry.role}.{method}", []).append((entry, method))
    tools: dict[str, Exposed] = {}
    for name, holders in plain.items():
        unique = len(holders) == 1 and MCP_NAME.fullmatch(name) is not None and name not in RESERVED
        for entry, method in holders:
            chosen = name if unique else _slug(entry.role, method)
            tools[chosen] = Exposed(chosen, entry.role, method, entry)
    return tools
