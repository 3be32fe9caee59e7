"""End to end: group tools run through the real Agent lifecycle (ScriptedProvider programs, validated by the
guardrails, executed in the subprocess sandbox), inside the session loop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.sessions import AgentToolRunner, SessionStore, ToolStatus
from sandforge.sandbox import Sandbox, SandboxConfig
from tests.sessions.helpers import call, load, make_session

SEARCH = "context['last_query'] = kwargs['query']\nreturn ['m1', 'm2', 'm3']"
TRASH = (
    "trashed = list(context.get('trashed', []))\n"
    "trashed.append(kwargs['id'])\n"
    "context['trashed'] = trashed\n"
    "return {'trashed': kwargs['id'], 'total': len(trashed)}"
)
NOT_FOUND = "return Outcome.error('not_found', 'no message ' + str(kwargs['id']), retriable=False)"

SCRIPT: list[Any] = [
    load("google_gmail"),
    call("gmail_search", query="from:spam"),
    "Found 3 spam messages.",
    call("gmail_trash", id=7),
    "Trashed message 7.",
]


@pytest.fixture(scope="module")
def subprocess_sandbox() -> Iterator[Sandbox]:
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=1))
    try:
        yield sb
    finally:
        sb.close()


def _runner(programs: list[str], sandbox: Sandbox) -> tuple[AgentToolRunner, ScriptedProvider]:
    provider = ScriptedProvider(programs)
    return AgentToolRunner(provider=provider, sandbox=sandbox, log=False), provider


def test_group_tools_run_through_the_agent_across_turns(
    session_store: SessionStore, subprocess_sandbox: Sandbox
) -> None:
    runner, programs = _runner([SEARCH, TRASH], subprocess_sandbox)
    session, _ = make_session(session_store, SCRIPT, runner=runner)
    first = session.send("find spam")
    assert [(c.name, c.status) for c in first.tool_calls] == [
        ("load_tool_group", ToolStatus.SUCCESS),
        ("gmail_search", ToolStatus.SUCCESS),
    ]
    assert first.tool_calls[1].content == '["m1", "m2", "m3"]'
    second = session.send("trash 7")  # no reload: restored from history
    assert second.restored_groups == ["google_gmail"]
    assert second.tool_calls[0].status is ToolStatus.SUCCESS
    assert second.tool_calls[0].content == '{"trashed": 7, "total": 1}'
    assert programs.calls == 2
    assert [(r.role, r.method) for r in programs.requests] == [("gmail", "search"), ("gmail", "trash")]
    # the role's context was committed by the lifecycle and carried over between turns
    assert runner.agent("gmail").context == {"last_query": "from:spam", "trashed": [7]}
    # outcome metadata is persisted with the result, never sent to the model
    result_msg = [m for m in session.history() if m.type.value == "tool_result"][-1]
    assert result_msg.metadata["tool_role"] == "gmail" and result_msg.metadata["method_name"] == "trash"
    runner.close()


def test_without_restore_the_agent_is_never_asked(session_store: SessionStore, subprocess_sandbox: Sandbox) -> None:
    runner, programs = _runner([SEARCH, TRASH], subprocess_sandbox)
    session, _ = make_session(session_store, SCRIPT, runner=runner, restore_groups=False)
    session.send("find spam")
    second = session.send("trash 7")
    assert second.tool_calls[0].status is ToolStatus.ERROR
    assert second.tool_calls[0].content == "Tool 'gmail_trash' is not available for this agent"
    assert programs.calls == 1  # only the search program was generated
    runner.close()


def test_error_outcome_becomes_an_error_tool_result(session_store: SessionStore, subprocess_sandbox: Sandbox) -> None:
    runner, _ = _runner([NOT_FOUND], subprocess_sandbox)
    session, provider = make_session(
        session_store, [load("google_gmail"), call("gmail_trash", id=9), "No such message."], runner=runner
    )
    result = session.send("trash 9")
    status, content = result.tool_calls[1].status, result.tool_calls[1].content
    assert status is ToolStatus.ERROR
    assert content == "not_found: no message 9"
    sent = provider.requests[-1].messages[-1]["content"][0]
    assert sent["is_error"] is True and sent["content"] == "not_found: no message 9"
    runner.close()
