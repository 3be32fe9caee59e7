"""A real `sandforge serve` process on loopback for the tests (and bench/bench_serve.py)."""

from __future__ import annotations

import os
import signal
import socket
import ssl
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
    """What `sandforge tokens create TENANT` does (tests/service/test_tokens_json.py runs the command itself),
    in this process: a CLI start costs ~0.4 s of CPU, and every server the tests start gives each tenant one."""
    from sandforge.runtime.files import exclusive
    from sandforge.runtime.service.tenants import edit_token_hashes, hash_token, new_token

    token = new_token()
    with exclusive(config):
        edit_token_hashes(config, tenant=tenant, add=hash_token(token), create=False)
    return token


@dataclass
class Server:
    root: Path
    config: Path
    port: int
    proc: subprocess.Popen[bytes]
    tokens: dict[str, str] = field(default_factory=dict)
    #: https when started with a certificate; ``verify`` then trusts it (and only it)
    scheme: str = "http"
    verify: ssl.SSLContext | bool = True

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def client(self, tenant: str | None = None, token: str | None = None, **kwargs: Any) -> httpx.Client:
        token = token if token is not None else (self.tokens[tenant] if tenant else None)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=kwargs.pop("timeout", 60.0), verify=self.verify,
                            **kwargs)  # fmt: skip

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


def start_server(
    root: Path, config: dict[str, Any], *, env: dict[str, str] | None = None, tls: tuple[Path, Path] | None = None
) -> Server:
    """Write ``config`` as server.yaml under ``root``, give every tenant a token, start the server, wait for
    /healthz. ``tls``: (certificate, key) to serve https with (the certificate is the CA clients trust)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "server.yaml"
    path.write_text(yaml.safe_dump(config))
    tokens = {t["name"]: create_token(path, t["name"]) for t in config.get("tenants", [])}
    port = free_port()
    log = (root / "serve.log").open("wb")
    options = ["--ssl-certfile", str(tls[0]), "--ssl-keyfile", str(tls[1])] if tls else []
    proc = subprocess.Popen(
        [SANDFORGE, "serve", "--port", str(port), "--config", str(path), "--log-level", "info", *options],
        stdout=log, stderr=subprocess.STDOUT, cwd=root, env={**os.environ, **(env or {})},
    )  # fmt: skip
    trust = ("https", ssl.create_default_context(cafile=str(tls[0]))) if tls else ()
    server = Server(root, path, port, proc, tokens, *trust)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {server.log()}")
        try:
            if httpx.get(server.url + "/healthz", timeout=1.0, verify=server.verify).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"the server did not come up: {server.log()}")
