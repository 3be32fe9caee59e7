"""The shared helpers that replaced several copies (issue 17 item 4): each used by every former owner."""

from __future__ import annotations

import gc
from pathlib import Path

import platformdirs
import pytest

from sandforge.runtime.agent.calllog import default_log_path
from sandforge.runtime.gc_pause import gc_paused
from sandforge.runtime.sessions import default_db_path
from sandforge.runtime.state_dir import resolve_state_dir
from sandforge.runtime.store import StorePaths, default_state_dir


def test_gc_paused_restores_an_enabled_collector() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: the inner one must not turn it back on
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_gc_paused_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_gc_paused_restores_on_error() -> None:
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_one_state_dir_for_store_sessions_and_call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDFORGE_CALL_LOG", raising=False)
    monkeypatch.setenv("SANDFORGE_STATE_DIR", f"  {tmp_path}  ")
    assert resolve_state_dir() == tmp_path
    assert default_state_dir() == tmp_path
    assert StorePaths().state_dir == tmp_path
    assert default_db_path() == tmp_path / "sessions.db"
    assert default_log_path() == tmp_path / "logs" / "calls.jsonl"


def test_state_dir_override_and_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORGE_STATE_DIR", " ")
    assert resolve_state_dir() == platformdirs.user_state_path("sandforge")
    assert resolve_state_dir(tmp_path / "x") == tmp_path / "x"
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_state_dir("~/state") == tmp_path / "state"


def test_one_contract_model_from_the_agent_to_the_store() -> None:
    from sandforge.runtime import agent, providers, store
    from sandforge.runtime.providers.base import GenerationRequest

    assert agent.ToolContract is providers.ToolContract is store.ToolContract
    contract = store.ToolContract(role="helper", purpose="helps", deliverable={"type": "string"})
    request = GenerationRequest(role="boss", method="go", contract=contract, known_tools=[contract])
    assert request.contract is contract


def test_the_store_keeps_a_bounded_contract_the_agent_a_whole_one(tmp_path: Path) -> None:
    from sandforge.runtime.names import MAX_CONTRACT_FIELD_CHARS, MAX_PURPOSE_CHARS
    from sandforge.runtime.store import ToolContract, ToolStore

    schema = {"type": "object", "properties": {f"k{i}": {"type": "string"} for i in range(200)}}
    whole = ToolContract(role="helper", purpose="p" * (MAX_PURPOSE_CHARS + 5), deliverable=schema)
    assert whole.deliverable == schema and whole.purpose is not None and len(whole.purpose) > MAX_PURPOSE_CHARS
    kept = whole.bounded()
    assert kept.purpose is not None and len(kept.purpose) == MAX_PURPOSE_CHARS
    assert isinstance(kept.deliverable, dict) and kept.deliverable["truncated"] is True
    assert kept.deliverable["chars"] > MAX_CONTRACT_FIELD_CHARS
    assert whole.fingerprint() == kept.fingerprint()
    small = ToolContract(role="helper", purpose="p")
    assert small.bounded() is small

    tools = ToolStore(tmp_path / "state")
    tools.register_tool(whole)
    manifest = tools.manifest("helper")
    assert manifest is not None and manifest.contract == kept
    entry = tools.get_tool("helper")
    assert entry is not None and entry.contract() == kept


def test_one_anthropic_exception_map_for_both_providers() -> None:
    import anthropic
    import httpx2 as httpx

    from sandforge.runtime.providers.anthropic_client import classify
    from sandforge.runtime.providers.anthropic_provider import map_api_error
    from sandforge.runtime.providers.chat import AnthropicChatProvider, ChatProviderError, ChatRequest
    from sandforge.runtime.sessions import SessionError

    request = httpx.Request("POST", "https://api.anthropic.com/v1/messages")
    timeout = anthropic.APITimeoutError(request=request)
    assert (classify(timeout).kind, classify(timeout).retriable) == ("timeout", True)
    error = map_api_error(timeout)
    assert (error.kind, error.retriable, error.message) == ("timeout", True, classify(timeout).message)

    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=req)

    client = anthropic.Anthropic(
        api_key="k", max_retries=0, http_client=httpx.Client(transport=httpx.MockTransport(handler))
    )
    chat = AnthropicChatProvider(client=client)
    with pytest.raises(ChatProviderError) as info:
        chat.complete(ChatRequest(messages=[{"role": "user", "content": "hi"}]))
    assert isinstance(info.value, SessionError)  # docs/sessions.md: every session error derives from it
    assert (info.value.message, info.value.retriable) == (classify(timeout).message, True)
