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

A contract that declares the files its calls take (``ToolContract.files``, issue 41) adds a ``files``
property (name -> base64; declared names as properties, required ones required, a glob admitting other
names); the files it produces are named in the output schema's ``files``, whose bytes follow as content
items, as ``run_tool_code``'s do.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from sandforge.runtime.agent.contracts import (
    InvalidContract,
    Parameter,
    arguments_problem,
    check_inputs,
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
from sandforge.runtime.store.models import FileSpec, RegistryEntry, ToolFiles
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
    def arguments_schema(self) -> dict[str, Any]:
        """The schema of the method's own arguments: :attr:`input_schema` without the declared files."""
        return input_schema(self.parameters)

    @property
    def input_schema(self) -> dict[str, Any]:
        schema = self.arguments_schema
        files = files_schema(self.entry.files)
        if files is None or FILES in schema["properties"]:  # a typed parameter named ``files`` keeps its name
            return schema
        schema = {**schema, "properties": {**schema["properties"], FILES: files}}
        if files.get("required"):
            schema["required"] = [*schema.get("required", []), FILES]
        return schema

    def take_files(self, arguments: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]] | str:
        """``arguments`` without the declared ``files`` property, and those files decoded; or why they do not
        fit the input schema (one line). Every name must be declared (a name, or matching a glob)."""
        schema = self.input_schema
        if FILES not in schema["properties"] or schema["properties"][FILES].get("type") != "object":
            return arguments, {}
        problem = arguments_problem(schema, arguments)
        if problem is not None:
            return problem
        rest = {k: v for k, v in arguments.items() if k != FILES}
        given: dict[str, Any] = arguments.get(FILES) or {}
        declared = self.entry.files.takes if self.entry.files is not None else []
        files: dict[str, bytes] = {}
        for name, text in given.items():
            if not any(fnmatch.fnmatchcase(name, spec.name) for spec in declared):
                return f"files/{name}: not a file this tool takes"[:500]
            try:
                files[name] = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                return f"files/{name}: not base64"[:500]
        problem = check_inputs(self.entry.files, files)  # the declared media types, checked against the bytes
        return (rest, files) if problem is None else problem[:500]

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
        produced = self.entry.files.produces if self.entry.files is not None else []
        if produced:
            listing = ", ".join(_described(spec) for spec in produced)
            files = schema["properties"]["files"]
            files["description"] = f"{files.get('description', '')}; this tool declares: {listing}"[:2000]
        return schema


#: The input property of a stored tool's declared files (issue 41).
FILES = "files"


def _is_glob(name: str) -> bool:
    return any(c in name for c in "*?[")


def _described(spec: FileSpec) -> str:
    kind = f" ({spec.media_type})" if spec.media_type else ""
    return f"{spec.name}{kind}{'' if spec.required else ', optional'}"


def files_schema(files: ToolFiles | None) -> dict[str, Any] | None:
    """The ``files`` input property of a contract's declared inputs (None: it declares none)."""
    if files is None or not files.takes:
        return None
    base64_text: dict[str, Any] = {"type": "string", "contentEncoding": "base64"}
    exact = [spec for spec in files.takes if not _is_glob(spec.name)]
    globs = [spec.name for spec in files.takes if _is_glob(spec.name)]
    properties = {
        spec.name: {**base64_text, **({"contentMediaType": spec.media_type} if spec.media_type else {}),
                    "description": spec.description or f"read-only to the program as inputs/{spec.name}"}
        for spec in exact
    }  # fmt: skip
    described = "input files by name, each base64: read-only to the program as inputs/NAME"
    schema: dict[str, Any] = {
        "type": "object",
        "description": described + (f"; other names matching {', '.join(globs)}" if globs else ""),
        "properties": properties,
        "additionalProperties": base64_text if globs else False,
    }
    required = [spec.name for spec in exact if spec.required]
    if required:
        schema["required"] = required
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

