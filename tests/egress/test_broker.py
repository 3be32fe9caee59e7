"""The broker against loopback servers, inside a network namespace with only lo up: allowed fetches work,
every bypass is denied before the forbidden server receives anything."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from sandforge.runtime.egress import (
    EgressBroker,
    EgressDenied,
    EgressPolicy,
    EgressSection,
    FetchReply,
    FetchRequest,
    InvalidFetch,
    MissingCredentials,
    NetworkError,
)
from tests.egress.conftest import CAFiles, Net, ScriptedResolver

pytestmark = pytest.mark.netns


def broker(section: dict[str, Any], **kwargs: Any) -> EgressBroker:
    return EgressBroker(EgressPolicy().merge(EgressSection.model_validate(section)), **kwargs)


def allowing(net: Net, *extra: dict[str, Any], **more: Any) -> dict[str, Any]:
    """allowed.test -> 127.0.0.1 (exempted), any path on the allowed server's port, GET/HEAD/POST."""
    return {
        "allow": [
            {"url": f"http://allowed.test:{net.port}/**", "methods": ["GET", "HEAD", "POST"], "name": "test"},
            *extra,
        ],
        "allow_ranges": ["127.0.0.1/32"],
        "resolve": {"allowed.test": "127.0.0.1", "forbidden.test": "127.0.0.2"},
        **more,
    }


def get(session: Any, url: str, **kwargs: Any) -> Any:
    return session.fetch(FetchRequest.of(url, **kwargs))


# ---------------------------------------------------------------------------------------- allowed


def test_these_tests_run_in_a_namespace_with_only_lo() -> None:
    import os
    import socket

    assert os.environ.get("SANDFORGE_EGRESS_NETNS") == "1"
    assert [name for _, name in socket.if_nameindex()] == ["lo"]


def test_an_allowed_fetch_works_and_is_recorded(net: Net) -> None:
    session = broker(allowing(net)).session()
    response = get(session, f"http://allowed.test:{net.port}/hello")
    assert (response.status, response.content) == (200, b"hello")
    assert response.headers["content-type"] == "text/plain"
    assert net.allowed.seen[0].headers["host"] == f"allowed.test:{net.port}"
    [record] = session.records
    assert record.final_url == f"http://allowed.test:{net.port}/hello"
    assert (record.status, record.bytes, record.rule, record.denied) == (
        200,
        5,
        f"test (http://allowed.test:{net.port}/**)",
        None,
    )
    assert net.nothing_reached_forbidden()


def test_5xx_is_a_response_not_an_error(net: Net) -> None:
    response = get(broker(allowing(net)).session(), f"http://allowed.test:{net.port}/status?code=503")
    assert (response.status, response.content) == (503, b"status body")


def test_post_body_and_gzip_are_handled(net: Net) -> None:
    session = broker(allowing(net)).session()
    echoed = json.loads(get(session, f"http://allowed.test:{net.port}/echo", method="POST", body=b"a=1").content)
    assert (echoed["method"], echoed["body"], echoed["headers"]["content-length"]) == ("POST", "a=1", "3")
    response = get(session, f"http://allowed.test:{net.port}/gzip")
    assert response.content == b"hello gzip" and "content-encoding" not in response.headers


def test_https_verifies_the_host_name_with_sni_while_connecting_to_the_checked_address(
    tls_net: Net, test_ca: CAFiles
) -> None:
    section = {
        "allow": [{"host": "*allowed.test", "ports": [tls_net.port]}],
        "allow_ranges": ["127.0.0.1/32"],
        "resolve": {"allowed.test": "127.0.0.1", "other-allowed.test": "127.0.0.1"},
        "ca_file": str(test_ca.ca_file),
    }
    session = broker(section).session()
    echoed = json.loads(get(session, f"https://allowed.test:{tls_net.port}/echo").content)
    assert echoed["sni"] == "allowed.test"
    # same checked address, but a name the certificate does not carry: TLS refuses it
    with pytest.raises(NetworkError) as caught:
        get(session, f"https://other-allowed.test:{tls_net.port}/echo")
    assert caught.value.reason == "tls"
    assert len(tls_net.allowed.seen) == 1
    # without the test CA the system store does not trust the server
    section.pop("ca_file")
    with pytest.raises(NetworkError, match="TLS"):
        get(broker(section).session(), f"https://allowed.test:{tls_net.port}/echo")


def test_proxy_variables_are_not_honoured(net: Net, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, f"http://127.0.0.2:{net.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    response = get(broker(allowing(net)).session(), f"http://allowed.test:{net.port}/hello")
    assert response.status == 200 and len(net.allowed.seen) == 1
    assert net.nothing_reached_forbidden()


def test_many_executions_fetch_at_once(net: Net) -> None:
    """Eight sessions whose requests the server holds until all eight arrived: a broker that serialised
    them on one lock or thread would never get there (the server's barrier would break)."""
    shared = broker(allowing(net))
    net.allowed.barrier = threading.Barrier(8)
    results: list[bytes] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            results.append(get(shared.session(), f"http://allowed.test:{net.port}/wait").content)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors and results == [b"together"] * 8


# ---------------------------------------------------------------------------------------- bypasses


def test_the_default_policy_allows_nothing_and_sends_nothing(net: Net) -> None:
    from sandforge.runtime.guardrails import default_policy

    session = EgressBroker(default_policy().egress).session()
    for url in (f"http://127.0.0.1:{net.port}/", f"http://allowed.test:{net.port}/", "https://example.com/"):
        with pytest.raises(EgressDenied, match="allows no destination"):
            get(session, url)
    assert not net.allowed.seen and net.nothing_reached_forbidden()
    assert [r.error for r in session.records] == ["egress_denied"] * 3


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.2",
        "2130706434",  # 127.0.0.2 as one number
        "0x7f.0.0.2",
        "0x7f000002",
        "127.2",
        "017700000002",
        "0177.0.0.02",
        "[::ffff:127.0.0.2]",
        "[::ffff:7f00:2]",
        "[64:ff9b::7f00:2]",
        "[::127.0.0.2]",
        "[2002:7f00:2::1]",
        "[2001:0:4136:e378:8000:63bf:80ff:fffd]",
        "[::1]",
        "[fe80::1]",
        "[fd00::1]",
        "[64:ff9b:1::7f00:2]",
        "0.0.0.0",
        "[::]",
    ],
)
def test_numeric_and_ipv6_forms_land_on_the_address_check(net: Net, host: str) -> None:
    """An allow-everything entry: only the platform deny list stands between the URL and the server."""
    section = {"allow": [{"host": "*", "schemes": ["http"], "ports": [net.port]}], "allow_ranges": []}
    with pytest.raises(EgressDenied) as caught:
        get(broker(section).session(), f"http://{host}:{net.port}/")
    assert caught.value.reason == "address"
    assert not net.allowed.seen and net.nothing_reached_forbidden()


@pytest.mark.parametrize(
    "address",
    [
        "169.254.169.254",
        "10.0.0.1",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "224.0.0.1",
        "240.0.0.1",
        "::ffff:169.254.169.254",
        "64:ff9b::a9fe:a9fe",
        "fd12::1",
        "2001:db8::1",
    ],
)
def test_a_name_resolving_to_a_denied_address_is_denied(net: Net, address: str) -> None:
    resolver = ScriptedResolver({"metadata.test": [[address]]})
    section = {"allow": [{"host": "metadata.test", "schemes": ["http"]}]}
    with pytest.raises(EgressDenied, match="platform denies") as caught:
        get(broker(section, resolver=resolver).session(), "http://metadata.test/latest/meta-data/")
    assert caught.value.reason == "address" and resolver.calls == ["metadata.test"]


def test_rebinding_between_check_and_connect_cannot_swap_the_target(net: Net) -> None:
    """The name answers the allowed address once and the forbidden one afterwards: the broker resolves once
    and connects to what it checked (a broker that resolved again, or let the client resolve, would land on
    the forbidden server, which listens on the same port)."""
    resolver = ScriptedResolver({"rebind.test": [["127.0.0.1"], ["127.0.0.2"]], "localhost": [["127.0.0.2"]]})
    section = {
        "allow": [{"host": "rebind.test", "schemes": ["http"], "ports": [net.port]}],
        "allow_ranges": ["127.0.0.1/32"],
    }
    response = get(broker(section, resolver=resolver).session(), f"http://rebind.test:{net.port}/hello")
    assert response.status == 200 and resolver.calls == ["rebind.test"]
    assert len(net.allowed.seen) == 1 and net.nothing_reached_forbidden()


def test_a_mixed_answer_is_denied_whole(net: Net) -> None:
    resolver = ScriptedResolver({"mixed.test": [["127.0.0.1", "127.0.0.2"]]})
    section = {
        "allow": [{"host": "mixed.test", "schemes": ["http"], "ports": [net.port]}],
        "allow_ranges": ["127.0.0.1/32"],
    }
    with pytest.raises(EgressDenied, match=r"127\.0\.0\.2"):
        get(broker(section, resolver=resolver).session(), f"http://mixed.test:{net.port}/")
    assert not net.allowed.seen and net.nothing_reached_forbidden()


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.2:{port}/",
        "http://forbidden.test:{port}/",
        "http://127.1:{port}/",
        "http://[::ffff:127.0.0.2]:{port}/",
    ],
)
@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_to_a_denied_host_is_denied(net: Net, target: str, code: int) -> None:
    session = broker(allowing(net)).session()
    location = target.format(port=net.port)
    with pytest.raises(EgressDenied):
        get(session, f"http://allowed.test:{net.port}/redirect?code={code}&to={location}")
    assert len(net.allowed.seen) == 1 and net.nothing_reached_forbidden()
    [record] = session.records
    assert record.error == "egress_denied" and record.redirects


def test_a_redirect_to_another_port_of_the_same_host_is_denied(net: Net) -> None:
    session = broker(allowing(net)).session()
    with pytest.raises(EgressDenied):
        get(session, f"http://allowed.test:{net.port}/redirect?to=http://allowed.test:{net.other_port.port}/")
    assert net.nothing_reached_forbidden()


@pytest.mark.parametrize(
    "url",
    [
        "http://allowed.test:{port}@127.0.0.2:{port}/",
        "http://allowed.test@forbidden.test:{port}/",
        "http://user:pw@allowed.test:{port}/",
        "http://allowed.test:{port}\\@127.0.0.2:{port}/",
        "http://127.0.0.2:{port}#@allowed.test:{port}/",
        "http://127.0.0.2:{port}?@allowed.test:{port}/",
    ],
)
def test_userinfo_tricks_are_denied(net: Net, url: str) -> None:
    with pytest.raises((EgressDenied, InvalidFetch)):
        get(broker(allowing(net)).session(), url.format(port=net.port))
    assert not net.allowed.seen and net.nothing_reached_forbidden()


def test_ports_outside_the_entry_are_denied(net: Net) -> None:
    session = broker({**allowing(net), "allow_ranges": ["127.0.0.0/8"]}).session()
    for url in (
        f"http://allowed.test:{net.other_port.port}/",
        f"http://allowed.test:0{net.other_port.port}/",
        f"http://allowed.test:{net.port + 65536}/",
        "http://allowed.test/",
    ):
        with pytest.raises((EgressDenied, InvalidFetch)):
            get(session, url)
    assert not net.allowed.seen and net.nothing_reached_forbidden()


def test_methods_schemes_and_paths_outside_the_entry_are_denied(net: Net) -> None:
    section = {**allowing(net), "allow": [{"url": f"http://allowed.test:{net.port}/public/**"}]}
    session = broker(section).session()
    for method, url in [
        ("POST", f"http://allowed.test:{net.port}/public/x"),
        ("GET", f"http://allowed.test:{net.port}/private"),
        ("GET", f"http://allowed.test:{net.port}/public/../private"),
        ("GET", f"http://allowed.test:{net.port}/public/%2e%2e/private"),
        ("GET", f"https://allowed.test:{net.port}/public/x"),
        ("GET", "file:///etc/passwd"),
        ("GET", f"ftp://allowed.test:{net.port}/public/x"),
    ]:
        with pytest.raises(EgressDenied):
            get(session, url, method=method)
    assert not net.allowed.seen
    assert get(session, f"http://allowed.test:{net.port}/public/a/b").status == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Host": "forbidden.test"},
        {"host": "allowed.test"},
        {"X-A": "b\r\nHost: forbidden.test"},
        {"X-A": "b\nX-B: c"},
        {"X-A\r\nX-B": "c"},
        {"X-A": "b\0"},
        {"Transfer-Encoding": "chunked"},
        {"Content-Length": "0"},
        {"Connection": "keep-alive, Upgrade"},
        {"Upgrade": "h2c"},
        {"Proxy-Authorization": "Basic eA=="},
        {"TE": "trailers"},
    ],
)
def test_header_injection_and_overrides_are_denied(net: Net, headers: dict[str, str]) -> None:
    with pytest.raises(EgressDenied):
        get(broker(allowing(net)).session(), f"http://allowed.test:{net.port}/echo", headers=headers)
    assert not net.allowed.seen and net.nothing_reached_forbidden()


def test_program_headers_pass_and_origin_bound_ones_stay_with_their_origin(net: Net) -> None:
    section = allowing(net, {"url": f"http://other.test:{net.port}/**"})
    section["resolve"]["other.test"] = "127.0.0.1"
    session = broker(section).session()
    headers = {"Authorization": "Bearer program-token", "Cookie": "a=b", "X-Custom": "1", "Accept-Encoding": "br"}
    get(session, f"http://allowed.test:{net.port}/redirect?to=http://other.test:{net.port}/echo", headers=headers)
    first, second = net.allowed.seen
    assert first.headers["authorization"] == "Bearer program-token" and first.headers["x-custom"] == "1"
    assert first.headers["accept-encoding"] == "gzip, deflate"
    assert "authorization" not in second.headers and "cookie" not in second.headers
    assert second.headers["x-custom"] == "1" and second.headers["host"] == f"other.test:{net.port}"


# ------------------------------------------------------------------------------------- credentials

SECRET = "s3cr3t-token-value"


def test_credentials_reach_the_server_and_nothing_else(net: Net, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    section = allowing(
        net,
        {"url": f"http://other.test:{net.port}/**"},
        credentials=[
            {"host": "allowed.test", "header": "Authorization", "value": "Bearer ${TEST_TOKEN}", "schemes": ["http"]}
        ],
    )
    section["resolve"]["other.test"] = "127.0.0.1"
    shared = broker(section, environ={"TEST_TOKEN": SECRET})
    session = shared.session()
    response = get(session, f"http://allowed.test:{net.port}/echo", headers={"Authorization": "Bearer mine"})
    assert net.allowed.seen[0].headers["authorization"] == f"Bearer {SECRET}"  # the host's value wins
    assert SECRET.encode() not in response.content and b"[redacted]" in response.content
    assert SECRET not in json.dumps(response.headers) and "[redacted]" in response.headers["x-echo-authorization"]
    # a redirect to another host: the credential is not forwarded
    get(session, f"http://allowed.test:{net.port}/redirect?to=http://other.test:{net.port}/echo")
    assert "authorization" not in net.allowed.seen[-1].headers
    # an error after the credential was used carries no value either
    with pytest.raises(EgressDenied) as caught:
        get(session, f"http://allowed.test:{net.port}/redirect?to=http://127.0.0.2:{net.port}/{SECRET}")
    assert SECRET not in str(caught.value)
    reply = session.handle(FetchRequest.of(f"http://allowed.test:{net.port}/echo").model_dump_json())
    assert SECRET not in reply.decode()
    assert SECRET not in json.dumps([r.model_dump(mode="json") for r in session.records])
    assert SECRET not in caplog.text
    assert net.nothing_reached_forbidden()


def test_credentials_are_https_only_by_default(net: Net) -> None:
    section = allowing(net, credentials=[{"host": "allowed.test", "header": "X-Key", "value": "${TEST_TOKEN}"}])
    get(broker(section, environ={"TEST_TOKEN": SECRET}).session(), f"http://allowed.test:{net.port}/echo")
    assert "x-key" not in net.allowed.seen[0].headers


def test_a_missing_credential_is_typed_and_sends_nothing(net: Net) -> None:
    section = allowing(
        net, credentials=[{"host": "allowed.test", "header": "X-Key", "value": "${ABSENT_TOKEN}", "schemes": ["http"]}]
    )
    with pytest.raises(MissingCredentials, match="ABSENT_TOKEN"):
        get(broker(section, environ={}).session(), f"http://allowed.test:{net.port}/echo")
    assert not net.allowed.seen


def test_a_credential_from_a_file(net: Net, tmp_path: Any) -> None:
    secret_file = tmp_path / "token"
    secret_file.write_text(SECRET + "\n")
    section = allowing(
        net,
        credentials=[{"host": "*.test", "header": "X-Key", "value": f"k=${{file:{secret_file}}}", "schemes": ["http"]}],
    )
    response = get(broker(section, environ={}).session(), f"http://allowed.test:{net.port}/echo")
    assert net.allowed.seen[0].headers["x-key"] == f"k={SECRET}"
    assert SECRET.encode() not in response.content


# --------------------------------------------------------------------------------------------- wire


def test_the_wire_is_json_in_json_out(net: Net) -> None:
    session = broker(allowing(net)).session()
    ok = FetchReply.model_validate_json(
        session.handle(
            json.dumps(
                {
                    "url": f"http://allowed.test:{net.port}/echo",
                    "method": "POST",
                    "body_b64": "aGk=",
                    "params": {"q": ["a b", "c"]},
                }
            )
        )
    )
    assert ok.response is not None and ok.response.status == 200
    assert json.loads(ok.response.content)["path"] == "/echo?q=a+b&q=c"
    for frame in (
        b"not json",
        b'{"url": 1}',
        b'{"url": "http://x/", "body_b64": "***"}',
        json.dumps({"url": "http://x/", "timeout_s": float("nan")}).encode(),
        b'{"url":"http://x/","x":1}',
    ):
        reply = FetchReply.model_validate_json(session.handle(frame))
        assert reply.error is not None and reply.error.kind == "invalid_fetch", frame
    denied = FetchReply.model_validate_json(session.handle(json.dumps({"url": f"http://127.0.0.2:{net.port}/"})))
    assert denied.error is not None and denied.error.kind == "egress_denied"
    assert net.nothing_reached_forbidden()
