"""A client that goes away before its ``POST /v1/exec`` is answered ends the execution (issue 24's contract on
the HTTP side).

uvicorn does not cancel a request's task when its connection is lost: the app runs on and its answer is
dropped. For ``/v1/exec`` that left the program running to its own time limit (up to the tenant's
``max_timeout_s``), holding an execution slot and the tenant's concurrency quota for nobody. Now the request is
cancelled: the awaited execution ends as a timeout would (worker killed, cleaned up), the slot and quota are
released, and the audit line says ``client_disconnected`` (status 499), with no traceback in the log.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import psutil
import pytest

from tests.service.serverproc import Server, start_server

pytestmark = pytest.mark.slow

SPIN = "while True:\n    pass"
#: a hang guard, far below the program's own 600 s limit: what is still running after it was not ended
GUARD_S = 60.0


def sandboxes(server: Server) -> set[int]:
    """The server's descendants: its zygotes, and the sandboxes they start (a runner the zygote clones as the
    server's own child, or the zygote's descendants where it cannot)."""
    try:
        return {p.pid for p in psutil.Process(server.proc.pid).children(recursive=True)}
    except psutil.Error:
        return set()


def running(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def spinning(server: Server, before: set[int]) -> set[int]:
    """The new processes that have burnt a second of CPU (the program runs): a zygote started for the call
    meanwhile stays, and is not the program."""
    deadline = time.monotonic() + GUARD_S
    while time.monotonic() < deadline:
        burning = set()
        for pid in sandboxes(server) - before:
            try:
                if psutil.Process(pid).cpu_times().user > 1.0:
                    burning.add(pid)
            except psutil.NoSuchProcess:
                continue
        if burning:
            return burning
        time.sleep(0.05)
    raise AssertionError("the program did not start")


def post_exec(server: Server, token: str, body: dict[str, object]) -> socket.socket:
    raw = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    head = (f"POST /v1/exec HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n")  # fmt: skip
    sock.sendall(head.encode() + raw)
    return sock


def audit_lines(server: Server) -> list[dict[str, object]]:
    path = server.root / "state" / "audit.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_client_gone_before_its_answer_ends_the_execution_and_frees_its_slot(tmp_path: Path) -> None:
    config = {"state_dir": "state", "pool_size": 0,
              "tenants": [{"name": "t", "quotas": {"max_timeout_s": 600, "concurrent_executions": 1}}]}  # fmt: skip
    server = start_server(tmp_path / "serve", config)
    try:
        before = sandboxes(server)
        sock = post_exec(server, server.tokens["t"], {"code": SPIN, "timeout_s": 600})
        program = spinning(server, before)
        sock.close()
        deadline = time.monotonic() + GUARD_S
        while running(program) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(program), "the gone client's program still runs"
        while not audit_lines(server) and time.monotonic() < deadline:  # written once the request has unwound
            time.sleep(0.05)
        [line] = audit_lines(server)
        assert line["outcome"] == "client_disconnected" and line["status"] == 499 and line["tenant"] == "t"
        with server.client("t") as client:  # the tenant's single concurrent execution is free again
            answer = client.post("/v1/exec", json={"code": "return 1"})
        assert answer.status_code == 200 and answer.json()["value"] == 1, answer.text
    finally:
        server.stop()
    assert "Exception in ASGI application" not in server.log() and "Traceback" not in server.log()
