"""Running the app on uvicorn with a graceful shutdown.

On SIGINT/SIGTERM the gatekeeper starts draining at once (new /v1 requests: 503, /healthz: 503 "draining"),
uvicorn stops accepting connections and waits ``shutdown_grace_s`` for in-flight requests; then the app's
lifespan waits for executions still running (each ends by its own timeout at the latest) and closes every
tenant's runtime, so no worker, container or temporary directory outlives the process.
"""

from __future__ import annotations

import gc
import logging
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.coalesce import CoalescingHttpProtocol
from sandforge.runtime.service.gate import Gatekeeper
from sandforge.runtime.service.memory import cap_malloc_arenas
from sandforge.runtime.service.tenants import ServerConfig

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """A uvicorn server that tells the gatekeeper to drain as soon as the exit signal arrives."""

    def __init__(self, config: uvicorn.Config, gate: Gatekeeper) -> None:
        super().__init__(config)
        self.gate = gate

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.gate.draining = True
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signal once it has shut down; a graceful stop is a normal exit (status 0)
        self._captured_signals.clear()


def freeze_startup_objects() -> None:
    """Move what the server made while starting (modules, the app, models: about 150,000 objects) out of the
    cyclic collector's reach: each full collection then walks only what came after, not the whole heap again
    (unfrozen, one took about 100 ms of the event loop every thousand or so requests). Garbage that starting
    left behind is collected first, so nothing that could be freed is frozen."""
    gc.collect()
    gc.freeze()


def build_server(
    config: ServerConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8700,
    ssl_certfile: Path | None = None,
    ssl_keyfile: Path | None = None,
    log_level: str = "warning",
    config_path: Path | None = None,
) -> DrainingServer:
    cap_malloc_arenas()  # before the server's threads exist: its heap then stops growing (see .memory)
    app = create_app(config, config_path=config_path)
    freeze_startup_objects()
    gate: Gatekeeper = app.state.gate
    options: dict[str, Any] = {}
    if ssl_certfile is not None:
        options["ssl_certfile"] = str(ssl_certfile)
    if ssl_keyfile is not None:
        options["ssl_keyfile"] = str(ssl_keyfile)
    uv_config = uvicorn.Config(
        gate, host=host, port=port, lifespan="on", log_level=log_level, access_log=False,
        timeout_graceful_shutdown=int(max(1, config.shutdown_grace_s)), server_header=False,
        http=CoalescingHttpProtocol, **options,
    )  # fmt: skip
    return DrainingServer(uv_config, gate)
