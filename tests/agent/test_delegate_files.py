"""Files through a nested call (issue 41): ``handle.call_with_files(method, files, *args)`` hands the callee
named files of the caller's own ``inputs/`` or ``outputs/``, and the callee's outputs land in the caller's
``outputs/`` only when it committed. A plain nested call still sees no file it was not given, and nothing
outside the caller's file area can be handed on (``sandbox/inside/handing.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandforge.sandbox.inside import handing
from tests.agent.conftest import MakeWorkspace, records

CSV = b"city,temp\nOslo,3\nLima,19\n"

#: the caller cleans its input into outputs/, hands both on, and returns what came back
CALLER = """
with open('inputs/data.csv') as f:
    text = f.read()
with open('outputs/clean.csv', 'w') as f:
    f.write(text.upper())
stats = delegate('statistician', purpose='summarise a CSV')
r = stats.call_with_files('summarise', {'raw.csv': 'inputs/data.csv', 'clean.csv': 'outputs/clean.csv'}, 'cities')
with open('outputs/summary.txt') as f:
    summary = f.read()
return [r.ok, r.value, summary]
"""
#: the callee sees exactly what it was handed, and nothing of its caller's (data.csv is not there)
CALLEE = """
try:
    open('inputs/data.csv')
    leaked = True
except FileNotFoundError:
    leaked = False
with open('inputs/raw.csv') as f:
    raw = f.read().splitlines()
with open('inputs/clean.csv') as f:
    clean = f.read().splitlines()
with open('outputs/summary.txt', 'w') as f:
    f.write(args[0] + ': ' + str(len(raw) - 1) + ' rows, ' + clean[1])
return leaked
"""


def test_a_delegated_call_takes_named_files_and_its_outputs_reach_the_caller(make_ws: MakeWorkspace) -> None:
    ws, _ = make_ws([CALLER, CALLEE])
    out = ws.call_with_files("boss", "run", {"data.csv": CSV})
    assert out.ok, out
    assert out.value == [True, False, "cities: 2 rows, OSLO,3"]
    assert out.files == {"clean.csv": CSV.upper(), "summary.txt": b"cities: 2 rows, OSLO,3"}
    nested = [r for r in records(ws) if r.depth == 1][-1]
    assert sorted(f.name for f in nested.input_files or []) == ["clean.csv", "raw.csv"]
    assert [f.name for f in nested.output_files or []] == ["summary.txt"]


FAILING_CALLEE = "with open('outputs/summary.txt', 'w') as f:\n    f.write('half')\nraise ValueError('boom')\n"
CALLER_OF_FAILURE = """
r = tool('statistician').call_with_files('summarise', {'raw.csv': 'inputs/data.csv'})
try:
    open('outputs/summary.txt')
    arrived = True
except FileNotFoundError:
    arrived = False
return [r.ok, arrived]
"""


def test_a_callee_that_fails_hands_nothing_back(make_ws: MakeWorkspace) -> None:
    ws, _ = make_ws([CALLER_OF_FAILURE, FAILING_CALLEE], execution_repair_budget=0)
    out = ws.call_with_files("boss", "run", {"data.csv": CSV})
    assert out.ok and out.value == [False, False] and out.files == {}


ATTACKS = """
results = []
for files in kwargs['attempts']:
    try:
        tool('statistician').call_with_files('summarise', files)
        results.append('handed')
    except PermissionError as exc:
        results.append('refused')
    except TypeError as exc:
        results.append('refused')
return results
"""


def test_nothing_outside_the_callers_file_area_can_be_handed_on(make_ws: MakeWorkspace) -> None:
    attempts = [
        {"x.csv": "/etc/passwd"}, {"x.csv": "../etc/passwd"}, {"x.csv": "inputs/../../etc/passwd"},
        {"x.csv": "inputs/"}, {"x.csv": "outputs/a/b"}, {"x.csv": "tmp/data.csv"}, {"x.csv": "inputs/.hidden"},
        {"../x": "inputs/data.csv"}, {"/abs": "inputs/data.csv"}, {"x.csv": 3}, ["inputs/data.csv"],
    ]  # fmt: skip
    ws, provider = make_ws([ATTACKS])
    out = ws.call_with_files("boss", "run", {"data.csv": CSV}, attempts=attempts)
    assert out.ok, out
    assert out.value == ["refused"] * len(attempts)
    assert len(provider.requests) == 1  # no nested call ever reached the host: no program was asked for


def test_the_runner_hands_on_only_a_regular_file_with_one_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The escaped-program moves (the tripwire ends ``os.symlink``/``os.link`` first): a symlink, a hard link
    and a FIFO in ``outputs/`` are refused by the descriptor checks, never followed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inputs").mkdir()
    (tmp_path / "outputs").mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    (tmp_path / "outputs" / "ok.txt").write_text("fine")
    os.symlink(secret, tmp_path / "outputs" / "link.txt")
    os.link(secret, tmp_path / "outputs" / "hard.txt")
    os.mkfifo(tmp_path / "outputs" / "fifo.txt")
    assert handing.given({"a": "outputs/ok.txt"}, 100) == {"a": "ZmluZQ=="}
    for name in ("link.txt", "hard.txt", "fifo.txt"):
        with pytest.raises(OSError):  # ELOOP for the link; PermissionError for the others
            handing.given({"a": f"outputs/{name}"}, 100)
    with pytest.raises(OSError, match="over 3 bytes"):
        handing.given({"a": "outputs/ok.txt"}, 3)


def test_a_callees_outputs_never_follow_a_link_in_the_callers_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").mkdir()
    target = tmp_path / "elsewhere.txt"
    os.symlink(target, tmp_path / "outputs" / "summary.txt")
    with pytest.raises(OSError):
        handing.received({"summary.txt": "eA=="})
    assert not target.exists()
    with pytest.raises(RuntimeError, match="malformed"):
        handing.received({"../x": "eA=="})
    handing.received({"new.txt": "eA=="})
    assert (tmp_path / "outputs" / "new.txt").read_bytes() == b"x"


DECLARING = """
stats = delegate('statistician', purpose='summarise a CSV', files={
    'takes': [{'name': 'raw.csv', 'media_type': 'text/csv'}],
    'produces': [{'name': 'summary.json', 'media_type': 'application/json'}],
})
mistyped = stats.call_with_files('summarise', {'raw.csv': 'inputs/blob.bin'})
r = stats.call_with_files('summarise', {'raw.csv': 'inputs/data.csv'})
try:
    delegate('other', purpose='x', files={'takes': [{'name': '../x'}]})
    bad = 'declared'
except Exception as exc:
    bad = type(exc).__name__
return [mistyped.error_type, 'text/csv' in (mistyped.error_message or ''), r.ok, r.error_type, bad]
"""
#: writes summary.json that is not JSON: the declared output's media type fails the nested attempt
NOT_JSON = "with open('outputs/summary.json', 'w') as f:\n    f.write('{rows: 2')\nreturn 2\n"


def test_a_delegate_declares_its_files_and_the_contract_checks_them(make_ws: MakeWorkspace) -> None:
    ws, provider = make_ws([DECLARING, NOT_JSON], execution_repair_budget=0, fresh_outcome_repair_budget=0)
    out = ws.call_with_files("boss", "run", {"data.csv": CSV, "blob.bin": b"\x89PNG\r\n\x1a\n\xff"})
    assert out.ok, out
    mistyped, named_type, ok, error_type, bad = out.value
    assert (mistyped, named_type) == ("invalid_tool_call", True)  # refused before the callee ran
    assert (ok, error_type) == (False, "contract_violation")  # its summary.json is not JSON: nothing handed back
    assert bad == "InvalidContract" and out.files == {}
    assert len(provider.requests) == 2  # the caller and one callee attempt: the mistyped call asked for nothing
