"""A real, non-editable install: what a user of ``pip install sandforge`` gets (issue 17, item 5).

The working tree is copied (so the build leaves nothing behind in it), built into a wheel with this venv's
setuptools (``--no-build-isolation``: no index needed), and installed ``--no-deps`` into a fresh venv that
borrows this venv's dependencies through a path entry (which adds their directory, not this venv's
editable install of sandforge). Every check then runs the fresh venv's interpreter outside the repository.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
COPY_IGNORE = shutil.ignore_patterns(
    ".venv", ".git", "__pycache__", "build", "*.egg-info", ".*_cache", ".hypothesis", ".peers-venv", "results"
)


@dataclass(frozen=True)
class Installed:
    python: Path
    site: Path  # the fresh venv's site-packages
    bin: Path
    workdir: Path  # outside the repository: the checks' working directory

    def run(self, *args: str) -> str:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        done = subprocess.run(args, cwd=self.workdir, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def python_json(self, code: str) -> object:
        return json.loads(self.run(str(self.python), "-c", code).strip().splitlines()[-1])


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    root = tmp_path_factory.mktemp("packaging")
    source, dist, venv = root / "src", root / "dist", root / "venv"
    shutil.copytree(REPO, source, symlinks=True, ignore=COPY_IGNORE)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(dist), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("sandforge-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # The dependencies (pydantic, click, ...) from this venv: a plain path line, so this venv's editable
    # sandforge (a .pth of its own there) is not installed into the fresh one.
    (site / "zz_project_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    workdir = root / "elsewhere"
    workdir.mkdir()
    return Installed(python=python, site=site, bin=venv / "bin", workdir=workdir)


def test_one_top_level_import_package(installed: Installed) -> None:
    names = {p.name for p in installed.site.iterdir()} - {"zz_project_dependencies.pth", "__pycache__"}
    assert {n for n in names if not n.endswith(".dist-info")} == {"sandforge"}
    assert [n for n in names if n.endswith(".dist-info")] == ["sandforge-0.1.0.dist-info"]


def test_the_installed_copy_is_imported_and_gives_the_api(installed: Installed) -> None:
    found = installed.python_json(
        "import json, sandforge; from sandforge import Agent, Sandbox, ToolStore;"
        "print(json.dumps([sandforge.__file__, Agent.__module__, Sandbox.__name__, ToolStore.__name__]))"
    )
    assert isinstance(found, list)
    assert Path(found[0]).is_relative_to(installed.site), found
    assert found[2:] == ["Sandbox", "ToolStore"]


def test_default_policy_and_image_recipe_ship_as_package_data(installed: Installed) -> None:
    found = installed.python_json(
        "import json; from sandforge.runtime.guardrails import default_policy;"
        "from sandforge.runtime.guardrails.loader import default_policy_dir; from sandforge.sandbox import image;"
        "policy = default_policy();"
        "print(json.dumps([str(default_policy_dir()), len(policy.rules), str(image.DOCKERFILE),"
        " image.DOCKERFILE.is_file()]))"
    )
    assert isinstance(found, list)
    policy_dir, rules, dockerfile, dockerfile_present = found
    assert Path(policy_dir).is_relative_to(installed.site) and rules > 0
    assert Path(dockerfile).is_relative_to(installed.site) and dockerfile_present
    assert (installed.site / "sandforge" / "policies" / "policy.schema.json").is_file()


def test_dashboard_templates_and_stylesheet_ship(installed: Installed) -> None:
    found = installed.python_json(
        "import json; from sandforge.runtime.dashboard import render;"
        "print(json.dumps([render.page('login.html', message=None)[:15], len(render.stylesheet())]))"
    )
    assert isinstance(found, list) and found[0] == "<!doctype html>" and found[1] > 1000


def test_the_framework_integrations_ship(installed: Installed) -> None:
    found = installed.python_json(
        "import json; from sandforge.integrations import SandforgeTools; import sandforge.integrations.langchain as m;"
        "print(json.dumps([SandforgeTools.__module__, m.__file__]))"
    )
    assert isinstance(found, list) and found[0] == "sandforge.integrations.core"
    assert Path(found[1]).is_relative_to(installed.site)


def test_py_typed_ships(installed: Installed) -> None:
    assert (installed.site / "sandforge" / "py.typed").is_file()


def test_cli_runs_and_has_no_bench_command(installed: Installed) -> None:
    out = installed.run(str(installed.bin / "sandforge"), "--help")
    commands = out.split("Commands:", 1)[1].split()
    assert "demo" in commands and "doctor" in commands
    assert "bench" not in commands


def _imported_tops(path: Path) -> set[str]:
    tops = set()
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            tops |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return tops


def test_nothing_installed_imports_bench_or_tests(installed: Installed) -> None:
    modules = sorted((installed.site / "sandforge").rglob("*.py"))
    assert len(modules) > 50
    offenders = {str(m.relative_to(installed.site)) for m in modules if _imported_tops(m) & {"bench", "tests"}}
    assert offenders == set()


def test_the_import_scan_sees_an_import_of_bench(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("def f():\n    from bench.run import main\n")
    assert "bench" in _imported_tops(tmp_path / "m.py")
