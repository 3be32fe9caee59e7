"""The call log: the published schema matches the model, records carry every ADR 0016 field, text is bounded."""

from __future__ import annotations

import json
from pathlib import Path

from sandforge.runtime.agent import CallLog, CallRecord, Workspace, call_log_schema, read_records
from sandforge.runtime.agent.calllog import MAX_JSON_CHARS, MAX_MESSAGE_CHARS, default_log_path
from sandforge.runtime.providers import ScriptedProvider
from sandforge.sandbox import SandboxConfig
from tests.agent.conftest import RECOVERABLE

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "call-log.schema.json"

ADR_SECTION_6 = [
    "attempt_id", "attempt_stage", "validation_failure_type", "rollback_applied", "retry_feedback_injected",
    "guardrail_recovery_attempts", "guardrail_retry_exhausted", "outcome_repair_attempts",
    "outcome_repair_triggered", "outcome_repair_retry_exhausted", "latest_failure_stage",
    "latest_failure_class", "latest_failure_message", "attempt_failures",
]  # fmt: skip
IDENTITY = ["trace_id", "call_id", "parent_call_id", "depth", "role", "method", "args", "kwargs"]
OTHER = [
    "program_source", "program_code", "duration_s", "status", "value", "error_type", "error_message",
    "retriable", "capabilities", "policy_fingerprint", "backend", "usage", "execution_repair_attempts",
]  # fmt: skip
ATTEMPT_FAILURE = ["attempt_id", "stage", "error_class", "error_message", "timestamp", "call_id"]


def test_published_schema_matches_the_model() -> None:
    published = json.loads(SCHEMA_FILE.read_text())
    hint = "regenerate with: sandforge logs --schema > docs/schemas/call-log.schema.json"
    assert published == call_log_schema(), hint


def test_schema_has_every_required_field() -> None:
    schema = call_log_schema()
    props = schema["properties"]
    for name in ADR_SECTION_6 + IDENTITY + OTHER:
        assert name in props, name
    failure = schema["$defs"]["AttemptFailure"]["properties"]
    for name in ATTEMPT_FAILURE:
        assert name in failure, name
    stages = schema["$defs"]["AttemptFailure"]["properties"]["stage"]["enum"]
    assert {"validation", "execution", "outcome_policy"} <= set(stages)
    assert set(props["attempt_stage"]["enum"]) == {"generated", "validated", "executed", "rolled_back"}


def run_calls(tmp_path: Path, programs: list[str], calls: list[tuple[str, list[object]]]) -> Path:
    path = tmp_path / "calls.jsonl"
    provider = ScriptedProvider(programs)
    with Workspace(provider=provider, sandbox=SandboxConfig(pool_size=0), log=CallLog(path)) as ws:
        for method, args in calls:
            ws.call("calc", method, *args)
    return path


def test_one_json_line_per_logical_call_including_nested(tmp_path: Path) -> None:
    parent = "r = tool('helper').ping()\nreturn r.value\n"
    path = run_calls(tmp_path, [RECOVERABLE, parent, "return 'pong'\n", "return 1\n"], [("a", []), ("b", [])])
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    raw = [json.loads(line) for line in lines]
    schema_props = set(call_log_schema()["properties"])
    for item in raw:
        assert set(item) == schema_props
        CallRecord.model_validate(item)
    nested, parent_rec, second = list(read_records(path))
    assert (nested.role, nested.depth, nested.parent_call_id) == ("helper", 1, parent_rec.call_id)
    assert parent_rec.attempts == 2 and parent_rec.attempt_failures[0].stage == "validation"
    assert parent_rec.policy_fingerprint and parent_rec.verdict == "approved"
    assert parent_rec.backend == "subprocess" and parent_rec.usage.peak_memory_mb > 0
    assert parent_rec.program_code == parent and parent_rec.program_sha256
    assert second.trace_id != parent_rec.trace_id


def test_messages_values_and_arguments_are_bounded(tmp_path: Path) -> None:
    noisy = "raise ValueError('x' * 100000)\n"
    big = "return 'y' * 100000\n"
    path = run_calls(tmp_path, [noisy, noisy, big], [("fail", ["z" * 10000]), ("big", [])])
    failed, large = list(read_records(path))
    assert failed.error_message is not None and len(failed.error_message) <= MAX_MESSAGE_CHARS
    assert all(len(f.error_message) <= MAX_MESSAGE_CHARS for f in failed.attempt_failures)
    assert failed.latest_failure_message is not None and len(failed.latest_failure_message) <= MAX_MESSAGE_CHARS
    assert isinstance(failed.args, dict) and failed.args["truncated"] is True
    assert isinstance(large.value, dict) and large.value["truncated"] is True
    assert len(json.dumps(large.value)) < MAX_JSON_CHARS + 200
    assert all(len(line) < 60_000 for line in path.read_text().splitlines())


def test_default_log_path_follows_the_environment(tmp_path: Path, monkeypatch: object) -> None:
    import pytest

    mp = monkeypatch
    assert isinstance(mp, pytest.MonkeyPatch)
    mp.setenv("SANDFORGE_CALL_LOG", str(tmp_path / "x.jsonl"))
    assert default_log_path() == tmp_path / "x.jsonl"
    mp.delenv("SANDFORGE_CALL_LOG")
    mp.setenv("SANDFORGE_STATE_DIR", str(tmp_path / "state"))
    assert default_log_path() == tmp_path / "state" / "logs" / "calls.jsonl"


def test_an_unwritable_log_does_not_fail_the_call(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    provider = ScriptedProvider(["return 1\n"])
    with Workspace(provider=provider, sandbox=SandboxConfig(pool_size=0), log=blocker / "calls.jsonl") as ws:
        out = ws.call("calc", "one")
        assert out.ok and len(ws.log.records) == 1
