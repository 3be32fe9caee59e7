"""parse_url keeps the Target of a URL without params (a pure function of its text): the kept answer is
the one computed afresh, refusals are computed every time, and params bypass the cache."""

from __future__ import annotations

import pytest

from sandforge.runtime.egress import EgressDenied, InvalidFetch, urls

URLS = [
    "http://bench.test:8080/1KB",
    "HTTPS://News.Example.COM/rss/../feed?q=1#frag",
    "http://2130706433/",
    "http://0x7f.1/",
    "http://[::ffff:127.0.0.1]/",
    "https://xn--bcher-kva.example/",
    "https://bücher.example/a b",
]


@pytest.mark.parametrize("url", URLS)
def test_the_kept_answer_is_the_fresh_one(url: str) -> None:
    first = urls.parse_url(url)
    assert first == urls._parse(url, None) and urls.parse_url(url) is first


@pytest.mark.parametrize("url", ["http://allowed@evil/", "ftp://x/", "http://a\\b/", "nope"])
def test_refusals_are_never_kept(url: str) -> None:
    before = urls._parse_plain.cache_info()
    for _ in range(2):
        with pytest.raises((EgressDenied, InvalidFetch)):
            urls.parse_url(url)
    after = urls._parse_plain.cache_info()
    assert after.currsize == before.currsize and after.hits == before.hits


def test_params_are_not_kept() -> None:
    assert urls._parse_plain.cache_info().maxsize == urls.PARSED_CACHE
    target = urls.parse_url("https://a.test/p", {"q": ["1", "2"]})
    assert target.query == "q=1&q=2" and urls.parse_url("https://a.test/p").query == ""
