"""A ceiling on complexity: no rule's count of offenders grows, and no function grows past 80 lines.

pyproject.toml enables ruff's C901 / PLR0912 / PLR0915 / PLR0913 and lets the files that held an offender when
they went in ignore them; this caps the totals, so such a file cannot gain a second offender. Lower the
numbers here when a function is split (a count below its ceiling fails too, so the ceiling follows).
"""

from __future__ import annotations

import ast
import collections
import json
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINTED = ["runtime", "sandbox", "policies", "images", "bench", "tests"]  # as `make lint`; sandforge/ only links
RULES = ["C901", "PLR0912", "PLR0913", "PLR0915"]

#: Offenders per rule when the rules went in (main at f430523), less those split since: select_artifact,
#: part of _resolve, bench's main, cacheability's _fold, the policy loader's _policy_files, `sandforge logs`,
#: the call loop, the egress broker's, the exchange's nested-frame handling (one branch on declare/call), the
#: inside's lock_down and restricting policy, and the exchange's loop (one poll's serving is its own step: issue 24),
#: and the inside's inner_wall_refusal (string annotations are no longer refused: issue 38), and the inside's
#: _context_texts (the passed descriptors' final check moved to read_execute: issue 41's input memfds).
CEILING = {"C901": 16, "PLR0912": 3, "PLR0913": 9, "PLR0915": 3}

MAX_FUNCTION_LINES = 80
#: Functions longer than MAX_FUNCTION_LINES: (path pattern, qualified name) -> lines. Empty since issue 17 split
#: the last ones (the call loop, select_artifact, _resolve, the inside's lock_down and its policy class).
LONG_FUNCTIONS: dict[tuple[str, str], int] = {}


def _ruff_counts(*extra: str) -> collections.Counter[str]:
    """Offenders per rule, with the per-file ignores of pyproject.toml switched off."""
    command = [sys.executable, "-m", "ruff", "check", *LINTED, "--select", ",".join(RULES), "--output-format", "json"]
    command += ["--config", "lint.per-file-ignores = {}", "--exit-zero", *extra]
    found = json.loads(subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True).stdout)
    return collections.Counter(item["code"] for item in found)


def test_complexity_stays_at_its_ceiling() -> None:
    counts = _ruff_counts()
    assert {rule: counts[rule] for rule in RULES} == CEILING, "lower CEILING when an offender is split"


def test_the_count_sees_a_new_offender(tmp_path: Path) -> None:
    """The counting is real: a function past every limit adds one to each rule."""
    (tmp_path / "worse.py").write_text(
        "def worse(a, b, c, d, e, f, g, h, i):\n"
        + "".join(f"    if a == {n}:\n        b = {n}\n" for n in range(30))
        + "".join(f"    c = {n}\n" for n in range(30))
    )
    before, after = _ruff_counts(), _ruff_counts(str(tmp_path))
    assert {rule: after[rule] - before[rule] for rule in RULES} == dict.fromkeys(RULES, 1)


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out.append((prefix + node.name, (node.end_lineno or node.lineno) - node.lineno + 1))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out += _functions(node, f"{prefix}{node.name}.")
    return out


def long_functions(root: Path) -> dict[tuple[str, str], int]:
    """Functions over MAX_FUNCTION_LINES in the linted folders under ``root``: (path, qualified name) -> lines."""
    found = {}
    for folder in LINTED:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative.startswith("tests/compat/programs/"):
                continue  # program bodies as models write them (a top-level return)
            for name, lines in _functions(ast.parse(path.read_text(), relative)):
                if lines > MAX_FUNCTION_LINES:
                    found[relative, name] = lines
    return found


def _allowed(path: str, name: str, lines: int) -> bool:
    return any(
        name == allowed_name and lines <= limit and any(fnmatch(path, p) for p in patterns.split("|"))
        for (patterns, allowed_name), limit in LONG_FUNCTIONS.items()
    )


def test_no_function_grows_past_80_lines() -> None:
    found = long_functions(REPO)
    assert [key for key, lines in found.items() if not _allowed(*key, lines)] == []
    assert len(found) == len(LONG_FUNCTIONS), f"a long function was split: remove it from LONG_FUNCTIONS ({found})"


@pytest.mark.parametrize("lines", [MAX_FUNCTION_LINES + 1, 200])
def test_a_new_long_function_is_refused(tmp_path: Path, lines: int) -> None:
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "long.py").write_text("def long():\n" + "    x = 1\n" * (lines - 1))
    found = long_functions(tmp_path)
    assert found == {("runtime/long.py", "long"): lines}
    assert not _allowed("runtime/long.py", "long", lines)


def test_an_allowed_long_function_may_not_grow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(LONG_FUNCTIONS, ("sandbox/inside/*.py", "lock_down"), 84)
    assert _allowed("sandbox/inside/lockdown.py", "lock_down", 84)
    assert not _allowed("sandbox/inside/lockdown.py", "lock_down", 85)
    assert not _allowed("runtime/agent/lifecycle.py", "lock_down", 84)
