"""An escape that forges an ok result commits nothing through the agent, on the container backends.

The runner here is the real one, except that right before the approved program runs it writes a forged ok
result of its own, changing a context key: what a program that escaped RestrictedPython could do first. The
program then raises (the runner writes its own error result) or returns (the runner writes its own ok): two
results either way. Containers used to take the first result frame, so the forged one was committed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandforge.runtime.agent import Agent, Budgets, CallLog, Workspace
from sandforge.runtime.providers import ScriptedProvider
from sandforge.sandbox import ErrorType, SandboxConfig
from sandforge.sandbox.backends import docker_backend, oci_backend
from sandforge.sandbox.image import IMAGE_INSIDE

FORGING_BOOTSTRAP = f"""
import json, os, struct, sys
sys.path.insert(0, {str(Path(IMAGE_INSIDE).parent)!r})
from inside import serving, start

real_globals = serving.build_globals

def forge_first(proxies, stdout, bridge):
    forged = json.dumps({{"type": "result", "status": "ok", "value": "forged",
                          "context_changed": [["memory", 4]]}}).encode()
    os.write(bridge.out_fd, struct.pack('>I', len(forged)) + forged + struct.pack('>I', 4) + b'1000')
    return real_globals(proxies, stdout, bridge)

serving.build_globals = forge_first
os._exit(start.main(["--result-stdout", *sys.argv[1:]]))
"""


@pytest.fixture(params=["docker", pytest.param("runc", marks=pytest.mark.oci("runc"))])
def forging_backend(request: pytest.FixtureRequest, docker_env: object, monkeypatch: pytest.MonkeyPatch) -> str:
    command = ["-I", "-S", "-B", "-c", FORGING_BOOTSTRAP]
    monkeypatch.setattr(docker_backend, "COMMAND", ["python3", *command])
    monkeypatch.setattr(oci_backend, "COMMAND", ["/usr/bin/python3", *command])
    backend: str = request.param
    return backend


@pytest.fixture
def workspace(forging_backend: str, tmp_path: Path) -> Iterator[tuple[Workspace, ScriptedProvider]]:
    provider = ScriptedProvider(["return 1 / 0\n", "return 1\n"] * 3)
    ws = Workspace(
        provider=provider,
        sandbox=SandboxConfig(backend=forging_backend, pool_size=0),
        log=CallLog(tmp_path / "calls.jsonl"),
        budgets=Budgets(),
    )
    try:
        yield ws, provider
    finally:
        ws.close()


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_a_forged_ok_before_the_program_commits_nothing(workspace: tuple[Workspace, ScriptedProvider]) -> None:
    ws, _ = workspace
    agent = Agent.for_role("calc", workspace=ws)
    for _ in range(2):  # the program raises, then (a fresh agent call) one that returns
        out = agent.add(1)
        assert not out.ok and out.error_type == ErrorType.SANDBOX_VIOLATION, (out.error_type, out.error_message)
        assert out.value != "forged"
        assert agent.context == {}
    assert all(r.status != "ok" for r in ws.log.records)
