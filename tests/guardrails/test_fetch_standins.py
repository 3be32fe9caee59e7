"""Guardrails for brokered egress (issue 18): with ``http_fetch`` granted, programs import ``urllib.request``,
``urllib.error`` and ``requests`` (the sandbox's broker-backed stand-ins) and call ``fetch``; anything beyond
the stand-ins' surface is a recoverable violation naming what is supported; without the grant, the imports
are what they were."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandforge.runtime.guardrails import default_policy, layered_policy, validate
from sandforge.runtime.guardrails.policy import Policy


@pytest.fixture(scope="module")
def granted(tmp_path_factory: pytest.TempPathFactory) -> Policy:
    layer: Path = tmp_path_factory.mktemp("granted")
    (layer / "egress.yaml").write_text(
        "grant: [http_fetch]\negress:\n  allow:\n    - url: 'https://news.example.com/**'\n"
    )
    policy = layered_policy([layer])
    assert "http_fetch" in policy.granted
    return policy


def kinds(source: str, policy: Policy) -> list[str]:
    return [v.violation_type for v in validate(source, policy).violations]


FETCHING = {
    "requests": "import requests\nr = requests.get(args[0], params={'q': 1}, timeout=5)\nr.raise_for_status()\n"
    "return r.json()",
    "urlopen": "import urllib.request\nwith urllib.request.urlopen(urllib.request.Request(args[0])) as f:\n"
    "    return f.read().decode()",
    "from imports": "from urllib.request import urlopen, Request\nfrom urllib.error import HTTPError, URLError\n"
    "from requests.exceptions import RequestException\ntry:\n    return urlopen(args[0]).read()\n"
    "except (HTTPError, URLError, RequestException):\n    return None",
    "fetch": "return fetch(args[0], headers={'Accept': 'text/xml'}).text",
}


@pytest.mark.parametrize("source", list(FETCHING.values()), ids=list(FETCHING))
def test_granted_programs_that_fetch_are_approved(source: str, granted: Policy) -> None:
    result = validate(source, granted)
    assert result.verdict == "approved", result.violations
    assert [c.tag for c in result.capabilities if c.tag == "http_fetch"] == ["http_fetch"]


@pytest.mark.parametrize("source", list(FETCHING.values()), ids=list(FETCHING))
def test_without_the_grant_fetching_stays_terminal(source: str) -> None:
    result = validate(source, default_policy())
    assert result.verdict == "terminal"
    assert "capability_not_granted" in [v.violation_type for v in result.violations]


def test_without_the_grant_the_imports_are_what_they_were() -> None:
    assert kinds("import requests", default_policy()) == ["capability_not_granted", "module_not_allowed"]
    assert kinds("import urllib.error", default_policy()) == ["module_not_allowed"]


UNSUPPORTED = {
    "a session": ("import requests\ns = requests.Session()", "requests.Session"),
    "verify=False": ("import requests\nr = requests.get(args[0], verify=False)", "verify=..."),
    "auth": ("import requests\nr = requests.post(args[0], auth=('a', 'b'))", "auth=..."),
    "an opener": ("from urllib.request import build_opener", "urllib.request.build_opener"),
    "a TLS context": ("import urllib.request\nurllib.request.urlopen(args[0], context=None)", "context=..."),
    "a submodule": ("import requests.adapters", "requests.adapters"),
    "an exception": ("import requests\nE = requests.exceptions.SSLError", "requests.exceptions.SSLError"),
}


@pytest.mark.parametrize(("source", "named"), list(UNSUPPORTED.values()), ids=list(UNSUPPORTED))
def test_beyond_the_surface_is_recoverable_and_names_what_is_supported(
    source: str, named: str, granted: Policy
) -> None:
    result = validate(source, granted)
    [violation] = [v for v in result.violations if v.violation_type == "unsupported_fetch_api"]
    assert violation.classification == "recoverable" and result.verdict == "recoverable"
    assert named in violation.message and "not supported in the sandbox" in violation.message
    assert "requests.get" in violation.required_correction


def test_other_modules_stay_refused_when_granted(granted: Policy) -> None:
    assert kinds("import httpx", granted) == ["module_not_allowed"]
    assert kinds("import http.client", granted) == ["module_not_allowed"]
