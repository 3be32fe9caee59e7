"""The dashboard over HTTP: login and cookie, every page and its JSON twin, filters, rollback with CSRF."""

from __future__ import annotations

import json
import re

import pytest

from tests.dashboard.conftest import Site

PAGES = [
    ("/dashboard", "/v1/dashboard/overview"),
    ("/dashboard/tools", "/v1/dashboard/tools"),
    ("/dashboard/tools/calc/div", "/v1/dashboard/tools/calc/div"),
    ("/dashboard/calls", "/v1/dashboard/calls"),
    ("/dashboard/patterns", "/v1/dashboard/patterns"),
    ("/dashboard/security", "/v1/dashboard/security"),
]


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def _audit(site: Site) -> list[dict[str, object]]:
    return [json.loads(line) for line in site.audit_path.read_text().splitlines()]


def test_the_calls_really_ran(site: Site) -> None:
    assert [o["status"] for o in site.outcomes] == ["ok", "ok", "ok", "ok", "ok", "error"]
    assert site.outcomes[4]["value"] == 2  # report.run(5) -> calc.div(5) through the repaired generation


@pytest.mark.parametrize("page, twin", PAGES)
def test_without_a_session_pages_send_to_login_and_twins_need_a_token(site: Site, page: str, twin: str) -> None:
    with site.client() as c:
        response = c.get(page, follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"] == "/dashboard/login"
        assert c.get(twin).status_code == 401
        c.cookies.set("sf_dashboard", "sf_forged", domain="testserver", path="/dashboard")
        assert c.get(page, follow_redirects=False).status_code == 303


@pytest.mark.parametrize("page, twin", PAGES)
def test_each_page_is_a_view_of_its_json_twin(site: Site, page: str, twin: str) -> None:
    with site.client("alpha") as browser, site.client("alpha", bearer=True) as api:
        html = browser.get(page)
        assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in html.headers["content-security-policy"]
        assert "<script" not in html.text
        as_json = browser.get(page, params={"format": "json"}).json()
        from_api = api.get(twin).json()
    for volatile in ("chart", "calls_last_hour", "calls_last_day", "indexed_calls", "indexed"):
        as_json.pop(volatile, None)
        from_api.pop(volatile, None)
    assert as_json == from_api
    assert str(site.root) not in html.text and str(site.root) not in json.dumps(from_api)


def test_login_keeps_the_token_in_a_strict_http_only_cookie(site: Site) -> None:
    with site.client() as c:
        refused = c.post("/dashboard/login", data={"token": site.tokens["alpha"] + "x"}, follow_redirects=False)
        assert refused.status_code == 401 and "set-cookie" not in refused.headers
        ok = c.post("/dashboard/login", data={"token": site.tokens["alpha"]}, follow_redirects=False)
    cookie = ok.headers["set-cookie"]
    for attribute in ("HttpOnly", "Secure", "SameSite=Strict", "Path=/dashboard"):
        assert attribute in cookie
    with site.client() as c:
        cross = c.post("/dashboard/login", data={"token": site.tokens["alpha"]}, headers={"Origin": "https://evil.example"},
                       follow_redirects=False)  # fmt: skip
        assert cross.status_code == 403 and "set-cookie" not in cross.headers


def test_a_login_code_works_once(site: Site) -> None:
    code = site.app.state.dashboard.sessions.add_login_code(site.tokens["beta"])
    with site.client() as c:
        first = c.get("/dashboard/login", params={"code": code}, follow_redirects=False)
        assert first.status_code == 303 and "sf_dashboard=" in first.headers["set-cookie"]
        assert c.get("/dashboard/login", params={"code": code}, follow_redirects=False).status_code == 401


def test_overview_counts_what_the_calls_did(site: Site) -> None:
    with site.client("alpha", bearer=True) as api:
        o = api.get("/v1/dashboard/overview").json()
    assert (o["tools"], o["calls_last_hour"], o["failures_last_hour"]) == (2, 7, 1)  # 6 + 1 nested; no broken tool
    assert o["calls_last_day"] == 7 and o["error_rate_last_day"] == round(1 / 7, 4)
    assert sum(p["calls"] for p in o["chart"]) == 7 and len(o["chart"]) == 24
    assert [t for t, _ in o["top_failure_types"]] == [site.outcomes[5]["error_type"]]


def test_tools_filter_sort_and_badges(site: Site) -> None:
    with site.client("alpha", bearer=True) as api:
        every = api.get("/v1/dashboard/tools").json()
        assert [t["role"] for t in every["tools"]] == ["calc", "report"]
        by_usage = api.get("/v1/dashboard/tools", params={"sort": "usage", "order": "desc"}).json()
        assert by_usage["tools"][0]["role"] == "calc"
        assert [t["role"] for t in api.get("/v1/dashboard/tools", params={"q": "rep"}).json()["tools"]] == ["report"]
        healthy = api.get("/v1/dashboard/tools", params={"badge": "healthy"}).json()
        assert [t["role"] for t in healthy["tools"]] == ["calc", "report"] and healthy["badge_counts"]["healthy"] == 2
        assert api.get("/v1/dashboard/tools", params={"badge": "degraded"}).json()["tools"] == []
        bad = api.get("/v1/dashboard/tools", params={"sort": "nonsense"})
        assert bad.status_code == 422 and bad.json()["error"]["type"] == "invalid_request"
    calc = next(t for t in every["tools"] if t["role"] == "calc")
    div = next(m for m in calc["methods"] if m["method"] == "div")
    assert (div["generation"], div["repairs_since_regeneration"], div["prompt_version_match"]) == (2, 1, True)


def test_calls_filters(site: Site) -> None:
    with site.client("alpha", bearer=True) as api:
        errors = api.get("/v1/dashboard/calls", params={"status": "error"}).json()["calls"]
        assert [(c["role"], c["failure_stage"]) for c in errors] == [("broken", "execution")]
        divs = api.get("/v1/dashboard/calls", params={"role": "calc", "method": "div"}).json()["calls"]
        assert len(divs) == 4 and {c["depth"] for c in divs} == {0, 1}
        assert api.get("/v1/dashboard/calls", params={"since": "2999-01-01T00:00:00Z"}).json()["calls"] == []
        assert len(api.get("/v1/dashboard/calls", params={"since": "1h"}).json()["calls"]) == 7
        first = api.get("/v1/dashboard/calls", params={"before": 4}).json()["calls"]
        assert [c["id"] for c in first] == [3, 2, 1]
        assert api.get("/v1/dashboard/calls", params={"since": "yesterday"}).status_code == 422


def test_a_call_page_shows_attempts_the_nested_tree_and_durations(site: Site) -> None:
    with site.client("alpha", bearer=True) as api:
        calls = api.get("/v1/dashboard/calls").json()["calls"]
        run = next(c for c in calls if c["role"] == "report")
        page = api.get(f"/v1/dashboard/calls/{run['call_id']}").json()
        refused = next(c for c in calls if (c["role"], c["method"]) == ("calc", "double"))
        double = api.get(f"/v1/dashboard/calls/{refused['call_id']}").json()
        assert api.get("/v1/dashboard/calls/nope").status_code == 404
    tree = page["tree"]
    assert tree["call"]["call_id"] == run["call_id"]
    assert [(n["call"]["role"], n["call"]["method"]) for n in tree["children"]] == [("calc", "div")]
    assert page["durations"]["total_s"] >= page["durations"]["sandbox_s"] > 0
    assert page["protections"]  # the wall this server requires of every sandbox
    verified = page["record"]["protections"]  # and what this call's sandbox was checked to have
    assert set(page["protections"]) <= {name for name, present in verified.items() if present}
    with site.client("alpha") as browser:
        html = browser.get(f"/dashboard/calls/{run['call_id']}").text
    assert 'id="verified"' in html and all(name in html for name in verified)
    failures = double["record"]["attempt_failures"]
    assert [f["stage"] for f in failures] == ["validation"] and double["record"]["attempts"] == 2


def test_the_artifact_page_diffs_any_two_generations(site: Site) -> None:
    with site.client("alpha", bearer=True) as api:
        art = api.get("/v1/dashboard/tools/calc/div").json()
        back = api.get("/v1/dashboard/tools/calc/div", params={"a": 2, "b": 1}).json()
    assert art["generation"] == 2 and art["rollback_targets"] == [1]
    assert (art["diff_from"], art["diff_to"]) == (1, 2)
    assert {"kind": "add", "text": "+if args[0] == 0:"} in art["diff"]
    assert {"kind": "remove", "text": "-if args[0] == 0:"} in back["diff"]
    assert art["cacheable"] is True and art["verdict"] == "approved"


def test_rollback_needs_session_csrf_confirmation_and_same_site(site: Site) -> None:
    store = site.store("alpha")
    path = "/dashboard/tools/calc/div/rollback"
    with site.client("alpha") as alpha, site.client("beta") as beta:
        page = alpha.get(path, params={"to": 1})
        assert page.status_code == 200 and "Roll back to generation 1" in page.text
        token = _csrf(page.text)
        beta_token = _csrf(beta.get("/dashboard").text)
        attempts = [
            (alpha, {"to": "1", "confirm": "yes"}, {}, 403),  # no CSRF token
            (alpha, {"to": "1", "confirm": "yes", "csrf": "0" * 64}, {}, 403),  # a wrong one
            (alpha, {"to": "1", "confirm": "yes", "csrf": beta_token}, {}, 403),  # another session's
            (beta, {"to": "1", "confirm": "yes", "csrf": token}, {}, 403),  # alpha's token in beta's session
            (beta, {"to": "1", "confirm": "yes", "csrf": beta_token}, {}, 404),  # beta has no calc tool
            (alpha, {"to": "1", "confirm": "yes", "csrf": token}, {"Origin": "https://evil.example"}, 403),
            (alpha, {"to": "1", "confirm": "yes", "csrf": token}, {"Sec-Fetch-Site": "cross-site"}, 403),
            (alpha, {"to": "1", "csrf": token}, {}, 400),  # not confirmed
        ]
        for client, form, headers, status in attempts:
            response = client.post(path, data=form, headers=headers, follow_redirects=False)
            assert response.status_code == status, (form, headers, response.text)
            assert store.lookup("calc", "div").artifact.generation == 2
        done = alpha.post(path, data={"to": "1", "confirm": "yes", "csrf": token}, follow_redirects=False)
        assert done.status_code == 303
        assert store.lookup("calc", "div").artifact.generation == 1
        assert "rolled back from generation 2 to 1" in alpha.get(done.headers["location"]).text
    records = [r for r in _audit(site) if r["path"] == path]
    assert [r["status"] for r in records] == [403, 403, 403, 403, 404, 403, 403, 400, 303]
    assert records[-1]["tenant"] == "alpha" and records[-1]["outcome"] == "rolled_back calc.div 2->1"
    assert records[3]["tenant"] == "beta"


def test_rollback_twin_with_a_bearer_token(site: Site) -> None:
    store = site.store("alpha")
    before = store.lookup("calc", "div").artifact.generation
    target = 2 if before == 1 else 1
    with site.client("beta", bearer=True) as beta:
        assert beta.post("/v1/dashboard/tools/calc/div/rollback", json={"to": target}).status_code == 404
    with site.client("alpha", bearer=True) as api:
        wrong = api.post("/v1/dashboard/tools/calc/div/rollback", json={"to": 99})
        assert wrong.status_code == 409 and wrong.json()["error"]["type"] == "rollback_refused"
        done = api.post("/v1/dashboard/tools/calc/div/rollback", json={"to": target})
    assert done.status_code == 200 and done.json()["generation"] == target
    assert store.lookup("calc", "div").artifact.generation == target
    audited = [r for r in _audit(site) if r["path"] == "/v1/dashboard/tools/calc/div/rollback"]
    assert audited[-1]["tenant"] == "alpha" and audited[-1]["outcome"] == f"rolled_back {before}->{target}"
    assert (audited[-1]["tool_role"], audited[-1]["tool_method"]) == ("calc", "div")


def test_logout_needs_csrf_and_clears_the_cookie(site: Site) -> None:
    with site.client("beta") as beta:
        assert beta.post("/dashboard/logout", data={}, follow_redirects=False).status_code == 403
        token = _csrf(beta.get("/dashboard").text)
        out = beta.post("/dashboard/logout", data={"csrf": token}, follow_redirects=False)
        assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
