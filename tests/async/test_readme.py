"""The README's Python API section: explicit forms first, context managers, and every example passes
``mypy --strict`` and runs against an installed wheel (``py.typed`` ships: without it mypy refuses the
package as untyped)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.architecture.test_packaging import Installed

REPO = Path(__file__).resolve().parents[2]


def api_examples() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_section_has_sync_and_async_examples() -> None:
    blocks = api_examples()
    assert len(blocks) >= 4
    assert any("AsyncAgent" in b for b in blocks) and any("AsyncSandbox" in b for b in blocks)


def test_explicit_forms_come_first() -> None:
    first, *rest = api_examples()
    assert 'calc.call("add"' in first and 'calc.context["total"]' in first
    assert not re.search(r"calc\.(?!call\b|context\b)\w+", first), "the first example uses the dynamic form"
    assert any(re.search(r"calc\.add\(", block) for block in rest)


def test_every_example_opens_agents_and_sandboxes_in_with_blocks() -> None:
    for block in api_examples():
        for line in block.splitlines():
            if re.search(r"\b(Agent\.for_role|AsyncAgent\.for_role|Sandbox|AsyncSandbox)\(", line):
                assert re.match(r"\s*(async )?with ", line), line


def _write(tmp_path: Path) -> list[Path]:
    paths = []
    for n, block in enumerate(api_examples()):
        path = tmp_path / f"readme_example_{n}.py"
        path.write_text(block)
        paths.append(path)
    return paths


@pytest.mark.slow
@pytest.mark.timeout(900)  # building the wheel, then mypy over sandforge and its dependencies with no cache
def test_the_examples_pass_mypy_strict_against_the_installed_package(installed: Installed, tmp_path: Path) -> None:
    paths = _write(tmp_path)
    command = [sys.executable, "-m", "mypy", "--strict", "--python-executable", str(installed.python),
               "--cache-dir", str(tmp_path / "mypy-cache"), *map(str, paths)]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    done = subprocess.run(command, cwd=installed.workdir, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_examples_run(installed: Installed, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["SANDFORGE_STATE_DIR"] = str(tmp_path / "state")
    for path in _write(tmp_path):
        done = subprocess.run([str(installed.python), str(path)], cwd=installed.workdir, env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, f"{path.name}: {done.stderr}"
        if "calc.totl" in path.read_text():
            assert "calculator.totl is an uncalled method" in done.stdout
