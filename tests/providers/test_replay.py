"""Record a live session (the openai provider against a model server on loopback), replay it with no model.

The recorded session exercises the lifecycle with model text: a guardrail rejection whose fix the model
then writes, a program that calls another tool (a nested call served from the store), and a second call
that the store answers without the model. Replaying it twice, each time into a fresh state directory, gives
call-log records byte-identical to each other and to the recorded run's, once the fields a run measures or
mints are normalised (``replay.normalised``: ids numbered by first appearance, clock times and durations
blanked; they are this machine's timing, not the model's answer). On subprocess, docker and gVisor.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandforge.runtime.agent import Agent, CallLog, Workspace
from sandforge.runtime.providers.openai_provider import OpenAIProvider
from sandforge.runtime.providers.replay import (
    RecordingProvider,
    ReplayMismatch,
    ReplayProvider,
    first_difference,
    normalised_log,
    read_recording,
)
from sandforge.runtime.store import ToolStore
from sandforge.sandbox import Limits, SandboxConfig
from tests.conftest import _require_backend
from tests.providers.wire import Reply, program_completion, wire_server

KEY = "sk-replay-test-7f3a9c0e5b2d4a1f"
#: What the model answers, in order: a program the guardrail rejects, its fix, a program with a nested call.
MODEL_ANSWERS = [
    "import os\ncontext['cwd'] = os.getcwd()\nreturn 1\n",
    "context['total'] = context.get('total', 0) + args[0]\nreturn context['total']\n",
    "r = tool('adder').add(args[0] * 2)\nreturn {'doubled_then_added': r.value}\n",
]


def session(provider: Any, state: Path, backend: str) -> tuple[list[Any], str]:
    """The session: adder.add(2), doubler.double(5) (nested adder.add(10), from the store), adder.add(1)."""
    # a generous time limit: a loaded machine must not turn a replay's execution into a timeout the recording
    # did not have (the replay would then rightly diverge)
    config = SandboxConfig(backend=backend, pool_size=0)  # type: ignore[arg-type]
    ws = Workspace(provider=provider, sandbox=config, log=CallLog(state / "calls.jsonl"), store=ToolStore(state),
                   limits=Limits(timeout_s=120))  # fmt: skip
    try:
        adder, doubler = Agent.for_role("adder", workspace=ws), Agent.for_role("doubler", workspace=ws)
        outcomes = [adder.add(2), doubler.double(5), adder.add(1)]
    finally:
        ws.close()
    return [(o.status, o.value, o.error_type) for o in outcomes], (state / "calls.jsonl").read_text()


@pytest.fixture(
    params=["subprocess", pytest.param("docker", marks=pytest.mark.docker),
            pytest.param("gvisor", marks=[pytest.mark.docker, pytest.mark.gvisor])]
)  # fmt: skip
def backend(request: pytest.FixtureRequest) -> str:
    _require_backend(request.param)
    return str(request.param)


@pytest.fixture
def recorded(tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Any, str]]:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with wire_server() as server:
        server.queue(*(Reply(body=program_completion(code)) for code in MODEL_ANSWERS))
        live = OpenAIProvider(base_url=f"{server.url}/v1", model="gpt-test", max_retries=0)
        recording = tmp_path / "session.jsonl"
        outcomes, log = session(RecordingProvider(live, recording), tmp_path / "live", backend)
        assert len(server.requests) == 3
    yield recording, outcomes, log


def test_a_recorded_session_replays_to_identical_call_records_twice(
    tmp_path: Path, backend: str, recorded: tuple[Path, Any, str]
) -> None:
    recording, live_outcomes, live_log = recorded
    assert live_outcomes == [("ok", 2, None), ("ok", {"doubled_then_added": 12}, None), ("ok", 13, None)]
    exchanges = read_recording(recording, "program")
    assert [e.seq for e in exchanges] == [1, 2, 3] and exchanges[0].usage == {"input_tokens": 19, "output_tokens": 10}
    assert exchanges[1].request["feedback"][0]["kind"] == "guardrail"  # the repair feedback was recorded
    assert KEY not in recording.read_text()

    replays = []
    for run in ("first", "second"):
        replay = ReplayProvider(recording)
        outcomes, log = session(replay, tmp_path / run, backend)
        assert outcomes == live_outcomes and replay.remaining == 0
        replays.append(log)
    first, second = (normalised_log(log) for log in replays)
    assert first == second == normalised_log(live_log)
    records = [json.loads(line) for line in first.splitlines()]
    assert [(r["role"], r["method"], r["depth"], r["provider"]) for r in records] == [
        ("adder", "add", 0, "openai"), ("adder", "add", 1, "toolstore"), ("doubler", "double", 0, "openai"),
        ("adder", "add", 0, "toolstore"),
    ]  # fmt: skip
    assert records[0]["guardrail_recovery_attempts"] == 1 and records[1]["program_source"] != "generated"
    assert records[1]["parent_call_id"] == records[2]["call_id"]  # ids are numbered, their links are kept


def test_a_replay_that_diverges_names_the_first_difference(tmp_path: Path, recorded: tuple[Path, Any, str]) -> None:
    recording, _, _ = recorded
    ws = Workspace(provider=ReplayProvider(recording), sandbox=SandboxConfig(backend="subprocess", pool_size=0),
                   log=CallLog(tmp_path / "calls.jsonl"), store=ToolStore(tmp_path / "state"))  # fmt: skip
    try:
        out = Agent.for_role("adder", workspace=ws).add(3)  # the recording saw adder.add(2)
    finally:
        ws.close()
    assert (out.error_type, out.retriable) == ("provider", False)
    assert out.metadata["provider_error_kind"] == "replay_mismatch"
    assert out.error_message is not None and "program exchange 1 differs at args[0]: recorded 2, asked 3" in (
        out.error_message
    )


def test_a_replay_asked_for_more_than_it_holds_fails(recorded: tuple[Path, Any, str]) -> None:
    recording, _, _ = recorded
    replay = ReplayProvider(recording)
    for exchange in replay.exchanges:  # the recorded questions, asked again
        from sandforge.runtime.providers import GenerationRequest

        replay.generate(GenerationRequest.model_validate(exchange.request))
    with pytest.raises(ReplayMismatch, match="after the last of the 3 recorded program exchanges"):
        replay.generate(GenerationRequest(role="adder", method="add"))


def test_first_difference() -> None:
    assert first_difference({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]}) is None
    assert first_difference({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]}) == "a[1].b: recorded 2, asked 3"
    assert first_difference({"a": [1]}, {"a": [1, 2]}) == "a: recorded 1 items, asked 2"
    assert first_difference({"a": 1}, {"a": 1, "c": 2}) == "c: recorded nothing, asked 2"
    assert first_difference({"time_budget_s": 3.0}, {"time_budget_s": 2.5}) is None  # a measurement


def test_secrets_in_the_environment_never_reach_a_recording(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller passed a secret as an argument: the recording keeps the exchange, with the value replaced."""
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "tok-" + "z" * 20)
    with wire_server() as server:
        server.queue(Reply(body=program_completion("return len(args[0])")))
        live = OpenAIProvider(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
        recording = tmp_path / "r.jsonl"
        from sandforge.runtime.providers import GenerationRequest

        RecordingProvider(live, recording, secrets=[KEY]).generate(
            GenerationRequest(role="r", method="m", args=[os.environ["SOME_SERVICE_TOKEN"], KEY])
        )
    text = recording.read_text()
    assert KEY not in text and "z" * 20 not in text
    assert json.loads(text)["request"]["args"] == ["[redacted]", "[redacted]"]
    assert (recording.stat().st_mode & 0o777) == 0o600
