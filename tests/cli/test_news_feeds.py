"""The news demo's local internet and its policy layer: reachable only through the broker, only under that layer."""

from __future__ import annotations

import http.client
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandforge.runtime.cli.news_feeds import LOOPBACK_RANGE, SITES, LocalInternet
from sandforge.runtime.egress import EgressBroker, EgressDenied, FetchRequest, FetchResponse
from sandforge.runtime.guardrails import default_policy
from sandforge.runtime.guardrails.loader import layered_policy


@pytest.fixture
def net() -> Iterator[LocalInternet]:
    with LocalInternet() as running:
        yield running


def raw_get(port: int, path: str, host: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_each_server_answers_its_feed_for_its_own_name_only(net: LocalInternet) -> None:
    for site in SITES:
        server = net.servers[site.host]
        status, body = raw_get(server.port, f"{site.feed_path}?x=1", f"{site.host}:{server.port}")
        assert status == 200
        titles = [node.text for node in ET.fromstring(body).iter("title")]
        assert titles[0] == site.channel and titles[1:] == [story.title for story in site.stories]
        other = next(s for s in SITES if s is not site)
        assert raw_get(server.port, site.feed_path, other.host)[0] == 421  # misdirected: another name
        assert raw_get(server.port, "/admin", site.host)[0] == 404
        assert (server.served, server.refused) == (1, 2)


def test_the_layer_grants_fetching_and_reaches_exactly_the_three_feeds(net: LocalInternet, tmp_path: Path) -> None:
    policy = layered_policy([net.write_policy_layer(tmp_path / "layer")])
    assert "http_fetch" in policy.granted
    assert policy.egress.allow_ranges == (LOOPBACK_RANGE,)
    assert set(policy.egress.resolve) == {site.host for site in SITES}
    broker = EgressBroker(policy.egress)
    session = broker.session(deadline=time.monotonic() + 10)
    for source, url in net.feeds().items():
        reply = session.fetch(FetchRequest.of(url))
        assert isinstance(reply, FetchResponse) and reply.status == 200, source
    assert [server.served for server in net.servers.values()] == [1, 1, 1]
    google = net.servers["news.google.com"]
    for url in (
        f"http://news.google.com:{google.port}/rss/articles/x",  # another path
        f"http://news.yahoo.com:{google.port}/rss",  # another name on the same port
        f"http://127.0.0.1:{google.port}/rss",  # the address itself: no entry names it
        f"http://news.google.com:{google.port + 1}/rss",  # another port
    ):
        with pytest.raises(EgressDenied):
            broker.session(deadline=time.monotonic() + 5).fetch(FetchRequest.of(url))
    assert [server.served + server.refused for server in net.servers.values()] == [1, 1, 1]


def test_without_the_layer_nothing_is_reachable_and_the_default_keeps_loopback_denied(
    net: LocalInternet, tmp_path: Path
) -> None:
    assert default_policy().egress.allow_ranges == () and default_policy().egress.resolve == {}
    url = net.feeds()["Google News"]
    with pytest.raises(EgressDenied):
        EgressBroker(default_policy().egress).session(deadline=time.monotonic() + 5).fetch(FetchRequest.of(url))
    # the same layer without its allow_ranges: the name resolves to loopback, which the deny list refuses
    layer = net.write_policy_layer(tmp_path / "layer")
    text = (layer / "policy.yaml").read_text()
    (layer / "policy.yaml").write_text(text.replace(f'  allow_ranges: ["{LOOPBACK_RANGE}"]\n', ""))
    policy = layered_policy([layer])
    assert policy.egress.allow_ranges == ()
    with pytest.raises(EgressDenied, match=r"127\.0\.0\.1"):
        EgressBroker(policy.egress).session(deadline=time.monotonic() + 5).fetch(FetchRequest.of(url))
    assert sum(server.served + server.refused for server in net.servers.values()) == 0


def test_closing_stops_the_servers() -> None:
    with LocalInternet() as running:
        port = running.servers["news.yahoo.com"].port
    with pytest.raises(OSError):
        raw_get(port, "/rss/", "news.yahoo.com")
