"""The design documents' scenario, for real (issue 18): `sandforge demo --news`, on every backend.

An assistant asks for Google News, Yahoo News and NYT headlines in turn. The feeds come from loopback
servers reached only through the host's egress broker under the demo's policy layer. The first two answers
are one-off generated programs, returned with the broker's provenance and not reused across sources; pattern
memory sees http_fetch and rss_parse repeat; the third request forges web_fetcher and rss_parser, which
persist; a second run on the same store calls them with no model call for them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.agent import Workspace
from sandforge.runtime.cli import main
from sandforge.runtime.cli.news_demo import NewsRun, Step, egress_records, reset_store, run_news_demo
from sandforge.runtime.cli.news_feeds import SITES, LocalInternet
from sandforge.runtime.guardrails.loader import layered_policy
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.store import ToolStore
from sandforge.sandbox import Sandbox, SandboxConfig

HOSTS = [site.host for site in SITES]
TITLES = {site.source: [story.title for story in site.stories] for site in SITES}


def run(sandbox: Sandbox, store: Path, work: Path) -> tuple[NewsRun, list[str]]:
    lines: list[str] = []
    work.mkdir()
    result = run_news_demo(sandbox, store, echo=lines.append, work_dir=work)
    return result, lines


def provenance(step: Step) -> list[dict[str, object]]:
    return egress_records(step.outcome)


def assert_answers_each_source_with_the_brokers_provenance(result: NewsRun) -> None:
    for step, site in zip(result.steps, SITES, strict=True):
        assert step.outcome.ok, (step.question, step.outcome.error_type, step.outcome.error_message)
        value = step.outcome.value
        assert isinstance(value, dict) and value["source"] == site.source
        assert [h["title"] for h in value["headlines"]] == TITLES[site.source][:5]
        (record,) = provenance(step)  # exactly one request, to this source's feed, recorded by the host
        assert str(record["url"]).startswith(f"http://{site.host}:") and record["status"] == 200
        assert record["rule"] and f"{site.host}" in str(record["rule"]) and not record["denied"]
        assert int(str(record["bytes"])) > 500


def test_first_run_generates_then_forges_and_a_second_run_reuses_the_tools(sandbox: Sandbox, tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    first, lines = run(sandbox, store_dir, tmp_path / "run1")
    assert_answers_each_source_with_the_brokers_provenance(first)
    google, yahoo, nyt = first.steps
    assert google.decisions == ["inline:requests"] and yahoo.decisions == ["inline:urllib"]
    assert nyt.decisions == ["forge", "web_fetcher.fetch", "rss_parser.parse"]
    # the provenance of the first two is the outcome's own (the program fetched itself)
    assert [r["url"] for r in google.outcome.metadata["egress"]] == [r["url"] for r in provenance(google)]
    # ADR 0013: the Google program is stored but never run for Yahoo
    (yahoo_top,) = [r for r in yahoo.records if r.depth == 0]
    assert (yahoo_top.selection_decision, yahoo_top.selection_reason) == ("regenerate", "dynamic_method")
    assert yahoo_top.program_source == "generated" and yahoo_top.cacheable is False
    # pattern memory: the nudge reached the third prompt, naming the repeated capabilities
    assert first.model_calls == {"assistant.ask": 3, "web_fetcher.fetch": 1, "rss_parser.parse": 1}
    nested = {f"{r.role}.{r.method}": r for r in nyt.records if r.depth == 1}
    assert set(nested) == {"web_fetcher.fetch", "rss_parser.parse"}
    # the tool fetched, and its sources travel up to the answer; the tool's call-log record has the same request
    (source,) = provenance(nyt)
    assert source["via"] == "web_fetcher.fetch" and "egress" not in nyt.outcome.metadata
    assert [call.url for call in nested["web_fetcher.fetch"].egress] == [source["url"]]
    assert nested["rss_parser.parse"].egress == []
    assert all(r.program_source == "generated" and r.cacheable for r in nested.values())
    assert any("consider Forging now" in line for line in lines)
    assert any("http_fetch 2/2" in line and "rss_parse 2/2" in line and "promotion" in line for line in lines)
    # the forged tools persist, reusable
    store = ToolStore(store_dir)
    assert {"web_fetcher", "rss_parser"} <= {entry.role for entry in store.list_tools()}
    assert first.tools["web_fetcher.fetch"]["cacheable"] and first.tools["rss_parser.parse"]["cacheable"]
    assert first.served == dict.fromkeys(HOSTS, 1)

    second, lines = run(sandbox, store_dir, tmp_path / "run2")
    assert_answers_each_source_with_the_brokers_provenance(second)
    assert [step.decisions for step in second.steps] == [["use_tools"]] * 3
    assert second.model_calls == {"assistant.ask": 3}  # none for web_fetcher or rss_parser
    for step in second.steps:
        tools = [r for r in step.records if r.depth == 1]
        assert {f"{r.role}.{r.method}" for r in tools} == {"web_fetcher.fetch", "rss_parser.parse"}
        assert all(r.program_source == "persisted" and r.selection_decision == "execute_persisted" for r in tools)
        assert [r["via"] for r in provenance(step)] == ["web_fetcher.fetch"]
    assert second.served == dict.fromkeys(HOSTS, 1)
    assert any("no model call for them" in line for line in lines)


def test_the_cli_runs_twice_on_its_store(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["demo", "--news", "--store", str(tmp_path / "store")]
    first = runner.invoke(main, args)
    assert first.exit_code == 0, first.output
    assert "forged two tools" in first.output and "run `sandforge demo --news` again" in first.output
    second = runner.invoke(main, args)
    assert second.exit_code == 0, second.output
    assert "used the stored tools" in second.output and "persisted program, NO model call" in second.output
    assert "of which for web_fetcher/rss_parser: 0" in second.output


@pytest.mark.parametrize(
    "extra",
    [["--live"], ["--log", "x.jsonl"], ["--fresh", "--store", "somewhere"]],
)
def test_news_refuses_options_it_does_not_take(extra: list[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["demo", "--news", *extra])
    assert result.exit_code == 2 and result.output.startswith("error:"), result.output


def test_store_and_fresh_belong_to_news() -> None:
    result = CliRunner().invoke(main, ["demo", "--fresh"])
    assert result.exit_code == 2 and "--news" in result.output


def test_a_program_under_the_demo_layer_reaches_only_the_three_feeds(sandbox: Sandbox, tmp_path: Path) -> None:
    check_only_the_three_feeds(sandbox, tmp_path)


def check_only_the_three_feeds(sandbox: Sandbox, tmp_path: Path) -> None:
    """Another path on an allowed host, an allowed path on another port, the address itself, a name the layer
    does not resolve: each is the terminal egress_denied (no regeneration), recorded, and no server sees it."""
    with LocalInternet() as net:
        policy = layered_policy([net.write_policy_layer(tmp_path / "layer")])
        google = net.servers["news.google.com"]
        targets = [
            f"http://news.google.com:{google.port}/admin",
            f"http://news.yahoo.com:{google.port}/rss/",
            f"http://127.0.0.1:{google.port}/rss",
            "http://news.example.invalid/rss",
        ]
        programs = [  # the URL is computed: judged at run time, by the broker, whichever client asks
            "return fetch(args[0] + '').text\n",
            "import requests\nreturn requests.get(args[0] + '').text\n",
            "import urllib.request\nreturn urllib.request.urlopen(args[0] + '').read().decode()\n",
        ]
        for index, url in enumerate(targets):
            program = programs[index % len(programs)]
            provider = ScriptedProvider([program, program])
            with Workspace(provider=provider, sandbox=sandbox, policy=policy, log=False) as ws:
                outcome = ws.call("assistant", "ask", url)
            assert outcome.error_type == "egress_denied" and not outcome.retriable, (url, outcome)
            assert provider.calls == 1  # terminal: retrying another way will not help
            (record,) = outcome.metadata["egress"]
            assert record["denied"] and record["status"] is None
        assert sum(server.served + server.refused for server in net.servers.values()) == 0


def test_a_tampered_stored_fetcher_is_never_run_the_next_run_rewrites_it(tmp_path: Path) -> None:
    """Someone edits the stored web_fetcher between runs to send the feed elsewhere: the checksum no longer
    matches, so the next run never executes it; the model writes the tool again and only the feeds are fetched."""
    store_dir = tmp_path / "store"
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=1)) as sandbox:
        run(sandbox, store_dir, tmp_path / "run1")
        (method_file,) = (store_dir / "tools").glob("web_fetcher-*/fetch-*.json")
        data = json.loads(method_file.read_text())
        data["current"]["code"] = "return fetch('http://169.254.169.254/latest/meta-data/').text\n"
        method_file.write_text(json.dumps(data))
        second, _ = run(sandbox, store_dir, tmp_path / "run2")
    assert_answers_each_source_with_the_brokers_provenance(second)
    assert second.model_calls == {"assistant.ask": 3, "web_fetcher.fetch": 1}  # rewritten once, then reused
    first_tool_call = next(r for r in second.steps[0].records if r.role == "web_fetcher")
    assert first_tool_call.selection_reason == "checksum_mismatch" and first_tool_call.program_source == "generated"
    later = [r for step in second.steps[1:] for r in step.records if r.role == "web_fetcher"]
    assert [r.program_source for r in later] == ["persisted", "persisted"]


def test_fresh_forgets_the_demos_tools_and_forges_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDFORGE_STATE_DIR", str(tmp_path / "state"))
    runner = CliRunner()
    assert "forged two tools" in runner.invoke(main, ["demo", "--news"]).output
    assert (tmp_path / "state" / "demo-news" / "tools").is_dir()
    assert "used the stored tools" in runner.invoke(main, ["demo", "--news"]).output
    again = runner.invoke(main, ["demo", "--news", "--fresh"])
    assert again.exit_code == 0 and "is empty: a first run" in again.output and "forged two tools" in again.output


def test_fresh_removes_a_symlinked_tools_directory_without_following_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    store = tmp_path / "demo-news"
    store.mkdir()
    (store / "tools").symlink_to(elsewhere)
    reset_store(store)
    assert not (store / "tools").exists() and (elsewhere / "keep.txt").read_text() == "mine"
    reset_store(store)  # nothing there: nothing to do
