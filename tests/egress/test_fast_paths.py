"""The shortcuts the fetch path takes for speed keep every check: verdicts kept per broker still deny what
they denied, per request and per redirect hop; the URL scan refuses what the per-character loop refused;
the encoders shared between frames write what ``json.dumps`` wrote; a body read in one piece by the sandbox
is refused like one read in pieces when its length or its descriptors are wrong."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from typing import Any

import pytest

from sandforge.runtime.egress import EgressBroker, EgressDenied, EgressPolicy, EgressSection, FetchRequest, InvalidFetch
from sandforge.runtime.egress import broker as broker_module
from sandforge.runtime.egress.urls import parse_url, path_matches
from sandforge.sandbox.inside import channel as inside_channel
from sandforge.sandbox.inside import wire as inside_wire
from sandforge.sandbox.inside.wire import HEADER
from tests.egress.conftest import Net, ScriptedResolver


def broker(section: dict[str, Any], **kwargs: Any) -> EgressBroker:
    return EgressBroker(EgressPolicy().merge(EgressSection.model_validate(section)), **kwargs)


# ------------------------------------------------------------------------------------ address verdicts


@pytest.mark.netns
def test_a_kept_verdict_denies_again_and_never_stands_for_another_address(net: Net) -> None:
    """The name answers the allowed address, then the forbidden one: the second request is judged on its
    own answer (a cache keyed by host name, or one that skipped the check, would connect to 127.0.0.2)."""
    resolver = ScriptedResolver({"flip.test": [["127.0.0.1"], ["127.0.0.2"]]})
    section = {
        "allow": [{"host": "flip.test", "schemes": ["http"], "ports": [net.port]}],
        "allow_ranges": ["127.0.0.1/32"],
    }
    session = broker(section, resolver=resolver).session()
    assert session.fetch(FetchRequest.of(f"http://flip.test:{net.port}/hello")).status == 200
    for _ in range(2):  # denied, and denied again once its verdict is kept
        with pytest.raises(EgressDenied, match=r"127\.0\.0\.2"):
            session.fetch(FetchRequest.of(f"http://flip.test:{net.port}/hello"))
    assert resolver.calls == ["flip.test"] * 3
    assert len(net.allowed.seen) == 1 and net.nothing_reached_forbidden()


def test_verdicts_are_bounded_and_judged_once(monkeypatch: pytest.MonkeyPatch) -> None:
    judged: list[str] = []
    real = broker_module.classify

    def counting(address: Any, exempt: Any = ()) -> Any:
        judged.append(str(address))
        return real(address, exempt)

    monkeypatch.setattr(broker_module, "classify", counting)
    monkeypatch.setattr(broker_module, "VERDICT_CACHE", 2)
    b = broker({"allow": [{"host": "*", "schemes": ["http"]}], "allow_ranges": ["127.0.0.1/32"]})
    addresses = [ipaddress.ip_address(a) for a in ("127.0.0.1", "169.254.169.254", "10.0.0.1")]
    first = [b._verdict(a) for a in addresses]
    second = [b._verdict(a) for a in addresses]
    assert [v.allowed for v in first] == [v.allowed for v in second] == [True, False, False]
    assert len(b._verdicts) == 2  # the third was judged and not kept
    assert judged == ["127.0.0.1", "169.254.169.254", "10.0.0.1", "10.0.0.1"]


# ------------------------------------------------------------------------------------------- URLs


@pytest.mark.parametrize("code", [*range(0x20), 0x7F, 0x5C])
def test_every_forbidden_character_is_refused_anywhere_in_the_url(code: int) -> None:
    for url in (f"http://a.test/p{chr(code)}q", f"http://a{chr(code)}b.test/", f"http://a.test/?q={chr(code)}"):
        with pytest.raises(InvalidFetch):
            parse_url(url)


def test_printable_characters_pass_the_scan_and_are_escaped_as_before() -> None:
    target = parse_url('http://a.test/a b"<>^`{|}é?x=1 2&y=é')
    assert target.path == "/a%20b%22%3C%3E%5E%60%7B%7C%7D%C3%A9"
    assert target.query == "x=1%202&y=%C3%A9"
    assert parse_url("http://a.test/plain/path-._~!$&'()*+,;=:@").path == "/plain/path-._~!$&'()*+,;=:@"


def test_path_globs_match_as_before() -> None:
    assert path_matches("/rss/**", "/rss/a/b") and not path_matches("/rss/*", "/rss/a/b")
    assert path_matches("/caf%C3%A9/*", "/caf%C3%A9/x") and path_matches("/café/*", "/caf%C3%A9/x")
    assert not path_matches("/a?", "/a/")


# ------------------------------------------------------------------------------------------ frames


@pytest.mark.parametrize(
    "value",
    [{"a": [1, 2.5, None, True]}, "é\u2028\x00", [], {"nested": {"k": "v" * 100}}, 1e308, -0.0],
)
def test_the_shared_encoder_writes_what_json_dumps_wrote(value: Any) -> None:
    expected = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    assert inside_wire.dumps(value) == expected
    assert inside_wire.dumps(value) == expected  # and again, from the kept encoder


def test_the_shared_encoder_still_refuses_what_is_not_json() -> None:
    with pytest.raises(ValueError):
        inside_wire.dumps(float("nan"))
    with pytest.raises(TypeError):
        inside_wire.dumps({1, 2})
    assert inside_wire.dumps({1, 2}, sorted) == "[1,2]"  # a hook has its own encoder


def _pair() -> tuple[socket.socket, inside_channel.Channel]:
    host, sandbox = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return host, inside_channel.Channel(sandbox.detach())


def test_a_body_arrives_whole_as_bytes_even_when_sent_in_pieces() -> None:
    host, channel = _pair()
    try:
        body = os.urandom(300_000)
        host.sendall(HEADER.pack(len(body)) + body[:1000])
        pid = os.fork()
        if pid == 0:  # the rest comes later, from another process
            try:
                host.sendall(body[1000:])
            finally:
                os._exit(0)
        got = inside_channel.read_bytes_frame(channel, 1 << 20)
        os.waitpid(pid, 0)
        assert type(got) is bytes and got == body
    finally:
        host.close()
        os.close(channel.fd)


def test_a_body_over_the_limit_or_cut_short_is_refused() -> None:
    host, channel = _pair()
    try:
        host.sendall(HEADER.pack(2 << 20))
        with pytest.raises(ValueError, match="exceeds"):
            inside_channel.read_bytes_frame(channel, 1 << 20)
        host.sendall(HEADER.pack(100) + b"x" * 10)
        host.shutdown(socket.SHUT_WR)
        with pytest.raises(EOFError):
            inside_channel.read_bytes_frame(channel, 1 << 20)
    finally:
        host.close()
        os.close(channel.fd)


def test_descriptors_riding_on_a_body_are_collected_not_missed() -> None:
    host, channel = _pair()
    r, w = os.pipe()
    try:
        body = b"y" * 5000
        host.sendall(HEADER.pack(len(body)))
        socket.send_fds(host, [body[:10]], [r])
        host.sendall(body[10:])
        got = inside_channel.read_bytes_frame(channel, 1 << 20)
        assert got == body
        fds, _ = channel.take_fds()
        assert len(fds) == 1  # the caller (Bridge.fetch) refuses a reply that came with any
        inside_channel.close_fds(fds)
    finally:
        for fd in (r, w):
            os.close(fd)
        host.close()
        os.close(channel.fd)
