"""`sandforge demo --news`: the design documents' scenario, for real and offline (issue 18).

An assistant is asked for the latest headlines of Google News, Yahoo News and The New York Times in turn.
The feeds are served by the demo's local internet (`news_feeds`), reached only through the host's egress
broker under the demo's own policy layer. The first two answers are one-off programs (generated, fetched
through the broker, parsed, returned with the broker's provenance records) and are never reused for another
source (ADR 0013: ``ask`` is a dynamic method); pattern memory sees ``http_fetch`` and ``rss_parse`` repeat,
and on the third request the (scripted) model forges ``web_fetcher`` and ``rss_parser`` with ``delegate``.
They persist in the ToolStore: a second run of the demo on the same store calls them with no model call.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandforge.runtime.agent import Agent, Outcome, Workspace
from sandforge.runtime.agent.calllog import CallLog, CallRecord
from sandforge.runtime.cli.logs_cmd import format_record, tree_order
from sandforge.runtime.cli.news_feeds import LOOPBACK, LOOPBACK_RANGE, LocalInternet
from sandforge.runtime.guardrails.loader import layered_policy
from sandforge.runtime.providers.scripted_news import FETCHER, PARSER, NewsModel
from sandforge.runtime.state_dir import resolve_state_dir
from sandforge.runtime.store import ToolStore
from sandforge.sandbox import Sandbox

Echo = Callable[[str], None]

#: The questions, in the order the scenario asks them.
QUESTIONS: tuple[str, ...] = (
    "What are the latest headlines on Google News?",
    "And the latest from Yahoo News?",
    "What does The New York Times lead with right now?",
)
FORGED_TOOLS: tuple[tuple[str, str], ...] = ((FETCHER, "fetch"), (PARSER, "parse"))
SHOWN_HEADLINES = 3

_DECISIONS = {
    "inline:requests": "the model wrote a one-off program: requests.get + xml.etree",
    "inline:urllib": "the model wrote a one-off program: urllib.request.urlopen + xml.etree",
    "inline:fetch": "the model wrote a one-off program: fetch() + xml.etree",
    "forge": "the model forged two tools with delegate(...): web_fetcher and rss_parser, then used them",
    "use_tools": "the model used the stored tools: tool('web_fetcher').fetch, tool('rss_parser').parse",
}


_SELECTION = {
    "missing": ": nothing stored for assistant.ask yet",
    "dynamic_method": ": the stored ask program answered another question; ask is never reused (ADR 0013)",
    "non_cacheable": ": the stored ask program is not reusable (ADR 0013)",
}


def default_store_dir() -> Path:
    """The demo's own store, beside (never inside) the user's: ``<state dir>/demo-news``."""
    return resolve_state_dir() / "demo-news"


def reset_store(store_dir: Path) -> None:
    """Forget what earlier runs stored (the ``tools`` directory of the demo's store only; a symlink there is
    removed, never followed)."""
    tools = store_dir / "tools"
    if tools.is_symlink() or tools.is_file():
        tools.unlink()
    elif tools.is_dir():
        shutil.rmtree(tools)


@dataclass
class Step:
    """One question: its outcome, the model's decisions and the call-log records of its whole trace."""

    question: str
    outcome: Outcome
    decisions: list[str]
    records: list[CallRecord]


@dataclass
class NewsRun:
    """What one run of the demo did, for the tests and the closing summary."""

    steps: list[Step] = field(default_factory=list)
    model_calls: dict[str, int] = field(default_factory=dict)  # "role.method" -> provider calls
    served: dict[str, int] = field(default_factory=dict)  # host -> feed requests its server answered
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)  # "role.method" -> stored artifact facts

    def calls_for(self, role: str) -> int:
        return sum(n for where, n in self.model_calls.items() if where.startswith(f"{role}."))


def _j(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def egress_records(outcome: Outcome) -> list[dict[str, Any]]:
    """The broker's provenance of an answer, from the outcome alone: its own execution's requests
    (``metadata["egress"]``), then those of its nested calls (``metadata["egress_nested"]``, each entry naming
    the call), so data a tool fetched still comes with the host's sources."""
    found = [r for r in _dicts(outcome.metadata.get("egress"))]
    for entry in _dicts(outcome.metadata.get("egress_nested")):
        where = f"{entry.get('role')}.{entry.get('method')}"
        found += [{**r, "via": where} for r in _dicts(entry.get("egress"))]
    return found


def _dicts(value: object) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def provenance_line(record: dict[str, Any]) -> str:
    """One broker record as a line: method, URL, status, bytes, time, and the rule (or why it failed)."""
    what = f"{record.get('method', 'GET')} {record.get('url')}"
    if record.get("via"):
        what = f"({record['via']}) {what}"
    if record.get("final_url") and record["final_url"] != record.get("url"):
        what += f" (final {record['final_url']})"
    if record.get("status") is not None:
        what += f" -> {record['status']}, {record.get('bytes', 0)} bytes, {record.get('duration_ms', 0):.0f} ms"
    if record.get("rule"):
        what += f", allowed by {record['rule']}"
    if record.get("denied") or record.get("error"):
        what += f", FAILED [{record.get('error')}]: {record.get('denied')}"
    return what


class NewsDemo:
    """One run: the local internet, the policy layer, the store, the assistant; prints as it goes."""

    def __init__(self, *, sandbox: Sandbox, store_dir: Path, work_dir: Path, echo: Echo) -> None:
        self.sandbox = sandbox
        self.store_dir = store_dir
        self.work_dir = work_dir
        self.echo = echo
        self.run = NewsRun()

    def start(self, net: LocalInternet) -> tuple[Workspace, NewsModel, ToolStore]:
        layer = net.write_policy_layer(self.work_dir / "policy")
        model = NewsModel(net.feeds())
        store = ToolStore(self.store_dir)
        ws = Workspace(provider=model, sandbox=self.sandbox, policy=layered_policy([layer]), store=store,
                       log=CallLog(self.work_dir / "calls.jsonl"))  # fmt: skip
        self._introduce(net, layer, store)
        return ws, model, store

    def _introduce(self, net: LocalInternet, layer: Path, store: ToolStore) -> None:
        echo = self.echo
        echo("sandforge demo --news: an assistant reads the news through tools it forges itself")
        echo(f"the local internet: {len(net.servers)} loopback HTTP servers (nothing leaves this machine)")
        for server in net.servers.values():
            echo(f"  {server.site.host:<16} -> {LOOPBACK}:{server.port}   feed {server.feed_url}")
        echo(f"policy: the default + the demo's layer {layer / 'policy.yaml'}")
        echo(f"  grant http_fetch; allow exactly these 3 feeds (GET); resolve the 3 names to {LOOPBACK};")
        echo(f"  allow_ranges [{LOOPBACK_RANGE}] in this layer only (else the platform deny list refuses loopback)")
        stored = [f"{r}.{m}" for r, m in FORGED_TOOLS if store.lookup(r, m).file is not None]
        state = f"holds {', '.join(stored)} from an earlier run" if stored else "is empty: a first run"
        echo(f"tool store: {store.tools_dir} ({state})")
        echo(f"programs come from a scripted model (no network, no API key); they run in the "
             f"{self.sandbox.config.backend} sandbox\n")  # fmt: skip

    def ask(self, ws: Workspace, model: NewsModel, number: int, question: str) -> Step:
        assistant = Agent.for_role("assistant", workspace=ws)
        seen_requests, seen_records = model.calls, len(ws.log.records)
        outcome = assistant.ask(question)
        step = Step(question, outcome, model.decisions[seen_requests:], list(ws.log.records[seen_records:]))
        for request in model.requests[seen_requests:]:
            where = f"{request.role}.{request.method}"
            self.run.model_calls[where] = self.run.model_calls.get(where, 0) + 1
        self.run.steps.append(step)
        self._show(number, step, model, seen_requests)
        return step

    def _show(self, number: int, step: Step, model: NewsModel, first_request: int) -> None:
        echo = self.echo
        echo(f"{number}. assistant.ask({_j(step.question)})")
        top = next((r for r in step.records if r.depth == 0), None)
        if top is not None and top.selection_decision:
            why = _SELECTION.get(top.selection_reason or "", "")
            echo(f"   store: {top.selection_decision} ({top.selection_reason}){why}")
        prompt = model.requests[first_request].recent_patterns if model.requests[first_request:] else None
        if prompt:
            echo("   the model's prompt carried the runtime's pattern memory:")
            for line in prompt.splitlines():
                echo(f"     {line}")
        for decision in step.decisions:
            if decision in _DECISIONS:
                echo(f"   {_DECISIONS[decision]}")
        for failure in step.outcome.metadata.get("attempt_failures") or []:
            if isinstance(failure, dict):
                echo(f"   attempt {failure.get('attempt_number')} failed at {failure.get('stage')}: "
                     f"{failure.get('error_message')} -> rolled back, regenerated with feedback")  # fmt: skip
        self._show_nested(step)
        self._show_answer(step)

    def _show_nested(self, step: Step) -> None:
        for record in step.records:
            if record.depth == 0:
                continue
            how = (
                "persisted program, NO model call"
                if record.program_source == "persisted"
                else f"{record.program_source} program (model call), stored: cacheable={record.cacheable}"
            )
            status = "ok" if record.status == "ok" else f"error [{record.error_type}]"
            self.echo(f"   nested {record.role}.{record.method}: {how}; {status}")

    def _show_answer(self, step: Step) -> None:
        echo, outcome = self.echo, step.outcome
        if not outcome.ok:
            echo(f"   => error [{outcome.error_type}] {outcome.error_message}\n")
            return
        value = outcome.value if isinstance(outcome.value, dict) else {}
        listed = value.get("headlines")
        headlines = [h for h in listed if isinstance(h, dict)] if isinstance(listed, list) else []
        echo(f"   => {len(headlines)} headlines from {value.get('source')}:")
        for item in headlines[:SHOWN_HEADLINES]:
            echo(f"      - {item.get('title')}  <{item.get('link')}>")
        records = egress_records(outcome)
        echo("   provenance (recorded by the host's broker, not by the program):")
        for record in records or [{"url": "(no broker records: the program did not fetch)"}]:
            echo(f"      {provenance_line(record)}")
        echo("")

    def patterns(self, store: ToolStore) -> None:
        summary = store.patterns.recent_patterns_for("assistant", "ask")
        counts = ", ".join(f"{c.label} {c.count}/{summary.calls}" for c in summary.counts) or "nothing yet"
        signal = store.promotion_signal("assistant", "ask")
        tail = f" -> promotion candidates: {', '.join(signal.capabilities)}" if signal.detected else ""
        self.echo(f"   pattern memory (assistant.ask, last {summary.window}): {counts}{tail}\n")

    def summarize(self, ws: Workspace, net: LocalInternet, store: ToolStore) -> None:
        echo = self.echo
        self.run.served = {host: server.served for host, server in net.servers.items()}
        for role, method in FORGED_TOOLS:
            history = store.history(role, method)
            if history:
                current = history[0]
                self.run.tools[f"{role}.{method}"] = {
                    "generation": current.generation, "cacheable": current.cacheable,
                    "success_count": current.success_count,
                }  # fmt: skip
        echo("tool store now:")
        for where, facts in self.run.tools.items():
            echo(f"  {where}: generation {facts['generation']}, cacheable={facts['cacheable']}, "
                 f"{facts['success_count']} successes")  # fmt: skip
        calls = ", ".join(f"{where} x{n}" for where, n in self.run.model_calls.items())
        echo(f"model calls this run: {sum(self.run.model_calls.values())} ({calls})")
        forged = sum(self.run.calls_for(role) for role, _ in FORGED_TOOLS)
        echo(f"  of which for web_fetcher/rss_parser: {forged}")
        echo(f"feed requests the servers answered: {_j(self.run.served)}")
        echo(f"call log: {len(ws.log.records)} records in {ws.log.path}  (sandforge logs --file {ws.log.path})")
        for record in tree_order(ws.log.records):
            for line in format_record(record):
                echo("  " + line)


def run_news_demo(sandbox: Sandbox, store_dir: Path, *, echo: Echo, work_dir: Path | None = None) -> NewsRun:
    """Run the scenario once on ``sandbox`` with the ToolStore at ``store_dir``; returns what happened."""
    work = work_dir or Path(tempfile.mkdtemp(prefix="sandforge-demo-news-"))
    demo = NewsDemo(sandbox=sandbox, store_dir=store_dir, work_dir=work, echo=echo)
    started = time.monotonic()
    with LocalInternet() as net:
        ws, model, store = demo.start(net)
        try:
            for number, question in enumerate(QUESTIONS, start=1):
                demo.ask(ws, model, number, question)
                demo.patterns(store)
        finally:
            ws.close()  # writes the successes still queued (write-behind), so the summary reads them
        demo.summarize(ws, net, store)
    if demo.run.calls_for(FETCHER) == 0 and FETCHER in {k.split(".")[0] for k in demo.run.tools}:
        echo("web_fetcher and rss_parser came from the store: no model call for them")
    else:
        echo("run `sandforge demo --news` again: it reuses web_fetcher and rss_parser from the store, "
             "with no model call for them")  # fmt: skip
    echo(f"done in {time.monotonic() - started:.2f}s")
    return demo.run
