"""`sandforge tools ...` through click's CliRunner: tables, --json, typed one-line errors, no tracebacks."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from sandforge.runtime.store import FailureClass, ToolStore
from tests.store.conftest import WEB_FETCHER, Clock, candidate


@pytest.fixture
def cli() -> click.Group:
    from sandforge.runtime.cli.tools_cmd import command

    return command


@pytest.fixture
def filled(store: ToolStore, clock: Clock) -> ToolStore:
    store.register_tool(WEB_FETCHER)
    for n in range(1, 4):
        clock.advance(minutes=1)
        store.record_regeneration(candidate(code=f"return Outcome.ok({n})  # gen {n}"))
    store.record_failure("web_fetcher", "fetch_url", FailureClass.INTRINSIC, "KeyError: 'body'")
    store.record_regeneration(candidate(role="assistant", method="ask", fingerprint=None, code="return 'x'"))
    for labels in (["http_fetch", "rss_parse"], ["rss_parse"], ["html_extract"]):
        store.record_pattern("assistant", "ask", labels)
    return store


def run(cli: click.Group, store: ToolStore, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--store", str(store.paths.state_dir), *args], catch_exceptions=False)


def test_registered_on_the_root_command() -> None:
    from sandforge.runtime.cli import main

    ctx = click.Context(main)  # the root group loads a command's module when it is asked for it (issue 39)
    assert "tools" in main.list_commands(ctx)
    assert main.get_command(ctx, "tools") is not None


def test_list(cli: click.Group, filled: ToolStore) -> None:
    result = run(cli, filled, "list")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:4] == ["ROLE", "METHODS", "USES", "OK"]
    assert any(line.startswith("web_fetcher") and "Fetch a URL" in line for line in lines)
    assert "2 tool(s)" in lines[-1]
    data = json.loads(run(cli, filled, "list", "--json").output)
    assert [t["role"] for t in data] == ["assistant", "web_fetcher"]


def test_list_empty_store(cli: click.Group, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--store", str(tmp_path / "empty"), "list"])
    assert result.exit_code == 0 and "no tools" in result.output
    assert not (tmp_path / "empty").exists()


def test_store_from_environment(cli: click.Group, filled: ToolStore) -> None:
    result = CliRunner().invoke(cli, ["list"], env={"SANDFORGE_STATE_DIR": str(filled.paths.state_dir)})
    assert result.exit_code == 0 and "web_fetcher" in result.output


def test_show_role_and_method(cli: click.Group, filled: ToolStore) -> None:
    role = run(cli, filled, "show", "web_fetcher")
    assert role.exit_code == 0
    assert "Fetch a URL and return its body" in role.output and "fetch_url" in role.output
    method = run(cli, filled, "show", "web_fetcher", "fetch_url")
    assert method.exit_code == 0
    assert "generation: 3" in method.output and "checksum: ok" in method.output
    assert "KeyError: 'body'" in method.output
    assert method.output.rstrip().endswith("return Outcome.ok(3)  # gen 3")
    data = json.loads(run(cli, filled, "show", "web_fetcher", "fetch_url", "--json", "--no-code").output)
    assert data["generation"] == 3 and data["checksum_ok"] is True and "code" not in data


def test_show_flags_a_tampered_artifact(cli: click.Group, filled: ToolStore) -> None:
    path = filled.paths.method_file("web_fetcher", "fetch_url")
    data = json.loads(path.read_text())
    data["current"]["code"] = "evil()"
    path.write_text(json.dumps(data))
    assert "MISMATCH" in run(cli, filled, "show", "web_fetcher", "fetch_url").output
    assert "MISMATCH" in run(cli, filled, "health").output


def test_health(cli: click.Group, filled: ToolStore) -> None:
    result = run(cli, filled, "health")
    assert result.exit_code == 0
    row = next(line for line in result.output.splitlines() if line.startswith("web_fetcher"))
    assert "degraded" in row and "1 (1/0/0)" in row
    data = json.loads(run(cli, filled, "health", "--json").output)
    assert {(r["role"], r["reusable"]) for r in data} == {("assistant", False), ("web_fetcher", True)}


def test_history_and_rollback(cli: click.Group, filled: ToolStore) -> None:
    history = run(cli, filled, "history", "web_fetcher", "fetch_url")
    assert history.exit_code == 0
    rows = history.output.splitlines()[1:]
    assert [r.split()[0] for r in rows] == ["3", "2", "1"] and rows[0].split()[1] == "*"
    result = run(cli, filled, "rollback", "web_fetcher", "fetch_url")
    assert result.exit_code == 0 and "generation 3 -> 2" in result.output
    result = run(cli, filled, "rollback", "web_fetcher", "fetch_url", "--to", "1")
    assert result.exit_code == 0 and "generation 2 -> 1" in result.output
    data = json.loads(run(cli, filled, "history", "web_fetcher", "fetch_url", "--json").output)
    assert [(g["generation"], g["current"]) for g in data] == [(1, True), (2, False), (3, False)]


def test_patterns(cli: click.Group, filled: ToolStore) -> None:
    result = run(cli, filled, "patterns")
    assert result.exit_code == 0
    assert "assistant: last 3 calls" in result.output and "rss_parse" in result.output
    narrow = run(cli, filled, "patterns", "--role", "assistant", "--window", "1")
    assert "html_extract" in narrow.output and "rss_parse" not in narrow.output
    data = json.loads(run(cli, filled, "patterns", "--json", "--window", "5").output)
    assert data[0]["role"] == "assistant" and data[0]["calls"] == 3
    assert "no recorded patterns" in run(cli, filled, "patterns", "--role", "nobody").output


def test_prune_dry_run_then_apply(cli: click.Group, state_dir: Path) -> None:
    clock = Clock()
    clock.now = datetime.now(UTC) - timedelta(days=60)  # the CLI's store runs on the real clock
    store = ToolStore(state_dir, clock=clock)
    store.record_regeneration(candidate(role="assistant", method="ask", fingerprint=None))
    clock.now = datetime.now(UTC)
    store.record_regeneration(candidate())
    dry = run(cli, store, "prune", "--older-than", "30")
    assert dry.exit_code == 0, dry.output
    assert "dry run: 1 tool(s)" in dry.output and "assistant" in dry.output and "web_fetcher" not in dry.output
    assert store.get_tool("assistant") is not None
    applied = json.loads(run(cli, store, "prune", "--older-than", "30", "--apply", "--json").output)
    assert applied["applied"] and [c["role"] for c in applied["candidates"]] == ["assistant"]
    assert [t.role for t in store.list_tools()] == ["web_fetcher"]
    assert Path(applied["archive_dir"]).is_dir()
    assert "nothing unused" in run(cli, store, "prune", "--older-than", "30").output


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["show", "nope"], 1, "error: no tool 'nope'"),
        (["show", "web_fetcher", "nope"], 1, "error: no stored artifact"),
        (["history", "nope", "m"], 1, "error: no stored artifact"),
        (["rollback", "web_fetcher", "fetch_url", "--to", "9"], 1, "error: generation 9"),
        (["rollback", "assistant", "ask"], 1, "error: 'assistant'.'ask' has no earlier generation"),
        (["health", "--role", "nope"], 1, "error: no tool 'nope'"),
        (["prune", "--older-than", "-1"], 2, ""),
        (["rollback", "web_fetcher", "fetch_url", "--to", "0"], 2, ""),
    ],
)
def test_errors_are_one_line_never_tracebacks(
    cli: click.Group, filled: ToolStore, args: list[str], code: int, message: str
) -> None:
    result = CliRunner().invoke(cli, ["--store", str(filled.paths.state_dir), *args])
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if message:
        assert message in result.output
        assert len([ln for ln in result.output.splitlines() if ln.startswith("error:")]) == 1


@pytest.mark.parametrize("which", ["registry.sqlite", "registry.json"])
def test_schema_too_new_is_a_clean_error(cli: click.Group, filled: ToolStore, which: str) -> None:
    if which == "registry.json":  # a newer sandforge's registry.json, never migrated: refused
        filled.paths.registry.unlink()
        filled.paths.legacy_registry.write_text('{"schema_version": 42}')
    else:
        with sqlite3.connect(filled.paths.registry) as db:
            db.execute("UPDATE meta SET value = '42' WHERE key = 'schema'")
    result = CliRunner().invoke(cli, ["--store", str(filled.paths.state_dir), "list"])
    assert result.exit_code == 1 and result.output.startswith("error: ") and "schema_version 42" in result.output


def test_unwritable_store_is_a_clean_error(
    cli: click.Group, filled: ToolStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    def denied(src: object, dst: object, **_: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", denied)
    result = CliRunner().invoke(cli, ["--store", str(filled.paths.state_dir), "rollback", "web_fetcher", "fetch_url"])
    assert result.exit_code == 7 and "Permission denied" in result.output and "Traceback" not in result.output


def test_hostile_role_names_print_on_one_line(cli: click.Group, store: ToolStore) -> None:
    store.record_regeneration(candidate(role="evil\nrole\x1b[31m", fingerprint=None))
    result = run(cli, store, "list")
    assert result.exit_code == 0 and "\x1b" not in result.output
    assert len(result.output.splitlines()) == 3
