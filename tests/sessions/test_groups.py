"""Group sources: configured groups (code, YAML/JSON files), composition, and the ToolStore's roles."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sandforge.runtime.errors import ConfigError
from sandforge.runtime.sessions import (
    CompositeGroupSource,
    SessionStore,
    StaticGroupSource,
    ToolGroup,
    ToolRegistry,
    ToolSpec,
    ToolStatus,
    ToolStoreGroupSource,
)
from sandforge.runtime.sessions.groups import ARGS_KWARGS_SCHEMA, tool_name_for
from sandforge.runtime.sessions.tool_runner import split_input
from sandforge.runtime.store import ArtifactCandidate, ToolStore, assess_cacheability
from sandforge.runtime.store.models import ProgramSource
from tests.sessions.helpers import CORE, GMAIL, RecordingRunner, call, load, make_session

GROUPS_YAML = """
groups:
  - name: google_gmail
    description: Gmail
    role: gmail
    tools:
      - name: gmail_search
        method: search
        input_schema: {type: object, properties: {query: {type: string}}, required: [query]}
  - name: notes
    tools: [{name: note_add}]
"""


def test_groups_from_yaml_and_json(tmp_path: Path) -> None:
    path = tmp_path / "groups.yaml"
    path.write_text(GROUPS_YAML)
    source = StaticGroupSource.from_file(path)
    assert source.group_names() == ["google_gmail", "notes"]
    gmail = source.get_group("google_gmail")
    assert gmail is not None and gmail.agent_role == "gmail" and gmail.tools[0].method_name == "search"
    notes = source.get_group("notes")
    assert notes is not None and notes.agent_role == "notes" and notes.tools[0].input_schema["type"] == "object"
    as_json = tmp_path / "groups.json"
    as_json.write_text('[{"name": "x", "tools": [{"name": "x_y"}]}]')
    assert StaticGroupSource.from_file(as_json).group_names() == ["x"]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("groups: [{name: a, tools: [{name: 'bad name'}]}]", "group #1 tools.0.name"),
        ("groups: [{name: a, tools: [{name: t, input_schema: {type: array}}]}]", "type 'object'"),
        ("groups: [{name: a, tools: [{name: t}, {name: t}]}]", "more than once"),
        ("groups: [{name: a}, {name: a}]", "defined twice"),
        ("groups: {name: a}", "expected a list"),
        ("groups: [{name: a, extra: 1}]", "extra"),
        ("[unclosed", "not valid YAML"),
    ],
)
def test_bad_group_files_are_config_errors(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        StaticGroupSource.from_file(path)


def test_tool_names_are_validated() -> None:
    with pytest.raises(ValidationError):
        ToolSpec(name="x" * 65)
    assert re.fullmatch(r"web_fetcher_get_[0-9a-f]{8}", tool_name_for("web fetcher", "get"))
    assert tool_name_for("calc", "add") == "calc_add"
    long = tool_name_for("r" * 100, "m")
    assert len(long) <= 64 and long != tool_name_for("r" * 101, "m")


def test_composite_first_source_wins() -> None:
    other = ToolGroup(name="google_gmail", description="shadowed")
    extra = ToolGroup(name="extra")
    source = CompositeGroupSource(StaticGroupSource([GMAIL]), StaticGroupSource([other, extra]))
    assert source.group_names() == ["google_gmail", "extra"]
    assert source.get_group("google_gmail") is GMAIL
    assert source.get_group("missing") is None
    assert ToolRegistry(source).group_tools("missing") == []


def test_tool_name_clash_between_groups_is_reported(session_store: SessionStore) -> None:
    clash = ToolGroup(name="clash", tools=(ToolSpec(name="gmail_search"), ToolSpec(name="own_tool")))
    session, provider = make_session(
        session_store, [load("google_gmail"), load("clash"), "ok"], reg=ToolRegistry(StaticGroupSource([GMAIL, clash]))
    )
    result = session.send("load both")
    assert "name already in use: gmail_search" in result.tool_calls[1].content
    assert provider.requests[-1].tool_names == [*CORE, "gmail_search", "gmail_trash", "own_tool"]


def test_list_tool_groups_core_tool(session_store: SessionStore) -> None:
    session, _ = make_session(session_store, [load("calendar"), call("list_tool_groups"), "ok"])
    result = session.send("what can you do")
    listing = result.tool_calls[1].content
    assert "google_gmail [not loaded]: Read, search and trash Gmail messages." in listing
    assert "calendar [loaded]" in listing


def test_args_kwargs_split() -> None:
    spec = ToolSpec(name="t", input_schema=ARGS_KWARGS_SCHEMA, arguments="args_kwargs")
    assert split_input(spec, {"args": [1, 2], "kwargs": {"a": 1}}) == ([1, 2], {"a": 1})
    assert split_input(spec, {}) == ([], {})
    with pytest.raises(ValueError):
        split_input(spec, {"args": "nope"})
    assert split_input(ToolSpec(name="k"), {"a": 1}) == ([], {"a": 1})


# --- the ToolStore's roles ----------------------------------------------------------------------------


def _persist(store: ToolStore, role: str, method: str, code: str = "return args[0] + 1") -> None:
    store.save_artifact(
        ArtifactCandidate(role=role, method_name=method, code=code, runtime_version="0.1.0",
                          cacheability=assess_cacheability(method, code)),
        source=ProgramSource.GENERATED,
    )  # fmt: skip


def test_toolstore_roles_become_groups(tmp_path: Path) -> None:
    tools = ToolStore(tmp_path)
    _persist(tools, "calculator", "add")
    _persist(tools, "calculator", "sub")
    _persist(tools, "web fetcher", "get")
    source = ToolStoreGroupSource(tools)
    assert source.group_names() == ["calculator", "web fetcher"]
    calc = source.get_group("calculator")
    assert calc is not None and calc.agent_role == "calculator"
    assert [(t.name, t.method_name, t.arguments) for t in calc.tools] == [
        ("calculator_add", "add", "args_kwargs"),
        ("calculator_sub", "sub", "args_kwargs"),
    ]
    web = source.get_group("web fetcher")
    assert web is not None and web.tools[0].name.startswith("web_fetcher_get_")
    assert source.get_group("nope") is None


def test_toolstore_group_runs_on_the_role(session_store: SessionStore, tmp_path: Path) -> None:
    tools = ToolStore(tmp_path / "ts")
    _persist(tools, "calculator", "add")
    runner = RecordingRunner()
    reg = ToolRegistry(CompositeGroupSource(StaticGroupSource([GMAIL]), ToolStoreGroupSource(tools)))
    turns = [load("calculator"), call("calculator_add", args=[2]), "3", call("calculator_add", args=[5]), "6"]
    session, provider = make_session(session_store, turns, reg=reg, runner=runner)
    session.send("2 + 1")
    second = session.send("5 + 1")
    assert second.restored_groups == ["calculator"] and second.tool_calls[0].status is ToolStatus.SUCCESS
    assert runner.calls == [("calculator", "add", {"args": [2]}), ("calculator", "add", {"args": [5]})]
    assert "calculator" in provider.requests[0].system


class _BrokenStore:
    def list_tools(self) -> list[Any]:
        raise OSError("disk on fire")

    def get_tool(self, role: str) -> Any:
        raise OSError("disk on fire")


def test_unreadable_toolstore_offers_nothing() -> None:
    source = ToolStoreGroupSource(_BrokenStore())
    assert source.group_names() == [] and source.get_group("x") is None


def test_toolstore_role_without_methods_is_no_group(tmp_path: Path) -> None:
    from sandforge.runtime.store import ToolContract

    tools = ToolStore(tmp_path, clock=lambda: datetime(2026, 1, 1, tzinfo=UTC))
    tools.register_tool(ToolContract(role="planner", purpose="plans"))
    source = ToolStoreGroupSource(tools)
    assert source.group_names() == [] and source.get_group("planner") is None
