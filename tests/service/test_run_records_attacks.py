"""Red team on the call log's run records (issue 37 item 5): what a program run through ``POST /v1/exec`` can
put in its record (its output, its error, its value, its arguments, its code) must stay inert text in the
dashboard's pages, in ``sandforge logs`` on a terminal, and in the JSONL log (one bounded line per run)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from sandforge.runtime.agent.calllog import CallLog, CallSource, parse_record
from sandforge.runtime.agent.runs import RunClock, run_record
from sandforge.runtime.cli.logs_cmd import MAX_LINE_BYTES, format_record, printable
from sandforge.runtime.cli.logs_cmd import command as logs_command
from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest
from tests.service.test_runs_recorded import site

__all__ = ["site"]

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202egnp.exe"  # title, clear screen, 8-bit CSI, right-to-left override
HTML = "<script>alert(1)</script><img src=x onerror=alert(2)><svg onload=alert(3)>"
FORGED = "\n12:00:00 deadbeef exec.run() [http] -> ok 1  (1 attempt, subprocess 1 ms)"
RUNS = [
    {"code": f"print({HTML!r} + {ESCAPES!r})\nraise ValueError({(HTML + ESCAPES + FORGED + chr(0x2028))!r})"},
    {"code": f"return {{{HTML!r}: {HTML!r} * 3, 'esc': {ESCAPES!r}}}", "args": [HTML], "kwargs": {HTML: ESCAPES}},
    {"code": f"s = '</code></pre></div>{HTML}'\nreturn len(s)"},  # the program's own text, highlighted
    {"code": "return 'x' * 3_000_000"},  # a huge value
    {"code": "print('y' * 900_000)\nreturn 'z' * 9_000", "args": ["w" * 200_000]},  # huge output and arguments
    {"code": f"import os  # {HTML}\nreturn 1"},  # refused: the violation's location quotes the code
]
LINE_BOUND = 200_000  # bytes: code, values, messages, output and arguments are each cut well below


def _exec(client: TestClient, bearer: dict[str, str], body: dict[str, object]) -> None:
    assert client.post("/v1/exec", json=body, headers=bearer).status_code == 200


@pytest.fixture
def hostile(site: tuple[TestClient, dict[str, str], Path]) -> Iterator[tuple[TestClient, str, Path]]:
    client, tokens, state = site
    bearer = {"Authorization": f"Bearer {tokens['alpha']}"}
    for body in RUNS:
        _exec(client, bearer, body)
    surrogates = json.dumps({"code": "return args[0] + '\ud800'", "args": ["\udfff"]}).encode()  # UTF-8 cannot
    refused = client.post("/v1/exec", content=surrogates, headers=bearer | {"Content-Type": "application/json"})
    assert refused.status_code == 422 and refused.json()["error"]["type"] == "invalid_request"  # at the edge
    yield client, tokens["alpha"], state / "tenants" / "alpha" / "logs" / "calls.jsonl"


def test_each_hostile_run_is_one_bounded_line_of_the_jsonl_log(hostile: tuple[TestClient, str, Path]) -> None:
    _, _, log = hostile
    lines = log.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) - 1 == len(RUNS)  # no line injected, none lost
    records = [parse_record(line.decode("utf-8")) for line in lines[:-1]]
    assert all(r is not None and r.source == "http" for r in records)
    assert max(len(line) for line in lines) < LINE_BOUND
    assert records[0] is not None and FORGED.strip() in (records[0].error_message or "")  # kept, as data


def test_the_dashboard_shows_hostile_runs_as_text(hostile: tuple[TestClient, str, Path]) -> None:
    client, token, log = hostile
    ids = [json.loads(line)["call_id"] for line in log.read_bytes().splitlines()]
    client.cookies.clear()
    assert client.post("/dashboard/login", data={"token": token}, follow_redirects=False).status_code == 303
    pages = [client.get(f"/dashboard/calls/{i}") for i in ids]
    pages += [client.get("/dashboard/calls"), client.get("/dashboard/security"),
              client.get("/dashboard/calls", params={"role": HTML})]  # fmt: skip
    bad_filter = client.get("/dashboard/calls", params={"source": HTML})
    assert bad_filter.status_code == 422
    for page in [*pages, bad_filter]:
        assert page.status_code in (200, 422), page.text
        text = page.text.lower()
        assert "<script" not in text and "<img" not in text and "<svg" not in text
        assert "content-security-policy" in {k.lower() for k in page.headers}
    assert "&lt;script&gt;" in pages[0].text  # the message is there, escaped


def test_sandforge_logs_sends_no_program_controlled_escape_to_the_terminal(
    hostile: tuple[TestClient, str, Path],
) -> None:
    _, _, log = hostile
    shown = CliRunner().invoke(logs_command, ["--file", str(log)])
    assert shown.exit_code == 0, shown.output
    for bad in ("\x1b", "\x9b", "\x07", "\u202e", "\u2028"):
        assert bad not in shown.output, repr(bad)
    assert "\\x9b31m" in shown.output  # shown as its escape, so the reader sees what was attempted
    assert not [line for line in shown.output.splitlines() if line.startswith("12:00:00 deadbeef")]  # no forgery
    brief = CliRunner().invoke(logs_command, ["--file", str(log), "--brief"]).output
    assert len(brief.splitlines()) == len(RUNS)  # one line a run, whatever its message holds


def test_printable_keeps_text_and_escapes_only_what_a_terminal_acts_on() -> None:
    assert printable("naïve 日本 - ok") == "naïve 日本 - ok"
    assert printable("a\x1b[2Jb\r\nc\x9b\u202e\ud800") == "a\\x1b[2Jb\\r\\nc\\x9b\\u202e\\ud800"


def test_the_calls_page_filters_by_every_source_a_run_can_have(hostile: tuple[TestClient, str, Path]) -> None:
    """A framework's runs (source ``framework``) are in the log like the others: its filter is offered too."""
    client, token, _ = hostile
    client.cookies.clear()
    assert client.post("/dashboard/login", data={"token": token}, follow_redirects=False).status_code == 303
    page = client.get("/dashboard/calls").text
    select = page[page.index('id="f-source"') :].split("</select>")[0]
    assert [s for s in get_args(CallSource) if f">{s}</option>" not in select] == []
    assert client.get("/dashboard/calls", params={"source": "framework"}).status_code == 200


def test_a_run_record_with_every_fetch_at_its_bounds_stays_readable(tmp_path: Path) -> None:
    """100 kept fetches of 30 redirects of 2 000-character URLs, held by the record and by its failed attempt:
    12 MB unbounded, which every reader of the log (the dashboard, ``sandforge logs``) skips unread."""
    url = "http://127.0.0.1/" + "a" * 2_100
    fetched = [{"method": "GET", "url": url, "final_url": url, "status": 200, "redirects": [url] * 30}] * 150
    outcome = ExecutionOutcome(status="error", error_type=ErrorType.EXECUTION, error_message="boom",
                               metadata={"egress": fetched}, backend="subprocess")  # fmt: skip
    record = run_record(outcome, None, ExecutionRequest(code="return 1"), source="cli", clock=RunClock())
    assert len(record.model_dump_json().encode()) < MAX_LINE_BYTES // 4
    assert record.egress_requests == 150 and 0 < len(record.egress) < 150
    log = CallLog(tmp_path / "calls.jsonl")
    log.append(record)
    shown = CliRunner().invoke(logs_command, ["--file", str(tmp_path / "calls.jsonl"), "--brief"])
    assert shown.exit_code == 0 and "exec.run() [cli] -> error" in shown.output and "skipped" not in shown.output


def test_lone_surrogates_in_what_the_caller_gave_make_one_utf8_line(tmp_path: Path) -> None:
    """The caller's code and arguments may hold lone surrogates (``sandforge exec`` reads undecodable bytes as
    surrogate escapes, JSON decodes ``"\\ud800"``); the sandbox replaces a program's own. The log is UTF-8."""
    lone = "\udcff\ud800"
    outcome = ExecutionOutcome(status="error", error_type=ErrorType.INVALID_CODE, error_message="unpaired surrogate")
    request = ExecutionRequest(code=f"# {lone}\nreturn 1", args=[lone], kwargs={lone: lone})
    record = run_record(outcome, None, request, source="cli", clock=RunClock())
    CallLog(tmp_path / "calls.jsonl").append(record)
    raw = (tmp_path / "calls.jsonl").read_bytes()
    assert raw.count(b"\n") == 1 and raw.decode("utf-8")  # strict UTF-8: no surrogate written
    again = parse_record(raw.decode("utf-8"))
    assert again is not None and "\ufffd" in (again.program_code or "") and "\ufffd" in str(again.args)


def test_in_colour_the_only_escapes_sent_are_the_colours_own(hostile: tuple[TestClient, str, Path]) -> None:
    _, _, log = hostile
    records = [r for r in (parse_record(line.decode()) for line in log.read_bytes().splitlines()) if r is not None]
    for record in records:
        for line in format_record(record, color=True):
            stripped = line.replace("\x1b[32m", "").replace("\x1b[31m", "").replace("\x1b[0m", "")
            assert not {"\x1b", "\x9b", "\x07", "\u202e", "\n", "\r"} & set(stripped), stripped
