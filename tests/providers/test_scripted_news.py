"""NewsModel, the news demo's scripted model: it decides from what the request shows, like a model would."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sandforge.runtime.cli.news_feeds import SITES, rss_document
from sandforge.runtime.providers import GenerationRequest, ProviderError
from sandforge.runtime.providers.scripted_news import (
    FETCHER_PROGRAM,
    PARSER_PROGRAM,
    NewsModel,
    listed_tools,
)
from sandforge.runtime.store.cacheability import assess_cacheability
from sandforge.runtime.store.models import ToolContract
from sandforge.runtime.store.patterns import NUDGE

FEEDS = {
    "Google News": "http://news.google.com:4001/rss?hl=en-US&gl=US&ceid=US:en",
    "Yahoo News": "http://news.yahoo.com:4002/rss/",
    "The New York Times": "http://rss.nytimes.com:4003/services/xml/rss/nyt/HomePage.xml",
}
KNOWN = (
    "<known_tools>\n- web_fetcher: Fetch one URL (methods: fetch; used 2x, 100% ok)\n"
    "- rss_parser: Parse a feed (methods: parse)\n</known_tools>"
)


def ask(question: str, **extra: object) -> GenerationRequest:
    return GenerationRequest(role="assistant", method="ask", args=[question], **extra)  # type: ignore[arg-type]


def test_one_off_programs_fetch_the_named_source_with_requests_then_urllib_then_fetch() -> None:
    model = NewsModel(FEEDS)
    codes = [model.generate(ask(q)).code for q in ("Google News?", "Yahoo News?", "the New York Times?")]
    assert model.decisions == ["inline:requests", "inline:urllib", "inline:fetch"]
    assert "import requests" in codes[0] and '"http://news.google.com:4001/rss"' in codes[0]
    assert '"ceid": "US:en"' in codes[0]  # the query travels as params
    assert "urllib.request.urlopen" in codes[1] and FEEDS["Yahoo News"] in codes[1]
    assert "fetch(" in codes[2] and FEEDS["The New York Times"] in codes[2]
    assert all('root.iter("item")' in code for code in codes)
    assert model.calls == 3 and len(model.prompts) == 3


def test_the_runtime_nudge_makes_it_forge_and_listed_tools_make_it_use_them() -> None:
    model = NewsModel(FEEDS)
    patterns = (
        f"<recent_patterns>\n- rss_parse: seen 2 of last 2 ask calls, tool_present=false\n</recent_patterns>\n{NUDGE}"
    )
    forged = model.generate(ask("New York Times", recent_patterns=patterns)).code
    assert 'delegate(\n    "web_fetcher"' in forged and 'delegate(\n    "rss_parser"' in forged
    assert f"fetcher.fetch({FEEDS['The New York Times']!r})".replace("'", '"') in forged
    used = model.generate(ask("yahoo", known_tools_block=KNOWN)).code
    assert 'tool("web_fetcher")' in used and "delegate(" not in used
    assert model.decisions == ["forge", "use_tools"]


def test_tools_of_the_workspace_count_as_known_and_half_a_toolbox_does_not() -> None:
    model = NewsModel(FEEDS)
    both = [ToolContract(role="web_fetcher"), ToolContract(role="rss_parser")]
    model.generate(ask("google", known_tools=both))
    model.generate(ask("google", known_tools_block="<known_tools>\n- web_fetcher: x (methods: fetch)\n</known_tools>"))
    model.generate(ask("google", known_tools_block=KNOWN.replace("methods: parse", "methods: dump")))
    assert model.decisions == ["use_tools", "inline:requests", "inline:urllib"]


def test_tool_methods_are_general_and_the_store_keeps_them_reusable() -> None:
    model = NewsModel(FEEDS)
    fetch = model.generate(GenerationRequest(role="web_fetcher", method="fetch", args=[FEEDS["Yahoo News"]], depth=1))
    parse = model.generate(GenerationRequest(role="rss_parser", method="parse", args=["<rss/>"], depth=1))
    assert (fetch.code, parse.code) == (FETCHER_PROGRAM, PARSER_PROGRAM)
    document = rss_document(SITES[2], datetime.now(UTC)).decode()
    for method, code, args, kwargs in (
        ("fetch", FETCHER_PROGRAM, [FEEDS["The New York Times"]], {}),
        ("parse", PARSER_PROGRAM, [document], {"limit": 5}),
    ):
        verdict = assess_cacheability(method, code, args, kwargs, is_delegated_contract=True)
        assert verdict.cacheable, verdict.detail
    one_off = NewsModel(FEEDS).generate(ask("Google News")).code
    assert not assess_cacheability("ask", one_off, ["Google News"], {}).cacheable  # ADR 0013: never reused


@pytest.mark.parametrize(
    "request_",
    [
        GenerationRequest(role="assistant", method="ask", args=["the weather in Oslo"]),
        GenerationRequest(role="assistant", method="ask", args=["any news? something new?"]),
        GenerationRequest(role="assistant", method="ask", args=["googleplex yahooligans"]),
        GenerationRequest(role="assistant", method="summarize", args=["Google News"]),
        GenerationRequest(role="web_fetcher", method="post", args=["x"]),
    ],
)
def test_anything_outside_the_script_is_a_non_retriable_provider_error(request_: GenerationRequest) -> None:
    with pytest.raises(ProviderError) as info:
        NewsModel(FEEDS).generate(request_)
    assert info.value.kind == "script_exhausted" and not info.value.retriable


@pytest.mark.parametrize(
    ("question", "source"),
    [
        ("What are the latest headlines on Google News?", "Google News"),
        ("And from YAHOO?", "Yahoo News"),
        ("What does The New York Times lead with?", "The New York Times"),
        ("the Times, please", "The New York Times"),
        ("what is on rss.nytimes.com", "The New York Times"),
    ],
)
def test_the_question_names_its_source(question: str, source: str) -> None:
    assert NewsModel(FEEDS).source_of(question) == (source, FEEDS[source])


def test_listed_tools_reads_names_and_methods_from_the_block() -> None:
    assert listed_tools(KNOWN) == {"web_fetcher": {"fetch"}, "rss_parser": {"parse"}}
    assert listed_tools("<known_tools>\n- solo\n- many: p (methods: a, b, ...)\n</known_tools>") == {
        "solo": set(),
        "many": {"a", "b"},
    }
    assert listed_tools(None) == {}
    purpose_with_parentheses = (
        "- web_fetcher: Fetch a URL over HTTP(S) (and more) (methods: fetch, head; used 1x, 100% ok)"
    )
    assert listed_tools(purpose_with_parentheses) == {"web_fetcher": {"fetch", "head"}}
