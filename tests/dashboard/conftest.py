"""A tenant store filled by real calls (scripted model, subprocess sandbox), served in-process."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config
from tests.dashboard.fill import fill, tenant_config


@dataclass
class Site:
    root: Path
    app: Any
    tokens: dict[str, str]
    audit_path: Path
    outcomes: list[dict[str, Any]]

    def client(self, tenant: str | None = None, *, bearer: bool = False) -> TestClient:
        """A client of the app; ``tenant``: logged in (cookie) or, with ``bearer``, with its API token."""
        c = TestClient(self.app.state.gate, base_url="https://testserver")
        if tenant is not None and bearer:
            c.headers["Authorization"] = f"Bearer {self.tokens[tenant]}"
        elif tenant is not None:
            response = c.post("/dashboard/login", data={"token": self.tokens[tenant]}, follow_redirects=False)
            assert response.status_code == 303, response.text
        return c

    def store(self, tenant: str) -> Any:
        return self.app.state.service.runtimes.get(tenant).tool_store


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("dash")
    config = tenant_config(root)
    tokens = {t["name"]: new_token() for t in config["tenants"]}
    for t in config["tenants"]:
        t["token_hashes"] = [hash_token(tokens[t["name"]])]
    audit_path = root / "audit.jsonl"
    app = create_app(parse_server_config(config, base=root), audit=AuditLog(audit_path))
    with TestClient(app.state.gate, base_url="https://testserver") as lifespan:
        lifespan.headers["Authorization"] = f"Bearer {tokens['alpha']}"
        outcomes = fill(lifespan)
        yield Site(root, app, tokens, audit_path, outcomes)
