"""Issue 36 in a real browser: a security event, caused by a real call whose program ended on one, is on the
"Security events" page with its tool, tenant, source, event and trace, and its link opens the call page, which
shows it on its attempt. Headless Chromium driven by Selenium, against a real `sandforge serve`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dashboard import test_dashboard_browser as base
from tests.dashboard.fill import SECURITY_CALLS, SECURITY_PROGRAMS
from tests.security_programs import EVENT, SOURCE, assert_policy_approves
from tests.service.serverproc import Server

pytestmark = pytest.mark.slow

#: the browser and screenshot fixtures of the dashboard's browser tests (pytest finds fixtures by the names a
#: module binds), against this module's server
browser = base.browser
shots = base.shots


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    assert_policy_approves()
    root = tmp_path_factory.mktemp("dash-security-browser")
    with base.filled_server(root, "sec", SECURITY_PROGRAMS, SECURITY_CALLS) as srv:
        yield srv


def test_the_security_page_shows_the_event_and_links_to_its_call(browser: object, server: Server, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    base._login(driver, server, server.tokens["sec"])
    base._click_and_load(driver, By.ID, "nav-security")
    driver.save_screenshot(str(shots / "security.png"))  # type: ignore[attr-defined]
    rows = driver.find_elements(By.CSS_SELECTOR, "#security tr.security-event")  # type: ignore[attr-defined]
    assert len(rows) == 3
    cells = [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in rows]
    # time, tenant, tool, attempt, source, event, detail, call, trace
    assert [(c[1], c[2], c[3], c[4], c[5]) for c in cells] == [
        ("sec", "vault.open", "2", SOURCE, EVENT),
        ("sec", "vault.open", "1", SOURCE, EVENT),
        ("sec", "vault.peek", "1", SOURCE, EVENT),
    ]
    assert all("update_wrapper" in c[6] and c[8] for c in cells)
    peek = rows[2].get_attribute("data-call")
    assert base._console_errors(driver) == []
    base._click_and_load(driver, By.CSS_SELECTOR, f'tr[data-call="{peek}"] a.call-link')
    assert driver.current_url.endswith(f"/dashboard/calls/{peek}")  # type: ignore[attr-defined]
    driver.save_screenshot(str(shots / "call-security.png"))  # type: ignore[attr-defined]
    attempt = driver.find_element(By.CSS_SELECTOR, "#attempts tr.failed td.security").text  # type: ignore[attr-defined]
    assert attempt == f"{SOURCE} {EVENT}"
    listed = driver.find_elements(By.CSS_SELECTOR, "#call-security td.event")  # type: ignore[attr-defined]
    assert [e.text for e in listed] == [EVENT]
    assert base._console_errors(driver) == []


def test_the_calls_page_filters_the_calls_that_had_one(browser: object, server: Server) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    base._login(driver, server, server.tokens["sec"])
    driver.get(server.url + "/dashboard/calls")  # type: ignore[attr-defined]
    assert len(driver.find_elements(By.CSS_SELECTOR, "#calls tr.call")) == 3  # type: ignore[attr-defined]
    Select(driver.find_element(By.ID, "f-security")).select_by_value("1")  # type: ignore[attr-defined]
    base._click_and_load(driver, By.ID, "filter")
    rows = driver.find_elements(By.CSS_SELECTOR, "#calls tr.call")  # type: ignore[attr-defined]
    assert [r.find_element(By.CSS_SELECTOR, "td a").text for r in rows] == ["vault.open", "vault.peek"]
    assert all(r.find_elements(By.CSS_SELECTOR, ".security-mark") for r in rows)
    assert base._console_errors(driver) == []
