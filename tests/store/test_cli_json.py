"""`sandforge tools rollback --json` (issue 21: --json on every command that prints data), RFC 3339 UTC times."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner

from sandforge.runtime.cli import main
from sandforge.runtime.store import ToolStore
from tests.store.conftest import WEB_FETCHER, Clock, candidate

RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def test_rollback_json_names_both_generations_and_changes_the_store(store: ToolStore, clock: Clock) -> None:
    store.register_tool(WEB_FETCHER)
    for n in (1, 2):
        clock.advance(minutes=1)
        store.record_regeneration(candidate(code=f"return Outcome.ok({n})  # gen {n}"))
    args = ["tools", "--store", str(store.paths.state_dir), "rollback", "web_fetcher", "fetch_url", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["role"], data["method"], data["from_generation"], data["to_generation"]) == (
        "web_fetcher", "fetch_url", 2, 1)  # fmt: skip
    assert data["artifact"]["generation"] == 1 and "code" not in data["artifact"]
    assert RFC3339_UTC.match(data["artifact"]["created_at"])
    assert store.history("web_fetcher", "fetch_url")[0].generation == 1
    again = CliRunner().invoke(main, [*args[:-1], "--to", "9", "--json"])
    assert again.exit_code == 1 and json.loads(again.stderr)["error"]["exit_code"] == 1
