"""Typed session records: what is persisted per session and per message."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class MessageType(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"


class ToolStatus(StrEnum):
    SUCCESS = "success"
    ERROR = "error"


class Message(BaseModel):
    """One persisted message.

    ``tool_input`` is the JSON text of a tool call's input exactly as stored: old rows (or rows written by
    other tools) may hold malformed JSON, so it is never parsed on load; readers parse it defensively.
    """

    model_config = ConfigDict(frozen=True)

    id: int | None = None
    session_id: str
    type: MessageType
    content: str = ""
    tool_name: str | None = None
    tool_call_id: str | None = None
    tool_status: ToolStatus | None = None
    tool_input: str | None = None
    created_at: float = 0.0
    metadata: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def user(cls, session_id: str, text: str) -> Message:
        return cls(session_id=session_id, type=MessageType.USER, content=text)

    @classmethod
    def assistant(cls, session_id: str, text: str, metadata: dict[str, Any] | None = None) -> Message:
        return cls(session_id=session_id, type=MessageType.ASSISTANT, content=text, metadata=metadata or {})

    @classmethod
    def tool_call(cls, session_id: str, *, name: str, call_id: str, tool_input: str, status: ToolStatus) -> Message:
        return cls(
            session_id=session_id,
            type=MessageType.TOOL_CALL,
            tool_name=name,
            tool_call_id=call_id,
            tool_input=tool_input,
            tool_status=status,
        )

    @classmethod
    def tool_result(
        cls,
        session_id: str,
        *,
        name: str,
        call_id: str,
        content: str,
        status: ToolStatus,
        metadata: dict[str, Any] | None = None,
    ) -> Message:
        return cls(
            session_id=session_id,
            type=MessageType.TOOL_RESULT,
            tool_name=name,
            tool_call_id=call_id,
            content=content,
            tool_status=status,
            metadata=metadata or {},
        )


class SessionInfo(BaseModel):
    """A session row plus a few derived numbers, for `sandforge sessions list|show`."""

    model_config = ConfigDict(frozen=True)

    id: str
    title: str = ""
    created_at: float
    updated_at: float
    cleared_from: str | None = None
    message_count: int = 0
