"""Agent calls with files (issue 41): inputs to every attempt, the outputs of the attempt that succeeded on the
Outcome, nothing of a failed attempt, nothing passed down to nested calls (docs/files.md, "Agent calls")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandforge import AsyncAgent
from sandforge.runtime.agent import Agent, Outcome
from sandforge.runtime.providers import ScriptedProvider
from sandforge.runtime.providers.prompt import render_prompt
from sandforge.sandbox import SandboxConfig
from tests.agent.conftest import MakeWorkspace, records, top

CSV = b"city,temp\nOslo,3\nLima,19\n"

#: writes an output, then fails: the execution-repair lane runs the next program
HALF_WRITTEN = "with open('outputs/partial.csv', 'w') as f:\n    f.write('half')\nraise ValueError('boom')\n"
TRANSFORM = (
    "import csv\n"
    "with open('inputs/data.csv') as f:\n"
    "    rows = list(csv.DictReader(f))\n"
    "with open('outputs/hot.csv', 'w', newline='') as f:\n"
    "    csv.writer(f).writerows([[r['city'].upper(), r['temp']] for r in rows])\n"
    "return len(rows)\n"
)


def test_a_call_gets_the_outputs_of_the_attempt_that_succeeded_and_nothing_of_the_failed_one(
    make_ws: MakeWorkspace,
) -> None:
    ws, provider = make_ws([HALF_WRITTEN, TRANSFORM])
    out = ws.call_with_files("weather", "hot", {"data.csv": CSV})
    assert out.ok and out.value == 2
    assert out.files == {"hot.csv": b"OSLO,3\r\nLIMA,19\r\n"}  # partial.csv of the failed attempt: never
    assert [r.input_files for r in provider.requests] == [{"data.csv": len(CSV)}] * 2  # the same inputs each time
    prompt = render_prompt(provider.requests[0]).user
    assert "inputs/NAME" in prompt and "data.csv" in prompt
    rec = top(ws)
    assert rec.attempts == 2
    assert [(f.name, f.size) for f in rec.input_files or []] == [("data.csv", len(CSV))]
    assert [f.name for f in rec.output_files or []] == ["hot.csv"]
    assert "files" not in out.model_dump() and "OSLO" not in out.model_dump_json()  # contents never in a dump


def test_a_failed_call_returns_no_file(make_ws: MakeWorkspace, tmp_path: Path) -> None:
    ws, _ = make_ws([HALF_WRITTEN], execution_repair_budget=0)
    (tmp_path / "data.csv").write_bytes(CSV)
    out = Agent.for_role("weather", workspace=ws).call_with_files("hot", {"data.csv": tmp_path / "data.csv"})
    assert not out.ok and out.files == {}
    assert top(ws).output_files is None and top(ws).input_files is not None


def test_a_nested_call_sees_none_of_its_callers_files_and_returns_none_to_it(make_ws: MakeWorkspace) -> None:
    caller = "r = tool('helper').peek()\nreturn [r.ok, r.value, open('inputs/data.csv').read()]\n"
    helper = (
        "try:\n"
        "    open('inputs/data.csv').read()\n"
        "    seen = True\n"
        "except FileNotFoundError:\n"
        "    seen = False\n"
        "with open('outputs/child.txt', 'w') as f:\n"
        "    f.write('x')\n"
        "return seen\n"
    )
    ws, _ = make_ws([caller, helper])
    out = ws.call_with_files("boss", "run", {"data.csv": CSV})
    assert out.value == [True, False, CSV.decode()] and out.files == {}
    nested = [r for r in records(ws) if r.depth == 1][-1]
    assert nested.input_files is None and nested.output_files is None


@pytest.mark.parametrize(
    ("files", "says"),
    [({"../x": b"1"}, "string_pattern_mismatch"), ({f"f{i}": b"" for i in range(65)}, "max_files")],
)
def test_bad_input_files_are_refused_before_anything_runs(
    make_ws: MakeWorkspace, files: dict[str, bytes], says: str
) -> None:
    ws, provider = make_ws(["return 1\n"])
    with pytest.raises(ValidationError, match=says):
        ws.call_with_files("weather", "hot", files)
    assert provider.requests == [] and records(ws) == []


def test_an_async_agent_call_with_files_returns_the_outputs(sandbox_backend: str) -> None:
    async def main() -> Outcome:
        config = SandboxConfig(backend=sandbox_backend, pool_size=0)
        async with AsyncAgent.for_role(
            "weather", provider=ScriptedProvider([TRANSFORM]), log=False, sandbox=config
        ) as agent:
            return await agent.call_with_files("hot", {"data.csv": CSV})

    out = asyncio.run(main())
    assert out.value == 2 and list(out.files) == ["hot.csv"]
