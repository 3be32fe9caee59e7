"""Chat sessions: persisted history (SQLite), tool groups loaded on demand and restored from history
(RFC-044), the tool-use loop over a chat provider. See docs/sessions.md."""

from __future__ import annotations

from sandforge.runtime.providers.chat import (
    AnthropicChatProvider,
    ChatProvider,
    ChatRequest,
    ChatResponse,
    ScriptedChatProvider,
    TextBlock,
    ToolUseBlock,
)
from sandforge.runtime.sessions.db import SCHEMA_VERSION, SessionStore, default_db_path, state_dir
from sandforge.runtime.sessions.errors import (
    ChatProviderError,
    CorruptDatabaseError,
    SchemaTooNewError,
    ScriptExhaustedError,
    SessionError,
    SessionNotFoundError,
    SessionStoreError,
)
from sandforge.runtime.sessions.groups import (
    CORE_TOOLS,
    LIST_TOOL_GROUPS,
    LOAD_TOOL_GROUP,
    CompositeGroupSource,
    GroupSource,
    StaticGroupSource,
    ToolGroup,
    ToolRegistry,
    ToolSpec,
    ToolStoreGroupSource,
)
from sandforge.runtime.sessions.history import restore_loaded_groups, to_api_messages
from sandforge.runtime.sessions.models import Message, MessageType, SessionInfo, ToolStatus
from sandforge.runtime.sessions.session import Session, ToolCallRecord, TurnResult, not_available
from sandforge.runtime.sessions.tool_runner import (
    AgentToolRunner,
    ToolAgent,
    ToolOutcome,
    ToolResult,
    ToolRunner,
    UnavailableRunner,
    outcome_to_result,
)

__all__ = [
    "CORE_TOOLS",
    "LIST_TOOL_GROUPS",
    "LOAD_TOOL_GROUP",
    "SCHEMA_VERSION",
    "AgentToolRunner",
    "AnthropicChatProvider",
    "ChatProvider",
    "ChatProviderError",
    "ChatRequest",
    "ChatResponse",
    "CompositeGroupSource",
    "CorruptDatabaseError",
    "GroupSource",
    "Message",
    "MessageType",
    "SchemaTooNewError",
    "ScriptExhaustedError",
    "ScriptedChatProvider",
    "Session",
    "SessionError",
    "SessionInfo",
    "SessionNotFoundError",
    "SessionStore",
    "SessionStoreError",
    "StaticGroupSource",
    "TextBlock",
    "ToolAgent",
    "ToolCallRecord",
    "ToolGroup",
    "ToolOutcome",
    "ToolRegistry",
    "ToolResult",
    "ToolRunner",
    "ToolSpec",
    "ToolStatus",
    "ToolStoreGroupSource",
    "ToolUseBlock",
    "TurnResult",
    "UnavailableRunner",
    "default_db_path",
    "not_available",
    "outcome_to_result",
    "restore_loaded_groups",
    "state_dir",
    "to_api_messages",
]
