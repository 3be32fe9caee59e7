"""A stderr flood does not hold the Docker backends (issue 13, item 4; no escape needed).

Generators whose ``finally`` raises while they are collected write "Exception ignored" tracebacks to the
real descriptor 2. After the output limit the host stops reading the attach stream; dockerd's copy of the
container's output then blocked the kill and the wait after it for the API's 30 s timeout each (measured:
61.6 s and 60.7 s for one execution). The host now closes the attach stream before it kills, kills the
container's process directly where it can see it, and uses short timeouts for the kill and the wait.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sandforge.sandbox import ErrorType, ExecutionRequest, Limits, SandboxConfig
from sandforge.sandbox.backends.docker_backend import AttachIO, DockerBackend

FLOOD = """
def gen():
    try:
        yield 1
    finally:
        raise ValueError('x' * 4000000)
while True:
    g = gen()
    next(g)
"""


@pytest.fixture(params=[pytest.param("docker", marks=pytest.mark.docker),
                        pytest.param("gvisor", marks=[pytest.mark.docker, pytest.mark.gvisor])])  # fmt: skip
def backend(request: pytest.FixtureRequest, docker_env: object) -> Iterator[DockerBackend]:
    b = DockerBackend(SandboxConfig(pool_size=0), runtime="runsc" if request.param == "gvisor" else None)
    try:
        yield b
    finally:
        b.close()


@pytest.mark.timeout(40)  # the old behaviour took ~60 s per execution
def test_a_stderr_flood_ends_at_the_output_limit_and_the_stream_is_closed_before_the_kill(
    backend: DockerBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    close = AttachIO.close

    def spy_close(io: AttachIO) -> None:
        events.append("closed")
        close(io)

    monkeypatch.setattr(AttachIO, "close", spy_close)
    quick = backend.quick_api()
    kill = quick.kill

    def spy_kill(*args: Any, **kwargs: Any) -> Any:
        events.append("engine kill")
        return kill(*args, **kwargs)

    monkeypatch.setattr(quick, "kill", spy_kill)
    for _ in range(3):
        events.clear()
        worker = backend.spawn(Limits(timeout_s=10))
        out = worker.execute(ExecutionRequest(code=FLOOD, limits=Limits(timeout_s=10)), None)
        assert out.error_type == ErrorType.OUTPUT_LIMIT, (out.error_type, out.error_message)
        assert "Exception ignored" in out.stderr
        assert events and events[0] == "closed", events  # never a kill while dockerd waits on our reading
        if worker.verified_from_host:  # runc on this machine: killed through its pid, not through dockerd
            assert "engine kill" not in events, events
