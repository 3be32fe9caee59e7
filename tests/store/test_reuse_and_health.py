"""Reuse and health of stored programs (issue 16, points 1, 3 and 4), through the public API on each backend.

- argument-blind code (``return 3`` for ``sqrt(9)``) and code with a small argument value baked in are
  stored for observability but never reused; ``sandforge tools show`` says why;
- a stored program whose result misses the deliverable is a failure (adaptive), never a success;
- a stored program that keeps answering ``Outcome.error`` degrades and is repaired, then regenerated once
  the repair budget is spent; the failure class is the same in the outcome, the call log and the store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.agent import Agent, Budgets, CallLog, CallRecord, Workspace
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.store import CacheabilityReason, SelectionPolicy, ToolStore, assess_cacheability
from sandforge.sandbox import Sandbox


class Env:
    """Workspaces on one store directory, on one backend; each ``session`` is a new Workspace and ToolStore."""

    def __init__(self, root: Path, sandbox: Sandbox) -> None:
        self.state_dir = root / "state"
        self.sandbox = sandbox
        self.workspaces: list[Workspace] = []

    def session(self, programs: list[str], policy: SelectionPolicy | None = None) -> tuple[Workspace, ScriptedProvider]:
        provider = ScriptedProvider(programs)
        store = ToolStore(self.state_dir, **({"policy": policy} if policy else {}))
        ws = Workspace(provider=provider, sandbox=self.sandbox, store=store, log=CallLog(None), budgets=Budgets())
        self.workspaces.append(ws)
        return ws, provider

    def store(self) -> ToolStore:
        return ToolStore(self.state_dir)

    def close(self) -> None:
        for ws in self.workspaces:
            ws.close()


@pytest.fixture
def env(tmp_path: Path, sandbox: Sandbox) -> Iterator[Env]:
    e = Env(tmp_path, sandbox)
    yield e
    e.close()


def top(ws: Workspace) -> CallRecord:
    return [r for r in ws.log.records if r.depth == 0][-1]


def tools_show(env: Env, role: str, method: str) -> str:
    from sandforge.runtime.cli.tools_cmd import command

    result = CliRunner().invoke(command, ["--store", str(env.state_dir), "show", role, method], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


# --- point 1: argument-blind and input-baked code ----------------------------------------------------------


def test_argument_blind_code_is_stored_but_never_reused(env: Env) -> None:
    ws, _ = env.session(["return 3\n", "return args[0] ** 0.5\n"])
    helper = Agent.for_role("math_helper", workspace=ws)
    assert helper.sqrt(9).value == 3
    art = env.store().lookup("math_helper", "sqrt").artifact
    assert art is not None and art.cacheable is False and art.input_sensitive
    assert (art.cacheability_reason or "").startswith("arg_ignored_code")
    assert top(ws).cacheability_reason == art.cacheability_reason
    shown = tools_show(env, "math_helper", "sqrt")
    assert "cacheability: arg_ignored_code" in shown and "input sensitive: yes" in shown

    ws2, provider2 = env.session(["return args[0] ** 0.5\n"])
    assert Agent.for_role("math_helper", workspace=ws2).sqrt(16).value == 4.0  # not the stored 3
    assert provider2.calls == 1 and top(ws2).program_source == "generated"
    assert top(ws2).selection_reason == "non_cacheable"
    art2 = env.store().lookup("math_helper", "sqrt").artifact
    assert art2 is not None and art2.cacheable and art2.generation == 2
    ws3, provider3 = env.session([])
    assert Agent.for_role("math_helper", workspace=ws3).sqrt(25).value == 5.0 and provider3.calls == 0


def test_a_small_argument_value_baked_in_is_input_baked(env: Env) -> None:
    baked = "x = args[0]\nreturn 21 if x == 7 else x * 3\n"
    ws, _ = env.session([baked, "return args[0] * 3\n"])
    assert Agent.for_role("calc", workspace=ws).triple(7).value == 21
    art = env.store().lookup("calc", "triple").artifact
    assert art is not None and not art.cacheable and (art.cacheability_reason or "").startswith("input_baked")
    assert "exact: 7 == args[0]" in (art.cacheability_reason or "")
    assert "input_baked" in tools_show(env, "calc", "triple")

    # a literal that is also in the method's contract is the tool's own, not the call's
    ws2, _ = env.session(["return [n for n in range(args[0]) if n < 20]\n"])
    ws2.register_tool("pager", purpose="Page numbers", deliverable={"type": "array", "max_items": 20})
    assert Agent.for_role("pager", workspace=ws2).pages(20).ok
    page = env.store().lookup("pager", "pages").artifact
    assert page is not None and page.cacheable and (page.cacheability_reason or "").startswith("delegated_contract")


# --- point 3: a stored program that misses its deliverable ------------------------------------------------


def test_a_stored_program_missing_its_deliverable_fails_adaptive_and_is_repaired(env: Env) -> None:
    words = "return [w for w in args[0].split() if len(w) > 3]\n"
    ws, _ = env.session([words, "return args[0].split()\n"])
    ws.register_tool("lister", purpose="Split into words", deliverable={"type": "array", "min_items": 1})
    lister = Agent.for_role("lister", workspace=ws)
    assert lister.words("hello world").value == ["hello", "world"]
    out = lister.words("a b")  # the stored program answers [], the deliverable wants an item
    assert out.ok and out.value == ["a", "b"]
    rec = top(ws)
    assert rec.program_source == "repaired" and rec.attempt_failures[0].error_type == "contract_violation"
    assert rec.store_actions == ["record_failure:adaptive@1", "record_pattern", "record_repair@2"]
    history = env.store().history("lister", "words")
    assert [a.generation for a in history] == [2, 1]
    assert history[1].success_count == 1 and history[1].adaptive_failure_count == 1  # never counted as success


# --- point 4: repeated adaptive failures degrade health -----------------------------------------------------

PARSER = (
    "if not args[0].startswith('<'):\n"
    "    return Outcome.error('parse_failed', 'not markup', retriable=False)\n"
    "return args[0]\n"
)


def test_repeated_deliberate_failures_degrade_and_are_repaired_with_one_failure_class(env: Env) -> None:
    ws, provider = env.session([PARSER, "return args[0].strip('<>')\n"])
    parser = Agent.for_role("parser", workspace=ws)
    assert parser.parse("<a>").ok
    for text in ("x", "y", "z"):
        out = parser.parse(text)
        assert out.error_type == "parse_failed" and not out.retriable
        rec = top(ws)
        assert out.metadata["failure_class"] == rec.failure_class == "adaptive"
        assert rec.store_actions == ["record_failure:adaptive@1"]
    art = env.store().lookup("parser", "parse").artifact
    assert art is not None and art.last_failure_class == "adaptive" and art.recent_adaptive.count(True) == 3
    assert provider.calls == 1  # three deliberate answers, no regeneration yet

    out = parser.parse("w")  # 3 of the last 5 answers were adaptive failures: degraded -> repair
    assert out.ok and out.value == "w"
    rec = top(ws)
    assert rec.selection_decision == "repair" and rec.selection_reason == "degraded"
    repair = provider.requests[-1].repair
    assert repair is not None and repair.prior_code == PARSER and repair.failure_class == "adaptive"
    assert "parse_failed" in (repair.error_message or "")
    repaired = env.store().lookup("parser", "parse").artifact
    assert repaired is not None and repaired.generation == 2 and repaired.repair_count_since_regen == 1


def test_degraded_by_adaptive_failures_with_the_repair_budget_spent_regenerates(env: Env) -> None:
    no_repairs = SelectionPolicy(max_repairs_before_regen=0)
    ws, provider = env.session([PARSER, "return args[0]\n"], policy=no_repairs)
    parser = Agent.for_role("parser", workspace=ws)
    assert parser.parse("<a>").ok
    for text in ("x", "y", "z"):
        assert parser.parse(text).error_type == "parse_failed"
    assert parser.parse("v").value == "v"
    rec = top(ws)
    assert rec.selection_reason == "repair_budget_exhausted" and rec.program_source == "generated"
    assert provider.requests[-1].repair is None
    assert "record_regeneration@2" in rec.store_actions


# --- point 2 and 3 with a store: structured contracts persist and are enforced in the next session ----------


def test_a_structured_contract_persists_and_its_deliverable_is_enforced_in_a_new_session(env: Env) -> None:
    boss = (
        "f = delegate('page_parser', purpose='Title of a page',\n"
        "             deliverable={'type': 'object', 'required': ['title']}, acceptance=['non-empty title'],\n"
        "             failure_policy={'retries': 1})\n"
        "return f.parse(args[0]).value\n"
    )
    parse = "return {'title': args[0]} if args[0] else {}\n"
    ws, _ = env.session([boss, parse])
    assert Agent.for_role("researcher", workspace=ws).read("Home").value == {"title": "Home"}
    entry = env.store().get_tool("page_parser")
    assert entry is not None and entry.deliverable == {"type": "object", "required": ["title"]}
    assert entry.acceptance == ["non-empty title"] and entry.failure_policy == {"retries": 1}

    use = "r = tool('page_parser').parse(args[0])\nreturn [r.ok, r.value, r.error_type]\n"
    ws2, provider2 = env.session([use, "return {'title': args[0] or 'untitled'}\n"])
    out = Agent.for_role("analyst", workspace=ws2).read("")
    assert out.value == [True, {"title": "untitled"}, None]
    nested = [r for r in ws2.log.records if r.depth == 1][-1]
    assert nested.program_source == "repaired"
    assert nested.attempt_failures[0].error_type == "contract_violation"
    assert "'title' is a required property" in nested.attempt_failures[0].error_message
    assert provider2.requests[1].contract is not None  # the persisted contract reached the repair prompt


# --- the AST rules, directly -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reads"),
    [
        ("return 3", False),
        ("n = args[0]\nreturn 3", False),  # derived, never used
        ("n = args[0]\nm = n * 2\nreturn 3", False),
        ("a, b = args\nreturn 3", False),
        ("total = 0\ntotal += args[0]\nreturn 1", False),
        ("return args[0] ** 0.5", True),
        ("n = args[0]\nreturn n", True),
        ("a, (b, c) = args\nreturn c", True),
        ("opts = dict(kwargs)\nreturn opts.get('x')", True),
        ("if args:\n    return 1\nreturn 2", True),  # control flow depends on them
        ("context['last'] = args[0]\nreturn None", True),  # written into the state
        ("for a in args:\n    pass\nreturn 1", True),
        ("def f():\n    return kwargs['q']\nreturn f()", True),
        ("return tool('x').y(*args)", True),
    ],
)
def test_what_counts_as_reading_the_arguments(code: str, reads: bool) -> None:
    verdict = assess_cacheability("m", code, [4], {"q": "query"})
    assert (verdict.reason is not CacheabilityReason.ARG_IGNORED_CODE) is reads, verdict
    assert assess_cacheability("m", code, [], {}).reason is not CacheabilityReason.ARG_IGNORED_CODE  # no arguments


@pytest.mark.parametrize(
    ("code", "args", "contract", "baked"),
    [
        ("x = args[0]\nreturn x * 3 if x != 7 else 21", [7], None, True),  # small number, exact
        ("return {'q': args[0]}", ["q"], None, True),  # one character, exact
        ("return args[0] * 2.5", [2.5], None, True),
        ("return args[0][1] + 1", [[1, 2]], None, False),  # structural 1, index 1
        ("return args[0][-3:]", [3], None, False),  # slice bound
        ("return args[0] + 0", [0], None, False),
        ("return [n for n in range(args[0]) if n < 20]", [20], {"deliverable": {"max_items": 20}}, False),
        ("return args[0] == 'monthly'", ["monthly"], {"purpose": "Report monthly totals"}, False),
        ("return args[0] == 'monthly'", ["monthly"], {"purpose": "Report totals"}, True),
    ],
)
def test_exact_literals_of_any_size_with_the_documented_exceptions(
    code: str, args: list[object], contract: object, baked: bool
) -> None:
    verdict = assess_cacheability("m", code, args, {}, contract=contract)
    assert (verdict.reason is CacheabilityReason.INPUT_BAKED) is baked, verdict
