"""Per-execution limits, inside a network namespace: sizes (plain, gzip bomb, endless chunked), time (a
server that drips body or headers), request counts, redirects and the execution's own deadline."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sandforge.runtime.egress import (
    EgressBroker,
    EgressLimit,
    EgressPolicy,
    EgressSection,
    FetchRequest,
    NetworkError,
)
from tests.egress.conftest import Net

pytestmark = pytest.mark.netns


def session(net: Net, **limits: Any) -> Any:
    section = {
        "allow": [{"url": f"http://allowed.test:{net.port}/**", "methods": ["GET", "POST"]}],
        "allow_ranges": ["127.0.0.1/32"],
        "resolve": {"allowed.test": "127.0.0.1"},
        "limits": limits,
    }
    return EgressBroker(EgressPolicy().merge(EgressSection.model_validate(section))).session()


def url(net: Net, path: str) -> FetchRequest:
    return FetchRequest.of(f"http://allowed.test:{net.port}{path}")


def test_a_body_over_max_response_bytes_stops_at_the_cap(net: Net) -> None:
    one = session(net, max_response_bytes=1024 * 1024)
    assert len(one.fetch(url(net, "/big?n=1048576")).content) == 1024 * 1024
    with pytest.raises(EgressLimit, match="max_response_bytes") as caught:
        one.fetch(url(net, "/big?n=1048577"))
    assert caught.value.reason == "size"
    assert one.records[-1].error == "egress_limit" and one.records[-1].bytes == 0


def test_a_gzip_bomb_stops_at_the_cap_after_decompression(net: Net) -> None:
    one = session(net, max_response_bytes=1024 * 1024)
    with pytest.raises(EgressLimit, match="larger than"):
        one.fetch(url(net, "/gzipbomb"))
    assert one.total_bytes == 0


def test_an_endless_chunked_body_stops_at_the_cap(net: Net) -> None:
    with pytest.raises(EgressLimit):
        session(net, max_response_bytes=2 * 1024 * 1024).fetch(url(net, "/endless"))


def test_a_dripping_body_times_out(net: Net) -> None:
    """40 bytes, one every 0.1 s: each read is quick, the whole is not; the request's timeout holds."""
    with pytest.raises(NetworkError) as caught:
        session(net, timeout_s=0.5).fetch(url(net, "/drip?n=40&every=0.1"))
    assert caught.value.reason == "timeout", str(caught.value)


def test_dripping_headers_time_out(net: Net) -> None:
    with pytest.raises(NetworkError) as caught:
        session(net, timeout_s=0.5).fetch(url(net, "/dripheaders"))
    assert caught.value.reason == "timeout", str(caught.value)


def test_a_request_cannot_ask_for_more_time_than_the_policy(net: Net) -> None:
    request = FetchRequest.of(f"http://allowed.test:{net.port}/drip?n=40&every=0.1", timeout_s=60)
    with pytest.raises(NetworkError, match="timed out"):
        session(net, timeout_s=0.5).fetch(request)


def test_too_many_requests(net: Net) -> None:
    one = session(net, max_requests=2)
    one.fetch(url(net, "/hello"))
    one.fetch(url(net, "/hello"))
    with pytest.raises(EgressLimit, match="max_requests"):
        one.fetch(url(net, "/hello"))
    assert len(net.allowed.seen) == 2


def test_the_total_is_counted_across_the_execution(net: Net) -> None:
    one = session(net, max_total_bytes=1000 * 1000, max_response_bytes=1000 * 1000)
    one.fetch(url(net, "/big?n=400000"))
    one.fetch(url(net, "/big?n=400000"))
    with pytest.raises(EgressLimit, match="max_total_bytes"):
        one.fetch(url(net, "/big?n=400000"))
    assert one.total_bytes == 800000
    other = session(net, max_total_bytes=1000 * 1000)  # another execution has its own budget
    other.fetch(url(net, "/big?n=400000"))


def test_redirect_loops_stop_at_max_redirects(net: Net) -> None:
    one = session(net, max_redirects=3)
    with pytest.raises(EgressLimit, match="max_redirects"):
        one.fetch(url(net, "/loop"))
    assert len(net.allowed.seen) == 4  # the request and three redirects
    assert len(one.records[-1].redirects) == 3


def test_a_request_body_over_its_limit_is_refused_before_sending(net: Net) -> None:
    one = session(net, max_request_bytes=1024)
    with pytest.raises(EgressLimit, match="max_request_bytes"):
        one.fetch(FetchRequest.of(f"http://allowed.test:{net.port}/echo", method="POST", body=b"x" * 1025))
    assert not net.allowed.seen


def test_the_execution_deadline_counts(net: Net) -> None:
    section = EgressSection.model_validate(
        {
            "allow": [{"url": f"http://allowed.test:{net.port}/**"}],
            "allow_ranges": ["127.0.0.1/32"],
            "resolve": {"allowed.test": "127.0.0.1"},
        }
    )
    broker = EgressBroker(EgressPolicy().merge(section))
    with pytest.raises(EgressLimit, match="time budget"):
        broker.session(deadline=time.monotonic() - 1).fetch(url(net, "/hello"))
    with pytest.raises(NetworkError, match="timed out"):
        broker.session(deadline=time.monotonic() + 0.5).fetch(url(net, "/drip?n=40&every=0.1"))
    assert not [seen for seen in net.allowed.seen if seen.path == "/hello"]
