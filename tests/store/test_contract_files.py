"""A tool's contract declares the files it takes and produces (issue 41 item 4): kept by the store, part of the
fingerprint, and a required output an ok run does not write is an intrinsic contract violation that the store
records against the artifact (docs/files.md, "Stored tools")."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sandforge.runtime.agent import Agent
from sandforge.runtime.agent.contracts import check_outputs
from sandforge.runtime.providers.prompt import render_prompt
from sandforge.runtime.store.models import ToolContract, ToolFiles
from tests.store.test_reuse_and_health import Env, env, top

__all__ = ["env"]  # the fixture, shared

CHART = {"produces": [{"name": "chart.png", "media_type": "image/png"}], "takes": [{"name": "*.csv"}]}
#: writes its chart only for a non-zero argument: the second call makes a stored program miss its output
PNG = b"\x89PNG\r\n\x1a\n"  # its signature: a declared image/png is checked against the bytes
SOMETIMES = (
    "if args[0]:\n    with open('outputs/chart.png', 'wb') as f:\n"
    f"        f.write({PNG!r} + bytes(args[0]))\nreturn args[0]\n"
)
ALWAYS = f"with open('outputs/chart.png', 'wb') as f:\n    f.write({PNG!r} + b'x')\nreturn args[0]\n"


def test_a_stored_program_missing_a_declared_output_is_an_intrinsic_contract_violation(env: Env) -> None:
    ws, provider = env.session([SOMETIMES, ALWAYS])
    ws.register_tool("charter", purpose="Draw a chart", files=CHART)
    charter = Agent.for_role("charter", workspace=ws)
    first = charter.draw(3)
    assert first.ok and first.files == {"chart.png": PNG + b"\0\0\0"}
    assert env.store().lookup("charter", "draw").artifact is not None
    assert "chart.png" in render_prompt(provider.requests[0]).user  # the model is told what to write

    out = charter.draw(0)  # the stored program runs, answers ok, writes no chart: repaired
    assert out.ok and out.files == {"chart.png": PNG + b"x"}
    rec = top(ws)
    failed = rec.attempt_failures[0]
    assert (failed.error_type, failed.failure_class) == ("contract_violation", "intrinsic")
    assert "outputs/chart.png" in (failed.error_message or "")
    assert "record_failure:intrinsic@1" in rec.store_actions and rec.program_source == "repaired"


def test_a_call_that_never_writes_its_declared_output_fails_and_returns_nothing(env: Env) -> None:
    ws, _ = env.session(["with open('outputs/other.txt', 'w') as f:\n    f.write('x')\nreturn 1\n"] * 3)
    ws.register_tool("charter", purpose="Draw a chart", files=CHART)
    out = Agent.for_role("charter", workspace=ws).draw(1)
    assert not out.ok and out.error_type == "contract_violation" and out.files == {}
    assert out.metadata["failure_class"] == "intrinsic"
    assert env.store().lookup("charter", "draw").artifact is None  # nothing stored from a failed call


def test_the_store_keeps_declared_files_and_they_are_part_of_the_fingerprint(env: Env) -> None:
    ws, _ = env.session([])
    ws.register_tool("charter", purpose="Draw a chart", files=CHART)
    entry = env.store().get_tool("charter")
    assert entry is not None and entry.files == ToolFiles.model_validate(CHART)
    assert entry.contract().files == entry.files
    plain = ToolContract(role="charter", purpose="Draw a chart")
    assert plain.fingerprint() != entry.contract().fingerprint() == entry.contract_fingerprint


def test_outputs_are_checked_by_name_or_glob_and_only_when_required() -> None:
    files = ToolFiles.model_validate(
        {"produces": [{"name": "chart-*.png"}, {"name": "notes.md", "required": False}, {"name": "t[0-9].csv"}]}
    )
    assert check_outputs(files, dict.fromkeys(["chart-1.png", "t3.csv"], b"")) is None
    assert check_outputs(None, {}) is None
    missing = check_outputs(files, dict.fromkeys(["chart-1.png", "tx.csv"], b""))
    assert missing is not None and missing.kind == "outputs" and missing.path == "outputs/t[0-9].csv"
    assert "tx.csv" in missing.text and "chart-1.png" in missing.text


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/b", ".hidden", "", "x" * 129])
def test_a_declared_file_is_a_name_or_a_glob_never_a_path(env: Env, name: str) -> None:
    ws, _ = env.session([])
    with pytest.raises(ValidationError):
        ws.register_tool("charter", purpose="Draw a chart", files={"produces": [{"name": name}]})
    assert env.store().get_tool("charter") is None
