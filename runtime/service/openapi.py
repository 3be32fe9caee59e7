"""The OpenAPI document of the HTTP API, as committed in docs/api/openapi.json.

Regenerate after changing a route or model: ``python -m sandforge.runtime.service.openapi > docs/api/openapi.json``
(tests/service/test_openapi.py fails while the committed file differs)."""

from __future__ import annotations

import json
import sys
from typing import Any

from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.tenants import ServerConfig


def openapi_document() -> dict[str, Any]:
    document: dict[str, Any] = create_app(ServerConfig()).openapi()
    return document


def render() -> str:
    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
