"""Kept-alive connections within one session (runtime/egress/transport.py's ConnectionPool): reuse skips a
handshake, never a decision. Every request is still matched, resolved and its addresses judged; a connection
is reused only for the same scheme, host name, port and checked address; non-idempotent requests never go on
a reused connection; a connection the server closed is dropped; nothing outlives the session."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sandforge.runtime.egress import EgressBroker, EgressDenied, EgressPolicy, EgressSection, FetchRequest, transport
from tests.egress.conftest import CAFiles, Net, ScriptedResolver

pytestmark = pytest.mark.netns


def broker(section: dict[str, Any], **kwargs: Any) -> EgressBroker:
    return EgressBroker(EgressPolicy().merge(EgressSection.model_validate(section)), **kwargs)


def section(net: Net, **more: Any) -> dict[str, Any]:
    return {
        "allow": [
            {"url": f"http://allowed.test:{net.port}/ok/**", "methods": ["GET", "HEAD", "POST"]},
            {"url": f"http://allowed.test:{net.port}/hangup"},
            {"url": f"http://allowed.test:{net.port}/big"},
            {"url": f"http://allowed.test:{net.port}/extra"},
        ],
        "allow_ranges": ["127.0.0.1/32"],
        "resolve": {"allowed.test": "127.0.0.1"},
        **more,
    }


def get(session: Any, url: str, **kwargs: Any) -> Any:
    return session.fetch(FetchRequest.of(url, **kwargs))


def peers(net: Net) -> list[Any]:
    return [seen.peer for seen in net.allowed.seen]


def test_requests_of_one_session_share_a_connection(net: Net) -> None:
    session = broker(section(net)).session()
    for _ in range(3):
        assert get(session, f"http://allowed.test:{net.port}/ok/a").content == b"hello"
    assert len(peers(net)) == 3 and len(set(peers(net))) == 1
    assert "connection" not in net.allowed.seen[0].headers  # HTTP/1.1: kept alive unless one side says close


def test_sessions_never_share_a_connection(net: Net) -> None:
    shared = broker(section(net))
    for _ in range(2):
        get(shared.session(), f"http://allowed.test:{net.port}/ok/a")
    assert len(set(peers(net))) == 2


def test_the_policy_is_decided_again_on_a_kept_connection(net: Net) -> None:
    session = broker(section(net)).session()
    get(session, f"http://allowed.test:{net.port}/ok/a")
    with pytest.raises(EgressDenied):
        get(session, f"http://allowed.test:{net.port}/admin")
    with pytest.raises(EgressDenied):
        session.fetch(FetchRequest.of(f"http://allowed.test:{net.port}/ok/a", method="DELETE"))
    assert [seen.path for seen in net.allowed.seen] == ["/ok/a"]


def test_a_name_that_rebinds_to_a_denied_address_is_denied_despite_an_idle_connection(net: Net) -> None:
    """The name answers the allowed address, then a denied one: the second request is judged on its own
    resolution and denied, though a connection to the allowed address is idle in the pool."""
    resolver = ScriptedResolver({"rebind.test": [["127.0.0.1"], ["127.0.0.2"]]})
    rules = {
        "allow": [{"host": "rebind.test", "schemes": ["http"], "ports": [net.port]}],
        "allow_ranges": ["127.0.0.1/32"],
    }
    session = broker(rules, resolver=resolver).session()
    assert get(session, f"http://rebind.test:{net.port}/").status == 200
    assert session._pool.idle == 1
    with pytest.raises(EgressDenied, match="platform denies"):
        get(session, f"http://rebind.test:{net.port}/")
    assert resolver.calls == ["rebind.test", "rebind.test"]
    assert len(net.allowed.seen) == 1 and net.nothing_reached_forbidden()


def test_a_connection_is_reused_only_for_the_address_it_was_checked_for(net: Net) -> None:
    """Both addresses allowed: after the name moves, the request goes to the new address on a new
    connection (the idle one to the old address is not taken)."""
    resolver = ScriptedResolver({"moving.test": [["127.0.0.1"], ["127.0.0.2"]]})
    rules = {
        "allow": [{"host": "moving.test", "schemes": ["http"], "ports": [net.port]}],
        "allow_ranges": ["127.0.0.1/32", "127.0.0.2/32"],
    }
    session = broker(rules, resolver=resolver).session()
    get(session, f"http://moving.test:{net.port}/")
    get(session, f"http://moving.test:{net.port}/")
    assert len(net.allowed.seen) == 1 and len(net.forbidden.seen) == 1


def test_a_connection_is_reused_only_for_its_own_host_name(net: Net) -> None:
    """Two names on one address: each gets its own connection (TLS verified one name; Host names one)."""
    rules = {
        "allow": [{"host": "*.test", "schemes": ["http"], "ports": [net.port]}],
        "allow_ranges": ["127.0.0.1/32"],
        "resolve": {"one.test": "127.0.0.1", "two.test": "127.0.0.1"},
    }
    session = broker(rules).session()
    for name in ("one.test", "two.test", "one.test", "two.test"):
        get(session, f"http://{name}:{net.port}/")
    by_host: dict[str, set[Any]] = {}
    for seen in net.allowed.seen:
        by_host.setdefault(seen.headers["host"], set()).add(seen.peer)
    assert {host: len(p) for host, p in by_host.items()} == {f"one.test:{net.port}": 1, f"two.test:{net.port}": 1}
    assert by_host[f"one.test:{net.port}"] != by_host[f"two.test:{net.port}"]


def test_tls_connections_are_kept_and_still_verified(tls_net: Net, test_ca: CAFiles) -> None:
    rules = {
        "allow": [{"url": f"https://allowed.test:{tls_net.port}/**"}],
        "allow_ranges": ["127.0.0.1/32"],
        "resolve": {"allowed.test": "127.0.0.1"},
        "ca_file": str(test_ca.ca_file),
    }
    session = broker(rules).session()
    for _ in range(2):
        assert get(session, f"https://allowed.test:{tls_net.port}/").content == b"hello"
    assert len({seen.peer for seen in tls_net.allowed.seen}) == 1
    assert tls_net.allowed.seen[0].sni == "allowed.test"


def test_non_idempotent_requests_never_go_on_a_reused_connection(net: Net) -> None:
    session = broker(section(net)).session()
    get(session, f"http://allowed.test:{net.port}/ok/a")
    session.fetch(FetchRequest.of(f"http://allowed.test:{net.port}/ok/a", method="POST", body=b"x"))
    session.fetch(FetchRequest.of(f"http://allowed.test:{net.port}/ok/a", method="POST", body=b"y"))
    first, post1, post2 = peers(net)
    assert post1 != first and post2 not in (first, post1)


def test_a_connection_the_server_closed_is_not_used_again(net: Net) -> None:
    session = broker(section(net)).session()
    assert get(session, f"http://allowed.test:{net.port}/hangup").content == b"bye"
    assert get(session, f"http://allowed.test:{net.port}/ok/a").content == b"hello"
    assert len(set(peers(net))) == 2


def test_bytes_nobody_asked_for_are_never_read_as_the_next_response(net: Net) -> None:
    """The server writes a forged response after the real one: the idle connection is readable, so it is
    closed, and the next request gets its own response on a new connection."""
    session = broker(section(net)).session()
    assert get(session, f"http://allowed.test:{net.port}/extra").content == b"first"
    deadline = time.monotonic() + 5
    while not transport._dropped(_idle_socket(session)) and time.monotonic() < deadline:
        time.sleep(0.01)  # the forged bytes follow the response: wait until they are there
    assert get(session, f"http://allowed.test:{net.port}/ok/a").content == b"hello"
    assert len(set(peers(net))) == 2


def _idle_socket(session: Any) -> Any:
    [conns] = session._pool._idle.values()
    return conns[-1][1].sock


def test_a_request_on_a_connection_closed_unseen_goes_again_on_a_new_one(
    net: Net, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server closes an idle connection in the instant after the pool looked at it: the idempotent
    request fails on it before any response and is sent once more on a new connection."""
    session = broker(section(net)).session()
    get(session, f"http://allowed.test:{net.port}/hangup")
    monkeypatch.setattr(transport, "_dropped", lambda sock: False)  # the pool cannot see the close
    assert get(session, f"http://allowed.test:{net.port}/ok/a").content == b"hello"
    assert len(net.allowed.seen) == 2 and len(set(peers(net))) == 2


def test_a_failed_or_oversized_response_does_not_keep_its_connection(net: Net) -> None:
    rules = section(net, limits={"max_response_bytes": 1000})
    session = broker(rules).session()
    with pytest.raises(Exception, match="larger than"):
        get(session, f"http://allowed.test:{net.port}/big?n=5000")
    assert session._pool.idle == 0


def test_closing_the_session_closes_its_connections(net: Net) -> None:
    session = broker(section(net)).session()
    get(session, f"http://allowed.test:{net.port}/ok/a")
    pool = session._pool
    assert pool.idle == 1
    session.close()
    assert pool.idle == 0
    get(session, f"http://allowed.test:{net.port}/ok/a")  # still works, on a connection closed afterwards
    assert pool.idle == 0


def test_the_execution_closes_its_session(net: Net) -> None:
    from sandforge.runtime.agent.egress import ExecutionEgress
    from sandforge.sandbox import ErrorType, ExecutionOutcome

    fetches = ExecutionEgress(broker(section(net)))
    request = FetchRequest.of(f"http://allowed.test:{net.port}/ok/a").model_dump_json().encode()
    _reply, body = fetches.egress_parts(request, deadline=1e12)
    assert body == b"hello"
    session = fetches._session
    assert session is not None and session._pool.idle == 1
    fetches.attach(ExecutionOutcome.failure(ErrorType.EXECUTION, "ended"))
    assert session._pool.idle == 0


def test_the_pool_is_bounded(net: Net) -> None:
    pool = transport.ConnectionPool()
    closed: list[int] = []

    class Fake:
        sock = None

        def __init__(self, n: int) -> None:
            self.n = n

        def close(self) -> None:
            closed.append(self.n)

    for n in range(transport.MAX_IDLE + 3):
        pool.give(("http", "a.test", 80, n), Fake(n))  # type: ignore[arg-type]
    assert pool.idle == transport.MAX_IDLE and closed == [8, 9, 10]
    assert pool.take(("http", "a.test", 80, 0)) is None  # no socket: dropped, closed, not handed out
    assert 0 in closed
