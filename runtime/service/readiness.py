"""``/readyz``: every backend the server's tenants use runs a trivial program (through a probe sandbox of
its own, cold, nothing persisted). Results are cached for ``TTL_S`` so a busy orchestrator cannot turn
readiness checks into a sandbox flood."""

from __future__ import annotations

import threading
import time

from sandforge.runtime.service.tenants import ServerConfig
from sandforge.sandbox import ExecutionRequest, Sandbox, SandboxConfig

TTL_S = 10.0


class ReadinessProbe:
    def __init__(self, config: ServerConfig) -> None:
        self.backends = sorted({config.backend, *(t.backend for t in config.tenants if t.backend)})
        self._lock = threading.Lock()
        self._sandbox: Sandbox | None = None
        self._report: dict[str, str] = {}
        self._at = -TTL_S
        self._closed = False

    def check(self) -> dict[str, str]:
        with self._lock:
            if self._closed:
                return {name: "shutting down" for name in self.backends}
            if time.monotonic() - self._at < TTL_S:
                return dict(self._report)
            if self._sandbox is None:
                self._sandbox = Sandbox(SandboxConfig.from_env(pool_size=0))
            report: dict[str, str] = {}
            for name in self.backends:
                outcome = self._sandbox.execute(ExecutionRequest(code="return 1"), backend=name)
                report[name] = "ok" if outcome.ok and outcome.value == 1 else (outcome.error_message or "failed")
            self._report, self._at = report, time.monotonic()
            return dict(report)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            sandbox.close()
