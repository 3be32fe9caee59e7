"""Issue 37 item 3: health attribution as ADR 0012 means it.

A failure the caller causes (its policy's grants, its trace budget) is EXTRINSIC and never degrades a stored
artifact; a program's own error is extrinsic only when the host saw the cause in that execution (here: a
nested call that failed extrinsically), never on the program's word alone. Real calls: stored program ->
validation under the caller's policy -> sandbox -> store record.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from mcp import Client

from sandforge.runtime.agent import Agent, CallLog, CallRecord, TraceBudget, Workspace
from sandforge.runtime.agent.persistence import RUNTIME_VERSION
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.providers.prompt import PROMPT_VERSION
from sandforge.runtime.service.mcp import TenantMCP
from sandforge.runtime.service.mcp.persisted import exposed
from sandforge.runtime.service.tenants import standalone_tenant
from sandforge.runtime.store import (
    ArtifactCandidate,
    Cacheability,
    CacheabilityReason,
    Decision,
    FailureClass,
    ToolContract,
    ToolStore,
)
from sandforge.sandbox import SandboxConfig
from tests.service.mcp.test_stdio import failure

#: What a model writes for ``web_fetcher.fetch(url)``: valid wherever ``http_fetch`` is granted.
FETCH = "r = fetch(args[0])\nreturn r.text()\n"
WEB_FETCHER = ToolContract(
    role="web_fetcher", purpose="Fetch a URL and return its body", deliverable={"type": "string"}
)
#: Asks a helper and passes on its answer, whatever it is (an error outcome is returned as the program's own).
RELAY = "return tool('helper').ping()\n"
#: The program's own answer that looks like the world's fault: a claim, since the host saw no such thing.
CLAIM = "return Outcome.error('budget_exhausted', 'no budget left, honestly', retriable=False)\n"


def store_program(state_dir: Path, role: str, method: str, code: str, contract: ToolContract | None = None) -> None:
    """A proven artifact, as an earlier session (under another policy) stored it."""
    store = ToolStore(state_dir)
    if contract is not None:
        store.register_tool(contract)
    verdict = Cacheability(cacheable=True, reason=CacheabilityReason.DELEGATED_CONTRACT, detail="test",
                           input_sensitive=False)  # fmt: skip
    store.record_regeneration(
        ArtifactCandidate(
            role=role, method_name=method, code=code, runtime_version=RUNTIME_VERSION, prompt_version=PROMPT_VERSION,
            contract_fingerprint=contract.fingerprint() if contract else None, cacheability=verdict,
        )
    )  # fmt: skip


def select(state_dir: Path, role: str, method: str, contract: ToolContract | None = None) -> Decision:
    return (
        ToolStore(state_dir)
        .select(
            role,
            method,
            contract_fingerprint=contract.fingerprint() if contract else None,
            runtime_version=RUNTIME_VERSION,
            prompt_version=PROMPT_VERSION,
        )
        .decision
    )


def workspace(made: list[Workspace], state_dir: Path, programs: list[str] | None = None, **kwargs: object) -> Workspace:
    ws = Workspace(provider=ScriptedProvider(programs or []), sandbox=SandboxConfig(backend="subprocess", pool_size=1),
                   store=ToolStore(state_dir), log=CallLog(state_dir / "calls.jsonl"), **kwargs)  # type: ignore[arg-type]  # fmt: skip
    made.append(ws)
    return ws


def top(ws: Workspace) -> CallRecord:
    return [r for r in ws.log.records if r.depth == 0][-1]


def test_a_policy_without_the_grant_never_degrades_a_stored_tool(tmp_path: Path, workspaces: list[Workspace]) -> None:
    state = tmp_path / "state"
    store_program(state, "web_fetcher", "fetch", FETCH, WEB_FETCHER)
    ws = workspace(workspaces, state)  # the default policy: no http_fetch
    for _ in range(5):
        out = Agent.for_role("web_fetcher", workspace=ws).fetch("https://example.com/")
        assert out.error_type == "guardrail_violation" and not out.retriable
        assert out.metadata["failure_class"] == "extrinsic" and out.metadata["terminal"] is True
        rec = top(ws)
        assert rec.program_source == "persisted" and rec.failure_class == "extrinsic"
        assert rec.store_actions == ["record_failure:extrinsic@1"]
    assert select(state, "web_fetcher", "fetch", WEB_FETCHER) is Decision.EXECUTE_PERSISTED  # still healthy
    art = ToolStore(state).lookup("web_fetcher", "fetch").artifact
    assert art is not None and art.extrinsic_failure_count == 5 and art.intrinsic_failure_count == 0
    assert "web_fetcher.fetch" in exposed(ToolStore(state))


def test_a_program_the_policy_refuses_for_what_it_does_is_still_the_programs_fault(
    tmp_path: Path, workspaces: list[Workspace]
) -> None:
    """Only a refusal made of ungranted capabilities is the caller's: ``import socket`` is forbidden anyway."""
    state = tmp_path / "state"
    store_program(state, "net", "peek", "import socket\nreturn 1\n")
    out = Agent.for_role("net", workspace=workspace(workspaces, state)).peek()
    assert out.error_type == "guardrail_violation" and out.metadata["failure_class"] == "intrinsic"
    assert top(workspaces[0]).store_actions == ["record_failure:intrinsic@1"]
    assert select(state, "net", "peek") is not Decision.EXECUTE_PERSISTED


def test_a_nested_call_the_trace_budget_refused_is_passed_on_unchanged(
    tmp_path: Path, workspaces: list[Workspace]
) -> None:
    """The host refused the nested call (the caller's trace budget): the relay's answer is extrinsic, returned
    as it is (no outcome repair), and its artifact stays healthy."""
    state = tmp_path / "state"
    store_program(state, "relay", "forward", RELAY)
    ws = workspace(workspaces, state, trace_budget=TraceBudget(max_nested_calls=0))
    for _ in range(4):
        out = Agent.for_role("relay", workspace=ws).forward()
        assert out.error_type == "budget_exhausted", out
        assert out.metadata["failure_class"] == "extrinsic" and out.metadata["host_observed"] == "nested_call"
        rec = top(ws)
        assert rec.outcome_repair_attempts == 0 and rec.store_actions == ["record_failure:extrinsic@1"]
    assert select(state, "relay", "forward") is Decision.EXECUTE_PERSISTED


def test_the_same_error_on_the_programs_word_alone_is_a_claim(tmp_path: Path, workspaces: list[Workspace]) -> None:
    state = tmp_path / "state"
    store_program(state, "liar", "answer", CLAIM)
    out = Agent.for_role("liar", workspace=workspace(workspaces, state)).answer()
    assert out.error_type == "budget_exhausted" and out.metadata["failure_class"] == FailureClass.ADAPTIVE.value
    assert "host_observed" not in out.metadata
    assert top(workspaces[0]).store_actions == ["record_failure:adaptive@1"]


def test_one_callers_refusals_cannot_push_the_tool_out_of_another_callers_tool_list(tmp_path: Path) -> None:
    """Two tenants (one with its own store, one sharing the store with a caller whose policy lacks
    ``http_fetch``, as ``serve`` and ``sandforge mcp --policy`` on one state directory): the strict caller's
    refusals leave ``web_fetcher.fetch`` in the other callers' MCP tool lists."""
    shared, other = tmp_path / "shared", tmp_path / "other"
    for state in (shared, other):
        store_program(state, "web_fetcher", "fetch", FETCH, WEB_FETCHER)
    layer = tmp_path / "egress"
    layer.mkdir()
    (layer / "egress.yaml").write_text("grant: [http_fetch]\negress:\n  allow:\n    - url: 'https://example.com/**'\n")

    strict = standalone_tenant("strict", shared, backend="subprocess")
    fetching = standalone_tenant("fetching", shared, policy=(layer,), backend="subprocess")
    elsewhere = standalone_tenant("elsewhere", other, policy=(layer,), backend="subprocess")
    listed: dict[str, set[str]] = {}

    async def main() -> None:
        async with Client(TenantMCP(strict)) as client:
            for _ in range(4):
                args = {"role": "web_fetcher", "method": "fetch", "args": ["https://example.com/"]}
                refused = failure(await client.call_tool("call_stored_tool", args))
                assert refused["error_type"] == "guardrail_violation"
                assert refused["details"]["failure_class"] == "extrinsic"
        for name, runtime in (("fetching", fetching), ("elsewhere", elsewhere)):
            async with Client(TenantMCP(runtime)) as client:
                listed[name] = {t.name for t in (await client.list_tools()).tools}

    try:
        asyncio.run(main())
    finally:
        for runtime in (strict, fetching, elsewhere):
            runtime.close()
    assert "web_fetcher.fetch" in listed["fetching"] and "web_fetcher.fetch" in listed["elsewhere"]


def test_the_callers_trace_budget_running_out_never_degrades_a_stored_tool(
    tmp_path: Path, workspaces: list[Workspace]
) -> None:
    """The wall-clock budget is the caller's (``TraceBudget.max_wall_s``), not the program's own time limit."""
    state = tmp_path / "state"
    store_program(state, "worker", "crunch", "if args[0] > 1000:\n    while True:\n        pass\nreturn args[0]\n")
    ws = workspace(workspaces, state, trace_budget=TraceBudget(max_wall_s=0.5))
    for _ in range(4):
        out = Agent.for_role("worker", workspace=ws).crunch(5000)
        assert out.error_type == "budget_exhausted" and out.metadata["failure_class"] == "extrinsic", out
        assert top(ws).store_actions == ["record_failure:extrinsic@1"]
    assert select(state, "worker", "crunch") is Decision.EXECUTE_PERSISTED
