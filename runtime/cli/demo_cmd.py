"""`sandforge demo`: a calculator agent whose methods a model writes, run through the whole lifecycle.

Scripted by default (no network, a few seconds): the first program breaks a guardrail and is regenerated,
a failing attempt is rolled back, state survives across calls, a failure is a typed outcome, a method
delegates to a second tool, and the call log is printed. ``--live`` runs the same calls on Claude, ``--provider
openai`` on any OpenAI-compatible endpoint (the same model flags as ``chat``; the key from the environment).
``--news`` runs the design documents' news scenario instead (brokered egress, forged tools that persist;
``runtime/cli/news_demo.py``).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from sandforge.runtime.agent import Agent, Outcome, Workspace
from sandforge.runtime.agent.calllog import CallLog
from sandforge.runtime.cli.logs_cmd import failure_text, format_record, tree_order
from sandforge.runtime.cli.model_options import model_options, model_settings
from sandforge.runtime.cli.output import emit_json
from sandforge.runtime.errors import UsageError
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.providers.base import GeneratedProgram, GenerationRequest, Provider
from sandforge.sandbox import BACKENDS, ExecutionRequest, Sandbox, SandboxConfig

#: What the scripted "model" answers, in the order the lifecycle asks for programs.
DEMO_PROGRAMS: list[str] = [
    # add(5), attempt 1: imports os, which the guardrail policy forbids
    "import os\n"
    "context['memory'] = context.get('memory', 0) + args[0]\n"
    "context['cwd'] = os.getcwd()\n"
    "return context['memory']\n",
    # add(5), attempt 2: the same without os
    "context['memory'] = context.get('memory', 0) + args[0]\nreturn context['memory']\n",
    # multiply(3), attempt 1: writes context, then raises (KeyError)
    "context['memory'] = context.get('memory', 0) * args[0]\n"
    "context['history'] = context.get('history', []) + ['multiply']\n"
    "settings = {'precision': 2}\n"
    "return round(context['memory'], settings['digits'])\n",
    # multiply(3), attempt 2
    "context['memory'] = context.get('memory', 0) * args[0]\nreturn context['memory']\n",
    # divide(0): a deliberate, typed failure
    "if args[0] == 0:\n"
    "    return Outcome.error('division_by_zero', 'cannot divide by zero', retriable=False)\n"
    "context['memory'] = context.get('memory', 0) / args[0]\n"
    "return context['memory']\n",
    # mean([2, 4, 9]): delegates to another tool
    "stats = delegate('statistician', purpose='descriptive statistics over lists of numbers')\n"
    "result = stats.mean(args[0])\n"
    "if not result.ok:\n"
    "    return Outcome.error(result.error_type, result.error_message, retriable=result.retriable)\n"
    "context['last_mean'] = result.value\n"
    "return result.value\n",
    # statistician.mean([2, 4, 9]), the nested call
    "import statistics\nreturn statistics.mean(args[0])\n",
]


def _j(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _describe(outcome: Outcome) -> list[str]:
    """What happened inside one call, attempt by attempt, from the outcome's metadata."""
    lines = []
    for failure in outcome.metadata.get("attempt_failures", []):
        stage = failure["stage"]
        what = {
            "validation": "rejected by the guardrail before running",
            "execution": "raised while running",
            "outcome_policy": "returned a retriable error",
            "generation": "was not a usable program",
        }.get(stage, stage)
        where = f" ({failure['violation_location']})" if failure.get("violation_location") else ""
        detail = failure_text(failure["error_class"], failure["error_message"])
        lines.append(f"   attempt {failure['attempt_number']}: {what}: {detail}{where}")
        lines.append("              -> rolled back; regenerated with structured feedback")
    attempts = outcome.metadata.get("attempts", 1)
    final = f"ok {_j(outcome.value)}" if outcome.ok else f"error [{outcome.error_type}] {outcome.error_message}"
    lines.append(f"   attempt {attempts}: {final}")
    return lines


class _Counting:
    """Wraps the provider to count the programs it was asked for (nested calls included)."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.name = inner.name
        self.calls = 0

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        self.calls += 1
        return self.inner.generate(request)


def _probe(sandbox: Sandbox, backend: str) -> None:
    outcome = sandbox.execute(ExecutionRequest(code="return 1"))
    if not outcome.ok:
        raise UsageError(
            f"the {backend} backend cannot run here: {outcome.error_message}",
            hint="run `sandforge doctor`, or use --backend subprocess",
        )


def _stderr(message: str = "") -> None:
    click.echo(message, err=True)


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    """One call of the demo under ``--json``: what it returned and how many attempts it took."""
    meta = outcome.metadata
    return {"status": outcome.status, "value": outcome.value, "error_type": outcome.error_type,
            "error_message": outcome.error_message, "attempts": meta.get("attempts"),
            "provider_calls": meta.get("provider_calls"), "call_id": meta.get("call_id")}  # fmt: skip


def run_demo(provider: Provider, backend: str, log_path: Path, *, live: bool, as_json: bool = False,
             source: str | None = None) -> None:  # fmt: skip
    """The calculator walk-through; under ``as_json`` the narrative goes to stderr and one JSON summary to stdout.

    ``source`` names a live model in the narrative (default: Claude)."""
    echo = _stderr if as_json else click.echo
    summary: list[dict[str, Any]] = []
    sandbox = Sandbox(SandboxConfig.from_env(backend=backend, pool_size=1))
    try:
        _probe(sandbox, backend)
        counting = _Counting(provider)
        ws = Workspace(provider=counting, sandbox=sandbox, log=CallLog(log_path))
        calc = Agent.for_role("calculator", workspace=ws)
        started = time.monotonic()
        source = source or ("Claude (live)" if live else "a scripted provider (prepared programs, no network)")
        echo("sandforge demo: a calculator agent whose methods are written by a model on first call")
        echo(f"programs come from {source}; they run in the {backend} sandbox\n")

        echo("1. calc.memory = 0")
        calc.memory = 0
        echo(f"   context write, no model call. context: {_j(calc.context)}\n")

        steps: list[tuple[str, str, list[Any], str]] = [
            ("2", "add", [5], "the first program imports os: the guardrail rejects it before it runs"),
            ("3", "multiply", [3], "the first attempt writes to context, then crashes: its writes are rolled back"),
            ("5", "divide", [0], "a failure is a typed Outcome, never an exception; context is not touched"),
            ("6", "mean", [[2, 4, 9]], "the program delegates to a second tool: a nested call at depth 1"),
        ]
        for number, method, args, why in steps:
            if number == "5":
                echo("4. calc.memory")
                echo(f"   -> {_j(calc.memory)}: read from context, no model call (state kept across calls)\n")
            before = counting.calls
            echo(f"{number}. calc.{method}({', '.join(_j(a) for a in args)})")
            if not live:
                echo(f"   ({why})")
            outcome = getattr(calc, method)(*args)
            summary.append({"step": number, "method": method, "args": args, **outcome_json(outcome)})
            for line in _describe(outcome):
                echo(line)
            used = counting.calls - before
            echo(f"   => {outcome}")
            echo(f"   provider calls: {used}; context now: {_j(calc.context)}")
            if method == "multiply" and not live:
                gone = "history" not in calc.context
                echo(f"   rollback check: 'history', written only by the failed attempt, is in context: {not gone}")
            echo("")
        if "statistician" in ws.tools:
            contract = ws.tools["statistician"]
            echo(f"tool registry: statistician ({contract.purpose}); its context: {_j(ws.context('statistician'))}\n")

        records = ws.log.records
        echo(f"call log: {len(records)} records in {log_path}  (sandforge logs --file {log_path})")
        for record in tree_order(records):
            for line in format_record(record):
                echo("  " + line)
        echo(f"\ndone in {time.monotonic() - started:.2f}s")
        if as_json:
            emit_json({"backend": backend, "calls": summary, "context": calc.context, "call_log": str(log_path),
                       "records": len(records), "seconds": round(time.monotonic() - started, 3)})  # fmt: skip
    finally:
        sandbox.close()


@click.command("demo")
@click.option("--backend", type=click.Choice(BACKENDS), default="subprocess", show_default=True,
              help="Sandbox backend (docker and gvisor need a Docker engine and the sandbox image).")  # fmt: skip
@click.option("--live", is_flag=True, help="Generate programs with a live model (default Claude: ANTHROPIC_API_KEY).")
@click.option("--provider", "provider_kind", type=click.Choice(["anthropic", "openai", "replay"]), default=None,
              help="The live model (implies --live; default: anthropic); replay serves a --record file.")  # fmt: skip
@model_options()
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the call log here (default: a new temporary file).")  # fmt: skip
@click.option("--news", is_flag=True,
              help="The news scenario: an assistant fetches feeds through the egress broker from a local "
              "internet and forges web_fetcher and rss_parser tools that persist (run it twice).")  # fmt: skip
@click.option("--store", "store_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="--news: the ToolStore directory (default: <state dir>/demo-news, kept across runs).")  # fmt: skip
@click.option("--fresh", is_flag=True, help="--news: forget the tools earlier runs stored first.")
@click.option("--json", "as_json", is_flag=True, help="Narrative on stderr, one JSON summary on stdout.")
def command(backend: str, live: bool, provider_kind: str | None, log_path: Path | None, news: bool,
            store_dir: Path | None, fresh: bool, as_json: bool, **model: Any) -> None:  # fmt: skip
    """Run a calculator agent through the lifecycle: guardrail recovery, rollback, state, nested calls.

    With --news: an assistant reads Google News, Yahoo News and NYT feeds served on loopback, through the
    host's egress broker, and forges tools that a second run reuses without a model call."""
    settings = model_settings(model)
    live = live or provider_kind is not None
    if settings and not live:
        raise UsageError("the model options need --live or --provider", hint="sandforge demo --provider openai")
    if news:
        _news(backend, live=live, log_path=log_path, store_dir=store_dir, fresh=fresh, as_json=as_json)
        return
    if store_dir is not None or fresh:
        raise UsageError("--store and --fresh belong to --news", hint="sandforge demo --news --fresh")
    provider = _live_provider(provider_kind or "anthropic", dict(settings)) if live else ScriptedProvider(DEMO_PROGRAMS)
    if log_path is None:
        log_path = Path(tempfile.mkdtemp(prefix="sandforge-demo-")) / "calls.jsonl"
    run_demo(provider, backend, log_path, live=live, as_json=as_json, source=_source(provider_kind, settings))


def _live_provider(kind: str, settings: dict[str, Any]) -> Provider:
    """The program writer ``chat --provider`` would build from the same flags."""
    from sandforge.runtime.providers.factory import ModelSettings, program_provider

    if kind == "anthropic" and not settings.get("api_key_env") and not os.environ.get("ANTHROPIC_API_KEY"):
        raise UsageError("--live needs ANTHROPIC_API_KEY", hint="without --live the demo uses scripted programs")
    if kind == "replay" and "recording" not in settings:
        raise UsageError("--provider replay needs --replay FILE", hint="record one with --record FILE")
    replay = settings.pop("recording", None)
    try:
        return program_provider(kind, ModelSettings(**settings), replay=replay)
    except ValueError as exc:  # pydantic's: a setting out of range
        raise UsageError(f"invalid model options: {str(exc).splitlines()[-1].strip()}") from None


def _source(kind: str | None, settings: dict[str, Any]) -> str | None:
    """Where the programs come from, for the narrative (never the key: only where it was sent)."""
    if kind == "openai":
        where = f" at {settings['base_url']}" if settings.get("base_url") else ""
        return f"an OpenAI-compatible model{where} (live)"
    if kind == "replay":
        return f"the recording {settings['recording']} (replayed, no network)"
    return None


def _news(backend: str, *, live: bool, log_path: Path | None, store_dir: Path | None, fresh: bool,
          as_json: bool = False) -> None:  # fmt: skip
    from sandforge.runtime.cli.news_demo import default_store_dir, reset_store, run_news_demo

    if live:
        raise UsageError("--news runs the scripted model only", hint="sandforge demo --news")
    if log_path is not None:
        raise UsageError("--news writes its call log in its own directory (printed at the end)")
    if fresh and store_dir is not None:
        raise UsageError("--fresh resets only the demo's own store", hint="remove the --store directory yourself")
    store = store_dir if store_dir is not None else default_store_dir()
    if fresh:
        reset_store(store)
    sandbox = Sandbox(SandboxConfig.from_env(backend=backend, pool_size=1))
    try:
        _probe(sandbox, backend)
        run = run_news_demo(sandbox, store, echo=_stderr if as_json else click.echo)
        if as_json:
            questions = [{"question": s.question, **outcome_json(s.outcome)} for s in run.steps]
            emit_json({"backend": backend, "store": str(store), "model_calls": run.model_calls, "served": run.served,
                       "tools": run.tools, "questions": questions})  # fmt: skip
    finally:
        sandbox.close()
