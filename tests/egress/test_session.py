"""Session behaviour that needs no server: refusals before any connection, budgets, the error table,
and the netns marker's fallback."""

from __future__ import annotations

from typing import Any

import pytest

from sandforge.runtime.egress import (
    LIFECYCLE,
    EgressBroker,
    EgressLimit,
    EgressPolicy,
    EgressSection,
    FetchError,
    FetchRequest,
    InvalidFetch,
)
from sandforge.runtime.egress.errors import ERRORS
from tests.egress import netns


def refusing_resolver(host: str, port: int) -> Any:
    raise AssertionError(f"nothing may be resolved here ({host})")


def session(**limits: Any) -> Any:
    section = EgressSection.model_validate({"allow": [{"host": "x.example"}], "limits": limits})
    return EgressBroker(EgressPolicy().merge(section), resolver=refusing_resolver).session()


@pytest.mark.parametrize("method", ["CONNECT", "TRACE", "G ET", "get\r\n"])
def test_unsupported_methods_are_refused_before_anything(method: str) -> None:
    one = session()
    with pytest.raises(InvalidFetch, match="not supported"):
        one.fetch(FetchRequest.of("https://x.example/", method=method))
    assert one.records[0].error == "invalid_fetch"


def test_denied_requests_count_against_max_requests() -> None:
    one = session(max_requests=2)
    for _ in range(2):
        with pytest.raises(FetchError):
            one.fetch(FetchRequest.of("https://not-allowed.example/"))
    with pytest.raises(EgressLimit, match="max_requests"):
        one.fetch(FetchRequest.of("https://not-allowed.example/"))
    assert [r.error for r in one.records] == ["egress_denied", "egress_denied", "egress_limit"]


def test_every_error_kind_has_a_lifecycle_class() -> None:
    assert set(ERRORS) == set(LIFECYCLE)
    terminal = {kind for kind, (is_terminal, _, _) in LIFECYCLE.items() if is_terminal}
    assert terminal == {"egress_denied", "missing_credentials"}
    assert LIFECYCLE["network_error"] == (False, True, False)


def test_marked_tests_skip_with_a_reason_without_a_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    class Item:
        def __init__(self) -> None:
            self.markers: list[Any] = []

        def get_closest_marker(self, name: str) -> object | None:
            return object() if name == "netns" else None

        def add_marker(self, marker: Any) -> None:
            self.markers.append(marker)

    monkeypatch.delenv(netns.ENV_INSIDE, raising=False)
    monkeypatch.setattr(netns, "unshare_command", lambda: (None, "unshare(1) is not installed"))
    item = Item()
    netns.configure_items([item])  # type: ignore[list-item]
    [marker] = item.markers
    assert marker.name == "skip" and "unshare(1) is not installed" in marker.kwargs["reason"]
