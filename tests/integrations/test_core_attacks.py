"""Red team on the framework core (``sandforge.integrations.core``): what a program run by ``run_code`` can
reach through its nested ``tool(name).method(...)``, and what a host tool's failure shows the model."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sandforge.integrations.core import SandforgeTools, tool_name
from tests.integrations.sessions import Sessions

ERROR = "return [r.ok, r.error_type, r.error_message]"


def test_a_program_reaches_no_role_the_workspace_does_not_know(sessions: Sessions) -> None:
    """With ``roles=None`` the model is offered the known roles; a program naming another (a new one, or a
    known one with a NUL or a homoglyph in it) is not offered it, and no model is asked to write one."""
    forge, provider = sessions.first()
    for name in ("brandnew", "calc\\x00ulator", "calculator ", "calcuIator"):
        answer = forge.run_code(f"r = tool('{name}').add(1, 2)\n{ERROR}")
        assert answer.value == [False, "tool_not_found", answer.value[2]], name  # type: ignore[index]
    assert provider.calls == 0 and forge.workspace.tool_store is not None
    assert [t.role for t in forge.workspace.tool_store.list_tools()] == ["calculator"]  # nothing new stored
    assert forge.run_code("return tool('calculator').add(1, 2).value").value == 3  # the known role still answers


@pytest.mark.parametrize(
    "reach",
    [
        "tool('calculator').__class__",
        "getattr(tool('calculator'), '__init__')",
        "tool('__class__').x()",
        "getattr(tool('calculator'), '_' * 2 + 'init' + '_' * 2)()",
    ],
)
def test_dunder_method_and_tool_names_never_reach_the_host(sessions: Sessions, reach: str) -> None:
    forge, provider = sessions.first()
    seen: list[str] = []
    forge.host_tools["__class__"] = lambda method, args, kwargs: seen.append(method)  # type: ignore[func-returns-value]
    answer = forge.run_code(f"r = {reach}\nreturn 1")
    assert not answer.ok and seen == [] and provider.calls == 0


def test_a_failing_host_tool_shows_the_model_no_host_path(sessions: Sessions, tmp_path: Path) -> None:
    forge, _ = sessions.first()
    secret = tmp_path / "secret" / "keys.txt"

    def reader(method: str, args: list[object], kwargs: dict[str, object]) -> object:
        return secret.read_text()

    forge.host_tools["reader"] = reader
    answer = forge.run_code(f"r = tool('reader').read()\n{ERROR}")
    assert answer.value[:2] == [False, "tool_error"]  # type: ignore[index]
    message = str(answer.value[2])  # type: ignore[index]
    assert message.startswith("FileNotFoundError:") and "<host>" in message
    assert str(tmp_path) not in answer.text and "secret" in message  # the name below the host's dirs stays


@pytest.mark.parametrize("value", [object(), {"d": None}], ids=["object", "cycle"])
def test_a_host_tool_answering_no_json_is_one_clean_error(sessions: Sessions, value: object) -> None:
    forge, _ = sessions.first()
    if isinstance(value, dict):
        value["d"] = value  # a cycle
    forge.host_tools["odd"] = lambda method, args, kwargs: value  # type: ignore[arg-type,return-value]
    answer = forge.run_code(f"r = tool('odd').get()\n{ERROR}")
    assert answer.value == [False, "tool_error", "the host tool 'odd' answered a value that is not JSON"]
    assert "0x" not in answer.text and "pydantic" not in answer.text


def test_nested_call_floods_and_huge_arguments_end_in_the_runs_own_limits(sessions: Sessions) -> None:
    forge, _ = sessions.first()
    calls: list[str] = []
    forge.host_tools["echo"] = lambda method, args, kwargs: calls.append(method)  # type: ignore[func-returns-value]
    flood = forge.run_code("while True:\n    tool('echo').m()\n")
    assert flood.error_type == "timeout" and "nested calls included" in (flood.message or "")
    huge = forge.run_code("r = tool('echo').m('y' * 400_000_000)\nreturn 1")
    assert not huge.ok and huge.error_type in {"memory_limit", "output_limit"}
    big = SandforgeTools(forge.workspace, host_tools={"big": lambda m, a, k: "x" * 50_000_000})
    assert big.run_code("r = tool('big').get()\nreturn [r.ok, r.error_type]").value == [False, "output_limit"]
    assert forge.run_code("return 1").value == 1 and forge.context == {}  # nothing left behind


@pytest.mark.parametrize(
    "poison",
    [
        "context['x'] = float('nan')",
        "context['x'] = '\\ud800'",
        "d = []\nfor i in range(500):\n    d = [d]\ncontext['x'] = d",
    ],
    ids=["nan", "lone-surrogate", "deep"],
)
def test_a_run_cannot_commit_a_context_that_breaks_the_next_runs(sessions: Sessions, poison: str) -> None:
    forge, _ = sessions.first()
    assert forge.run_code("context['kept'] = 1\nreturn 0").ok
    assert not forge.run_code(f"{poison}\nreturn 1").ok
    assert forge.context == {"kept": 1} and forge.run_code("return context['kept']").value == 1


def test_concurrent_runs_and_role_calls_lose_no_context_update(sessions: Sessions) -> None:
    forge, _ = sessions.first()
    bump = "context['n'] = context.get('n', 0) + 1\nr = tool('calculator').add(1, 2)\nreturn r.value"
    threads = [threading.Thread(target=forge.run_code, args=(bump,)) for _ in range(3)]
    threads += [threading.Thread(target=forge.run_code, args=("context['n'] = -1\nreturn 1 / 0",))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert forge.context == {"n": 3}


def test_a_role_stored_later_cannot_take_over_a_tool_name_the_model_uses() -> None:
    """``a__b.c`` and ``a.b__c`` (or ``a_.b`` and ``a._b``) would share ``a__b__c``; whichever is listed first
    would get it, so storing the other could move the name: each has a name of its own, whatever else exists."""
    pairs = [("a__b", "c"), ("a", "b__c"), ("a_", "_b"), ("a", "__b")]
    alone = [tool_name(r, m) for r, m in pairs]
    assert len(set(alone)) == len(pairs)
    assert [tool_name(r, m, taken=set(alone) - {n}) for (r, m), n in zip(pairs, alone, strict=True)] == alone
    assert tool_name("calculator", "add") == "calculator__add" and tool_name("web_fetch", "get") == "web_fetch__get"


@pytest.mark.parametrize("code", ["return 1  # \ud800", "return '\udfff'"])
def test_a_lone_surrogate_in_a_program_is_an_answer_never_an_exception(sessions: Sessions, code: str) -> None:
    """A model's JSON arguments may carry ``"\\ud800"`` (json.loads decodes it): the run's record used to raise."""
    forge, _ = sessions.first()
    answer = forge.use("run_code", {"code": code})
    assert answer.error_type == "invalid_code" and "unpaired surrogate" in (answer.message or "")
    assert forge.workspace.log.records[-1].source == "framework"
    assert forge.run_code("return args[0] + 'x'", args=["\ud800"]).error_type is not None  # nor in its arguments
