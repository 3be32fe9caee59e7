"""An uncalled method proxy says what it is: a typo while reading state (``calc.totl``) cannot pass as a value."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from sandforge import AsyncAgent
from sandforge.runtime.agent import Agent, MethodProxy
from sandforge.runtime.providers import ScriptedProvider


@pytest.fixture
def calc() -> Iterator[Agent]:
    with Agent.for_role("calculator", provider=ScriptedProvider([]), log=False, context={"total": 1}) as agent:
        yield agent


def test_a_context_key_reads_as_its_value(calc: Agent) -> None:
    assert calc.total == 1 and calc.context["total"] == 1


def test_printing_a_proxy_says_it_is_an_uncalled_method_and_names_the_keys(calc: Agent) -> None:
    proxy = calc.totl
    assert isinstance(proxy, MethodProxy)
    for text in (repr(proxy), str(proxy), f"{proxy}"):
        assert "calculator.totl is an uncalled method" in text
        assert "no key 'totl'" in text and "'total'" in text
        assert "did you mean the context key 'total'" in text


@pytest.mark.parametrize("compare", [
    lambda p: p == 1, lambda p: p != 1, lambda p: p < 1, lambda p: p <= 1, lambda p: p > 1, lambda p: p >= 1,
    lambda p: 1 in [p], lambda p: bool(p), lambda p: 1 if p else 0,
])  # fmt: skip
def test_comparing_or_testing_a_proxy_raises_with_the_same_words(calc: Agent, compare: object) -> None:
    with pytest.raises(TypeError, match=r"calculator\.totl is an uncalled method"):
        compare(calc.totl)  # type: ignore[operator]


def test_a_proxy_is_not_hashable(calc: Agent) -> None:
    with pytest.raises(TypeError):
        hash(calc.totl)


def test_no_suggestion_when_nothing_is_close(calc: Agent) -> None:
    assert "did you mean" not in repr(calc.multiply)


def test_the_async_proxy_is_printed_the_same_way() -> None:
    async def main() -> str:
        async with AsyncAgent.for_role("calculator", provider=ScriptedProvider([]), log=False,
                                       context={"total": 1}) as agent:  # fmt: skip
            proxy = agent.totl
            assert isinstance(proxy, MethodProxy)
            with pytest.raises(TypeError, match="uncalled method"):
                _ = proxy == 1
            agent.total = 2  # writes the context, no model call
            assert agent.context == {"total": 2}
            with pytest.raises(AttributeError):
                agent.aclose = 1  # reserved on an AsyncAgent
            return repr(proxy)

    assert "calculator.totl is an uncalled method" in asyncio.run(main())
