"""URL normalisation and allow-entry matching (no network)."""

from __future__ import annotations

import pytest

from sandforge.runtime.egress import EgressDenied, EgressPolicy, EgressSection, InvalidFetch, parse_url, static_check
from sandforge.runtime.egress.urls import join


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("http://2130706433/", "http://127.0.0.1/"),
        ("http://0x7f.1/", "http://127.0.0.1/"),
        ("http://0x7F000001/", "http://127.0.0.1/"),
        ("http://127.1/", "http://127.0.0.1/"),
        ("http://127.0.1/", "http://127.0.0.1/"),
        ("http://0177.0.0.1/", "http://127.0.0.1/"),
        ("http://017700000001/", "http://127.0.0.1/"),
        ("http://0/", "http://0.0.0.0/"),
        ("http://169.254.169.254./", "http://169.254.169.254/"),
        ("http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/"),
        ("http://[0:0:0:0:0:ffff:7f00:1]:80/", "http://[::ffff:7f00:1]/"),
        ("HTTPS://News.Google.COM./rss/", "https://news.google.com/rss/"),
        ("https://news.google.com:443/a/./b/../c", "https://news.google.com/a/c"),
        ("https://x.com/rss/%2e%2e/admin", "https://x.com/admin"),
        ("https://x.com/%7euser/a b?q=a b&r=é#frag", "https://x.com/~user/a%20b?q=a%20b&r=%C3%A9"),
        ("https://x.com", "https://x.com/"),
        ("https://x.com:8443/", "https://x.com:8443/"),
        ("http://bücher.de/", "http://xn--bcher-kva.de/"),
        ("https://x.com/50%", "https://x.com/50%25"),
    ],
)
def test_normal_forms(url: str, normal: str) -> None:
    assert parse_url(url).url == normal


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("http://allowed.com@evil.com/", EgressDenied),
        ("http://user:pass@x.com/", EgressDenied),
        ("http://x.com:80@127.0.0.1/", EgressDenied),
        ("ftp://x.com/", EgressDenied),
        ("file:///etc/passwd", EgressDenied),
        ("gopher://x.com/", EgressDenied),
        ("javascript:alert(1)", EgressDenied),
        ("http://evil.com\\@allowed.com/", InvalidFetch),
        ("http://x.com/\r\nHost: evil", InvalidFetch),
        ("http://x.com\t/", InvalidFetch),
        ("http://[::1%25eth0]/", InvalidFetch),
        ("http://[::1/", InvalidFetch),
        ("http://x.com:0/", InvalidFetch),
        ("http://x.com:65536/", InvalidFetch),
        ("http://x.com:+80/", InvalidFetch),
        ("http://x.com:\uff18\uff10/", InvalidFetch),  # fullwidth digits
        ("http://x.com:80:80/", InvalidFetch),
        ("http://1.2.3.4.5/", InvalidFetch),
        ("http://256.1.1.1/", InvalidFetch),
        ("http://0x100000000/", InvalidFetch),
        ("http://089/", InvalidFetch),
        ("http://x%2ecom/", InvalidFetch),
        ("http://x.com/a%2Fb", InvalidFetch),
        ("http://x.com/a%5cb", InvalidFetch),
        ("http://x.com/a%00", InvalidFetch),
        ("http:///path", InvalidFetch),
        ("http:x.com", InvalidFetch),
        ("//x.com/", InvalidFetch),
        ("", InvalidFetch),
        ("http://" + "a" * 9000, InvalidFetch),
        ("http://-x.com/", InvalidFetch),
    ],
)
def test_refused(url: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_url(url)


def test_redirect_locations_are_normalised_like_any_url() -> None:
    base = parse_url("https://a.com/x/y")
    assert join(base, "z").url == "https://a.com/x/z"
    assert join(base, "//b.com/p").url == "https://b.com/p"
    assert join(base, "http://2130706433/").url == "http://127.0.0.1/"
    with pytest.raises(EgressDenied):
        join(base, "http://a.com@evil.com/")
    with pytest.raises(InvalidFetch):
        join(base, "/x\r\nSet-Cookie: a")


def policy(*allow: dict[str, object]) -> EgressPolicy:
    return EgressPolicy().merge(EgressSection.model_validate({"allow": list(allow)}))


@pytest.mark.parametrize(
    ("entry", "url", "method", "allowed"),
    [
        ({"url": "https://news.google.com/rss/**"}, "https://news.google.com/rss/a/b?x=1", "GET", True),
        ({"url": "https://news.google.com/rss/**"}, "https://news.google.com/rss", "GET", False),
        ({"url": "https://news.google.com/rss/**"}, "https://news.google.com/rss/../x", "GET", False),
        ({"url": "https://news.google.com/rss/**"}, "http://news.google.com/rss/a", "GET", False),
        ({"url": "https://news.google.com/rss/**"}, "https://news.google.com:8443/rss/a", "GET", False),
        ({"url": "https://news.google.com/rss/**"}, "https://news.google.com/rss/a", "POST", False),
        ({"url": "https://news.google.com/rss/**"}, "https://NEWS.google.com./rss/a", "HEAD", True),
        ({"url": "https://news.google.com/rss/*"}, "https://news.google.com/rss/a/b", "GET", False),
        ({"url": "https://news.google.com"}, "https://news.google.com/anything", "GET", True),
        ({"url": "http://h.test:8080/x"}, "http://h.test:8080/x", "GET", True),
        ({"host": "*.yahoo.com"}, "https://news.yahoo.com/", "GET", True),
        ({"host": "*.yahoo.com"}, "https://a.b.yahoo.com/", "GET", True),
        ({"host": "*.yahoo.com"}, "https://yahoo.com/", "GET", False),
        ({"host": "*.yahoo.com"}, "https://evilyahoo.com/", "GET", False),
        ({"host": "*.yahoo.com"}, "https://yahoo.com.evil.com/", "GET", False),
        ({"host": "*.yahoo.com"}, "http://news.yahoo.com/", "GET", False),
        ({"host": "*.yahoo.com", "schemes": ["http", "https"]}, "http://news.yahoo.com/", "GET", True),
        ({"host": "*.yahoo.com"}, "https://news.yahoo.com:444/", "GET", False),
        ({"host": "api-*.x.com"}, "https://api-eu.x.com/", "GET", True),
        ({"host": "api-*.x.com"}, "https://api-eu.evil.x.com/", "GET", False),
        ({"host": "8.8.8.8"}, "https://134744072/", "GET", True),
        ({"host": "*.com"}, "https://8.8.8.8/", "GET", False),
        ({"host": "[2606:4700::1]"}, "https://[2606:4700:0::1]/", "GET", True),
        ({"host": "bücher.de"}, "https://xn--bcher-kva.de/", "GET", True),
    ],
)
def test_allow_matching(entry: dict[str, object], url: str, method: str, allowed: bool) -> None:
    assert (static_check(policy(entry), url, method) is None) == allowed


def test_static_check_names_why() -> None:
    assert "allows no destination" in (static_check(EgressPolicy(), "https://x.com/") or "")
    assert "method POST" in (static_check(policy({"host": "x.com"}), "https://x.com/", "POST") or "")
