"""A provider is told how long the call has left (issue 13 item 6) and the Anthropic one gives up by then."""

from __future__ import annotations

import httpx2 as httpx
import pytest

from sandforge.runtime.providers import ProviderError
from tests.providers.test_anthropic import REQUEST, FakeApi, message, provider, tool_use


def _timeouts(api: FakeApi) -> list[float | None]:
    return [r.extensions["timeout"]["read"] for r in api.requests]


def test_the_remaining_time_bounds_the_api_request() -> None:
    api = FakeApi(httpx.Response(200, json=message([tool_use({"code": "return 1"})])))
    p = provider(api, timeout_s=60, max_retries=2)
    p.generate(REQUEST.model_copy(update={"time_budget_s": 1.5}))
    p.generate(REQUEST.model_copy(update={"time_budget_s": 600.0}))  # more than the provider's own limit
    p.generate(REQUEST)
    assert _timeouts(api) == [1.5, 60, 60]


def test_no_sdk_retries_past_the_remaining_time() -> None:
    api = FakeApi(httpx.Response(529, json={"type": "error", "error": {"type": "overloaded_error", "message": "x"}}))
    p = provider(api, timeout_s=60, max_retries=2)
    with pytest.raises(ProviderError):
        p.generate(REQUEST.model_copy(update={"time_budget_s": 1.0}))
    assert len(api.requests) == 1  # one attempt: the SDK's retries would outlive the caller
