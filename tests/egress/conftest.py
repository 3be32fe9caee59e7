"""Fixtures for the egress tests: the network-namespace marker (`tests/egress/netns.py`) and loopback
HTTP/HTTPS servers that record what reaches them."""

from __future__ import annotations

import pytest

from tests.egress import netns


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "netns: runs inside a network namespace with only lo up (tests/egress/netns.py); skips without"
    )
    if netns.inside():
        netns.bring_lo_up()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    netns.configure_items(items)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    netns.log_report(report)


# ----------------------------------------------------------------------------------- servers and CA

import ipaddress  # noqa: E402
import ssl  # noqa: E402
from collections.abc import Iterator, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

from tests.egress import servers  # noqa: E402

TLS_NAMES = ("allowed.test", "other-allowed.test", "127.0.0.1")


@dataclass
class CAFiles:
    ca_file: Path
    server_context: ssl.SSLContext


def _make_ca(directory: Path) -> CAFiles:
    trustme = pytest.importorskip("trustme", reason="HTTPS tests need trustme (a dev dependency)")
    ca = trustme.CA()
    cert = ca.issue_cert("allowed.test", "127.0.0.1")
    ca_file = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    return CAFiles(ca_file, context)


@pytest.fixture
def test_ca(tmp_path: Path) -> CAFiles:
    return _make_ca(tmp_path)


@dataclass
class Net:
    """An allowed server on 127.0.0.1:P, a forbidden one on 127.0.0.2:P (same port: a broker that
    connects to anything but the checked address lands there), and another forbidden one on 127.0.0.1:Q."""

    allowed: servers.Server
    forbidden: servers.Server
    other_port: servers.Server
    started: list[servers.Server] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.allowed.port

    def nothing_reached_forbidden(self) -> bool:
        return not self.forbidden.seen and not self.other_port.seen


def _pair(tls: ssl.SSLContext | None) -> tuple[servers.Server, servers.Server]:
    for _ in range(20):
        allowed = servers.start("127.0.0.1", tls=tls)
        try:
            return allowed, servers.start("127.0.0.2", allowed.port, tls=tls)
        except OSError:
            allowed.close()
    raise RuntimeError("no port free on both 127.0.0.1 and 127.0.0.2")


@pytest.fixture
def net() -> Iterator[Net]:
    allowed, forbidden = _pair(None)
    other = servers.start("127.0.0.1")
    setup = Net(allowed, forbidden, other, [allowed, forbidden, other])
    yield setup
    for server in setup.started:
        server.close()


@pytest.fixture
def tls_net(test_ca: CAFiles) -> Iterator[Net]:
    allowed, forbidden = _pair(test_ca.server_context)
    other = servers.start("127.0.0.1", tls=test_ca.server_context)
    setup = Net(allowed, forbidden, other, [allowed, forbidden, other])
    yield setup
    for server in setup.started:
        server.close()


class ScriptedResolver:
    """A resolver the tests control: successive answers per host (the last one repeats), and a count."""

    def __init__(self, answers: dict[str, Sequence[Sequence[str]]]) -> None:
        self.answers = {host: [list(a) for a in seq] for host, seq in answers.items()}
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        self.calls.append(host)
        queue = self.answers.get(host)
        if not queue:
            from sandforge.runtime.egress import NetworkError

            raise NetworkError(f"DNS: cannot resolve {host} (test resolver)", reason="dns")
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        return [ipaddress.ip_address(a) for a in answer]
