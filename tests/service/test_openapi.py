"""docs/api/openapi.json is the document the server publishes at /openapi.json, and it stays current."""

from __future__ import annotations

import json
from pathlib import Path

from sandforge.runtime.service.models import ExecResult, exec_result
from sandforge.runtime.service.openapi import openapi_document, render
from sandforge.sandbox import ExecutionOutcome
from sandforge.sandbox.protocol import ErrorType

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "api" / "openapi.json"
REGENERATE = "python -m sandforge.runtime.service.openapi > docs/api/openapi.json"


def test_the_committed_document_is_current() -> None:
    assert COMMITTED.read_text() == render(), f"docs/api/openapi.json is stale; regenerate: {REGENERATE}"


def test_the_document_lists_every_endpoint_and_the_bearer_scheme() -> None:
    document = openapi_document()
    paths = document["paths"]
    for path in ("/v1/exec", "/v1/agents/{role}/{method}", "/v1/tools", "/v1/tools/{role}", "/v1/tools/{role}/{method}",
                 "/v1/calls", "/v1/sessions/{session_id}", "/v1/sessions/{session_id}/messages", "/v1/policy/check",
                 "/healthz", "/readyz"):  # fmt: skip
        assert path in paths, path
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    exec_post = paths["/v1/exec"]["post"]
    assert {"401", "413", "422", "429"} <= set(exec_post["responses"])
    assert "security" not in paths["/healthz"]["get"]


def test_exec_result_matches_its_schema() -> None:
    for outcome in (
        ExecutionOutcome(status="ok", value=[1, {"a": None}], context={"k": 2}, stdout="x", backend="subprocess"),
        ExecutionOutcome.failure(ErrorType.TIMEOUT, "took too long", retriable=True, backend="docker"),
    ):
        result = exec_result(outcome)
        ExecResult.model_validate(result)
        assert result["status"] == outcome.status and result["metadata"]["backend"] == outcome.backend
    assert json.loads(COMMITTED.read_text())["components"]["schemas"]["ExecResult"]["required"] == ["status"]
