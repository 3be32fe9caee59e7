"""IPv6 paths, inside a network namespace: an allowed fetch over ::1, and an IPv4-mapped literal that is
connected to as its IPv4 address."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from sandforge.runtime.egress import EgressBroker, EgressDenied, EgressPolicy, EgressSection, FetchRequest
from tests.egress import servers
from tests.egress.conftest import Net

pytestmark = pytest.mark.netns


@pytest.fixture
def v6_server() -> Iterator[servers.Server]:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        server = servers.start("::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    yield server
    server.close()


def broker(section: dict[str, object]) -> EgressBroker:
    return EgressBroker(EgressPolicy().merge(EgressSection.model_validate(section)))


def test_an_allowed_fetch_over_ipv6(v6_server: servers.Server) -> None:
    port = v6_server.port
    section = {"allow": [{"host": "[::1]", "schemes": ["http"], "ports": [port]}], "allow_ranges": ["::1/128"]}
    response = broker(section).session().fetch(FetchRequest.of(f"http://[0:0::1]:{port}/hello"))
    assert (response.status, response.url) == (200, f"http://[::1]:{port}/hello")
    assert v6_server.seen[0].headers["host"] == f"[::1]:{port}"


def test_ipv6_loopback_is_denied_without_its_range(v6_server: servers.Server) -> None:
    section = {"allow": [{"host": "*", "schemes": ["http"], "ports": [v6_server.port]}]}
    with pytest.raises(EgressDenied):
        broker(section).session().fetch(FetchRequest.of(f"http://[::1]:{v6_server.port}/"))
    assert not v6_server.seen


def test_a_mapped_literal_is_connected_to_as_ipv4(net: Net) -> None:
    section = {
        "allow": [{"host": "[::ffff:127.0.0.1]", "schemes": ["http"], "ports": [net.port]}],
        "allow_ranges": ["127.0.0.1/32"],
    }
    response = broker(section).session().fetch(FetchRequest.of(f"http://[::ffff:127.0.0.1]:{net.port}/hello"))
    assert response.status == 200 and len(net.allowed.seen) == 1 and net.nothing_reached_forbidden()
