"""Query strings of the pages and twins, checked: a bad value is a typed one-line error (422), never a 500."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, get_args

from sandforge.runtime.dashboard.callindex import CallFilter, SecurityFilter
from sandforge.runtime.dashboard.toolhealth import Badge
from sandforge.runtime.dashboard.views import CALL_SOURCES, SECURITY_SOURCES, SortKey

STAGES = ("generation", "validation", "execution", "outcome_policy", "none")
MAX_TEXT = 200


class PageError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _text(q: Mapping[str, str], name: str) -> str | None:
    value = q.get(name, "").strip()
    if len(value) > MAX_TEXT:
        raise PageError(f"{name}: at most {MAX_TEXT} characters")
    return value or None


def _int(q: Mapping[str, str], name: str, default: int | None, low: int = 1) -> int | None:
    value = q.get(name, "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        raise PageError(f"{name}: not a whole number") from None
    if number < low:
        raise PageError(f"{name}: at least {low}")
    return number


def _choice(q: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str | None:
    value = _text(q, name)
    if value is not None and value not in choices:
        raise PageError(f"{name}: one of {', '.join(choices)}")
    return value


def _time(q: Mapping[str, str], name: str) -> float | None:
    """An RFC 3339 / ISO 8601 time (UTC if it names no zone), or a number of hours ago like ``24h``."""
    value = _text(q, name)
    if value is None:
        return None
    if value.endswith("h") and value[:-1].replace(".", "", 1).isdigit():
        return datetime.now(UTC).timestamp() - float(value[:-1]) * 3600
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise PageError(f"{name}: an ISO 8601 time (2026-11-26T15:00:00Z) or hours ago (24h)") from None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()


def page_query(q: Mapping[str, str]) -> dict[str, Any]:
    return {"page": _int(q, "page", 1)}


def tools_query(q: Mapping[str, str]) -> dict[str, Any]:
    return {
        "page": _int(q, "page", 1),
        "sort": _choice(q, "sort", get_args(SortKey)) or "role",
        "descending": _choice(q, "order", ("asc", "desc")) == "desc",
        "q": _text(q, "q"),
        "badge": _choice(q, "badge", get_args(Badge)),
    }


def artifact_query(q: Mapping[str, str]) -> dict[str, Any]:
    return {"a": _int(q, "a", None), "b": _int(q, "b", None)}


def calls_query(q: Mapping[str, str]) -> CallFilter:
    return CallFilter(
        role=_text(q, "role"), method=_text(q, "method"), status=_choice(q, "status", ("ok", "error")),
        stage=_choice(q, "stage", STAGES), since=_time(q, "since"), until=_time(q, "until"), trace=_text(q, "trace"),
        before=_int(q, "before", None), security=_choice(q, "security", ("1",)) == "1",
        source=_choice(q, "source", CALL_SOURCES),
    )  # fmt: skip


def security_query(q: Mapping[str, str]) -> SecurityFilter:
    return SecurityFilter(source=_choice(q, "source", SECURITY_SOURCES), event=_text(q, "event"),
                          since=_time(q, "since"), before=_int(q, "before", None))  # fmt: skip
