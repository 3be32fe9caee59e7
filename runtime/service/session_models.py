"""What the session routes answer (``/v1/sessions``), and the body that creates one: sessions and messages
with RFC 3339 times (the turn's body, ``MessageRequest``, is in :mod:`.models`).

The session store keeps Unix-float times (its schema, ``sandforge sessions --json``); the API answers every
time as an RFC 3339 UTC string, like the ToolStore's and the call log's, so a client parses one format
(docs/serve.md, "Times")."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue

from sandforge.runtime.sessions.db import TITLE_MAX
from sandforge.runtime.sessions.models import Message, SessionInfo
from sandforge.runtime.sessions.session import TurnResult

#: ``GET /v1/sessions``: the default and the largest page
PAGE_DEFAULT = 50
PAGE_MAX = 500


def utc(seconds: float) -> datetime:
    """A store time (Unix seconds) as an aware UTC datetime, which pydantic writes as RFC 3339 (``...Z``)."""
    return datetime.fromtimestamp(seconds, UTC)


class SessionCreate(BaseModel):
    """``POST /v1/sessions``: an optional body; unknown fields are refused, like every body of the API."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field("", max_length=TITLE_MAX)


class SessionSummary(BaseModel):
    id: str
    title: str = ""
    created_at: AwareDatetime
    updated_at: AwareDatetime
    cleared_from: str | None = Field(None, description="the session this one was cleared from")
    message_count: int = 0

    @classmethod
    def of(cls, info: SessionInfo) -> SessionSummary:
        return cls(id=info.id, title=info.title, created_at=utc(info.created_at), updated_at=utc(info.updated_at),
                   cleared_from=info.cleared_from, message_count=info.message_count)  # fmt: skip


class SessionMessage(BaseModel):
    id: int | None = None
    type: str = Field(description="user, assistant, tool_call or tool_result")
    content: str = ""
    tool_name: str | None = None
    tool_call_id: str | None = None
    tool_status: str | None = None
    tool_input: str | None = Field(None, description="a tool call's input: JSON text exactly as stored")
    created_at: AwareDatetime | None = Field(None, description="when it was stored (none before that)")
    metadata: dict[str, JsonValue] = Field(default_factory=dict)

    @classmethod
    def of(cls, message: Message) -> SessionMessage:
        fields: dict[str, Any] = message.model_dump(mode="json", exclude={"session_id", "created_at"})
        return cls(**fields, created_at=utc(message.created_at) if message.created_at else None)


class SessionView(BaseModel):
    """``GET /v1/sessions/{id}``."""

    session: SessionSummary
    messages: list[SessionMessage]


class SessionPage(BaseModel):
    """``GET /v1/sessions``: the tenant's sessions, newest first, one page at a time."""

    sessions: list[SessionSummary]
    next_cursor: str | None = Field(None, description="pass as `cursor` for the next page; none on the last one")


class TurnAnswer(TurnResult):
    """``POST /v1/sessions/{id}/messages``: what the turn did (:class:`TurnResult`), its stored messages with
    RFC 3339 times."""

    messages: list[SessionMessage] = Field(default_factory=list)  # type: ignore[assignment]

    @classmethod
    def of(cls, turn: TurnResult) -> TurnAnswer:
        fields = {name: value for name, value in turn if name != "messages"}
        return cls(**fields, messages=[SessionMessage.of(m) for m in turn.messages])
