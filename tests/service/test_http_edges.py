"""The HTTP API's edges, in process through the gatekeeper (issue 37, item 6): one answer per kind of bad body,
``Allow`` on every 405 (HEAD wherever GET) and HEAD on every GET route, swept over the app's own route table (a
route added later is covered without touching this file); RFC 3339 times; ``GET /v1/sessions`` paged and per
tenant; strict session bodies; the auth challenge and the OAuth paths' answer."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from starlette.routing import Route

from sandforge.runtime.service import session_models
from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.auth_challenge import LEGACY_ENDPOINTS, PROBED
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config
from sandforge.runtime.sessions.db import TITLE_MAX

#: RFC 3339's date-time with a UTC offset (what pydantic writes for an aware UTC datetime)
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
BODY_METHODS = {"POST", "PUT", "PATCH"}
#: one of each kind of bad body: not UTF-8, not JSON, JSON of the wrong shape (every body of the API is an object)
BAD_BODIES = {"not-utf8": b'{"text": "\xff\xfe"}', "not-json": b'{"text": ', "wrong-shape": b'["text", 1]'}


@dataclass
class Site:
    app: Any
    tokens: dict[str, str]

    def client(self, tenant: str | None = None) -> AbstractContextManager[TestClient]:
        """A client of the running app (entering a TestClient itself would run the app's lifespan again)."""
        client = TestClient(self.app.state.gate, base_url="http://127.0.0.1")
        if tenant is not None:
            client.headers["Authorization"] = f"Bearer {self.tokens[tenant]}"
        return nullcontext(client)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("edges")
    (root / "chat.json").write_text(json.dumps(["hello"]))
    tokens = {name: new_token() for name in ("alpha", "beta")}
    config = {
        "state_dir": str(root / "state"),
        "tenants": [
            {"name": "alpha", "token_hashes": [hash_token(tokens["alpha"])],
             "provider": {"kind": "scripted", "programs": "chat.json", "chat_script": "chat.json"}},
            {"name": "beta", "token_hashes": [hash_token(tokens["beta"])]},
        ],
    }  # fmt: skip
    app = create_app(parse_server_config(config, base=root), audit=AuditLog(None))
    with TestClient(app.state.gate):  # the lifespan: started and, at the end, shut down
        yield Site(app, tokens)


def _routes(site: Site) -> list[Route]:
    return [r for r in site.app.routes if isinstance(r, Route) and r.methods]


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def _assert_error(response: Any, status: int, error_type: str) -> None:
    assert response.status_code == status, (response.request.method, response.request.url, response.text)
    body = response.json()
    assert set(body) == {"error"} and body["error"]["type"] == error_type, body
    assert "\n" not in body["error"]["message"] and "Traceback" not in response.text


def test_every_body_route_answers_each_kind_of_bad_body_alike(site: Site) -> None:
    routes = [(m, r.path) for r in _routes(site) if r.path.startswith("/v1/") for m in sorted(r.methods & BODY_METHODS)]
    assert ("POST", "/v1/exec") in routes and ("POST", "/v1/sessions") in routes  # the sweep sees the table
    assert ("POST", "/v1/files") in routes  # an upload takes a form or raw bytes, never JSON: the same 422
    with site.client("alpha") as client:
        for method, path in routes:
            for kind, raw in BAD_BODIES.items():
                response = client.request(method, _concrete(path), content=raw,
                                          headers={"Content-Type": "application/json"})  # fmt: skip
                assert response.status_code == 422, (kind, method, path, response.text)
                _assert_error(response, 422, "invalid_request")


def test_every_405_says_what_the_path_allows(site: Site) -> None:
    by_path: dict[str, set[str]] = {}
    for route in _routes(site):
        by_path.setdefault(route.path, set()).update(route.methods or ())
    assert by_path["/v1/sessions"] >= {"GET", "POST"}  # two routes, one path: Allow names both
    assert by_path["/v1/files/{file_id}"] == {"GET", "DELETE"}
    with site.client("alpha") as client:
        for path, methods in by_path.items():
            refused = next(m for m in ("DELETE", "PATCH", "PUT", "POST", "GET") if m not in methods)
            response = client.request(refused, _concrete(path))
            _assert_error(response, 405, "method_not_allowed")
            allowed = methods | {"HEAD"} if "GET" in methods else methods  # HEAD wherever GET (RFC 9110)
            assert set(response.headers["allow"].split(", ")) == allowed, (path, response.headers["allow"])


#: the headers a HEAD answers as its GET does (RFC 9110 section 9.3.2); Content-Length only present, as live
#: pages (counts, ages) may change length between two requests (the stored file's is compared exactly below)
HEAD_HEADERS = ("content-type", "etag", "location", "www-authenticate", "cache-control")


def _assert_head_like_get(client: TestClient, path: str, **kwargs: Any) -> None:
    got = client.get(path, follow_redirects=False, **kwargs)
    head = client.head(path, follow_redirects=False, **kwargs)
    assert head.status_code == got.status_code, (path, head.status_code, got.status_code)
    assert head.content == b"", (path, head.content[:80])
    for name in HEAD_HEADERS:
        assert head.headers.get(name) == got.headers.get(name), (path, name)
    assert ("content-length" in head.headers) == ("content-length" in got.headers), path


def test_every_get_route_answers_head_like_get_without_a_body(site: Site) -> None:
    paths = sorted({_concrete(r.path) for r in _routes(site) if "GET" in (r.methods or ())})
    assert {"/healthz", "/v1/tools", "/dashboard", "/v1/files/x"} <= set(paths)  # the sweep sees the table
    with site.client("alpha") as client:
        stored = client.post("/v1/files", files={"file": ("notes.txt", b"hello, head")}).json()["files"][0]
        paths.append(f"/v1/files/{stored['id']}")  # a real download, not only a 404
        for path in paths:
            _assert_head_like_get(client, path)
        session = {"Cookie": f"sf_dashboard={site.tokens['alpha']}"}
        for path in (p for p in paths if p.startswith("/dashboard")):
            _assert_head_like_get(client, path, headers=session)  # the pages themselves, logged in
        download = client.head(f"/v1/files/{stored['id']}")
    assert download.status_code == 200 and download.headers["content-length"] == str(len(b"hello, head"))


def test_a_head_without_a_token_is_refused_like_its_get(site: Site) -> None:
    with site.client() as client:
        _assert_head_like_get(client, "/v1/tools")
        assert client.head("/v1/tools").status_code == 401


def test_a_head_of_a_login_link_leaves_its_code_usable(site: Site) -> None:
    code = site.app.state.dashboard.sessions.add_login_code(site.tokens["alpha"])
    with site.client() as client:
        head = client.head(f"/dashboard/login?code={code}", follow_redirects=False)
        assert head.status_code == 303 and "set-cookie" not in head.headers  # only the GET logs a browser in
        login = client.get(f"/dashboard/login?code={code}", follow_redirects=False)
        assert login.status_code == 303 and "sf_dashboard=" in login.headers["set-cookie"]
        again = client.head(f"/dashboard/login?code={code}", follow_redirects=False)
    assert again.status_code == 401 and again.content == b""  # used up by the GET, as a second GET would see


def test_session_times_are_rfc3339_everywhere_the_api_answers_them(site: Site) -> None:
    with site.client("alpha") as client:
        created = client.post("/v1/sessions", json={"title": "times"})
        assert created.status_code == 201, created.text
        session = created.json()
        turn = client.post(f"/v1/sessions/{session['id']}/messages", json={"text": "hi"})
        assert turn.status_code == 200, turn.text
        view = client.get(f"/v1/sessions/{session['id']}").json()
        listed = client.get("/v1/sessions").json()["sessions"]
    stamps = [session["created_at"], session["updated_at"], view["session"]["updated_at"],
              *(m["created_at"] for m in view["messages"]), *(m["created_at"] for m in turn.json()["messages"]),
              *(s["created_at"] for s in listed)]  # fmt: skip
    assert len(view["messages"]) == 2 and turn.json()["text"] == "hello"
    for stamp in stamps:
        assert isinstance(stamp, str) and RFC3339.match(stamp), stamp
        assert datetime.fromisoformat(stamp).utcoffset() is not None
    assert view["session"]["title"] == "times"


def test_sessions_are_listed_per_tenant_a_page_at_a_time(site: Site) -> None:
    with site.client("beta") as beta, site.client("alpha") as alpha:
        made = [beta.post("/v1/sessions").json()["id"] for _ in range(5)]
        alpha_own = alpha.post("/v1/sessions").json()["id"]
        seen: list[str] = []
        cursor = None
        while True:
            page = beta.get("/v1/sessions", params={"limit": 2, **({"cursor": cursor} if cursor else {})}).json()
            assert len(page["sessions"]) <= 2
            seen += [s["id"] for s in page["sessions"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == made[::-1]  # newest first, each once, only beta's
        assert alpha_own not in {s["id"] for s in beta.get("/v1/sessions").json()["sessions"]}
        # another tenant's session as a cursor is answered like one that never existed
        _assert_error(beta.get("/v1/sessions", params={"cursor": alpha_own}), 422, "invalid_request")
        _assert_error(beta.get("/v1/sessions", params={"cursor": "nobody"}), 422, "invalid_request")
        _assert_error(beta.get("/v1/sessions", params={"limit": session_models.PAGE_MAX + 1}), 422, "invalid_request")
    with site.client() as anonymous:
        _assert_error(anonymous.get("/v1/sessions"), 401, "unauthorized")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/sessions", {"title": "t", "extra": 1}),
        ("/v1/sessions", {"title": 7}),
        ("/v1/sessions", {"title": "x" * (TITLE_MAX + 1)}),
        ("/v1/sessions", "garbage"),
        ("/v1/sessions/{sid}/messages", {"text": "hi", "role": "system"}),
        ("/v1/sessions/{sid}/messages", {"txt": "hi"}),
    ],
)
def test_session_bodies_are_strict(site: Site, path: str, body: Any) -> None:
    with site.client("alpha") as client:
        sid = client.post("/v1/sessions").json()["id"]
        before = client.get(f"/v1/sessions/{sid}").json()["messages"]
        _assert_error(client.post(path.format(sid=sid), json=body), 422, "invalid_request")
        assert client.get(f"/v1/sessions/{sid}").json()["messages"] == before


def test_a_401_is_an_rfc6750_challenge_without_oauth_metadata(site: Site) -> None:
    with site.client() as client:
        missing = client.post("/mcp", json={})
        wrong = client.get("/v1/tools", headers={"Authorization": "Bearer sf_wrong"})
    assert missing.headers["www-authenticate"] == 'Bearer realm="sandforge"'  # no error code without a token
    assert wrong.headers["www-authenticate"].startswith('Bearer realm="sandforge", error="invalid_token"')
    for response in (missing, wrong):
        _assert_error(response, 401, "unauthorized")
        assert "resource_metadata" not in response.headers["www-authenticate"]


def test_the_paths_oauth_clients_probe_say_to_send_a_bearer_token(site: Site) -> None:
    probes = [("GET", p) for p in PROBED] + [("GET", p + "/mcp") for p in PROBED]
    probes += [("POST", p) for p in LEGACY_ENDPOINTS]
    with site.client() as client:
        for method, path in probes:
            response = client.request(method, path)
            assert response.status_code == 404, (path, response.text)
            body = response.json()  # RFC 6749 section 5.2's shape: what OAuth clients show their user
            assert body["error"] == "access_denied" and "sandforge tokens create" in body["error_description"]


def _raw_head(site: Site, path: str, token: str | None) -> tuple[int, bytes]:
    """A HEAD straight through the gatekeeper's ASGI interface: the test client drops a HEAD's body itself, so
    only the messages the app sends show that no body leaves the server."""
    headers = [(b"host", b"127.0.0.1")] + ([(b"authorization", f"Bearer {token}".encode())] if token else [])
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "HEAD", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "headers": headers,
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "root_path": ""}  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    anyio.run(site.app.state.gate, scope, receive, send)
    assert scope["method"] == "HEAD"  # the server's own scope stays a HEAD (uvicorn sends no body for it either)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_no_body_leaves_the_gatekeeper_for_a_head(site: Site) -> None:
    with site.client("alpha") as client:
        stored = client.post("/v1/files", files={"file": ("raw.txt", b"raw bytes")}).json()["files"][0]
    assert _raw_head(site, "/healthz", None) == (200, b"")
    assert _raw_head(site, f"/v1/files/{stored['id']}", site.tokens["alpha"]) == (200, b"")
    assert _raw_head(site, "/v1/tools", None) == (401, b"")  # the gatekeeper's own answer too
