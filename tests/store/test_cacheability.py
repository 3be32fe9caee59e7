"""ADR 0013 cacheability: dynamic methods, input-baked code found on the AST, model veto, legacy rule."""

from __future__ import annotations

import pytest

from sandforge.runtime.store import (
    CacheabilityHint,
    CacheabilityReason,
    assess_cacheability,
    find_baked_inputs,
)

GOOGLE_CODE = """
import urllib.request
query = "latest on Google News?"
feed = fetch("https://news.google.com/rss/search?q=latest+on+Google+News%3F")
return Outcome.ok({"query": query, "items": feed})
"""

FETCH_URL_CODE = '''
"""Fetch any URL: the URL is the argument."""
url = args[0] if args else kwargs["url"]
timeout = kwargs.get("timeout", 10)
return Outcome.ok(tool("http").get(url, timeout=timeout))
'''


def test_google_news_ask_is_non_cacheable_and_input_sensitive() -> None:
    c = assess_cacheability("ask", GOOGLE_CODE, ["latest on Google News?"], {})
    assert not c.cacheable
    assert c.reason is CacheabilityReason.DYNAMIC_DISPATCH
    assert c.input_sensitive
    assert any("exact" in e for e in c.baked_literals)  # the AST check found the literal too


def test_baked_literal_alone_makes_a_stable_method_non_cacheable() -> None:
    c = assess_cacheability("headlines", GOOGLE_CODE, ["latest on Google News?"], {}, is_delegated_contract=True)
    assert not c.cacheable
    assert c.reason is CacheabilityReason.INPUT_BAKED
    assert c.input_sensitive
    assert c.reason_text.startswith("input_baked: ")


def test_generic_fetch_url_using_its_arguments_is_cacheable() -> None:
    c = assess_cacheability("fetch_url", FETCH_URL_CODE, ["https://example.com/feed.xml"], {"timeout": 5})
    assert c.cacheable
    assert c.reason is CacheabilityReason.STABLE_METHOD
    assert not c.input_sensitive


def test_delegated_contract_tool_is_cacheable() -> None:
    c = assess_cacheability("fetch_url", FETCH_URL_CODE, ["https://example.com/"], {}, is_delegated_contract=True)
    assert c.cacheable and c.reason is CacheabilityReason.DELEGATED_CONTRACT


def test_detection_is_on_the_ast_not_a_substring_of_the_source() -> None:
    # The argument value appears in the source only as a name, a comment and a docstring: not baked.
    code = '''
"""Look up a city; e.g. the city Paris."""
# Paris is just an example in this comment
paris_mode = args[0]
return Outcome.ok(paris_mode)
'''
    assert find_baked_inputs(code, ["Paris"], {}) == []
    assert find_baked_inputs(code, ["paris_mode"], {}) == []


@pytest.mark.parametrize(
    ("code", "args", "kwargs"),
    [
        ("u = f\"https://api.example.com/weather?city={'San Francisco'}\"\nreturn u", ["San Francisco"], {}),
        (
            'base = "https://news.yahoo.com/" + "rss/" + "latest+on+Yahoo+News"\nreturn base',
            ["latest on Yahoo News"],
            {},
        ),
        ('return {"Yahoo News": 1}', ["Yahoo News"], {}),
        ('return "https://feeds.example.com/{}".format("tech-weekly")', [], {"feed": "tech-weekly"}),
        ('return ", ".join(["alpha", "bravo charlie"])', ["bravo charlie delta"], {}),
        ("zip_code = 94103\nreturn zip_code", [94103], {}),
        ('return "https://api.example.com/weather?zip=94103"', [94103], {}),
        ("lat = -37.81\nreturn lat", [{"lat": -37.81}], {}),
        ('q = "latest on google news?"\nreturn q', ["Latest on Google   News?"], {}),  # case/whitespace
        ('return b"secret-token-123"', ["secret-token-123"], {}),
        ('return "Google News headlines"', ["what is on Google News today?"], {}),  # multi-word fragment
    ],
)
def test_baked_forms(code: str, args: list[object], kwargs: dict[str, object]) -> None:
    evidence = find_baked_inputs(code, args, kwargs)
    assert evidence, f"missed a baked input in {code!r}"
    assert not assess_cacheability("m", code, args, kwargs).cacheable


@pytest.mark.parametrize(
    ("code", "args"),
    [
        ("return args[0][:3]", [3]),  # small integers are everywhere
        ('sep = ","\nreturn args[0].split(sep)', ["a,b"]),  # short strings too
        ("return len(args)", [True]),  # booleans ignored
        ('return "https://" + args[0]', ["example.com/feed"]),  # literal is a prefix, input is data
        ('return {"key": args[0]}', ["q"]),  # one-character input not among the literals
        ("return args[0][-1] + 1", [1]),  # structural numbers and indexes
        ('return args[0] or "no results for"', ["show results for cats"]),  # shares only one content word
    ],
)
def test_trivial_or_structural_literals_do_not_count(code: str, args: list[object]) -> None:
    assert find_baked_inputs(code, args, {}) == []
    assert assess_cacheability("m", code, args, {}).cacheable


def test_model_hint_can_veto_but_not_force() -> None:
    veto = assess_cacheability("fetch_url", FETCH_URL_CODE, ["https://x.org"], {}, model_hint=False)
    assert not veto.cacheable and veto.reason is CacheabilityReason.MODEL_VETO
    reasoned = CacheabilityHint(cacheable=False, reason="depends on today's date")
    assert "today's date" in assess_cacheability("f", FETCH_URL_CODE, [], {}, model_hint=reasoned).detail
    forced = assess_cacheability("ask", FETCH_URL_CODE, ["https://x.org"], {}, model_hint=True)
    assert not forced.cacheable and forced.reason is CacheabilityReason.DYNAMIC_DISPATCH
    forced = assess_cacheability(
        "m", GOOGLE_CODE, ["latest on Google News?"], {}, model_hint=CacheabilityHint(cacheable=True)
    )
    assert not forced.cacheable and forced.reason is CacheabilityReason.INPUT_BAKED


def test_dynamic_set_is_configurable() -> None:
    assert assess_cacheability("ask", FETCH_URL_CODE, [], {}, dynamic_methods=()).cacheable
    c = assess_cacheability("fetch_url", FETCH_URL_CODE, [], {}, dynamic_methods={"fetch_url"})
    assert not c.cacheable and c.reason is CacheabilityReason.DYNAMIC_DISPATCH


def test_unparseable_code_is_not_cacheable() -> None:
    c = assess_cacheability("m", "return (", [], {})
    assert not c.cacheable and c.reason is CacheabilityReason.UNPARSEABLE


def test_top_level_return_parses() -> None:
    assert assess_cacheability("m", "return 1", [], {}).cacheable
