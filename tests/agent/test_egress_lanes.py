"""The agent's side of brokered egress (issue 18) on the in-memory sandbox: the program's fetches reach the
bridge's ``egress`` as a running program's would, and the typed outcomes take their lanes.

Nothing here reaches a server: every request is refused (no grant, no allow entry, a denied address, a
missing credential, a spent budget, a malformed request) or fails in a resolver the test controls, before
any connection; the fetches that succeed are tests/egress/test_agent_egress.py's (in a network namespace).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from sandforge.runtime.agent import Budgets, CallRecord, Outcome
from sandforge.runtime.agent.egress import NO_GRANT, ExecutionEgress, broker_for
from sandforge.runtime.agent.env import CallEnv, CallSpec
from sandforge.runtime.agent.lifecycle import CallRun
from sandforge.runtime.agent.persistence import artifact_failure_class
from sandforge.runtime.agent.state import StagedRecord, State
from sandforge.runtime.agent.trace_budget import TraceBudget
from sandforge.runtime.egress import EgressBroker, FetchReply, FetchRequest, NetworkError
from sandforge.runtime.guardrails import Policy, default_policy, load_policy
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.providers.base import GeneratedProgram, GenerationRequest
from sandforge.runtime.store.models import FailureClass
from sandforge.sandbox import BridgeHandler, BridgeReply, ErrorType, ExecutionOutcome, ExecutionRequest, Limits
from tests.agent.memory_sandbox import MemorySandbox

EXCEPTIONS = {
    "egress_denied": "EgressDenied",
    "egress_limit": "EgressLimit",
    "network_error": "NetworkError",
    "missing_credentials": "MissingCredentials",
    "invalid_fetch": "InvalidFetch",
}


def fetch(bridge: Any, url: str, *, method: str = "GET", deadline: float | None = None) -> Any:
    """What ``fetch(url)`` does inside a sandbox: one FetchRequest frame through the bridge's egress."""
    assert bridge is not None and hasattr(bridge, "egress"), "the agent's bridge answers fetches"
    frame = FetchRequest.of(url, method=method).model_dump_json().encode()
    reply = FetchReply.model_validate_json(bridge.egress(frame, deadline or time.monotonic() + 30))
    return reply


def fetching(*urls: str, catch: bool = False, method: str = "GET") -> Any:
    """A program fetching ``urls`` in turn: an uncaught failure ends it with its kind (as the runner does)."""

    def run(request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        statuses: list[Any] = []
        for url in urls:
            reply = fetch(bridge, url, method=method)
            if reply.error is not None:
                if catch:
                    statuses.append(reply.error.kind)
                    continue
                kind = reply.error.kind
                return ExecutionOutcome.failure(
                    ErrorType(kind), f"{EXCEPTIONS[kind]}: {reply.error.message}", backend="memory",
                    metadata={"exception": EXCEPTIONS[kind], "fetches": len(statuses) + 1},
                )  # fmt: skip
            statuses.append(reply.response.status if reply.response else None)
        return ExecutionOutcome(status="ok", value=statuses, context=request.context.to_dict(), backend="memory")

    return run


class RecordingProvider(ScriptedProvider):
    """A scripted provider that keeps each request (to read the feedback a retry carries)."""

    def __init__(self, programs: list[str]) -> None:
        super().__init__(programs)
        self.seen: list[GenerationRequest] = []

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        self.seen.append(request)
        return super().generate(request)


@dataclasses.dataclass
class Harness:
    env: CallEnv
    sandbox: MemorySandbox
    provider: RecordingProvider
    sink: list[StagedRecord]

    def call(self) -> tuple[Outcome, CallRecord]:
        outcome = CallRun.top(self.env, CallSpec(role="news", method="latest", args=[], kwargs={})).run()
        return outcome, self.sink[-1].record


def harness(
    programs: dict[str, Any], order: list[str], policy: Policy, broker: EgressBroker | None = None, **budgets: int
) -> Harness:
    provider = RecordingProvider(order)
    sandbox = MemorySandbox(programs)
    sink: list[StagedRecord] = []
    env = CallEnv(
        provider=provider, provider_name="scripted", policy=policy, sandbox=sandbox, backend=None, limits=Limits(),
        budgets=Budgets(**budgets), trace_budget=TraceBudget(), store=None, state=State(sink.extend),
        records=sink.extend, egress=broker,
    )  # fmt: skip
    return Harness(env, sandbox, provider, sink)


def granting(tmp_path: Path, egress: str = "", grant: bool = True, name: str = "layer") -> Policy:
    layer = tmp_path / name
    layer.mkdir(exist_ok=True)
    (layer / "egress.yaml").write_text(("grant: [http_fetch]\n" if grant else "") + egress)
    return load_policy([*default_policy().sources, layer])


ALLOW_SVC = """egress:
  allow:
    - url: "http://svc.test:9/**"
    - url: "http://meta.test:9/**"
  allow_ranges: ["127.0.0.1/32"]
  resolve: {svc.test: 127.0.0.1, meta.test: 169.254.169.254}
"""

P1, P2 = "return 1", "return 2"


def single(handler: Any, policy: Policy, broker: EgressBroker | None = None) -> tuple[Harness, Outcome, CallRecord]:
    h = harness({P1: handler, P2: handler}, [P1, P2], policy, broker)
    outcome, record = h.call()
    return h, outcome, record


# --------------------------------------------------------------------------------------- terminal lanes


def test_a_policy_without_the_grant_denies_every_fetch_naming_it_and_never_regenerates() -> None:
    h, outcome, record = single(fetching("https://news.example/rss"), default_policy())
    assert (outcome.error_type, outcome.retriable) == ("egress_denied", False)
    assert "grant http_fetch" in (outcome.error_message or "")
    assert "Retrying another way will not help" in (outcome.error_message or "")
    assert h.provider.calls == 1 and h.sandbox.ran() == [P1]  # terminal: no regeneration
    assert outcome.metadata["failure_class"] == "extrinsic" and outcome.metadata["terminal"] is True
    [entry] = outcome.metadata["egress"]
    assert (entry["method"], entry["url"], entry["error"], entry["denied"]) == (
        "GET", "https://news.example/rss", "egress_denied", NO_GRANT,
    )  # fmt: skip
    assert record.egress_requests == 1 and record.egress[0].denied == NO_GRANT
    assert record.error_type == "egress_denied" and record.attempt_failures == []


def test_the_grant_is_checked_even_when_the_environment_holds_a_broker(tmp_path: Path) -> None:
    ungranted = granting(tmp_path, ALLOW_SVC, grant=False)
    broker = EgressBroker(granting(tmp_path, ALLOW_SVC, name="granted").egress)
    _, outcome, _ = single(fetching("http://svc.test:9/x"), ungranted, broker)
    assert outcome.error_type == "egress_denied" and "grant http_fetch" in (outcome.error_message or "")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://elsewhere.example/", "no allow entry covers host elsewhere.example"),
        ("http://svc.test:10/x", "no allow entry covers http, port 10"),
        ("http://meta.test:9/latest/meta-data", "169.254.169.254"),
    ],
)
def test_a_denied_request_ends_the_call_naming_the_rule(tmp_path: Path, url: str, why: str) -> None:
    h, outcome, record = single(fetching(url), granting(tmp_path, ALLOW_SVC))
    assert (outcome.error_type, outcome.retriable) == ("egress_denied", False)
    assert why in (outcome.error_message or "") and "will not help" in (outcome.error_message or "")
    assert h.provider.calls == 1
    assert why in (record.egress[0].denied or "")
    assert artifact_failure_class(record) is FailureClass.EXTRINSIC  # a stored tool is not blamed for the policy


def test_a_missing_credential_is_terminal_and_names_the_variable_not_a_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SVC_TOKEN_FOR_TEST", raising=False)
    creds = (
        "  credentials:\n    - {host: svc.test, header: Authorization, "
        'value: "Bearer ${SVC_TOKEN_FOR_TEST}", schemes: [http]}\n'
    )
    h, outcome, record = single(fetching("http://svc.test:9/x"), granting(tmp_path, ALLOW_SVC + creds))
    assert (outcome.error_type, outcome.retriable) == ("missing_credentials", False)
    assert "${SVC_TOKEN_FOR_TEST}" in (outcome.error_message or "") and "will not help" in (outcome.error_message or "")
    assert h.provider.calls == 1 and record.egress[0].error == "missing_credentials"
    assert artifact_failure_class(record) is FailureClass.EXTRINSIC


# --------------------------------------------------------------------------------------- the world's fault


def failing_resolver(host: str, port: int) -> Any:
    raise NetworkError(f"DNS: cannot resolve {host} (test resolver)", reason="dns")


def test_a_network_error_is_extrinsic_retriable_and_never_the_artifacts(tmp_path: Path) -> None:
    policy = granting(tmp_path, 'egress:\n  allow: [{host: "feeds.example"}]\n')
    broker = EgressBroker(policy.egress, resolver=failing_resolver)
    h, outcome, record = single(fetching("https://feeds.example/rss"), policy, broker)
    assert (outcome.error_type, outcome.retriable) == ("network_error", True)
    assert outcome.metadata["failure_class"] == "extrinsic"
    assert h.provider.calls == 1 and h.sandbox.ran() == [P1]  # returned unchanged, never regenerated
    assert record.egress[0].error == "network_error" and record.egress[0].rule == "host feeds.example"
    assert artifact_failure_class(record) is FailureClass.EXTRINSIC


# --------------------------------------------------------------------------------------- execution repair


@pytest.mark.parametrize(
    ("egress", "method", "kind", "advice"),
    [
        ("  limits: {max_requests: 0}\n", "GET", "egress_limit", "egress budgets"),
        ("", "BREW", "invalid_fetch", "malformed"),
    ],
)
def test_limits_and_malformed_requests_are_repaired_with_feedback(
    tmp_path: Path, egress: str, method: str, kind: str, advice: str
) -> None:
    policy = granting(tmp_path, ALLOW_SVC + egress)
    h = harness({P1: fetching("http://svc.test:9/x", method=method), P2: fetching()}, [P1, P2], policy)
    outcome, record = h.call()
    assert outcome.ok and h.sandbox.ran() == [P1, P2]
    [feedback] = h.provider.seen[1].feedback
    assert (feedback.kind, feedback.error_type) == ("execution", kind)
    assert advice in (feedback.error_message or "")
    [failed] = record.attempt_failures
    assert failed.error_type == kind and [e.error for e in failed.egress] == [kind]
    assert record.egress == [] and "egress" not in outcome.metadata  # the attempt that answered did not fetch


def test_a_limit_that_keeps_failing_exhausts_the_repair_lane(tmp_path: Path) -> None:
    policy = granting(tmp_path, ALLOW_SVC + "  limits: {max_requests: 0}\n")
    h = harness({P1: fetching("http://svc.test:9/a"), P2: fetching("http://svc.test:9/b")}, [P1, P2], policy,
                execution_repair_budget=1)  # fmt: skip
    outcome, record = h.call()
    assert (outcome.error_type, outcome.retriable) == ("egress_limit", False)
    assert record.execution_repair_exhausted and outcome.metadata["failure_class"] == "intrinsic"
    assert [f.egress[0].url for f in record.attempt_failures] == ["http://svc.test:9/a", "http://svc.test:9/b"]
    assert outcome.metadata["egress"][0]["url"] == "http://svc.test:9/b"  # the last attempt's requests


def test_a_program_raising_an_egress_error_itself_is_an_execution_error(tmp_path: Path) -> None:
    def forged(request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        return ExecutionOutcome.failure(ErrorType.EGRESS_DENIED, "EgressDenied: made up", backend="memory",
                                        metadata={"exception": "EgressDenied"})  # fmt: skip

    h = harness({P1: forged, P2: fetching()}, [P1, P2], granting(tmp_path, ALLOW_SVC))
    outcome, record = h.call()
    assert outcome.ok and h.sandbox.ran() == [P1, P2]  # not terminal: the execution-repair lane
    assert record.attempt_failures[0].error_type == "execution"
    assert "itself" in record.attempt_failures[0].error_message


def test_a_program_raising_another_kind_than_it_was_answered_is_an_execution_error(tmp_path: Path) -> None:
    def relabelled(request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        reply = fetch(bridge, "http://svc.test:9/x", method="BREW")  # answered invalid_fetch
        assert reply.error is not None and reply.error.kind == "invalid_fetch"
        return ExecutionOutcome.failure(ErrorType.EGRESS_DENIED, "EgressDenied: pretend", backend="memory")

    h = harness({P1: relabelled, P2: fetching()}, [P1, P2], granting(tmp_path, ALLOW_SVC))
    outcome, record = h.call()
    assert outcome.ok and record.attempt_failures[0].error_type == "execution"


# --------------------------------------------------------------------------------------- provenance


def test_an_ok_outcome_of_a_program_that_caught_its_failures_still_carries_them(tmp_path: Path) -> None:
    urls = ("https://elsewhere.example/", "http://svc.test:9/x")
    h = harness({P1: fetching(*urls, catch=True, method="BREW")}, [P1], granting(tmp_path, ALLOW_SVC))
    outcome, record = h.call()
    assert outcome.ok and outcome.value == ["invalid_fetch", "invalid_fetch"]
    assert [e["url"] for e in outcome.metadata["egress"]] == list(urls)
    assert record.egress_requests == 2 and [e.error for e in record.egress] == ["invalid_fetch"] * 2
    schema_fields = set(CallRecord.model_json_schema()["$defs"]["EgressCall"]["properties"])
    assert {"method", "url", "final_url", "status", "bytes", "duration_ms", "rule", "denied"} <= schema_fields


def test_userinfo_never_reaches_a_record(tmp_path: Path) -> None:
    _, outcome, record = single(fetching("https://user:hunter22@news.example/rss"), default_policy())
    assert "hunter22" not in json.dumps(outcome.metadata) and "hunter22" not in record.model_dump_json()
    assert outcome.metadata["egress"][0]["url"] == "https://news.example/rss"


def test_nested_calls_broker_their_own_fetches(tmp_path: Path) -> None:
    from sandforge.sandbox.protocol import CallFrame, CallTarget

    def parent(request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        assert bridge is not None
        frame = CallFrame(type="call", id=1, target=CallTarget(kind="tool", name="child"), method="get")
        reply = BridgeReply.of(bridge(frame))
        return ExecutionOutcome(status="ok", value=reply.value, context={}, backend="memory")

    child = "return 3"
    h = harness({P1: parent, child: fetching("https://elsewhere.example/", catch=True)}, [P1, child],
                granting(tmp_path, ALLOW_SVC))  # fmt: skip
    outcome, _ = h.call()
    assert outcome.ok and "egress" not in outcome.metadata  # the parent itself fetched nothing
    nested = [s.record for s in h.sink if s.record.depth == 1]
    assert [e.url for e in nested[0].egress] == ["https://elsewhere.example/"]
    # ... but what it returns came from a tool that fetched: the sources travel up with it
    [via] = outcome.metadata["egress_nested"]
    assert (via["role"], via["method"], via["depth"], via["call_id"]) == ("child", "get", 1, nested[0].call_id)
    assert [e["url"] for e in via["egress"]] == ["https://elsewhere.example/"]
    from sandforge.runtime.sessions.tool_runner import outcome_to_result

    assert "- GET https://elsewhere.example/ -> egress_denied" in outcome_to_result(outcome).content


# --------------------------------------------------------------------------------------- brokers and sessions


def test_one_broker_per_compiled_policy(tmp_path: Path) -> None:
    policy = granting(tmp_path, ALLOW_SVC)
    broker = broker_for(policy)
    assert isinstance(broker, EgressBroker) and broker_for(policy) is broker
    other = granting(tmp_path, ALLOW_SVC, name="same-content")
    assert broker_for(other) is not broker
    assert broker_for(default_policy()) == NO_GRANT


def test_an_unusable_egress_section_fails_closed(tmp_path: Path) -> None:
    policy = granting(tmp_path, ALLOW_SVC + f"  ca_file: {tmp_path / 'missing.pem'}\n")
    broker = broker_for(policy)
    assert isinstance(broker, str) and "cannot be used" in broker
    _, outcome, _ = single(fetching("http://svc.test:9/x"), policy)
    assert outcome.error_type == "egress_denied" and "missing.pem" in (outcome.error_message or "")


def test_the_session_gets_the_executions_deadline(tmp_path: Path) -> None:
    broker = broker_for(granting(tmp_path, ALLOW_SVC))
    assert isinstance(broker, EgressBroker)
    spent = ExecutionEgress(broker)
    reply = fetch(spent, "http://svc.test:9/x", deadline=time.monotonic() - 1)
    assert reply.error is not None and (reply.error.kind, reply.error.reason) == ("egress_limit", "time_budget")
    parent_bound = ExecutionEgress(broker, deadline=time.monotonic() - 1)  # a nested call's parent's deadline
    reply = fetch(parent_bound, "http://svc.test:9/x", deadline=time.monotonic() + 60)
    assert reply.error is not None and reply.error.reason == "time_budget"


def test_a_malformed_frame_is_an_invalid_fetch_with_or_without_a_broker(tmp_path: Path) -> None:
    for broker in (broker_for(granting(tmp_path, ALLOW_SVC)), NO_GRANT):
        reply = FetchReply.model_validate_json(ExecutionEgress(broker).egress(b'{"url": 3}', time.monotonic() + 5))
        assert reply.error is not None and reply.error.kind == "invalid_fetch"


# --------------------------------------------------------------------------------------- logs, exec, sessions


def test_sandforge_logs_shows_each_request_per_attempt(tmp_path: Path) -> None:
    from sandforge.runtime.cli.logs_cmd import format_record

    policy = granting(tmp_path, ALLOW_SVC + "  limits: {max_requests: 1}\n")
    both = fetching("https://elsewhere.example/", "http://svc.test:9/x", catch=False)
    h = harness({P1: fetching("http://svc.test:9/x", method="BREW"), P2: both}, [P1, P2], policy)
    _, record = h.call()
    text = "\n".join(format_record(record))
    assert "attempt 1 failed in execution" in text
    assert "  fetch BREW http://svc.test:9/x -> invalid_fetch: method 'BREW' is not supported" in text
    assert "fetch GET https://elsewhere.example/ -> egress_denied: GET https://elsewhere.example/ is denied" in text
    brief = "\n".join(format_record(record, details=False))
    assert "fetch" not in brief


def test_the_exec_bridge_brokers_under_the_policy_and_has_no_nested_calls(tmp_path: Path) -> None:
    from sandforge.runtime.agent.egress import StandaloneBridge
    from sandforge.sandbox.protocol import CallFrame, CallTarget

    bridge = StandaloneBridge.of(default_policy())
    assert fetch(bridge, "https://news.example/").error.message == NO_GRANT
    frame = CallFrame(type="call", id=1, target=CallTarget(kind="tool", name="t"), method="m")
    assert BridgeReply.of(bridge(frame)).error_type == "nested_calls_unavailable"
    granted = StandaloneBridge.of(granting(tmp_path, ALLOW_SVC))
    reply = fetch(granted, "https://elsewhere.example/")
    assert reply.error is not None and "no allow entry covers host elsewhere.example" in reply.error.message
    forged = ExecutionOutcome.failure(ErrorType.MISSING_CREDENTIALS, "MissingCredentials: x", backend="memory")
    checked = granted.fetches.attach(forged)
    assert checked.error_type is ErrorType.EXECUTION and len(checked.metadata["egress"]) == 1


def test_session_tools_run_under_the_runners_policy(tmp_path: Path) -> None:
    from sandforge.runtime.sessions import AgentToolRunner
    from sandforge.sandbox import SandboxConfig

    policy = granting(tmp_path, ALLOW_SVC)
    config = SandboxConfig(backend="subprocess", pool_size=0)
    runner = AgentToolRunner(provider=ScriptedProvider([]), sandbox=config, log=False, policy=policy)
    try:
        runner.agent("news")
        assert runner.workspace is not None and runner.workspace.policy is policy
    finally:
        runner.close()


def test_a_session_tool_result_names_its_sources_to_the_model(tmp_path: Path) -> None:
    from sandforge.runtime.sessions.tool_runner import outcome_to_result

    urls = ("https://elsewhere.example/", "http://svc.test:9/x")
    h = harness({P1: fetching(*urls, catch=True, method="BREW")}, [P1], granting(tmp_path, ALLOW_SVC))
    outcome, _ = h.call()
    result = outcome_to_result(outcome)
    assert result.ok and result.content.startswith('["invalid_fetch", "invalid_fetch"]')
    assert "sources (requests made by the host for this result):" in result.content
    assert "- BREW https://elsewhere.example/ -> invalid_fetch" in result.content
    assert [e["url"] for e in result.metadata["egress"]] == list(urls)
    _, denied, _ = single(fetching("https://news.example/"), default_policy())
    assert "- GET https://news.example/ -> egress_denied" in outcome_to_result(denied).content


def test_a_stored_tool_is_not_demoted_for_network_errors_or_denials(tmp_path: Path) -> None:
    from sandforge.runtime.agent import CallLog, Workspace
    from sandforge.runtime.store import ToolStore

    policy = granting(tmp_path, 'egress:\n  allow: [{host: "feeds.example"}]\n', name="feeds")
    runs: list[str] = []

    def tool(request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        runs.append(request.code)
        if len(runs) == 1:
            return ExecutionOutcome(status="ok", value=1, context={}, backend="memory")
        url = "https://feeds.example/rss" if len(runs) == 2 else "https://elsewhere.example/rss"
        return fetching(url)(request, bridge)

    store = ToolStore(tmp_path / "state")
    broker = EgressBroker(policy.egress, resolver=failing_resolver)
    sandbox: Any = MemorySandbox({P1: tool})
    ws = Workspace(
        provider=ScriptedProvider([P1]), sandbox=sandbox, limits=Limits(), policy=policy, store=store,
        log=CallLog(tmp_path / "calls.jsonl"), egress=broker,
    )  # fmt: skip
    try:
        assert ws.call("feeds", "latest").ok
        assert ws.call("feeds", "latest").error_type == "network_error"
        assert ws.call("feeds", "latest").error_type == "egress_denied"
    finally:
        ws.close()
    assert runs == [P1] * 3  # the stored program ran each time: nothing was regenerated
    artifact = ToolStore(tmp_path / "state").lookup("feeds", "latest").artifact
    assert artifact is not None
    assert (artifact.extrinsic_failure_count, artifact.intrinsic_failure_count) == (2, 0)
    assert artifact.consecutive_intrinsic_failures == 0 and artifact.recent_failure_rate == 0.0


# --------------------------------------------------------------------------------------- caught and answered


def answering(kind: str, *urls: str) -> Any:
    """A program that fetches ``urls`` (catching every failure), then returns ``Outcome.error(kind, ...)``."""

    def run(request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        for url in urls:
            fetch(bridge, url)
        return ExecutionOutcome.failure(
            ErrorType.TOOL_ERROR, "the feed could not be fetched", retriable=True, backend="memory",
            metadata={"tool_error_type": kind},
        )  # fmt: skip

    return run


def test_a_caught_network_error_the_host_observed_is_extrinsic_not_a_claim(tmp_path: Path) -> None:
    policy = granting(tmp_path, 'egress:\n  allow: [{host: "feeds.example"}]\n')
    broker = EgressBroker(policy.egress, resolver=failing_resolver)
    h, outcome, record = single(answering("network_error", "https://feeds.example/rss"), policy, broker)
    assert (outcome.error_type, outcome.retriable, outcome.metadata["failure_class"]) == (
        "network_error", True, "extrinsic",
    )  # fmt: skip
    assert h.provider.calls == 1 and record.tool_error
    assert artifact_failure_class(record) is FailureClass.EXTRINSIC


def test_a_caught_denial_the_host_observed_is_terminal(tmp_path: Path) -> None:
    h, outcome, _ = single(answering("egress_denied", "https://news.example/"), default_policy())
    assert (outcome.error_type, outcome.retriable) == ("egress_denied", False)
    assert "will not help" in (outcome.error_message or "") and h.provider.calls == 1


@pytest.mark.parametrize("kind", ["network_error", "egress_denied"])
def test_the_same_answer_without_the_hosts_evidence_is_a_claim(tmp_path: Path, kind: str) -> None:
    policy = granting(tmp_path, ALLOW_SVC + "  limits: {max_requests: 0}\n")  # its fetch fails otherwise
    h = harness({P1: answering(kind, "http://svc.test:9/x"), P2: fetching()}, [P1, P2], policy)
    outcome, record = h.call()
    assert outcome.ok and h.sandbox.ran() == [P1, P2]  # the outcome-repair lane regenerated it
    [failed] = record.attempt_failures
    assert failed.stage == "outcome_policy" and failed.failure_class != "extrinsic"


def test_a_broker_failure_is_a_network_error_the_host_answered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = granting(tmp_path, 'egress:\n  allow: [{host: "feeds.example"}]\n')

    class Broken(EgressBroker):
        def session(self, *, deadline: float | None = None) -> Any:
            raise RuntimeError("a broker bug")

    h, outcome, record = single(fetching("https://feeds.example/rss"), policy, Broken(policy.egress))
    assert (outcome.error_type, outcome.retriable) == ("network_error", True)  # not turned into a forged kind
    assert record.egress[0].error == "network_error" and "failed to broker" in (record.egress[0].denied or "")
    assert h.provider.calls == 1 and "the egress broker failed" in caplog.text
