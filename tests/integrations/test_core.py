"""The shared core every adapter stands on (``sandforge.integrations.core``), without any framework."""

from __future__ import annotations

import threading

from sandforge.integrations.core import RUN_CODE, SandforgeTools, tool_name
from tests.integrations.sessions import Sessions


def test_runs_commit_context_in_turn_when_a_framework_runs_tool_calls_at_once(sessions: Sessions) -> None:
    forge, _ = sessions.first()
    count = "context['n'] = context.get('n', 0) + 1\nreturn context['n']"
    threads = [threading.Thread(target=forge.run_code, args=(count,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert forge.context == {"n": 4}
    assert not forge.run_code("context['n'] = 99\nreturn 1 / 0").ok and forge.context == {"n": 4}  # failed: kept


def test_a_program_reaches_only_the_roles_offered_and_cannot_delegate(sessions: Sessions) -> None:
    forge, provider = sessions.first()
    narrow = SandforgeTools(forge.workspace, roles=["other"])
    assert narrow.methods() == [] and [s.name for s in narrow.specs()] == [RUN_CODE]
    answer = narrow.run_code("r = tool('calculator').add(1, 2)\nreturn [r.ok, r.error_type]")
    assert answer.value == [False, "tool_not_found"] and provider.calls == 0
    answer = forge.run_code("r = delegate('helper', purpose='help').go()\nreturn [r.ok, r.error_type]")
    assert answer.value == [False, "delegate_unavailable"]


def test_bad_arguments_are_answers_with_the_fix_never_exceptions(sessions: Sessions) -> None:
    forge, _ = sessions.first()
    bad = forge.use(RUN_CODE, {"code": 3})
    assert bad.error_type == "invalid_arguments" and bad.recoverable and "run_code" in bad.fixes[0]
    assert forge.use("nothing__here", {}).error_type == "tool_not_found"
    missing = forge.use("calculator__add", {"a": 1})
    assert missing.error_type == "invalid_arguments" and "'b' is a required property" in missing.text


def test_host_tools_answer_nested_calls_and_their_failures_are_error_outcomes(sessions: Sessions) -> None:
    forge, _ = sessions.first()

    def lookup(method: str, args: list[object], kwargs: dict[str, object]) -> object:
        if args == ["missing"]:
            raise KeyError("missing")
        return {"method": method, "args": args, "kwargs": kwargs}

    forge.host_tools["lookup"] = lookup
    answer = forge.run_code("ok = tool('lookup').find('a', n=1)\nbad = tool('lookup').find('missing')\n"
                            "return [ok.value, bad.error_type, bad.error_message]")  # fmt: skip
    assert answer.value == [{"method": "find", "args": ["a"], "kwargs": {"n": 1}}, "tool_error", "KeyError: 'missing'"]


def test_tool_names_are_what_every_framework_accepts() -> None:
    assert tool_name("calculator", "add") == "calculator__add"
    assert tool_name("calculator", "add", taken={"calculator__add"}).startswith("calculator__add-")
    long = tool_name("r" * 80, "m")
    assert len(long) <= 64 and long.startswith("r")
    assert tool_name("web fetcher", "get.page").startswith("web_fetcher__get_page-")


def test_every_run_is_in_the_workspace_call_log_as_a_framework_run(sessions: Sessions) -> None:
    forge, _ = sessions.first()
    assert forge.run_code("return 6 * 7").value == 42
    assert not forge.run_code("import os\nreturn 1").ok  # refused: recorded too, with its stage
    runs = [r for r in forge.workspace.log.records if r.source == "framework"]
    assert [(r.role, r.method, r.status) for r in runs] == [("exec", "run", "ok"), ("exec", "run", "error")]
    assert runs[1].attempt_failures[0].stage == "validation"
