"""``run_tool_code`` with files (issue 41), in-process through the SDK's client: input files as base64
arguments, the outputs/ files of an ok run as content items (PNG, JPEG and SVG as images, the rest as
embedded resources) beside a structured listing with sizes and sha256; a failed run gives none."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from pathlib import Path
from typing import Any

from mcp import Client

from sandforge.runtime.service.mcp import TenantMCP
from sandforge.runtime.service.tenants import standalone_tenant

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
PROGRAM = """
with open("inputs/data.csv") as f:
    n = len(f.read().splitlines())
with open("outputs/chart.png", "wb") as f:
    f.write(bytes(args[0]))
with open("outputs/count.csv", "w") as f:
    f.write("n\\n" + str(n))
if kwargs.get("fail"):
    raise ValueError("after writing")
return n
"""


def test_run_tool_code_takes_files_and_gives_images_and_resources(tenant_a: Path) -> None:
    results: list[Any] = []
    arguments = {"code": PROGRAM, "args": [list(PNG)], "files": {"data.csv": base64.b64encode(b"a\nb\n").decode()}}

    async def main() -> None:
        async with Client(TenantMCP(standalone_tenant("a", tenant_a, backend="subprocess"))) as client:
            results.append(await client.call_tool("run_tool_code", arguments))
            results.append(await client.call_tool("run_tool_code", {**arguments, "kwargs": {"fail": True}}))
            results.append(await client.call_tool("run_tool_code", {**arguments, "files": {"../x": ""}}))

    asyncio.run(main())
    ok, failed, bad = results
    assert not ok.is_error, ok.content
    assert ok.structured_content["value"] == 2
    listed = {f["name"]: f for f in ok.structured_content["files"]}
    assert listed["chart.png"]["sha256"] == hashlib.sha256(PNG).hexdigest() and listed["chart.png"]["size"] == len(PNG)
    assert listed["chart.png"]["uri"].startswith("sandforge://files/f_")  # kept: a resource, a later run's input
    kinds = [item.type for item in ok.content]
    assert kinds == ["text", "image", "resource"], kinds
    image, resource = ok.content[1], ok.content[2]
    assert image.mime_type == "image/png" and base64.b64decode(image.data) == PNG
    assert str(resource.resource.uri) == "sandforge://outputs/count.csv" and resource.resource.mime_type == "text/csv"
    assert base64.b64decode(resource.resource.blob) == b"n\n2"
    assert failed.is_error and {item.type for item in failed.content} == {"text"}
    assert bad.is_error and "invalid_request" in bad.content[0].text and "files" in bad.content[0].text


def test_run_tool_code_takes_a_stored_file_by_its_resource_uri(tenant_a: Path, tmp_path: Path) -> None:
    mine = standalone_tenant("a", tenant_a, backend="subprocess")
    other = standalone_tenant("b", tmp_path / "b", backend="subprocess")
    stored = mine.uploads.put("data.csv", b"a\nb\nc\n")
    theirs = other.uploads.put("data.csv", b"secret\n")
    uri = f"sandforge://files/{stored.id}"
    results: list[Any] = []

    async def main() -> None:
        async with Client(TenantMCP(mine)) as client:
            templates = [str(t.uri_template) for t in (await client.list_resource_templates()).resource_templates]
            assert "sandforge://files/{id}" in templates, templates
            read = await client.read_resource(uri)
            results.append(base64.b64decode(read.contents[0].blob))
            for ref in (uri, stored.id, f"sandforge://files/{theirs.id}", "sandforge://files/nothing"):
                args = {"code": PROGRAM, "args": [list(PNG)], "file_refs": {"data.csv": ref}}
                results.append(await client.call_tool("run_tool_code", args))
            # an output of one run is the input of the next, by its kept file's URI
            kept = {f["name"]: f["uri"] for f in results[1].structured_content["files"]}
            chained = {"code": PROGRAM, "args": [list(PNG)], "file_refs": {"data.csv": kept["count.csv"]}}
            assert (await client.call_tool("run_tool_code", chained)).structured_content["value"] == 2
            try:
                await client.read_resource(f"sandforge://files/{theirs.id}")
            except Exception as exc:  # the SDK raises the server's error answer
                results.append(str(exc))

    asyncio.run(main())
    body, by_uri, by_id, other_tenants, made_up, refused = results
    assert body == b"a\nb\nc\n"
    assert by_uri.structured_content["value"] == 3 and by_id.structured_content["value"] == 3
    for failed in (other_tenants, made_up):  # another tenant's file is not found, as a made-up one
        assert failed.is_error and "no such stored file" in failed.content[0].text, failed.content
    assert "no such stored file" in refused


LABELS = """
with open("outputs/chart.png", "wb") as f:
    f.write(b"<html><script>alert(1)</script></html>")
with open("outputs/active.svg", "w") as f:
    f.write('<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"/>')
with open("outputs/plain.svg", "w") as f:
    f.write('<svg xmlns="http://www.w3.org/2000/svg"><rect width="1" height="1"/></svg>')
with open("outputs/real.png", "wb") as f:
    f.write(bytes(args[0]))
return 1
"""


def test_only_bytes_that_really_are_an_image_become_image_content(tenant_a: Path) -> None:
    results: list[Any] = []

    async def main() -> None:
        async with Client(TenantMCP(standalone_tenant("a", tenant_a, backend="subprocess"))) as client:
            results.append(await client.call_tool("run_tool_code", {"code": LABELS, "args": [list(PNG)]}))

    asyncio.run(main())
    (ok,) = results
    assert not ok.is_error, ok.content
    items = {str(item.resource.uri).rsplit("/", 1)[-1] if item.type == "resource" else item.mime_type: item
             for item in ok.content[1:]}  # fmt: skip
    assert sorted(items) == ["active.svg", "chart.png", "image/png", "image/svg+xml"], sorted(items)
    assert base64.b64decode(items["image/png"].data) == PNG
    assert b"<rect" in base64.b64decode(items["image/svg+xml"].data)
    assert items["chart.png"].resource.mime_type == "application/octet-stream"  # HTML named .png: not an image
    assert items["active.svg"].resource.mime_type == "image/svg+xml"  # an SVG, but active: a resource, never shown
    listed = {f["name"]: f["media_type"] for f in ok.structured_content["files"]}
    assert listed["chart.png"] == "application/octet-stream" and listed["real.png"] == "image/png"
