"""The server process under load and at shutdown: /healthz while every slot is busy, a graceful stop with a
call in flight that leaves no worker process, container or temporary directory behind."""

from __future__ import annotations

import contextlib
import socket
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from tests.service.serverproc import start_server

pytestmark = pytest.mark.slow

SPIN = "while True:\n    pass\n"


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _wait_running(pid: int, count: int, futures: list[Future[httpx.Response]]) -> None:
    """Until the server has at least ``count`` descendants (workers spinning) while the calls are pending."""
    for _ in range(600):
        if len(_tree(pid)) >= count:
            return
        assert not any(f.done() for f in futures), [f.result().text for f in futures if f.done()]
        psutil.Process(pid).children()  # raises if the server died
        time.sleep(0.05)
    raise AssertionError("the executions never started")


def _wait_spinning(pid: int, futures: list[Future[httpx.Response]]) -> None:
    """Until one of the server's descendants is spinning (has used CPU time): a warm pool's idle worker or its
    zygote is a descendant too, so counting processes can return before the execution reached the server."""
    for _ in range(600):
        for proc in _tree(pid):
            with contextlib.suppress(psutil.Error):
                if proc.cpu_times().user >= 0.3:
                    return
        assert not any(f.done() for f in futures), [f.result().text for f in futures if f.done()]
        time.sleep(0.05)
    raise AssertionError("the execution never started")


def test_healthz_answers_while_every_execution_slot_is_busy(tmp_path: Path) -> None:
    server = start_server(
        tmp_path,
        {"state_dir": "state", "execution_slots": 2, "pool_size": 0,
         "tenants": [{"name": "t", "quotas": {"concurrent_executions": 4}}]},
    )  # fmt: skip
    try:
        with server.client("t") as client, ThreadPoolExecutor(3) as pool:
            # 5 s: long enough to ask while both slots spin, short enough that the queued third one adds 5 s, not 10
            busy = [pool.submit(client.post, "/v1/exec", json={"code": SPIN, "timeout_s": 5}) for _ in range(3)]
            _wait_running(server.proc.pid, 2, busy)
            health = httpx.get(server.url + "/healthz", timeout=30)
            tools = client.get("/v1/tools")  # store reads do not take an execution slot either
            assert health.status_code == 200 and health.json() == {"status": "ok"}
            assert tools.status_code == 200
            assert not any(f.done() for f in busy)  # answered while all slots spun
            for f in busy:
                assert f.result().json()["error_type"] == "timeout"
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("backend", ["subprocess", pytest.param("docker", marks=pytest.mark.docker)])
def test_graceful_shutdown_finishes_calls_in_flight_and_leaves_nothing(tmp_path: Path, backend: str) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    server = start_server(
        tmp_path,
        {"state_dir": "state", "backend": backend, "pool_size": 1, "shutdown_grace_s": 20,
         "tenants": [{"name": "t"}]},
        env={"TMPDIR": str(scratch)},
    )  # fmt: skip
    owner = f"{socket.gethostname()}:{server.proc.pid}:{psutil.Process(server.proc.pid).create_time():.2f}"
    try:
        with server.client("t") as client, ThreadPoolExecutor(1) as pool:
            assert client.post("/v1/exec", json={"code": "return 1"}).json()["value"] == 1  # pools are warm
            in_flight = pool.submit(client.post, "/v1/exec", json={"code": SPIN, "timeout_s": 6})
            if backend == "subprocess":
                _wait_spinning(server.proc.pid, [in_flight])
            else:  # containers are the engine's children, not the server's: give the call time to start
                time.sleep(2)
                assert not in_flight.done()
            descendants = _tree(server.proc.pid)
            server.proc.terminate()
            response = in_flight.result(timeout=60)
            assert response.status_code == 200 and response.json()["error_type"] == "timeout"
            with pytest.raises(httpx.HTTPError):  # new requests are refused: not listening any more
                for _ in range(50):
                    later = httpx.post(server.url + "/v1/exec", json={"code": "return 1"}, timeout=5,
                                       headers={"Authorization": f"Bearer {server.tokens['t']}"})  # fmt: skip
                    assert later.status_code == 503
        assert server.proc.wait(60) == 0
    finally:
        server.stop()
    assert not [p for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("sandforge")], list(scratch.iterdir())
    if backend == "docker":
        import docker

        api = docker.from_env()
        try:
            left = api.containers.list(all=True, filters={"label": f"sandforge.owner={owner}"})
        finally:
            api.close()
        assert left == []


def test_a_call_longer_than_the_grace_period_is_ended_and_leaves_nothing(tmp_path: Path) -> None:
    """Shutdown past ``shutdown_grace_s``: the execution still running is ended (its worker killed, as a timeout
    would), the server exits cleanly long before the program's own time limit, and nothing survives it."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    server = start_server(
        tmp_path,
        {"state_dir": "state", "pool_size": 1, "shutdown_grace_s": 1,
         "tenants": [{"name": "t", "quotas": {"max_timeout_s": 300}}]},
        env={"TMPDIR": str(scratch)},
    )  # fmt: skip
    try:
        with server.client("t") as client, ThreadPoolExecutor(1) as pool:
            assert client.post("/v1/exec", json={"code": "return 1"}).json()["value"] == 1
            in_flight = pool.submit(client.post, "/v1/exec", json={"code": SPIN, "timeout_s": 120})
            _wait_running(server.proc.pid, 2, [in_flight])  # the spinning worker and the warm one
            descendants = _tree(server.proc.pid)
            server.proc.terminate()
            assert server.proc.wait(90) == 0  # well before the program's 120 s
            answer = in_flight.result(timeout=30)
            assert answer.status_code == 503 and answer.json()["error"]["type"] == "shutting_down", answer.text
    finally:
        server.stop()
    assert not [p for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("sandforge")], list(scratch.iterdir())
    assert "Traceback" not in server.log(), server.log()
