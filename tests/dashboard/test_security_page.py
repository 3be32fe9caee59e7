"""Issue 36: the dashboard's record of security events: the "Security events" page and its JSON twin (time,
tenant, tool, attempt, source, event, detail, trace, a link to the call), the calls page's filter, and the
call page's attempts, over real calls whose programs ended on one (scripted model, subprocess sandbox)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sandforge.runtime.service.app import create_app
from sandforge.runtime.service.audit import AuditLog
from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config
from tests.dashboard.fill import SECURITY_CALLS, SECURITY_PROGRAMS, fill, tenant_config
from tests.security_programs import EVENT, SOURCE, VIOLATING, assert_policy_approves


@dataclass
class SecuritySite:
    app: Any
    tokens: dict[str, str]
    outcomes: list[dict[str, Any]]

    def client(self, tenant: str, *, bearer: bool = False) -> TestClient:
        c = TestClient(self.app.state.gate, base_url="https://testserver")
        if bearer:
            c.headers["Authorization"] = f"Bearer {self.tokens[tenant]}"
        else:
            response = c.post("/dashboard/login", data={"token": self.tokens[tenant]}, follow_redirects=False)
            assert response.status_code == 303, response.text
        return c


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuritySite]:
    assert_policy_approves()
    root = tmp_path_factory.mktemp("dash-security")
    config = tenant_config(root, "sec", SECURITY_PROGRAMS)
    config["tenants"].append({"name": "gamma"})  # its own POST /v1/exec run (issue 37)
    tokens = {t["name"]: new_token() for t in config["tenants"]}
    for t in config["tenants"]:
        t["token_hashes"] = [hash_token(tokens[t["name"]])]
    app = create_app(parse_server_config(config, base=root), audit=AuditLog(root / "audit.jsonl"))
    with TestClient(app.state.gate, base_url="https://testserver") as lifespan:
        lifespan.headers["Authorization"] = f"Bearer {tokens['sec']}"
        yield SecuritySite(app, tokens, fill(lifespan, SECURITY_CALLS))


def test_agent_responses_carry_the_security_events(site: SecuritySite) -> None:
    peek, div, opened = site.outcomes
    assert peek["status"] == "ok" and peek["value"] == "nothing committed"
    assert [(e["source"], e["event"], e["attempt_number"]) for e in peek["metadata"]["security_events"]] == [
        (SOURCE, EVENT, 1)
    ]
    assert "security_events" not in div["metadata"]
    assert opened["status"] == "error" and opened["error_type"] == "sandbox_violation"
    assert [e["attempt_number"] for e in opened["metadata"]["security_events"]] == [1, 2]


def test_post_exec_answers_the_security_event(site: SecuritySite) -> None:
    """Gamma's run (issue 37: runs are recorded): on gamma's security page with its call, on no other's."""
    with site.client("gamma", bearer=True) as api:
        body = api.post("/v1/exec", json={"code": VIOLATING, "context": {"n": 1}}).json()
        listed = api.get("/v1/dashboard/security").json()["events"]
    assert body["status"] == "error" and body["error_type"] == "sandbox_violation"
    assert (body["security_event"]["source"], body["security_event"]["event"]) == (SOURCE, EVENT)
    assert body["context"] is None
    assert [(e["role"], e["method"], e["source"], e["event"]) for e in listed] == [("exec", "run", SOURCE, EVENT)]


def test_the_security_twin_lists_every_event_with_its_call(site: SecuritySite) -> None:
    with site.client("sec", bearer=True) as api:
        page = api.get("/v1/dashboard/security").json()
        calls = {c["call_id"]: c for c in api.get("/v1/dashboard/calls").json()["calls"]}
    assert page["tenant"] == "sec" and page["indexed"] == 3
    events = page["events"]
    assert [(e["role"], e["method"], e["attempt"]) for e in events] == [("vault", "open", 2), ("vault", "open", 1),
                                                                          ("vault", "peek", 1)]  # fmt: skip
    for e in events:
        assert (e["tenant"], e["source"], e["event"]) == ("sec", SOURCE, EVENT)
        assert "update_wrapper" in e["detail"] and e["attempt_id"].startswith(e["call_id"])
        call = calls[e["call_id"]]
        assert (call["role"], call["method"], call["trace_id"]) == (e["role"], e["method"], e["trace_id"])
    assert [e["status"] for e in events] == ["error", "error", "ok"]


def test_the_security_filters(site: SecuritySite) -> None:
    with site.client("sec", bearer=True) as api:
        queries = ("source=inner_wall", "source=tripwire", "event=withheld_name", "event=open", "since=1h")
        count = {q: len(api.get(f"/v1/dashboard/security?{q}").json()["events"]) for q in queries}
        refused = api.get("/v1/dashboard/security", params={"source": "kernel"})
        paged = api.get(
            "/v1/dashboard/security", params={"before": api.get("/v1/dashboard/security").json()["events"][0]["id"]}
        )
    assert count == {"source=inner_wall": 3, "source=tripwire": 0, "event=withheld_name": 3, "event=open": 0,
                     "since=1h": 3}  # fmt: skip
    assert refused.status_code == 422 and "source: one of tripwire, inner_wall, host" in refused.text
    assert len(paged.json()["events"]) == 2


def test_the_calls_filter_and_the_call_page(site: SecuritySite) -> None:
    with site.client("sec", bearer=True) as api:
        flagged = api.get("/v1/dashboard/calls", params={"security": "1"}).json()["calls"]
        everything = api.get("/v1/dashboard/calls").json()["calls"]
        bad = api.get("/v1/dashboard/calls", params={"security": "yes"})
        peek = next(c for c in flagged if c["method"] == "peek")
        record = api.get(f"/v1/dashboard/calls/{peek['call_id']}").json()["record"]
    assert [(c["method"], c["security_events"]) for c in flagged] == [("open", 2), ("peek", 1)]
    assert len(everything) == 3 and bad.status_code == 422
    assert record["attempt_failures"][0]["security_event"]["event"] == EVENT
    assert [e["source"] for e in record["security_events"]] == [SOURCE]


def test_the_pages_show_them(site: SecuritySite) -> None:
    with site.client("sec") as browser:
        security = browser.get("/dashboard/security").text
        calls = browser.get("/dashboard/calls?security=1").text
        twin = browser.get("/v1/dashboard/security")
        first = browser.get("/dashboard/security?format=json").json()["events"][-1]
        call = browser.get(f"/dashboard/calls/{first['call_id']}").text
    assert 'id="nav-security"' in security and security.count('class="security-event failed"') == 3
    assert f'href="/dashboard/calls/{first["call_id"]}"' in security and "withheld_name" in security
    assert calls.count('class="call ') == 2 and "security-mark" in calls
    assert 'id="call-security"' in call and "inner_wall withheld_name" in call
    assert twin.status_code == 401  # the twin wants the bearer token, not the cookie


def test_another_tenant_sees_none(site: SecuritySite) -> None:
    with site.client("beta", bearer=True) as api:
        page = api.get("/v1/dashboard/security").json()
    assert page["events"] == [] and page["indexed"] == 0
