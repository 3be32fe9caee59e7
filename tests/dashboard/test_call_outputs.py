"""The call page shows a run's image outputs (issue 41): a PNG, JPEG or SVG that ``POST /v1/exec`` kept is an
``<img>`` whose source is the dashboard's own URL behind its session (an SVG is never inlined as markup, and
is served with a CSP that runs nothing); other tenants and anonymous visitors get none of it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00\x90wS\xde"
SVG = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert("svg-ran")</script><rect width="4" height="4"/></svg>'
PROGRAM = """
with open("outputs/dot.png", "wb") as f:
    f.write(bytes(kwargs["png"]))
with open("outputs/drawing.svg", "w") as f:
    f.write(kwargs["svg"])
with open("outputs/table.csv", "w") as f:
    f.write("a,b\\n1,2\\n")
return 3
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict[str, str], str]]:
    root = tmp_path_factory.mktemp("dash-outputs")
    tokens = {name: new_token() for name in ("alpha", "beta")}
    tenants = [{"name": n, "token_hashes": [hash_token(t)], "backend": "subprocess"} for n, t in tokens.items()]
    app = create_app(parse_server_config({"state_dir": str(root / "state"), "tenants": tenants}, base=root),
                     audit=AuditLog(root / "audit.jsonl"))  # fmt: skip
    with TestClient(app.state.gate, base_url="https://testserver") as api:
        api.headers["Authorization"] = f"Bearer {tokens['alpha']}"
        ran = api.post("/v1/exec", json={"code": PROGRAM, "kwargs": {"png": list(PNG), "svg": SVG.decode()}}).json()
        assert ran["status"] == "ok", ran
        (call,) = [c for c in api.get("/v1/calls").json() if c["source"] == "http"]
        yield app, tokens, call["call_id"]


def _browser(app: Any, token: str | None) -> TestClient:
    browser = TestClient(app.state.gate, base_url="https://testserver")
    if token is not None:
        assert browser.post("/dashboard/login", data={"token": token}, follow_redirects=False).status_code == 303
    return browser


def test_the_call_page_shows_image_outputs_as_img_only(site: tuple[Any, dict[str, str], str]) -> None:
    app, tokens, call_id = site
    browser = _browser(app, tokens["alpha"])
    page = browser.get(f"/dashboard/calls/{call_id}")
    assert page.status_code == 200, page.text
    html = page.text
    base = f"/dashboard/calls/{call_id}/files"
    assert f'<img src="{base}/dot.png" alt="dot.png">' in html
    assert f'<img src="{base}/drawing.svg" alt="drawing.svg">' in html
    assert f'<img src="{base}/table.csv"' not in html and f'href="{base}/table.csv"' in html  # listed, not shown
    assert "<svg" not in html and "<script" not in html  # the SVG's markup never reaches the page unescaped
    assert "img-src 'self'" in page.headers["content-security-policy"]

    png = browser.get(f"{base}/dot.png")
    assert png.status_code == 200 and png.content == PNG and png.headers["content-type"] == "image/png"
    svg = browser.get(f"{base}/drawing.svg")
    assert svg.content == SVG and svg.headers["content-type"].startswith("image/svg+xml")
    assert svg.headers["content-security-policy"] == "default-src 'none'; sandbox"  # opened alone: runs nothing
    assert svg.headers["x-content-type-options"] == "nosniff"
    assert png.headers["content-disposition"].startswith("inline")  # the bytes are a PNG: shown
    assert svg.headers["content-disposition"].startswith("attachment")  # an SVG with a script is never shown
    csv = browser.get(f"{base}/table.csv")
    assert csv.content == b"a,b\n1,2\n" and csv.headers["content-disposition"].startswith("attachment")
    assert browser.get(f"{base}/nothing.png").status_code == 404


def test_no_other_tenant_and_no_anonymous_visitor_sees_them(site: tuple[Any, dict[str, str], str]) -> None:
    app, tokens, call_id = site
    other = _browser(app, tokens["beta"])
    assert other.get(f"/dashboard/calls/{call_id}").status_code == 404
    response = other.get(f"/dashboard/calls/{call_id}/files/dot.png")
    assert response.status_code == 404 and PNG not in response.content
    anonymous = _browser(app, None)
    response = anonymous.get(f"/dashboard/calls/{call_id}/files/dot.png", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/dashboard/login"
    with_bearer = TestClient(app.state.gate, base_url="https://testserver")  # a page route: the session, not a token
    with_bearer.headers["Authorization"] = f"Bearer {tokens['alpha']}"
    assert with_bearer.get(f"/dashboard/calls/{call_id}/files/dot.png", follow_redirects=False).status_code == 303
