"""Issue 39 item 3: ``POST /v1/exec`` with ``Accept: text/event-stream`` streams the first build of the
program's environment as ``progress`` events, then the answer as one ``result`` event (the status and body the
plain answer has); a cached environment streams the result alone, and without the header nothing changes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import yaml

from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config
from tests.environments.helpers import WHEELHOUSE_ALLOW, require_wheelhouse

DATEUTIL = """# /// script
# dependencies = ["python-dateutil>=2.8"]
# ///
from dateutil import parser
return parser.parse(args[0]).isoformat()
"""
STREAM = {"accept": "text/event-stream"}


def _events(text: str) -> list[tuple[str, Any]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_a_first_build_streams_progress_then_the_answer(tmp_path: Path) -> None:
    house = require_wheelhouse()
    (tmp_path / "deps").mkdir()
    section = {"allow": list(WHEELHOUSE_ALLOW), "source": "offline", "wheelhouse": str(house)}
    (tmp_path / "deps" / "deps.yaml").write_text(yaml.safe_dump({"dependencies": section}))
    token = new_token()
    config = parse_server_config(
        {"state_dir": str(tmp_path / "state"),
         "tenants": [{"name": "t", "token_hashes": [hash_token(token)], "policy": ["deps"]}]},
        base=tmp_path,
    )  # fmt: skip
    app = create_app(config, audit=AuditLog(None))

    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app.state.gate)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=300,
                                     headers={"Authorization": f"Bearer {token}"}) as client:  # fmt: skip
            bodies = [({"code": DATEUTIL, "args": ["5 March 2024"]}, STREAM),
                      ({"code": DATEUTIL, "args": ["6 March 2024"]}, STREAM),
                      ({"code": DATEUTIL, "args": ["7 March 2024"]}, {}),
                      ({"code": DATEUTIL, "args": "not a list"}, STREAM)]  # fmt: skip
            return [await client.post("/v1/exec", json=body, headers=headers) for body, headers in bodies]

    try:
        first, cached, plain, invalid = asyncio.run(main())
    finally:
        app.state.service.runtimes.close()
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/event-stream")
    events = _events(first.text)
    progress, (last_name, last) = events[:-1], events[-1]
    messages = [data["message"] for name, data in progress if name == "progress"]
    assert messages and messages[0].startswith("resolving python-dateutil"), events
    assert any(m.startswith("installing ") for m in messages), messages
    assert [data["step"] for _, data in progress] == list(range(1, len(progress) + 1))
    assert last_name == "result" and last["status"] == 200 and last["body"]["value"] == "2024-03-05T00:00:00"
    assert str(tmp_path) not in first.text
    assert _events(cached.text) == [("result", {"status": 200, "body": _events(cached.text)[0][1]["body"]})]
    assert _events(cached.text)[0][1]["body"]["value"] == "2024-03-06T00:00:00"
    assert (
        plain.headers["content-type"].startswith("application/json") and plain.json()["value"] == "2024-03-07T00:00:00"
    )
    ((name, data),) = _events(invalid.text)
    assert invalid.status_code == 200 and name == "result" and data["status"] == 422
    assert data["body"]["error"]["type"] == "invalid_request"
