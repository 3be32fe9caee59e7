"""Issue 41 item 4 on MCP: a stored tool whose contract declares files shows them in its schemas, takes its
input files as base64 and returns its outputs as content items (a PNG as an image). In-process client."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from mcp import Client
from mcp.types import ImageContent

from sandforge.runtime.service.tenants import standalone_tenant
from sandforge.runtime.store import ToolContract
from sandforge.runtime.store.models import ToolFiles
from tests.service.mcp.test_server import run
from tests.service.mcp.test_stdio import failure, ok
from tests.store.test_health_attribution import store_program

CHARTER = ToolContract(
    role="charter", purpose="Chart a CSV",
    files=ToolFiles.model_validate({
        "takes": [{"name": "data.csv", "media_type": "text/csv"}, {"name": "extra-*.csv", "required": False}],
        "produces": [{"name": "chart.png", "media_type": "image/png"}],
    }),
)  # fmt: skip
PNG = b"\x89PNG\r\n\x1a\n"
DRAW = (
    "with open('inputs/data.csv') as f:\n"
    "    rows = f.read().splitlines()\n"
    "with open('outputs/chart.png', 'wb') as f:\n"
    f"    f.write({PNG!r} + bytes(len(rows)))\n"
    "return len(rows)\n"
)
CSV = base64.b64encode(b"a\n1\n2\n").decode()


def test_a_stored_tool_shows_takes_and_returns_its_declared_files(tmp_path: Path) -> None:
    state = tmp_path / "state"
    store_program(state, "charter", "draw", DRAW, CHARTER)
    seen: dict[str, Any] = {}

    async def body(client: Client) -> None:
        tool = {t.name: t for t in (await client.list_tools()).tools}["charter.draw"]
        seen["schema"], seen["output"] = tool.input_schema, tool.output_schema
        result = await client.call_tool("charter.draw", {"args": [], "files": {"data.csv": CSV}})
        seen["ok"], seen["content"] = ok(result), result.content
        seen["missing"] = failure(await client.call_tool("charter.draw", {"args": []}))
        seen["undeclared"] = failure(await client.call_tool("charter.draw", {"files": {"data.csv": CSV, "x.txt": ""}}))
        seen["glob"] = ok(await client.call_tool("charter.draw", {"files": {"data.csv": CSV, "extra-1.csv": CSV}}))
        seen["bad"] = failure(await client.call_tool("charter.draw", {"files": {"data.csv": "not base64!"}}))
        binary = base64.b64encode(b"\xff\xd8\xff\xe0 a JPEG, not text").decode()
        seen["mistyped"] = failure(await client.call_tool("charter.draw", {"files": {"data.csv": binary}}))

    run(standalone_tenant("a", state, backend="subprocess"), body)
    schema = seen["schema"]
    Draft202012Validator.check_schema(schema)
    files = schema["properties"]["files"]
    assert schema["required"] == ["files"] and files["required"] == ["data.csv"]
    assert files["properties"]["data.csv"]["contentMediaType"] == "text/csv" and "extra-*.csv" in files["description"]
    assert "chart.png (image/png)" in seen["output"]["properties"]["files"]["description"]
    assert seen["ok"]["value"] == 3 and [f["name"] for f in seen["ok"]["files"]] == ["chart.png"]
    assert seen["ok"]["files"][0]["uri"].startswith("sandforge://files/")  # kept as run_tool_code's outputs are
    image = [c for c in seen["content"] if isinstance(c, ImageContent)]
    assert len(image) == 1 and image[0].mime_type == "image/png"
    assert base64.b64decode(image[0].data) == PNG + bytes(3)
    assert seen["glob"]["value"] == 3
    assert "the contract declares text/csv" in seen["mistyped"]["error_message"]  # checked against the bytes
    for refused in ("missing", "undeclared", "bad", "mistyped"):
        assert seen[refused]["error_type"] == "invalid_request", seen[refused]
    assert "x.txt" in seen["undeclared"]["error_message"]
