"""The ToolStore wired into the agent lifecycle (ADR 0012 sections 4 to 7 and 10, ADR 0013, the pattern plan).

Every test runs real calls: scripted provider -> store plan -> validation -> sandbox -> commit -> store
record. Tests that take ``sandbox_backend`` also run on the container backends (skipped without Docker).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sandforge.runtime.agent.failures as lifecycle_failures
import sandforge.runtime.store as store_pkg
from sandforge.runtime.agent import Agent, Budgets, CallLog, CallRecord, Workspace, call_log_schema, read_records
from sandforge.runtime.agent.persistence import RUNTIME_VERSION, ToolStoreSource
from sandforge.runtime.guardrails import default_policy, validate
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.providers.prompt import PROMPT_VERSION
from sandforge.runtime.providers.scripted import ScriptItem
from sandforge.runtime.store import (
    MAX_REPAIRS_BEFORE_REGEN,
    Decision,
    FailureClass,
    ProgramSource,
    SelectionReason,
    ToolStore,
)
from sandforge.sandbox import ExecutionOutcome, ExecutionRequest, Limits, Sandbox
from tests.conftest import SharedSandboxes

ADD = "context['total'] = context.get('total', 0) + args[0]\nreturn context['total']\n"
TAMPERED = "context['tampered'] = True\nreturn 'TAMPERED'\n"
#: fails (ZeroDivisionError, intrinsic) for 0, works otherwise
DIVIDE = "return 100 // args[0]\n"
DIVIDE_REPAIRED = "d = args[0]\nreturn 100 // d\n"


def news(source: str, host: str) -> str:
    """What a model writes for ``ask("latest on <source>?")``: the source baked in (ADR 0013's bug)."""
    return (
        "import xml.etree.ElementTree as ET\n"
        f"feed = '<rss><channel><item><title>{source} 1</title><link>https://{host}/1</link></item></channel></rss>'\n"
        "root = ET.fromstring(feed)\n"
        f"return [{{'title': i.findtext('title'), 'link': i.findtext('link'), 'source': '{source}'}}"
        " for i in root.iter('item')]\n"
    )


GOOGLE, YAHOO = news("Google News", "news.google.com"), news("Yahoo News", "news.yahoo.com")


class SpySandbox:
    """A real Sandbox that remembers every program it was asked to run."""

    def __init__(self, inner: Sandbox) -> None:
        self.inner = inner
        self.config = self.inner.config
        self.codes: list[str] = []

    def execute(self, request: ExecutionRequest, **kwargs: Any) -> ExecutionOutcome:
        self.codes.append(request.code)
        return self.inner.execute(request, **kwargs)


class Env:
    """Workspaces on one store directory; each ``session`` is a new Workspace (and a new ToolStore)."""

    def __init__(self, root: Path, sandbox: Sandbox) -> None:
        self.state_dir = root / "state"
        self.log_path = root / "calls.jsonl"
        self.sandbox = sandbox
        self.sandboxes: list[SpySandbox] = []
        self.workspaces: list[Workspace] = []

    def session(
        self,
        programs: list[ScriptItem],
        *,
        store: ToolStore | ToolStoreSource | None = None,
        limits: Limits | None = None,
        policy: Any = None,
        **budgets: int,
    ) -> tuple[Workspace, ScriptedProvider, SpySandbox]:
        provider = ScriptedProvider(programs)
        spy = SpySandbox(self.sandbox)
        ws = Workspace(
            provider=provider,
            sandbox=spy,  # type: ignore[arg-type]
            store=store or ToolStore(self.state_dir),
            log=CallLog(self.log_path),
            policy=policy,
            limits=limits,
            budgets=Budgets(**budgets),
        )
        self.sandboxes.append(spy)
        self.workspaces.append(ws)
        return ws, provider, spy

    def store(self) -> ToolStore:
        return ToolStore(self.state_dir)

    def close(self) -> None:
        for ws in self.workspaces:
            ws.close()


@pytest.fixture
def env(tmp_path: Path, shared_sandboxes: SharedSandboxes) -> Iterator[Env]:
    e = Env(tmp_path, shared_sandboxes.get("subprocess"))
    yield e
    e.close()


@pytest.fixture
def env_any(tmp_path: Path, sandbox: Sandbox) -> Iterator[Env]:
    """Like ``env``, on every sandbox backend."""
    e = Env(tmp_path, sandbox)
    yield e
    e.close()


def last(ws: Workspace, depth: int = 0) -> CallRecord:
    return [r for r in ws.log.records if r.depth == depth][-1]


def select(store: ToolStore, role: str, method: str, fingerprint: str | None = None) -> Any:
    return store.select(
        role, method, contract_fingerprint=fingerprint, runtime_version=RUNTIME_VERSION, prompt_version=PROMPT_VERSION
    )


# --- wiring ----------------------------------------------------------------------------------------------


def test_one_failure_classification_is_shared() -> None:
    assert lifecycle_failures.classify_failure is store_pkg.classify_failure
    assert lifecycle_failures.FailureClass is store_pkg.FailureClass
    assert lifecycle_failures.classify_failure("timeout") is FailureClass.EXTRINSIC


def test_call_log_schema_has_the_store_fields() -> None:
    props = call_log_schema()["properties"]
    adr_0012 = [
        "program_source", "artifact_hit", "artifact_prompt_version", "artifact_contract_fingerprint",
        "artifact_success_count", "artifact_failure_count", "artifact_intrinsic_failure_count",
        "artifact_extrinsic_failure_count", "repair_attempted", "repair_succeeded", "failure_class",
    ]  # fmt: skip
    adr_0013 = ["cacheable", "cacheability_reason", "input_sensitive", "artifact_cacheable"]
    plan = ["capability_patterns", "promotion_candidate_detected", "promotion_candidate_capabilities"]
    for name in adr_0012 + adr_0013 + plan:
        assert name in props, name


def test_a_toolstore_is_wrapped_and_other_program_stores_are_kept(env: Env) -> None:
    ws, _, _ = env.session([])
    assert isinstance(ws.store, ToolStoreSource) and ws.tool_store is not None
    assert ws.tool_store.paths.state_dir == env.store().paths.state_dir
    other = ToolStoreSource(env.store())
    ws2 = Workspace(provider=ScriptedProvider([]), sandbox=env.sandboxes[0], store=other, log=False)  # type: ignore[arg-type]
    assert ws2.store is other


# --- reuse across sessions ------------------------------------------------------------------------------


def test_artifact_is_created_after_a_first_success_and_reused_by_a_new_agent(env_any: Env) -> None:
    env = env_any
    ws1, p1, _ = env.session([ADD])
    assert Agent.for_role("calc", workspace=ws1).add(3).value == 3
    first = last(ws1)
    assert (first.program_source, first.selection_reason, first.artifact_hit) == ("generated", "missing", False)
    assert first.store_actions[-1] == "record_regeneration@1" and first.cacheable is True
    stored = env.store().lookup("calc", "add").artifact
    assert stored is not None and stored.code == ADD and stored.program_source is ProgramSource.GENERATED
    assert stored.prompt_version == PROMPT_VERSION and stored.runtime_version == RUNTIME_VERSION
    assert p1.calls == 1

    ws2, p2, spy2 = env.session([])  # a new agent: new workspace, new ToolStore instance, empty script
    out = Agent.for_role("calc", workspace=ws2).add(4)
    assert out.ok and out.value == 4  # its own (empty) context: state is per workspace, code is shared
    assert p2.calls == 0 and out.metadata["provider_calls"] == 0
    assert spy2.codes == [ADD]  # the persisted code ran in the sandbox
    rec = last(ws2)
    assert rec.program_source == "persisted" and rec.artifact_hit and rec.selection_decision == "execute_persisted"
    assert rec.artifact_generation == 1 and rec.artifact_success_count == 1 and rec.verdict == "approved"
    assert rec.store_actions == ["record_success@1"] and rec.provider == "toolstore"
    on_disk = [r for r in read_records(env.log_path) if r.call_id == rec.call_id]
    assert on_disk and on_disk[0].program_source == "persisted" and on_disk[0].store_actions == ["record_success@1"]
    ws2.close()  # the success of a persisted call is written behind; closing the workspace writes it
    again = env.store().lookup("calc", "add").artifact
    assert again is not None and again.success_count == 2 and again.generation == 1


def test_tampered_code_is_regenerated_never_executed(env_any: Env) -> None:
    env = env_any
    ws1, _, _ = env.session([ADD])
    assert Agent.for_role("calc", workspace=ws1).add(1).ok
    path = env.store().paths.method_file("calc", "add")
    data = json.loads(path.read_text())
    data["current"]["code"] = TAMPERED  # edited by hand, checksum left as it was
    path.write_text(json.dumps(data))

    ws2, p2, spy = env.session([ADD])
    out = Agent.for_role("calc", workspace=ws2).add(5)
    assert out.ok and out.value == 5 and "tampered" not in ws2.context("calc")
    assert TAMPERED not in spy.codes and spy.codes == [ADD]
    assert p2.calls == 1 and p2.requests[0].repair is None
    assert "TAMPERED" not in p2.prompts[0].user  # stored code is never shown for a (re)generation
    rec = last(ws2)
    assert (rec.selection_decision, rec.selection_reason) == ("generate", "checksum_mismatch")
    assert rec.program_source == "generated" and rec.store_actions[-1] == "record_regeneration@2"
    history = env.store().history("calc", "add")
    assert history[0].checksum_ok() and not history[1].checksum_ok()


# --- repair and regeneration -----------------------------------------------------------------------------


def test_repair_then_forced_regeneration_when_the_repair_budget_is_spent(env: Env) -> None:
    # execution_repair_budget=0: a failing persisted call ends there, so the NEXT call's selection decides
    repaired = [f"{DIVIDE_REPAIRED}# repair {i}\n" for i in range(MAX_REPAIRS_BEFORE_REGEN)]
    ws, provider, _ = env.session([DIVIDE, *repaired, DIVIDE], execution_repair_budget=0)
    calc = Agent.for_role("calc", workspace=ws)
    assert calc.div(4).value == 25
    for i in range(MAX_REPAIRS_BEFORE_REGEN):
        failed = calc.div(0)
        assert failed.error_type == "execution" and provider.calls == 1 + i  # persisted, no model call
        assert last(ws).store_actions == [f"record_failure:intrinsic@{i + 1}"]
        assert select(env.store(), "calc", "div").decision is Decision.REPAIR

        out = calc.div(5)  # degraded: repair with prior code + failure context
        assert out.ok and out.value == 20
        request = provider.requests[-1]
        assert request.repair is not None and "ZeroDivisionError" in (request.repair.error_message or "")
        assert request.repair.prior_code == (DIVIDE if i == 0 else repaired[i - 1])
        assert "<repair>" in provider.prompts[-1].user and "ZeroDivisionError" in provider.prompts[-1].user
        rec = last(ws)
        assert rec.program_source == "repaired" and rec.repair_attempted and rec.repair_succeeded
        assert rec.selection_reason == "degraded" and rec.store_actions[-1] == f"record_repair@{i + 2}"
        art = env.store().lookup("calc", "div").artifact
        assert art is not None and art.repair_count_since_regen == i + 1

    assert calc.div(0).error_type == "execution"
    s = select(env.store(), "calc", "div")
    assert (s.decision, s.reason) == (Decision.REGENERATE, SelectionReason.REPAIR_BUDGET_EXHAUSTED)
    out = calc.div(10)
    assert out.ok and out.value == 10
    assert provider.requests[-1].repair is None and "<repair>" not in provider.prompts[-1].user
    rec = last(ws)
    assert rec.program_source == "generated" and not rec.repair_attempted
    assert rec.selection_reason == "repair_budget_exhausted"
    art = env.store().lookup("calc", "div").artifact
    assert art is not None and art.repair_count_since_regen == 0 and art.program_source is ProgramSource.GENERATED


def test_a_failing_persisted_program_is_repaired_within_the_call(env: Env) -> None:
    ws, provider, spy = env.session([DIVIDE, DIVIDE_REPAIRED])
    calc = Agent.for_role("calc", workspace=ws)
    assert calc.div(2).ok
    out = calc.div(0)  # persisted fails; the execution lane's retry is a repair of it, which fails too
    assert out.error_type == "execution" and provider.calls == 2
    request = provider.requests[-1]
    assert request.repair is not None and request.repair.prior_code == DIVIDE and request.repair.generation == 1
    assert request.repair.failure_class == "intrinsic" and "ZeroDivisionError" in (request.repair.error_message or "")
    assert spy.codes[1:] == [DIVIDE, DIVIDE_REPAIRED]
    rec = last(ws)
    assert rec.repair_attempted and not rec.repair_succeeded and rec.program_source == "repaired"
    assert rec.store_actions == ["record_failure:intrinsic@1", "record_pattern"]  # a failed repair is not stored
    assert select(env.store(), "calc", "div").decision is Decision.REPAIR


def test_no_repair_within_the_call_once_the_repair_budget_is_spent(env: Env) -> None:
    ws, provider, _ = env.session([DIVIDE, "return 0 if args[0] == 0 else 100 // args[0]\n"])
    calc = Agent.for_role("calc", workspace=ws)
    assert calc.div(2).ok
    path = env.store().paths.method_file("calc", "div")
    data = json.loads(path.read_text())
    data["current"]["repair_count_since_regen"] = MAX_REPAIRS_BEFORE_REGEN  # metadata, not code: no checksum
    path.write_text(json.dumps(data))
    out = calc.div(0)
    assert out.ok and out.value == 0
    assert provider.requests[-1].repair is None and "<repair>" not in provider.prompts[-1].user
    rec = last(ws)
    assert rec.program_source == "generated" and not rec.repair_attempted
    assert rec.store_actions == ["record_failure:intrinsic@1", "record_pattern", "record_regeneration@2"]
    art = env.store().lookup("calc", "div").artifact
    assert art is not None and art.repair_count_since_regen == 0


def test_a_successful_repair_within_the_call_is_stored_as_repaired(env: Env) -> None:
    ws, provider, _ = env.session([DIVIDE, "return 0 if args[0] == 0 else 100 // args[0]\n"])
    calc = Agent.for_role("calc", workspace=ws)
    assert calc.div(2).ok
    out = calc.div(0)
    assert out.ok and out.value == 0 and provider.calls == 2
    rec = last(ws)
    assert rec.program_source == "repaired" and rec.repair_succeeded
    assert rec.store_actions == ["record_failure:intrinsic@1", "record_pattern", "record_repair@2"]
    art = env.store().lookup("calc", "div").artifact
    assert art is not None and art.program_source is ProgramSource.REPAIRED and art.repair_count_since_regen == 1


def test_write_behind_successes_keep_their_order_with_failures(env: Env) -> None:
    source = ToolStoreSource(env.store(), write_behind_delay=60.0)  # the writer thread never gets to it here
    ws, _, _ = env.session([DIVIDE], store=source, execution_repair_budget=0)
    calc = Agent.for_role("calc", workspace=ws)
    assert calc.div(1).ok  # generated: stored at once
    for _ in range(5):
        assert calc.div(2).ok and last(ws).program_source == "persisted"
    art = env.store().lookup("calc", "div").artifact
    assert art is not None and art.success_count == 1  # five successes queued, not written yet
    assert calc.div(0).error_type == "execution"  # sync write: the queued successes go first
    art = env.store().lookup("calc", "div").artifact
    assert art is not None and art.success_count == 6 and art.recent_outcomes[-1] is False
    assert art.consecutive_intrinsic_failures == 1  # wrong order would have reset it: [T, F, T x 5]
    s = select(env.store(), "calc", "div")
    assert (s.decision, s.reason) == (Decision.REPAIR, SelectionReason.DEGRADED)
    source.close()


def test_the_writer_thread_writes_queued_successes_by_itself(env: Env) -> None:
    source = ToolStoreSource(env.store(), write_behind_delay=0.0)
    ws, _, _ = env.session([ADD], store=source)
    assert Agent.for_role("calc", workspace=ws).add(1).ok and Agent.for_role("calc", workspace=ws).add(1).ok
    deadline = time.monotonic() + 30
    while (art := env.store().lookup("calc", "add").artifact) is not None and art.success_count < 2:
        assert time.monotonic() < deadline, "the writer thread did not write the queued success"
        time.sleep(0.01)
    source.close()
    source.flush()
    assert not source._pending


def test_extrinsic_failures_do_not_count_toward_regeneration(env: Env) -> None:
    slow = "if args[0] > 1000:\n    while True:\n        pass\nreturn args[0]\n"
    ws, provider, _ = env.session([slow], limits=Limits(timeout_s=0.5))
    tool = Agent.for_role("worker", workspace=ws)
    assert tool.run(1).ok
    for _ in range(4):  # more timeouts than min_samples: they must not make the artifact unhealthy
        out = tool.run(5000)
        assert out.error_type == "timeout" and last(ws).failure_class == "extrinsic"
        assert last(ws).store_actions == ["record_failure:extrinsic@1"]
    art = env.store().lookup("worker", "run").artifact
    assert art is not None
    assert (art.extrinsic_failure_count, art.intrinsic_failure_count, art.recent_failure_rate) == (4, 0, 0.0)
    assert select(env.store(), "worker", "run").decision is Decision.EXECUTE_PERSISTED
    assert tool.run(2).value == 2 and last(ws).program_source == "persisted"
    assert provider.calls == 1  # generated once, never again


def test_a_deliberate_tool_error_is_the_answer_not_a_defect(env: Env) -> None:
    code = (
        "if args[0] == 0:\n"
        "    return Outcome.error('division_by_zero', 'cannot divide by zero', retriable=False)\n"
        "return 100 // args[0]\n"
    )
    ws, provider, _ = env.session([code])
    calc = Agent.for_role("calc", workspace=ws)
    assert calc.div(4).ok
    assert calc.div(0).error_type == "division_by_zero"
    assert last(ws).store_actions == ["record_failure:adaptive@1"]
    assert select(env.store(), "calc", "div").decision is Decision.EXECUTE_PERSISTED
    assert provider.calls == 1


# --- cacheability (ADR 0013) -----------------------------------------------------------------------------


def test_google_then_yahoo_generates_twice(env: Env) -> None:
    ws, provider, spy = env.session([GOOGLE, YAHOO])
    assistant = Agent.for_role("assistant", workspace=ws)
    first = assistant.ask("latest on Google News?")
    assert first.ok and first.value[0]["source"] == "Google News"
    rec = last(ws)
    assert rec.cacheable is False and (rec.cacheability_reason or "").startswith("dynamic_dispatch")
    assert rec.input_sensitive is True
    stored = env.store().lookup("assistant", "ask").artifact
    assert stored is not None and stored.cacheable is False  # persisted, not reusable

    second = assistant.ask("latest on Yahoo News?")
    assert second.ok and second.value[0]["source"] == "Yahoo News"
    assert provider.calls == 2 and len(provider.requests) == 2
    assert spy.codes == [GOOGLE, YAHOO]
    rec = last(ws)
    assert (rec.selection_decision, rec.selection_reason, rec.program_source) == (
        "regenerate", "dynamic_method", "generated",
    )  # fmt: skip
    assert provider.requests[1].repair is None and "news.google.com" not in provider.prompts[1].user


def test_input_baked_code_of_a_stable_method_is_stored_but_not_reused(env: Env) -> None:
    baked = "return {'url': 'https://example.com/report', 'status': 200}\n"
    generic = "return {'url': args[0], 'status': 200}\n"
    ws, provider, _ = env.session([baked, generic])
    fetcher = Agent.for_role("fetcher", workspace=ws)
    assert fetcher.fetch("https://example.com/report").ok
    assert last(ws).cacheable is False and (last(ws).cacheability_reason or "").startswith("input_baked")
    assert fetcher.fetch("https://example.com/other").value == {"url": "https://example.com/other", "status": 200}
    assert last(ws).selection_reason == "non_cacheable" and provider.calls == 2
    assert fetcher.fetch("https://example.com/third").ok and last(ws).program_source == "persisted"
    assert provider.calls == 2  # the generic code is cacheable and reused


# --- pattern memory and prompt blocks --------------------------------------------------------------------


def test_pattern_memory_survives_a_restart_and_reaches_depth_0_prompts_only(env: Env) -> None:
    ws1, _, _ = env.session([GOOGLE, YAHOO])
    assistant = Agent.for_role("assistant", workspace=ws1)
    assert assistant.ask("latest on Google News?").ok
    assert assistant.ask("latest on Yahoo News?").ok
    assert "rss_parse" in last(ws1).capability_patterns and "record_pattern" in last(ws1).store_actions

    nested = "r = tool('assistant').ask('and the weather?')\nreturn r.value\n"
    ws2, provider, _ = env.session([news("NYT", "nytimes.com"), nested, "return 'sunny'\n", "return 'short'\n"])
    assistant = Agent.for_role("assistant", workspace=ws2)
    assert assistant.ask("latest on NYT?").ok
    block = provider.requests[0].recent_patterns
    assert block is not None and "rss_parse: seen 2 of last 2 ask calls, tool_present=false" in block
    prompt = provider.prompts[0].user
    assert 'source="recent_patterns"' in prompt and "consider Forging now" in prompt
    for code in (GOOGLE, YAHOO):  # labels and counts only, never prior code
        assert "news.google.com" not in prompt and "news.yahoo.com" not in prompt
        assert code.splitlines()[1] not in prompt
    rec = last(ws2)
    assert rec.promotion_candidate_detected and "rss_parse" in rec.promotion_candidate_capabilities

    assert assistant.ask("what about the weather?").value == "sunny"
    depth0, depth1 = provider.requests[1], provider.requests[2]
    assert depth0.depth == 0 and depth0.recent_patterns is not None
    assert depth1.depth == 1 and depth1.recent_patterns is None
    assert 'source="recent_patterns"' not in provider.prompts[2].user
    assert not last(ws2, depth=1).promotion_candidate_detected

    assert assistant.summarize("text").ok  # a stable method at depth 0: no block either
    assert provider.requests[3].recent_patterns is None and 'source="recent_patterns"' not in provider.prompts[3].user


def test_delegated_contracts_persist_and_materialize_in_a_new_session(env: Env) -> None:
    fetch = "return 'clean: ' + args[0]\n"
    research = (
        "f = delegate('text_cleaner', purpose='Clean up a text and return it', deliverable='text')\n"
        "r = f.clean(args[0])\nreturn r.value\n"
    )
    ws1, _, _ = env.session([research, fetch])
    assert Agent.for_role("researcher", workspace=ws1).run("Alpha").value == "clean: Alpha"
    entry = env.store().get_tool("text_cleaner")
    assert entry is not None and entry.purpose == "Clean up a text and return it"
    art = env.store().lookup("text_cleaner", "clean").artifact
    assert art is not None and art.cacheable and (art.cacheability_reason or "").startswith("delegated_contract")
    assert art.contract_fingerprint == entry.contract_fingerprint

    use = "r = tool('text_cleaner').clean(args[0])\nreturn r.value\n"
    ws2, provider, _ = env.session([use])
    assert Agent.for_role("analyst", workspace=ws2).read("Beta").value == "clean: Beta"
    assert provider.calls == 1  # only the analyst's program; text_cleaner came from the store
    nested = last(ws2, depth=1)
    assert nested.role == "text_cleaner" and nested.program_source == "persisted"
    known = provider.requests[0].known_tools_block
    assert known is not None and "text_cleaner" in known and "Clean up a text" in known
    assert 'source="known_tools"' in provider.prompts[0].user and fetch.strip() not in provider.prompts[0].user

    changed = research.replace("return it", "return it as plain ASCII")
    ws3, provider3, _ = env.session([changed, "return ('clean: ' + args[0]).strip()\n"])
    assert Agent.for_role("researcher2", workspace=ws3).run("Gamma").ok
    repair = provider3.requests[1].repair
    assert repair is not None and repair.prior_code == fetch and repair.reason.startswith("stale_contract")
    nested = last(ws3, depth=1)
    assert nested.program_source == "repaired" and nested.selection_reason == "stale_contract"
    assert env.store().lookup("text_cleaner", "clean").artifact.repair_count_since_regen == 1  # type: ignore[union-attr]


# --- damage and hostile stores -------------------------------------------------------------------------


def test_corrupt_artifact_is_quarantined_and_the_call_still_succeeds(env: Env) -> None:
    ws1, _, _ = env.session([ADD])
    assert Agent.for_role("calc", workspace=ws1).add(1).ok
    path = env.store().paths.method_file("calc", "add")
    path.write_text("{ not json")
    ws2, provider, _ = env.session([ADD])
    out = Agent.for_role("calc", workspace=ws2).add(2)
    assert out.ok and out.value == 2 and provider.calls == 1
    assert last(ws2).selection_reason == "corrupt"
    assert list(path.parent.glob(path.name + ".corrupt-*"))
    assert env.store().lookup("calc", "add").artifact is not None  # a new artifact replaced it


def test_corrupt_registry_and_patterns_are_quarantined_and_persisted_calls_go_on(env: Env) -> None:
    ws1, _, _ = env.session([ADD, GOOGLE])
    assert Agent.for_role("calc", workspace=ws1).add(1).ok
    assert Agent.for_role("assistant", workspace=ws1).ask("latest on Google News?").ok
    paths = env.store().paths
    paths.registry.write_bytes(b"\x00garbage")
    paths.patterns.write_text('{"schema_version": 1, "roles": 7}')
    ws2, provider, _ = env.session([YAHOO])
    calc = Agent.for_role("calc", workspace=ws2)
    assert calc.add(2).ok and provider.calls == 0 and last(ws2).program_source == "persisted"
    assert Agent.for_role("assistant", workspace=ws2).ask("latest on Yahoo News?").ok
    assert list(paths.registry.parent.glob("registry.sqlite.corrupt-*"))
    assert list(paths.patterns.parent.glob("patterns.json.corrupt-*"))
    assert provider.requests[0].recent_patterns is None  # memory started empty
    store = env.store()
    assert {"calc", "assistant"} <= set(store.registry())  # rebuilt from the role directories


def plant(store: ToolStore, role: str, method: str, code: str) -> None:
    """Replace the stored code by hand, with a correct checksum (someone with write access to the store)."""
    path = store.paths.method_file(role, method)
    data = json.loads(path.read_text())
    data["current"]["code"] = code
    data["current"]["code_checksum"] = hashlib.sha256(code.encode("utf-8")).hexdigest()
    path.write_text(json.dumps(data))


def test_a_planted_forbidden_program_is_rejected_by_the_same_policy(env_any: Env, tmp_path: Path) -> None:
    env = env_any
    marker = tmp_path / "escaped"
    forbidden = f"open({str(marker)!r}, 'w').write('x')\nreturn 1\n"
    assert validate(forbidden, default_policy()).verdict == "terminal"
    ws1, _, _ = env.session([ADD])
    assert Agent.for_role("calc", workspace=ws1).add(1).ok
    plant(env.store(), "calc", "add", forbidden)
    assert select(env.store(), "calc", "add").decision is Decision.EXECUTE_PERSISTED  # it looks healthy

    ws2, provider, spy = env.session([])
    out = Agent.for_role("calc", workspace=ws2).add(1)
    assert out.status == "error" and out.error_type == "guardrail_violation"
    assert spy.codes == [] and provider.calls == 0  # never reached the sandbox
    rec = last(ws2)
    assert rec.program_source == "persisted" and rec.verdict == "terminal"
    # refused only for a capability this policy does not grant (file_write): the caller's policy, not a defect
    # the store can see (ADR 0012, issue 37), so it stays selected and is refused again, never run
    assert rec.store_actions == ["record_failure:extrinsic@1"]
    assert not marker.exists()


def test_a_planted_escape_with_the_policy_disabled_still_hits_the_sandbox_wall(env_any: Env, tmp_path: Path) -> None:
    env = env_any
    marker = tmp_path / "escaped"
    escape = f"import os\nos.system('touch {marker}')\nopen({str(marker)!r}, 'w').write('x')\nreturn 1\n"
    no_policy = dataclasses.replace(default_policy(), rules=())
    assert validate(escape, no_policy).verdict == "approved"
    ws1, _, _ = env.session([ADD])
    assert Agent.for_role("calc", workspace=ws1).add(1).ok
    plant(env.store(), "calc", "add", escape)

    ws2, _, spy = env.session([], policy=no_policy, execution_repair_budget=0)
    out = Agent.for_role("calc", workspace=ws2).add(1)
    assert spy.codes == [escape]  # the sandbox got it ...
    assert out.status == "error" and out.error_type in {"sandbox_violation", "execution"}  # ... and stopped it
    assert not marker.exists()
    assert last(ws2).store_actions == ["record_failure:intrinsic@1"]
