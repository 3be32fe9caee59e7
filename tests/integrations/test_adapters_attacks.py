"""Red team on the adapters: what a model can send as a tool's arguments ends as an answer it reads, never as
an exception out of the adapter."""

from __future__ import annotations

import asyncio

import pytest

from sandforge.integrations.openai_agents import function_tools
from tests.integrations.sessions import Sessions

#: JSON the decoder gives up on with a RecursionError, not a ValueError. (The SDK's Runner itself fails on it
#: before any tool runs, in agents/_tool_invocation.py: an SDK bug; the adapter's own entry point must not.)
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(("tool", "arguments"), [("run_code", DEEP), ("calculator__add", '{"a": ' + DEEP + "}")])
def test_openai_agents_arguments_nested_too_deep_are_an_answer(sessions: Sessions, tool: str, arguments: str) -> None:
    forge, provider = sessions.first()
    invoke = {t.name: t for t in function_tools(forge)}[tool].on_invoke_tool
    answer = asyncio.run(invoke(None, arguments))
    assert answer.startswith("error [invalid_arguments]: the arguments are not JSON") and provider.calls == 0
