"""What tools and callers wrote is shown, never run: values, arguments, messages and query text are escaped."""

from __future__ import annotations

from tests.dashboard.conftest import Site

PAYLOAD = "<script>alert(1)</script>"


def test_values_arguments_and_filters_are_escaped(site: Site) -> None:
    with site.client("alpha", bearer=True) as api:
        outcome = api.post("/v1/agents/calc/double", json={"args": [PAYLOAD]}).json()
        assert outcome["status"] == "ok" and outcome["value"] == PAYLOAD * 2  # the stored program ran on it
        call_id = api.get("/v1/dashboard/calls", params={"method": "double"}).json()["calls"][0]["call_id"]
    with site.client("alpha") as browser:
        pages = [
            browser.get(f"/dashboard/calls/{call_id}"),
            browser.get("/dashboard/tools", params={"q": PAYLOAD}),
            browser.get("/dashboard/calls", params={"role": PAYLOAD}),
        ]
    for page in pages:
        assert page.status_code == 200
        assert "<script" not in page.text.lower()
    assert "\\u003cscript\\u003e" in pages[0].text  # the value is there, as inert JSON text
    assert "&lt;script&gt;" in pages[1].text
