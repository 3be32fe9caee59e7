"""``ModelSettings``: how to reach a live model, the one settings model of every live provider.

The factory builds it from flags, the configuration file or a ``serve`` tenant; the providers validate their
keyword arguments through it (a bad value is a ``ValueError``, pydantic's), so each bound is written once.
Neither the key nor an SDK is here: this module imports pydantic only.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

ENV_PATTERN = r"^[A-Z_][A-Z0-9_]{0,127}$"


class ModelSettings(BaseModel):
    """How to reach a live model. The key is never here: only the environment variable that holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    base_url: str | None = Field(None, description="openai: the endpoint (default: OpenAI's, or $OPENAI_BASE_URL)")
    api_key_env: str | None = Field(
        None, pattern=ENV_PATTERN,
        description="the variable holding the key (default: ANTHROPIC_API_KEY; SANDFORGE_OPENAI_API_KEY, then "
        "OPENAI_API_KEY)",
    )  # fmt: skip
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int = Field(4096, ge=1, le=1_000_000)
    timeout_s: float = Field(60.0, gt=0, le=3600)
    max_retries: int = Field(2, ge=0, le=10, description="the SDK's retries of 429/5xx (honouring Retry-After)")
    record: Path | None = Field(None, description="append every model exchange to this JSON-lines file")
