"""The deployed stack (deploy/compose.yaml on the service image), started once per test session by pytest-docker.

The image is built from this tree (``sandforge image build --service``); the stack is brought up with whichever
compose is installed (``docker compose`` or Debian's ``docker-compose``) on an ephemeral loopback port, under a
project name of its own, and brought down at the end of the session: the teardown itself is checked (no
container or network of the project left, and of volumes only the named state volume, which is then removed).
Skips without an engine or compose; fails instead under ``SANDFORGE_REQUIRE_DOCKER=1`` (CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REQUIRE_DOCKER, container_unavailable

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "deploy" / "compose.yaml"


def _unavailable(reason: str) -> None:
    if REQUIRE_DOCKER:
        pytest.fail(f"the compose stack is required (SANDFORGE_REQUIRE_DOCKER=1) but {reason}")
    pytest.skip(reason)


def compose_command() -> str:
    """``docker compose`` (v2) where the plugin is installed, else Debian's ``docker-compose`` (v1)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0:
        return "docker compose"
    if shutil.which("docker-compose"):
        return "docker-compose"
    _unavailable("neither `docker compose` nor `docker-compose` is installed (apt-get install docker-compose)")
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def service_image() -> str:
    if (reason := container_unavailable("docker")) is not None:
        _unavailable(f"the Docker engine is unavailable: {reason}")
    from sandforge.runtime.deploy.service_image import build_service
    from sandforge.sandbox.docker_engine import connect

    return build_service(connect(None)).tag


@dataclass
class Stack:
    """The running stack: its compose invocation, the service's URL and container, the tenants' tokens."""

    compose: str
    project: str
    env: dict[str, str]
    url: str = ""
    tokens: dict[str, str] | None = None

    def run(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        cmd = [*self.compose.split(), "-f", str(COMPOSE_FILE), "-p", self.project, *args]
        done = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {done.returncode}: {done.stdout}{done.stderr}")
        return done

    @property
    def container(self) -> str:
        return self.run("ps", "-q", "sandforge").stdout.strip()

    def exec(self, *argv: str) -> str:
        return self.run("exec", "-T", "sandforge", *argv).stdout

    def health(self, container: str) -> str:
        """The container's health status, asked of the engine (a compose command is ~0.5 CPU-s: poll this)."""
        out = subprocess.run(["docker", "inspect", "-f", "{{.State.Health.Status}}", container],
                             capture_output=True, text=True, check=False)  # fmt: skip
        return out.stdout.strip()

    def wait_healthy(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        container = self.container
        while (status := self.health(container)) != "healthy":
            if time.monotonic() > deadline:
                raise AssertionError(f"the service is {status!r} after {timeout:g} s:\n{self.run('logs').stdout}")
            time.sleep(0.5)
        port = self.run("port", "sandforge", "8700").stdout.strip().rsplit(":", 1)[1]
        self.url = f"http://127.0.0.1:{port}"

    def client(self, tenant: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[tenant]}"} if tenant and self.tokens else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kwargs)


def stack_env(image: str, **extra: str) -> dict[str, str]:
    # compose v1 reads a seccomp profile relative to its working directory, v2 relative to the file: absolute here
    return {**os.environ, "SANDFORGE_SERVICE_IMAGE": image, "SANDFORGE_PORT": "0", "SANDFORGE_HEALTH_INTERVAL": "2s",
            "SANDFORGE_SECCOMP": str(COMPOSE_FILE.parent / "seccomp.json"), **extra}  # fmt: skip


def leftovers(project: str) -> dict[str, list[str]]:
    """What of ``project`` is still on the engine: containers, networks, volumes (by compose's labels)."""
    label = f"label=com.docker.compose.project={project}"

    def names(*argv: str) -> list[str]:
        out = subprocess.run(["docker", *argv, "--filter", label], capture_output=True, text=True, check=True)
        return sorted(line for line in out.stdout.splitlines() if line)

    return {"containers": names("ps", "-a", "--format", "{{.Names}}"),
            "networks": names("network", "ls", "--format", "{{.Name}}"),
            "volumes": names("volume", "ls", "--format", "{{.Name}}")}  # fmt: skip


@pytest.fixture(scope="session")
def docker_compose_command() -> str:
    return compose_command()


@pytest.fixture(scope="session")
def docker_compose_file() -> str:
    return str(COMPOSE_FILE)


@pytest.fixture(scope="session")
def docker_compose_project_name() -> str:
    return f"sfdeploy{os.getpid()}"


@pytest.fixture(scope="session")
def docker_setup() -> list[str]:
    return ["up -d"]  # compose v1 has no --wait: the stack fixture waits for the health check


@pytest.fixture(scope="session")
def docker_cleanup() -> list[str]:
    return ["down"]  # keeps the named volume: the teardown check below looks for what else is left


@pytest.fixture(scope="module")  # down after its file: a stack left up checks its health every 2 s until the run ends
def stack(
    service_image: str, docker_compose_command: str, docker_compose_project_name: str, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    env = stack_env(service_image)
    saved = {k: os.environ.get(k) for k in env if os.environ.get(k) != env[k]}
    os.environ.update(env)  # pytest-docker runs compose through the shell with this process's environment
    try:
        with _services(request) as _:
            s = Stack(docker_compose_command, docker_compose_project_name, env)
            s.wait_healthy()
            s.tokens = {t: s.exec("cat", f"/var/lib/sandforge/initial-tokens/{t}.token").strip()
                        for t in ("acme", "globex")}  # fmt: skip
            yield s
        left = leftovers(docker_compose_project_name)
        assert left == {"containers": [], "networks": [], "volumes": [f"{docker_compose_project_name}_state"]}, left
    finally:
        subprocess.run(["docker", "volume", "rm", "-f", f"{docker_compose_project_name}_state"],
                       capture_output=True, check=False)  # fmt: skip
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _services(request: pytest.FixtureRequest) -> Any:
    """pytest-docker's ``docker_services`` context (its fixture, entered here so the teardown can be checked)."""
    from pytest_docker.plugin import get_docker_services

    return get_docker_services(
        request.getfixturevalue("docker_compose_command"),
        request.getfixturevalue("docker_compose_file"),
        request.getfixturevalue("docker_compose_project_name"),
        request.getfixturevalue("docker_setup"),
        request.getfixturevalue("docker_cleanup"),
    )
