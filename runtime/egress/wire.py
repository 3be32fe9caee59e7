"""The JSON-only request/response model between a sandboxed program and the broker.

The sandbox side (next round) sends a `FetchRequest` frame and gets a `FetchReply`; bodies travel as
base64 with size bounds, header maps are bounded, and nothing but JSON crosses."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sandforge.runtime.egress.errors import ErrorKind, InvalidFetch

MAX_WIRE_BODY_BYTES = 64 * 1024 * 1024
_B64_CHARS = (MAX_WIRE_BODY_BYTES + 2) // 3 * 4
MAX_HEADERS = 64

HeaderName = Annotated[str, Field(min_length=1, max_length=128)]
HeaderValue = Annotated[str, Field(max_length=8192)]
ParamValue = Annotated[str, Field(max_length=8192)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FetchRequest(_Wire):
    """One request as the program asks for it (``params`` are appended to the URL's query)."""

    method: str = Field("GET", min_length=1, max_length=16)
    url: str = Field(min_length=1, max_length=8192)
    headers: dict[HeaderName, HeaderValue] = Field(default_factory=dict, max_length=MAX_HEADERS)
    params: dict[Annotated[str, Field(max_length=1024)], ParamValue | list[ParamValue]] | None = Field(
        None, max_length=256
    )
    body_b64: str | None = Field(None, max_length=_B64_CHARS)
    timeout_s: float | None = Field(None, gt=0, le=600, allow_inf_nan=False)

    @classmethod
    def of(
        cls,
        url: str,
        *,
        method: str = "GET",
        headers: dict[str, str] | None = None,
        params: dict[str, str | list[str]] | None = None,
        body: bytes | None = None,
        timeout_s: float | None = None,
    ) -> FetchRequest:
        """Convenience for host-side callers and tests."""
        encoded = base64.b64encode(body).decode("ascii") if body is not None else None
        return cls(method=method, url=url, headers=headers or {}, params=params, body_b64=encoded, timeout_s=timeout_s)

    def body(self) -> bytes | None:
        if self.body_b64 is None:
            return None
        try:
            return base64.b64decode(self.body_b64, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidFetch("request body is not valid base64", reason="invalid_body") from None


class FetchResponse(_Wire):
    """What the program gets back: status, lower-case header names, the final URL, the decoded body."""

    status: int = Field(ge=100, le=999)
    headers: dict[str, str]
    url: str
    body_b64: str
    elapsed_ms: float = Field(ge=0)

    @property
    def content(self) -> bytes:
        return base64.b64decode(self.body_b64)


class FetchFailure(_Wire):
    kind: ErrorKind
    message: str = Field(max_length=4096)
    reason: str = Field(max_length=100)


class FetchReply(_Wire):
    """Exactly one of ``response`` and ``error``."""

    response: FetchResponse | None = None
    error: FetchFailure | None = None

    @model_validator(mode="after")
    def _one(self) -> FetchReply:
        if (self.response is None) == (self.error is None):
            raise ValueError("a fetch reply carries exactly one of response and error")
        return self
