"""The dashboard in a real browser: Debian's headless Chromium driven by Selenium (nothing downloaded at run
time) against a real `sandforge serve` whose store was filled by real calls. Screenshots of every page go to
``$SANDFORGE_DASHBOARD_SCREENSHOTS`` (the committed ones under docs/dashboard/ come from there), else a
temporary directory."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.fill import CALLS, PROGRAMS, fill, tenant_config
from tests.service.serverproc import Server, start_server

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def _browser_or_skip() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium")
    if missing:
        message = f"the browser tests need Debian's chromium and chromium-driver and selenium (missing: {missing})"
        if os.environ.get("SANDFORGE_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)


@contextmanager
def filled_server(root: Path, tenant: str = "alpha", programs: list[str] = PROGRAMS,
                  calls: list[tuple[str, str, list[Any]]] = CALLS) -> Iterator[Server]:  # fmt: skip
    """A real server whose ``tenant`` made ``calls`` (its scripted model answering ``programs``), then stopped."""
    _browser_or_skip()
    srv = start_server(root, tenant_config(root, tenant, programs))
    try:
        with srv.client(tenant) as client:
            fill(client, calls)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with filled_server(tmp_path_factory.mktemp("dash-browser")) as srv:
        yield srv


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = os.environ.get("SANDFORGE_DASHBOARD_SCREENSHOTS")
    path = Path(target) if target else tmp_path_factory.mktemp("shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def browser(server: Server) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1360,900",
                "--no-first-run", "--disable-extensions", "--disable-background-networking"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _console_errors(driver: object) -> list[dict[str, object]]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]  # type: ignore[attr-defined]


def _login(driver: object, server: Server, token: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.delete_all_cookies()  # type: ignore[attr-defined]
    driver.get(server.url + "/dashboard")  # type: ignore[attr-defined]
    assert driver.current_url.endswith("/dashboard/login")  # type: ignore[attr-defined]
    driver.find_element(By.ID, "token").send_keys(token)  # type: ignore[attr-defined]
    driver.find_element(By.ID, "login").click()  # type: ignore[attr-defined]
    # the answer (the overview, or the login page with its error) has loaded before anything else is asked
    WebDriverWait(driver, 60).until(  # type: ignore[arg-type]
        lambda d: d.find_elements(By.ID, "tenant") or d.find_elements(By.ID, "login-error")
    )


def _click_and_load(driver: object, by: str, value: str) -> None:
    """Click what navigates, and wait until the next page replaced this one (else the next look may see the old)."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    for attempt in range(3):  # chromium may renumber the page's nodes between a find and a click: find again
        old = driver.find_element("tag name", "html")  # type: ignore[attr-defined]
        try:
            driver.find_element(by, value).click()  # type: ignore[attr-defined]
            break
        except StaleElementReferenceException:
            continue
        except WebDriverException as exc:
            if "does not belong to the document" not in str(exc) or attempt == 2:
                raise
    WebDriverWait(driver, 60).until(lambda _: _stale(old))


def _stale(element: Any) -> bool:
    """``staleness_of``, also for chromium's other answer about a node of a page that navigated away."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    try:
        element.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in str(exc):
            return True
        raise
    return False


def _page(driver: object, url: str, shots: Path, name: str) -> None:
    driver.get(url)  # type: ignore[attr-defined]
    driver.save_screenshot(str(shots / f"{name}.png"))  # type: ignore[attr-defined]
    assert _console_errors(driver) == [], name


def test_login_and_every_page_loads_without_console_errors(browser: object, server: Server, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    _login(driver, server, "sf_wrong")
    assert "not valid" in driver.find_element(By.ID, "login-error").text  # type: ignore[attr-defined]
    driver.save_screenshot(str(shots / "login.png"))  # type: ignore[attr-defined]
    driver.get_log("browser")  # type: ignore[attr-defined]  # drained: the refused login's 401 is expected
    _login(driver, server, server.tokens["alpha"])
    assert driver.find_element(By.ID, "tenant").text == "alpha"  # type: ignore[attr-defined]
    cookie = driver.get_cookie("sf_dashboard")  # type: ignore[attr-defined]
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
    assert driver.execute_script("return document.cookie") == ""  # type: ignore[attr-defined]
    calls = driver.find_elements  # type: ignore[attr-defined]
    _page(driver, server.url + "/dashboard", shots, "overview")
    assert driver.find_element(By.ID, "n-tools").text == "2"  # type: ignore[attr-defined]
    assert len(calls(By.CSS_SELECTOR, "#chart rect.calls")) == 24
    _page(driver, server.url + "/dashboard/tools", shots, "tools")
    _page(driver, server.url + "/dashboard/tools/calc/div", shots, "artifact")
    _page(driver, server.url + "/dashboard/calls", shots, "calls")
    run = next(e for e in calls(By.CSS_SELECTOR, "#calls a") if e.text == "report.run")
    _click_and_load(driver, By.LINK_TEXT, run.text)
    driver.save_screenshot(str(shots / "call.png"))  # type: ignore[attr-defined]
    assert [e.text for e in calls(By.CSS_SELECTOR, "#tree a")] == ["report.run", "calc.div"]
    assert _console_errors(driver) == []
    _page(driver, server.url + "/dashboard/patterns", shots, "patterns")


def test_filters_work_in_the_browser(browser: object, server: Server) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver = browser
    _login(driver, server, server.tokens["alpha"])
    driver.get(server.url + "/dashboard/tools")  # type: ignore[attr-defined]
    driver.find_element(By.ID, "q").send_keys("rep")  # type: ignore[attr-defined]
    _click_and_load(driver, By.ID, "filter")
    roles = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#tools td.role")]  # type: ignore[attr-defined]
    assert roles == ["report"]
    _click_and_load(driver, By.ID, "sort-usage")
    assert "sort=usage" in driver.current_url  # type: ignore[attr-defined]
    driver.get(server.url + "/dashboard/calls")  # type: ignore[attr-defined]
    Select(driver.find_element(By.ID, "f-status")).select_by_visible_text("error")  # type: ignore[attr-defined]
    _click_and_load(driver, By.ID, "filter")
    rows = driver.find_elements(By.CSS_SELECTOR, "#calls tr.call")  # type: ignore[attr-defined]
    assert len(rows) == 1 and "broken.go" in rows[0].text
    assert _console_errors(driver) == []


def test_diff_and_rollback_in_the_browser(browser: object, server: Server, shots: Path) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    _login(driver, server, server.tokens["alpha"])
    driver.get(server.url + "/dashboard/tools/calc/div")  # type: ignore[attr-defined]
    driver.find_element(By.ID, "a-2").click()  # type: ignore[attr-defined]
    driver.find_element(By.ID, "b-1").click()  # type: ignore[attr-defined]
    _click_and_load(driver, By.ID, "show-diff")
    removed = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#diff .d-remove")]  # type: ignore[attr-defined]
    assert "-if args[0] == 0:" in removed
    _click_and_load(driver, By.ID, "rollback-1")
    driver.save_screenshot(str(shots / "rollback.png"))  # type: ignore[attr-defined]
    _click_and_load(driver, By.ID, "confirm-rollback")
    assert "rolled back from generation 2 to 1" in driver.find_element(By.ID, "notice").text  # type: ignore[attr-defined]
    assert driver.find_element(By.ID, "generation").text == "1"  # type: ignore[attr-defined]
    with server.client("alpha") as api:
        assert api.get("/v1/tools/calc/div").json()["generation"] == 1  # the store changed
    assert _console_errors(driver) == []


def test_another_tenant_cannot_roll_back_or_see_alpha(browser: object, server: Server) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    with server.client("alpha") as api:
        before = api.get("/v1/tools/calc/div").json()["generation"]
    _login(driver, server, server.tokens["beta"])
    driver.get(server.url + "/dashboard/tools/calc/div")  # type: ignore[attr-defined]
    assert "404" in driver.find_element(By.TAG_NAME, "h1").text  # type: ignore[attr-defined]
    for to in (1, 2):
        driver.get(server.url + f"/dashboard/tools/calc/div/rollback?to={to}")  # type: ignore[attr-defined]
        assert "no such generation" in driver.find_element(By.ID, "error").text  # type: ignore[attr-defined]
    with server.client("alpha") as api:
        assert api.get("/v1/tools/calc/div").json()["generation"] == before


def _overflow(driver: object, table: str) -> dict[str, int]:
    """How wide the table's content is against its container (the page's main column), in CSS pixels."""
    script = (f"const t = document.getElementById({table!r}); const c = t.parentElement; "
              "const s = getComputedStyle(c); "
              "return {table: t.scrollWidth, page: document.documentElement.scrollWidth, window: window.innerWidth, "
              "box: c.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight)};")  # fmt: skip
    return driver.execute_script(script)  # type: ignore[attr-defined,no-any-return]


def test_the_tables_fit_a_1400_px_window(browser: object, server: Server, shots: Path) -> None:
    """Issue 37 item 6: the tools table overflowed its column at 1400 px (the calls table has one more column,
    the source: a run of ``POST /v1/exec`` is listed there beside the agent calls, issue 37 item 5)."""
    from selenium.webdriver.common.by import By

    driver = browser
    with server.client("alpha") as api:
        assert api.post("/v1/exec", json={"code": "return 1"}).json()["status"] == "ok"
    driver.set_window_size(1400, 900)  # type: ignore[attr-defined]
    try:
        _login(driver, server, server.tokens["alpha"])
        for path, table in (("/dashboard/tools", "tools"), ("/dashboard/calls", "calls")):
            driver.get(server.url + path)  # type: ignore[attr-defined]
            width = _overflow(driver, table)
            assert width["window"] <= 1400 and width["table"] <= width["box"], (path, width)
            assert width["page"] <= width["window"], (path, width)  # no horizontal scroll bar on the page
            driver.save_screenshot(str(shots / f"{table}-1400.png"))  # type: ignore[attr-defined]
        sources = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#calls td.source")]  # type: ignore[attr-defined]
        assert sources[0] == "http" and set(sources[1:]) == {"agent"}, sources
    finally:
        driver.set_window_size(1360, 900)  # type: ignore[attr-defined]
