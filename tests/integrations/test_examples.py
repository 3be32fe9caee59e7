"""Every example in examples/ runs as a user would run it (a fresh interpreter, its own state directory) and
says what it promises; a second run on the same directory reuses the stored tool (no program is written)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandforge.runtime.store import ToolStore

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: example -> a line its output must hold
PROMISES = {
    "smolagents_agent.py": "final answer: 10",
    "langchain_agent.py": "ai: 10, then 42",
    "openai_agents_agent.py": "final output: 10, then 42",
    "pydantic_ai_agent.py": "output: 10, then 42",
}


def test_every_example_is_checked() -> None:
    assert {p.name for p in EXAMPLES.glob("*.py")} == set(PROMISES)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROMISES))
def test_example_runs_and_its_second_run_reuses_the_stored_tool(name: str, tmp_path: Path) -> None:
    promise = PROMISES[name]
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES.parent)}
    for _ in range(2):
        done = subprocess.run([sys.executable, str(EXAMPLES / name), str(tmp_path)], capture_output=True, text=True,
                              env=env, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert promise in done.stdout.splitlines(), done.stdout[-2000:]
    (row,) = ToolStore(tmp_path).health_report(["calculator"])
    assert row.generation == 1  # written once, by the first run; the second run reused it


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def test_the_snippets_of_docs_frameworks_are_in_the_examples() -> None:
    """docs/frameworks.md shows code the examples run (each snippet: consecutive lines of one example)."""
    doc = (EXAMPLES.parent / "docs" / "frameworks.md").read_text()
    snippets = [block.split("```", 1)[0] for block in doc.split("```python\n")[1:]]
    examples = {p.name: _lines(p.read_text()) for p in EXAMPLES.glob("*.py")}
    assert len(snippets) >= 5
    for snippet in snippets:
        want = _lines(snippet)
        assert any(lines[i : i + len(want)] == want for lines in examples.values() for i in range(len(lines))), snippet
