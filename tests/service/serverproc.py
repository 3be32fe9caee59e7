"""A real `sandforge serve` process on loopback for the tests (and bench/bench_serve.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

SANDFORGE = str(Path(sys.executable).parent / "sandforge")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def create_token(config: Path, tenant: str) -> str:
    out = subprocess.run(
        [SANDFORGE, "tokens", "create", tenant, "--config", str(config)], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@dataclass
class Server:
    root: Path
    config: Path
    port: int
    proc: subprocess.Popen[bytes]
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, tenant: str | None = None, token: str | None = None, **kwargs: Any) -> httpx.Client:
        token = token if token is not None else (self.tokens[tenant] if tenant else None)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=kwargs.pop("timeout", 60.0), **kwargs)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log(self) -> str:
        return (self.root / "serve.log").read_text(errors="replace")


def start_server(root: Path, config: dict[str, Any], *, env: dict[str, str] | None = None) -> Server:
    """Write ``config`` as server.yaml under ``root``, give every tenant a token, start the server, wait for
    /healthz."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "server.yaml"
    path.write_text(yaml.safe_dump(config))
    tokens = {t["name"]: create_token(path, t["name"]) for t in config.get("tenants", [])}
    port = free_port()
    log = (root / "serve.log").open("wb")
    proc = subprocess.Popen(
        [SANDFORGE, "serve", "--port", str(port), "--config", str(path), "--log-level", "info"],
        stdout=log, stderr=subprocess.STDOUT, cwd=root, env={**os.environ, **(env or {})},
    )  # fmt: skip
    server = Server(root, path, port, proc, tokens)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {server.log()}")
        try:
            if httpx.get(server.url + "/healthz", timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"the server did not come up: {server.log()}")
