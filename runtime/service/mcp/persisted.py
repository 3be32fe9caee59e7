"""Persisted tool methods as MCP tools of their own: which ones, under what name, with what schemas.

A method is exposed when its current artifact is healthy, reusable (cacheable, not a dynamic method) and
its checksum holds: the tools earlier sessions forged and proved, callable directly. The name is
``role.method`` when MCP accepts it (SEP-986: ``[A-Za-z0-9._-]{1,128}``) and no other method maps to it;
otherwise a readable slug with a digest. The mapping is rebuilt from the store on every listing and call,
so a tool that turns unhealthy stops being callable this way at once.

A method whose stored code the calling tenant's policy would reject (a ``web_fetcher.fetch`` for a tenant
without ``http_fetch``) is not listed: calling it could only be refused (docs/serve.md). A method whose
contract types its inputs (``ToolContract.inputs``) gets them as its input schema, positional parameters as
named properties; the others keep the generic ``{args, kwargs}``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from sandforge.runtime.agent.contracts import (
    InvalidContract,
    Parameter,
    deliverable_validator,
    input_schema,
    method_description,
    method_parameters,
    positional_arguments,
    to_json_schema,
)
from sandforge.runtime.guardrails import Policy, validate
from sandforge.runtime.service.mcp.models import CallOutcome
from sandforge.runtime.store import ToolStore
from sandforge.runtime.store.models import RegistryEntry
from sandforge.runtime.store.selection import HealthStatus
from sandforge.runtime.store.toolstore import LookupStatus

MCP_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
#: The fixed tools; a persisted name never takes one (theirs have no dot, ``role.method`` always does).
RESERVED = frozenset({"run_tool_code", "validate_code", "list_tools", "get_tool", "call_stored_tool", "explain_policy"})

@dataclass(frozen=True)
class Exposed:
    """One persisted method exposed as an MCP tool."""

    name: str
    role: str
    method: str
    entry: RegistryEntry

    @property
    def parameters(self) -> list[Parameter] | None:
        """The method's typed positional parameters, None when its contract does not type them (or badly)."""
        try:
            return method_parameters(self.entry.inputs, self.method)
        except InvalidContract:
            return None

    @property
    def input_schema(self) -> dict[str, Any]:
        return input_schema(self.parameters)

    def positional(self, arguments: dict[str, Any]) -> list[Any] | None:
        """Named arguments of a typed method as its positional ones (a missing optional one ends them, so
        the program's own default applies); None when the method is untyped."""
        params = self.parameters
        return None if params is None else positional_arguments(params, arguments)

    @property
    def description(self) -> str:
        headline = f"{self.role}.{self.method}: a stored sandforge tool method (runs sandboxed, no model call)."
        return method_description(headline, self.entry.contract(), typed=self.parameters is not None)

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


#: (code checksum, policy fingerprint) -> approved: a listing validates each stored program once per policy
_VERDICTS: dict[tuple[str, str], bool] = {}
_MAX_VERDICTS = 4096


def _approved(code: str, checksum: str, policy: Policy) -> bool:
    key = (checksum, policy.fingerprint)
    verdict = _VERDICTS.get(key)
    if verdict is None:
        if len(_VERDICTS) >= _MAX_VERDICTS:
            _VERDICTS.clear()
        verdict = _VERDICTS[key] = validate(code, policy).verdict == "approved"
    return verdict


def _eligible(store: ToolStore, policy: Policy | None) -> list[tuple[RegistryEntry, str]]:
    registry = store.registry()
    found: list[tuple[RegistryEntry, str]] = []
    for row in store.health_report():
        if (
            row.status is LookupStatus.FOUND
            and row.health is HealthStatus.HEALTHY
            and row.reusable
            and row.checksum_ok
            and row.role in registry
            and (policy is None or (row.artifact is not None
                                    and _approved(row.artifact.code, row.artifact.code_checksum, policy)))
        ):  # fmt: skip
            found.append((registry[row.role], row.method_name))
    return found


def exposed(store: ToolStore, policy: Policy | None = None) -> dict[str, Exposed]:
    """MCP name -> exposed method, for every healthy reusable method of ``store`` (that ``policy``, the calling
    tenant's, would approve, when given)."""
    eligible = _eligible(store, policy)
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

