"""The program's side of brokered egress in-process (issue 18): what ``fetch()`` and the ``requests`` /
``urllib.request`` stand-ins put on the wire, and how they present the host's reply, with a scripted sender
in place of the host. End to end on every backend: ``tests/egress/test_sandbox_fetch.py``."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from sandforge.sandbox.inside import fetching, standins

Reply = tuple[dict[str, Any], bytes]


class Host:
    """Answers each request with the next scripted reply and records the requests."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.sent: list[dict[str, Any]] = []

    def __call__(self, request: dict[str, Any]) -> Reply:
        self.sent.append(request)
        return self.replies.pop(0)


def ok(body: bytes = b"", status: int = 200, **headers: str) -> Reply:
    response = {"status": status, "headers": headers, "url": "https://x.example/final", "elapsed_ms": 2.0}
    return {"type": "fetch_result", "id": 0, "response": {**response, "body_bytes": len(body)}}, body


def failed(kind: str, reason: str = "") -> Reply:
    return {"type": "fetch_result", "id": 0, "error": {"kind": kind, "message": f"{kind}!", "reason": reason}}, b""


@pytest.fixture
def modules() -> Iterator[dict[str, Any]]:
    yield standins.build()
    fetching.bind(None)


def host(*replies: Reply) -> Host:
    scripted = Host(*replies)
    fetching.bind(scripted)
    return scripted


def test_fetch_sends_the_wire_request_and_presents_the_response(modules: dict[str, Any]) -> None:
    scripted = host(ok("é".encode("latin-1"), **{"content-type": "text/plain; charset=ISO-8859-1"}))
    response = fetching.fetch("https://x.example/a", method="post", headers={"X-A": 1}, params={"q": [1, 2], "n": None},
                              json={"k": "v"}, timeout=3)  # fmt: skip
    assert scripted.sent == [{
        "method": "POST", "url": "https://x.example/a", "headers": {"X-A": "1", "Content-Type": "application/json"},
        "params": {"q": ["1", "2"]}, "body_b64": base64.b64encode(b'{"k": "v"}').decode(), "timeout_s": 3.0,
    }]  # fmt: skip
    assert (response.status, response.ok, response.url, response.text) == (200, True, "https://x.example/final", "é")
    assert response.headers == {"content-type": "text/plain; charset=ISO-8859-1"}


@pytest.mark.parametrize(
    ("kind", "error"),
    [("egress_denied", fetching.EgressDenied), ("egress_limit", fetching.EgressLimit),
     ("network_error", fetching.NetworkError), ("missing_credentials", fetching.MissingCredentials),
     ("invalid_fetch", fetching.InvalidFetch), ("something_new", fetching.NetworkError)],
)  # fmt: skip
def test_each_failure_kind_is_its_exception(modules: dict[str, Any], kind: str, error: type[Exception]) -> None:
    host(failed(kind, "why"))
    with pytest.raises(error) as caught:
        fetching.fetch("https://x.example/")
    assert isinstance(caught.value, fetching.FetchError) and caught.value.reason == "why"


def test_the_kind_comes_from_the_runners_classes_not_an_attribute() -> None:
    class Sneaky(fetching.EgressLimit):
        kind = "network_error"

    assert fetching.error_kind(Sneaky("x")) == "egress_limit"
    assert fetching.error_kind(ValueError("x")) is None


@pytest.mark.parametrize(
    "call",
    [lambda: fetching.fetch(b"https://x/"), lambda: fetching.fetch("https://x/", body=1),
     lambda: fetching.fetch("https://x/", body=b"a", json={}), lambda: fetching.fetch("https://x/", timeout=0),
     lambda: fetching.fetch("https://x/", params="q=1"), lambda: fetching.fetch("x" * 9000)],
    ids=["url bytes", "body int", "body and json", "timeout 0", "params text", "url too long"],
)  # fmt: skip
def test_arguments_that_cannot_be_a_request_never_leave(modules: dict[str, Any], call: Any) -> None:
    scripted = host()
    with pytest.raises((TypeError, ValueError)):
        call()
    assert scripted.sent == []


def test_requests_surface(modules: dict[str, Any]) -> None:
    requests = modules["requests"]
    scripted = host(
        ok(b'{"a": 1}', status=404, **{"content-type": "application/json"}), failed("network_error", "timeout")
    )
    response = requests.post("https://x.example/", data={"a": "b c"}, timeout=(1, 2))
    assert scripted.sent[0]["body_b64"] == base64.b64encode(b"a=b+c").decode()
    assert scripted.sent[0]["headers"] == {"Content-Type": "application/x-www-form-urlencoded"}
    assert scripted.sent[0]["timeout_s"] == 3.0
    assert (response.status_code, response.ok, response.json(), response.headers["Content-Type"]) == (
        404, False, {"a": 1}, "application/json")  # fmt: skip
    with pytest.raises(requests.HTTPError, match="404 Client Error"):
        response.raise_for_status()
    with pytest.raises(requests.Timeout) as caught:
        requests.get("https://x.example/")
    assert isinstance(caught.value, fetching.NetworkError)
    with pytest.raises(standins.NotSupported, match=r"requests.get\(verify=...\) is not supported"):
        requests.get("https://x.example/", verify=False)
    with pytest.raises(standins.NotSupported, match=r"requests\.Session is not supported.*offers ConnectionError"):
        requests.Session  # noqa: B018
    assert len(scripted.sent) == 2


def test_urllib_surface(modules: dict[str, Any]) -> None:
    request_module, error_module = modules["urllib.request"], modules["urllib.error"]
    scripted = host(ok(b"line 1\nline 2\n", **{"content-type": "text/plain"}), ok(b"gone", status=410),
                    failed("egress_denied"))  # fmt: skip
    request = request_module.Request("https://x.example/", data=b"payload", headers={"x-token": "t"})
    with request_module.urlopen(request, timeout=2) as response:
        assert (response.status, response.getcode(), response.headers["Content-Type"]) == (200, 200, "text/plain")
        assert [response.readline(), list(response), response.read()] == [b"line 1\n", [b"line 2\n"], b""]
    assert scripted.sent[0]["method"] == "POST" and scripted.sent[0]["headers"] == {"X-token": "t"}
    with pytest.raises(error_module.HTTPError) as http_error:
        request_module.urlopen("https://x.example/gone")
    assert (http_error.value.code, http_error.value.read()) == (410, b"gone")
    with pytest.raises(fetching.EgressDenied) as denied:  # a denial is not a URLError: it ends typed
        request_module.urlopen("https://x.example/denied")
    assert not isinstance(denied.value, error_module.URLError)
    with pytest.raises(standins.NotSupported, match="build_opener"):
        request_module.build_opener  # noqa: B018


def test_the_surface_table_is_what_the_modules_expose(modules: dict[str, Any]) -> None:
    for name, module in modules.items():
        exposed = {key for key in vars(module) if not key.startswith("_")}
        assert exposed == set(standins.SURFACE[name]), name
    assert json.loads(json.dumps(sorted(standins.SURFACE)))  # the guardrails read the same table
