"""`sandforge dashboard`: this machine's store on 127.0.0.1, one tenant, a login link that works once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from sandforge.runtime.store import ToolStore
from sandforge.runtime.store.models import ToolContract

SANDFORGE = str(Path(sys.executable).parent / "sandforge")
pytestmark = pytest.mark.slow


def test_serves_the_state_dir_on_loopback_with_a_one_time_link(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ToolStore(state).register_tool(ToolContract(role="weather", purpose="today's weather"))
    proc = subprocess.Popen(
        [SANDFORGE, "dashboard", "--port", "0", "--state-dir", str(state)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        link = proc.stdout.readline().strip()
        parts = urlsplit(link)
        assert parts.hostname == "127.0.0.1" and parts.path == "/dashboard/login" and parts.query.startswith("code=")
        base = f"{parts.scheme}://{parts.netloc}"
        with httpx.Client(base_url=base, timeout=60) as browser:
            login = browser.get(link, follow_redirects=False)
            assert login.status_code == 303 and login.headers["location"] == "/dashboard"
            # a Secure cookie: browsers send it to loopback over HTTP, Python's cookie jar does not
            cookie = {"Cookie": login.headers["set-cookie"].split(";")[0]}
            first = browser.get("/dashboard", headers=cookie)
            assert first.status_code == 200 and ">local<" in first.text
            tools = browser.get("/dashboard/tools", params={"format": "json"}, headers=cookie).json()
            assert [t["role"] for t in tools["tools"]] == ["weather"]
        with httpx.Client(base_url=base, timeout=60) as other:
            assert other.get(link, follow_redirects=False).status_code == 401  # used up
            assert other.get("/dashboard", follow_redirects=False).status_code == 303
        assert tools["tenant"] == "local"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "API token for the JSON twins: sf_" in err
