"""Charts (issue 41 item 3): with matplotlib allowed in a policy's dependencies,
``plt.savefig("outputs/chart.png")`` draws with the Agg backend (no display) and the PNG comes back as an output
file, on every backend (the container backends after docker reuse the environment built for its target: the
module's store). matplotlib is not in the offline wheelhouse: the environment is built from the package index, as
``test_index.py``'s is (skipped when it cannot be reached, failed instead under SANDFORGE_REQUIRE_WHEELHOUSE=1)."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import pytest

from sandforge.runtime.agent.environment import Environments
from sandforge.runtime.agent.program_exec import execute_program
from sandforge.runtime.environments.policy import DependencyPolicy
from sandforge.runtime.guardrails import default_policy
from sandforge.sandbox import ExecutionRequest, Limits, Sandbox
from tests.environments.helpers import require_index

pytestmark = pytest.mark.slow

#: matplotlib and what it requires (each must be allowed: docs/environments.md)
ALLOW = ("matplotlib", "contourpy", "cycler", "fonttools", "kiwisolver", "numpy", "packaging", "pillow",
         "pyparsing", "python-dateutil", "six", "tzdata")  # fmt: skip
CHART = """# /// script
# dependencies = ["matplotlib"]
# ///
import csv
import matplotlib
import matplotlib.pyplot as plt
with open("inputs/temps.csv") as f:
    rows = list(csv.DictReader(f))
plt.plot([r["city"] for r in rows], [float(r["temp"]) for r in rows])
plt.title("temperatures")
plt.savefig("outputs/chart.png")
return [matplotlib.get_backend(), len(rows)]
"""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def environments(tmp_path_factory: pytest.TempPathFactory) -> Environments:
    """One environment store for the module: each backend's target builds once, the downloads are shared."""
    return Environments(tmp_path_factory.mktemp("charts") / "environments")


def test_a_program_draws_a_png_chart_with_matplotlib(sandbox: Sandbox, environments: Environments) -> None:
    require_index()
    policy = dataclasses.replace(default_policy(), dependencies=DependencyPolicy(allow=ALLOW, source="index"))
    request = ExecutionRequest(code=CHART, files={"temps.csv": b"city,temp\nOslo,3\nLima,19\nCairo,24\n"},
                               limits=Limits(timeout_s=60, memory_mb=512))  # fmt: skip
    outcome, _ = execute_program(sandbox, request, policy=policy, environments=environments)
    assert outcome.ok, outcome
    assert outcome.value == ["agg", 3] or outcome.value == ["Agg", 3], outcome.value
    png = outcome.files["chart.png"]
    assert png[:8] == PNG_SIGNATURE and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (640, 480)  # matplotlib's default figure, 6.4 x 4.8 in at 100 dpi
    assert len(png) > 10_000  # drawn, not blank: axes, a line, tick labels and a title
    assert "temporary cache directory" not in outcome.stderr  # MPLCONFIGDIR is in the sandbox's own scratch


def test_a_chart_dependency_not_allowed_is_refused(tmp_path: Path) -> None:
    """Without matplotlib in the policy's dependencies, nothing is built: the manifest is refused first."""
    with Sandbox() as sb:
        outcome, _ = execute_program(sb, ExecutionRequest(code=CHART), policy=default_policy(),
                                     environments=Environments(tmp_path / "e"))  # fmt: skip
    assert not outcome.ok and not (tmp_path / "e" / "envs").exists()
