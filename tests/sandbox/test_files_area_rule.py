"""The tripwire's file-area rule with the work directory at "/" (the subprocess backend's private root) as well
as below it (containers' /tmp): a library's relative ``outputs/NAME`` is the area's, and nothing else is."""

from __future__ import annotations

from typing import Any

import pytest

from sandforge.sandbox.inside.tripwire import _files_rule

REFUSED = "refused by the other rules"


def _decide(workdir: str, path: str, mode: str = "w+") -> str | None:
    state: list[Any] = [True, False, -1, None, None, 0, (f"{workdir}/inputs", f"{workdir}/outputs")]
    checked = _files_rule(state)(lambda *_: REFUSED)
    why: str | None = checked("open", None, "library", (path, mode, 0))
    return why


@pytest.mark.parametrize("workdir", ["", "/tmp"])
def test_a_librarys_relative_output_path_is_in_the_area_wherever_the_work_directory_is(workdir: str) -> None:
    assert _decide(workdir, "outputs/chart.png") is None  # savefig("outputs/chart.png"), PIL opening "w+b"
    assert _decide(workdir, "./outputs/chart.png") is None
    assert _decide(workdir, "inputs/data.csv", "r") is None
    assert _decide(workdir, "inputs/data.csv") == "an input file opened for writing"
    assert _decide(workdir, "elsewhere/chart.png") == REFUSED
    assert _decide(workdir, "outputs/.hidden") == REFUSED
