"""The Docker engine's API client: connecting, and removing a container. Shared by the docker/gvisor
backends and the leftovers reaper (``sandbox/leftovers.py``), which must not import a backend."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from sandforge.sandbox.containers import LABEL
from sandforge.sandbox.errors import SandboxUnavailable

log = logging.getLogger(__name__)

API_TIMEOUT_S = 30.0


def engine_errors() -> tuple[type[BaseException], ...]:
    import docker.errors
    import requests

    return (docker.errors.DockerException, requests.exceptions.RequestException)


def connect(base_url: str | None = None, timeout: float = API_TIMEOUT_S, max_pool_size: int = 10) -> Any:
    """A low-level Docker API client with the engine's API version negotiated; SandboxUnavailable if down."""
    import docker

    try:
        if base_url:
            return docker.APIClient(
                base_url=base_url, version="auto", timeout=int(timeout), max_pool_size=max_pool_size
            )
        return docker.from_env(version="auto", timeout=int(timeout), max_pool_size=max_pool_size).api
    except engine_errors() as exc:
        where = base_url or os.environ.get("DOCKER_HOST") or "the default socket"
        raise SandboxUnavailable(
            f"Docker engine unreachable at {where}: {exc} (is dockerd running?)", retriable=True
        ) from exc


# --- container removal, off the hot path --------------------------------------------------------------


def remove_container(api: Any, cid: str) -> bool:
    """Remove (and so kill) a container; False when the engine would not, after three tries."""
    import docker.errors

    for attempt in range(3):
        try:
            api.remove_container(cid, force=True, v=True)
            return True
        except docker.errors.NotFound:
            return True
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and "already in progress" in str(exc):
                return True
            log.debug("removing container %s failed (attempt %d): %s", cid[:12], attempt + 1, exc)
        except engine_errors() as exc:
            log.debug("removing container %s failed (attempt %d): %s", cid[:12], attempt + 1, exc)
        time.sleep(0.2 * (attempt + 1))
    log.warning("could not remove sandbox container %s; it is labelled %s=1 for later reaping", cid[:12], LABEL)
    return False
