"""`sandforge logs`: read the call log (one JSON record per logical call) as text a person can scan."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import click

from sandforge.runtime.agent.calllog import CallRecord, EgressCall, call_log_schema, default_log_path, parse_record
from sandforge.runtime.errors import InputFileError, UsageError
from sandforge.runtime.files.read import file_kind

POLL_S = 0.25
#: A call record is bounded (code, values and messages are cut); a longer line is not one: skipped unread.
MAX_LINE_BYTES = 4 * 1024 * 1024
#: What a program may put in a message that a terminal would act on or that would forge a line: C0 and C1
#: controls (ESC, CSI 0x9b, CR, LF), bidirectional overrides and isolates, and lone surrogates.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` with every character of :data:`_UNPRINTABLE` shown as its escape (``\\x1b``), never sent."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def open_log(path: Path) -> BinaryIO:
    """The log file for reading: O_NONBLOCK (a FIFO never blocks), regular files only."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputFileError(f"cannot read call log {path}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputFileError(f"call log {path} is {file_kind(st.st_mode)}, not a regular file; refused")
    return os.fdopen(fd, "rb")


def bounded_lines(fh: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[str | None]:
    """Each line (decoded, invalid UTF-8 replaced), or None for a line over ``limit`` bytes (never held)."""
    while True:
        line = fh.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit:
            yield line.decode("utf-8", "replace")
            continue
        while line and not line.endswith(b"\n"):  # skip the rest of the overlong line in bounded pieces
            line = fh.readline(limit)
        yield None


def _short(value: object, limit: int = 40) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _call_text(record: CallRecord) -> str:
    args = record.args if isinstance(record.args, list) else [record.args]
    parts = [_short(a, 30) for a in args]
    if isinstance(record.kwargs, dict):
        parts += [f"{k}={_short(v, 30)}" for k, v in record.kwargs.items()]
    return f"{record.role}.{record.method}({', '.join(parts)})"


def failure_text(error_class: str, message: str) -> str:
    """``KeyError: 'x'`` rather than ``KeyError: KeyError: 'x'``."""
    return message if message.startswith(f"{error_class}:") else f"{error_class}: {message}"


def egress_line(entry: EgressCall | dict[str, Any]) -> str:
    """One brokered request as a line: what was asked, what came back (or why not), and the rule that allowed it."""
    call = entry if isinstance(entry, EgressCall) else EgressCall.model_validate(entry)
    asked = f"fetch {call.method} {call.url}"
    if call.error is not None:
        return f"{asked} -> {call.error}: {call.denied or ''}".rstrip()
    final = f" (at {call.final_url})" if call.final_url and call.final_url != call.url else ""
    rule = f" [allowed by {call.rule}]" if call.rule else ""
    return f"{asked} -> {call.status}, {call.bytes} bytes, {call.duration_ms:.0f} ms{final}{rule}"


def tree_order(records: list[CallRecord]) -> list[CallRecord]:
    """Records grouped by trace (in order of first appearance), each call followed by its nested calls.

    Nested records are committed before their parent's, so the file order puts children first.
    """
    by_parent: dict[str | None, list[CallRecord]] = {}
    ids = {r.call_id for r in records}
    roots: list[CallRecord] = []
    for record in records:
        if record.parent_call_id is not None and record.parent_call_id in ids:
            by_parent.setdefault(record.parent_call_id, []).append(record)
        else:
            roots.append(record)
    ordered: list[CallRecord] = []

    def visit(record: CallRecord) -> None:
        ordered.append(record)
        for child in by_parent.get(record.call_id, []):
            visit(child)

    trace_order: dict[str, int] = {}
    for record in records:
        trace_order.setdefault(record.trace_id, len(trace_order))
    for root in sorted(roots, key=lambda r: trace_order[r.trace_id]):
        visit(root)
    return ordered


def format_record(record: CallRecord, *, details: bool = True, color: bool = False) -> list[str]:
    """A record as one summary line plus (with ``details``) one line per failed attempt."""
    indent = "  " * record.depth + ("└ " if record.depth else "")
    if record.status == "ok":
        result = click.style("ok", fg="green") if color else "ok"
        result += printable(f" {_short(record.value)}")
    else:
        result = click.style("error", fg="red") if color else "error"
        told = f" [{record.error_type}{', retriable' if record.retriable else ''}] {record.error_message or ''}"
        result += printable(told)
    stamp = record.started_at.astimezone().strftime("%H:%M:%S")
    attempts = f"{record.attempts} attempt{'s' if record.attempts != 1 else ''}"
    where = f"{record.backend or '-'} {record.duration_s * 1000:.0f} ms"
    via = f" [{record.source}]" if record.source != "agent" else ""  # a run: sandforge exec, POST /v1/exec, MCP
    called = printable(f"{stamp} {record.trace_id[:8]} {indent}{_call_text(record)}{via}")
    lines = [f"{called} -> {result}  ({attempts}, {where})"]  # only the colour's own escapes are sent
    if not details:
        return lines
    pad = " " * (18 + len(indent))
    for failure in record.attempt_failures:
        where_failed = f" at {failure.violation_location}" if failure.violation_location else ""
        lines.append(
            f"{pad}attempt {failure.attempt_number} failed in {failure.stage}: "
            f"{failure_text(failure.error_class, failure.error_message)}{where_failed} -> rolled back"
        )
        lines.extend(f"{pad}  {egress_line(call)}" for call in failure.egress)
    lines.extend(f"{pad}{egress_line(call)}" for call in record.egress)
    if record.egress_requests > len(record.egress):
        lines.append(f"{pad}(+{record.egress_requests - len(record.egress)} more requests)")
    flags = [
        name
        for name, on in (
            ("guardrail_retry_exhausted", record.guardrail_retry_exhausted),
            ("outcome_repair_retry_exhausted", record.outcome_repair_retry_exhausted),
            ("execution_repair_exhausted", record.execution_repair_exhausted),
            ("generation_retry_exhausted", record.generation_retry_exhausted),
        )
        if on
    ]
    if flags:
        lines.append(f"{pad}exhausted: {', '.join(flags)}")
    return [lines[0], *(printable(line) for line in lines[1:])]


def matches(record: CallRecord, *, role: str | None, status: str | None, trace: str | None) -> bool:
    if role is not None and record.role != role:
        return False
    if status is not None and record.status != status:
        return False
    return trace is None or record.trace_id.startswith(trace)


def follow_lines(path: Path, *, poll_s: float = POLL_S, stop: Callable[[], bool] = lambda: False) -> Iterator[str]:
    """Lines appended to ``path`` from its current end on; survives the file being created or truncated."""
    position = path.stat().st_size if path.exists() else 0
    partial = ""
    while not stop():
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size, position = 0, 0
        if size < position:  # truncated or replaced: start over
            position, partial = 0, ""
        if size > position:
            try:
                with open_log(path) as fh:
                    fh.seek(position)
                    chunk = fh.read(min(size - position, MAX_LINE_BYTES))
            except InputFileError:  # replaced by something that is not a regular file: wait for a real one
                chunk = b""
            if chunk:
                position += len(chunk)
                partial += chunk.decode("utf-8", "replace")
                *complete, partial = partial.split("\n")
                if len(partial) > MAX_LINE_BYTES:  # an overlong line is no record: drop it
                    partial = ""
                yield from complete
                continue
        time.sleep(poll_s)


def _emit(record: CallRecord, *, as_json: bool, details: bool, color: bool) -> None:
    if as_json:
        click.echo(record.model_dump_json())
    else:
        for line in format_record(record, details=details, color=color):
            click.echo(line)


def _select(
    log_path: Path, *, last: int | None, role: str | None, status: str | None, trace: str | None
) -> tuple[list[CallRecord], int]:
    """The matching records (the last ``last`` of them) and how many lines could not be read."""
    selected: deque[CallRecord] = deque(maxlen=last)
    skipped = 0
    with open_log(log_path) as fh:
        for line in bounded_lines(fh):
            record = parse_record(line) if line is not None else None
            if record is None:
                skipped += line is None or bool(line.strip())
            elif matches(record, role=role, status=status, trace=trace):
                selected.append(record)
    return list(selected), skipped


@click.command("logs")
@click.option("--file", "path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Log file. Default: $SANDFORGE_CALL_LOG or <state dir>/logs/calls.jsonl.")  # fmt: skip
@click.option("-f", "--follow", is_flag=True, help="Keep printing records as they are written (Ctrl-C stops).")
@click.option("--role", default=None, help="Only calls to this role.")
@click.option("--status", type=click.Choice(["ok", "error"]), default=None, help="Only ok or only error calls.")
@click.option("--trace", default=None, help="Only one trace (an id or its prefix).")
@click.option("-n", "--last", type=click.IntRange(min=1), default=None, help="Only the last N matching records.")
@click.option("--brief", is_flag=True, help="One line per call, without failed-attempt details.")
@click.option("--json", "as_json", is_flag=True, help="Print the matching records as JSON lines.")
@click.option("--schema", is_flag=True, help="Print the JSON Schema of a record and exit.")
def command(
    path: Path | None,
    follow: bool,
    role: str | None,
    status: str | None,
    trace: str | None,
    last: int | None,
    brief: bool,
    as_json: bool,
    schema: bool,
) -> None:
    """Show the call log: one entry per logical call, nested calls indented under their trace.

    Each entry shows the call, its outcome, how many attempts it took, and why earlier attempts failed.
    """
    if schema:
        click.echo(json.dumps(call_log_schema(), indent=2))
        return
    log_path = path or default_log_path()
    color = not as_json and sys.stdout.isatty()
    if not log_path.exists() and not follow:
        raise UsageError(f"no call log at {log_path}", hint="run `sandforge demo`, or point --file at a log")
    if log_path.exists():
        selected, skipped = _select(log_path, last=last, role=role, status=status, trace=trace)
        for shown in selected if as_json else tree_order(selected):
            _emit(shown, as_json=as_json, details=not brief, color=color)
        if skipped:
            click.echo(f"({skipped} unreadable line{'s' if skipped != 1 else ''} skipped)", err=True)
    if not follow:
        return
    try:
        for line in follow_lines(log_path):
            record = parse_record(line)
            if record is not None and matches(record, role=role, status=status, trace=trace):
                _emit(record, as_json=as_json, details=not brief, color=color)
    except KeyboardInterrupt:
        pass
