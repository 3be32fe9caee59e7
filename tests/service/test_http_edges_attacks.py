"""Red team on this session's HTTP edges (``gate.bearer``, ``auth_challenge``, ``route_table``, ``GET /v1/sessions``
cursors): credentials only where they belong, typed answers for probed paths, ``Allow`` whatever the method."""

from __future__ import annotations

import pytest

from sandforge.runtime.service.session_models import PAGE_MAX
from tests.service.test_http_edges import Site, _assert_error, _concrete, _routes, site

__all__ = ["site"]


@pytest.mark.parametrize("scheme", ["Bearer {t}", "bearer {t}", "BEARER {t}", "Bearer  {t}", "Bearer {t} "])
def test_the_bearer_scheme_is_case_insensitive_and_its_spaces_are_not_part_of_the_token(
    site: Site, scheme: str
) -> None:
    header = {"Authorization": scheme.format(t=site.tokens["alpha"])}
    with site.client() as client:
        assert client.get("/v1/tools", headers=header).status_code == 200


@pytest.mark.parametrize(
    "header",
    ["Bearer {t} extra", "Bearer {t}\x00", "Basic {t}", "{t}", "Bearer\t{t}", "Token {t}", "Bearer {t}x", "Bearer    "],
)
def test_a_token_in_any_other_form_is_a_401_challenge(site: Site, header: str) -> None:
    with site.client() as client:
        response = client.get("/v1/tools", headers={"Authorization": header.format(t=site.tokens["alpha"])})
    _assert_error(response, 401, "unauthorized")
    assert response.headers["www-authenticate"].startswith('Bearer realm="sandforge"')


def test_a_token_authenticates_only_from_the_authorization_header(site: Site) -> None:
    token = site.tokens["alpha"]
    with site.client() as client:
        _assert_error(client.get("/v1/tools", params={"access_token": token}), 401, "unauthorized")
        for cookie in (f"sf_dashboard={token}", f"access_token={token}"):  # the dashboard's cookie is not an API key
            _assert_error(client.get("/v1/tools", headers={"Cookie": cookie}), 401, "unauthorized")
            _assert_error(client.post("/v1/exec", json={"code": "return 1"}, headers={"Cookie": cookie}), 401,
                          "unauthorized")  # fmt: skip
        # the first Authorization header is the one read: a valid second one does not rescue an invalid first
        twice = [("Authorization", "Bearer sf_wrong"), ("Authorization", f"Bearer {token}")]
        _assert_error(client.get("/v1/tools", headers=twice), 401, "unauthorized")


@pytest.mark.parametrize(
    "path",
    ["/v1/nonexistent", "/v1/sessions/..%2F..%2Fetc%2Fpasswd", "/v1/sessions/%00", "/v1/sessions/" + "a" * 5000,
     "/v1//sessions", "/%2e%2e/v1/tools", "/v1/tools/%2e%2e/%2e%2e/x", "/v1/sessions/x/messages/../../.."],
)  # fmt: skip
def test_probed_paths_are_typed_404s_and_say_nothing_to_a_caller_without_a_token(site: Site, path: str) -> None:
    with site.client("alpha") as client:
        _assert_error(client.get(path), 404, "not_found")
    with site.client() as anonymous:  # under /v1, the same 401 whether the path exists or not: no map of the API
        response = anonymous.get(path)
        _assert_error(response, 401 if response.request.url.path.startswith("/v1/") else 404,
                      "unauthorized" if response.request.url.path.startswith("/v1/") else "not_found")  # fmt: skip


def test_every_route_answers_405_with_allow_for_any_method_it_does_not_take(site: Site) -> None:
    by_path: dict[str, set[str]] = {}
    for route in _routes(site):
        by_path.setdefault(route.path, set()).update(route.methods or ())
    with site.client("alpha") as client:
        for path, methods in by_path.items():
            for method in ("OPTIONS", "TRACE", "CONNECT", "FOO", "DELETE", "PATCH"):
                if method in methods:
                    continue
                response = client.request(method, _concrete(path))
                _assert_error(response, 405, "method_not_allowed")
                expected = methods | ({"HEAD"} if "GET" in methods else set())  # HEAD wherever GET (RFC 9110)
                assert set(response.headers["allow"].split(", ")) == expected, (method, path)


@pytest.mark.parametrize(
    "cursor",
    ["' OR 1=1 --", "%", "*", "\x00", "x" * 64, "../alpha", "\u202e", " "],
)
def test_a_forged_cursor_is_a_422_and_never_another_page(site: Site, cursor: str) -> None:
    with site.client("beta") as beta:
        beta.post("/v1/sessions")
        _assert_error(beta.get("/v1/sessions", params={"cursor": cursor}), 422, "invalid_request")
        _assert_error(beta.get("/v1/sessions", params={"cursor": "x" * 65}), 422, "invalid_request")
        for limit in (0, -1, PAGE_MAX + 1, "1e3", "NaN"):
            _assert_error(beta.get("/v1/sessions", params={"limit": limit}), 422, "invalid_request")


def test_a_cursor_is_answered_only_from_the_callers_own_sessions(site: Site) -> None:
    """Paging beta's sessions with an alpha cursor, or alpha's with a beta cursor, is refused alike (no oracle:
    the answer is that of an id nobody has); and a page never holds another tenant's session."""
    with site.client("alpha") as alpha, site.client("beta") as beta:
        mine = [alpha.post("/v1/sessions").json()["id"] for _ in range(3)]
        theirs = [beta.post("/v1/sessions").json()["id"] for _ in range(3)]
        crossed = [beta.get("/v1/sessions", params={"cursor": c}) for c in mine]
        crossed += [alpha.get("/v1/sessions", params={"cursor": c}) for c in theirs]
        for response in crossed:
            _assert_error(response, 422, "invalid_request")
        assert len({r.text for r in crossed}) == 1
        page = alpha.get("/v1/sessions", params={"cursor": mine[-1], "limit": PAGE_MAX}).json()
        assert not {s["id"] for s in page["sessions"]} & set(theirs)
