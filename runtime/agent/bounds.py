"""Bounds on what a program hands the host: nested-call names, delegate contracts and call arguments.

A program is untrusted, and what it names and declares outlives it: roles and purposes are stored in the
registry and shown to the model in later prompts (this session and the next). So before the host acts on
a nested call it checks:

- the role matches :data:`ROLE_PATTERN` and the method :data:`METHOD_PATTERN` (no newline, no markup,
  at most 64 characters: a name is an identifier, not text);
- a delegate's ``purpose`` is at most :data:`MAX_PURPOSE_CHARS` characters, and each other contract field
  is JSON of at most :data:`MAX_CONTRACT_FIELD_CHARS` characters;
- the arguments are JSON the sandbox can carry: no lone surrogate anywhere, nested at most
  :data:`MAX_ARGUMENT_DEPTH` levels (the runner's limit).

A nested call that fails a check is answered with an error outcome (``invalid_tool_call``); a top-level
call's arguments that fail it raise ``TypeError`` as any non-JSON argument does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator

from sandforge.runtime.names import (
    MAX_CONTRACT_FIELD_CHARS,
    MAX_PURPOSE_CHARS,
    METHOD_PATTERN,
    ROLE_PATTERN,
    valid_method,
    valid_role,
)
from sandforge.runtime.store.models import ToolFiles

#: The sandbox refuses values nested deeper (``sandbox/inside/lazycontext.py``, ``check_json``).
MAX_ARGUMENT_DEPTH = 200

INVALID_TOOL_CALL = "invalid_tool_call"

RoleName = Annotated[str, Field(pattern=ROLE_PATTERN), AfterValidator(lambda v: _fullmatch(v, valid_role))]
MethodName = Annotated[str, Field(pattern=METHOD_PATTERN), AfterValidator(lambda v: _fullmatch(v, valid_method))]


def _fullmatch(value: str, check: Callable[[object], bool]) -> str:
    if not check(value):
        raise ValueError("a trailing newline")  # the pattern's ``$`` lets one through
    return value


def json_problem(value: Any, what: str, *, max_depth: int = MAX_ARGUMENT_DEPTH) -> str | None:
    """Why ``value`` cannot cross the sandbox boundary as JSON, or None. Iterative: no recursion limit."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            return f"{what} is nested more than {max_depth} levels deep"
        if isinstance(item, str):
            if not _utf8(item):
                return f"{what} contains a lone surrogate (text that is not valid unicode)"
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and not _utf8(key):
                    return f"{what} has a key with a lone surrogate (text that is not valid unicode)"
                stack.append((child, depth + 1))
    return None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_arguments(args: Any, kwargs: Any, what: str = "call arguments") -> None:
    """TypeError (the documented error for arguments that are not JSON) if they cannot reach a sandbox."""
    problem = json_problem(args, what) or json_problem(kwargs, what.replace("arguments", "keyword arguments"))
    if problem is not None:
        raise TypeError(problem)


def _bounded_json_field(value: JsonValue, info: Any) -> JsonValue:
    if value is None:
        return value
    problem = json_problem(value, info.field_name, max_depth=32)
    if problem is not None:
        raise ValueError(problem)
    text = json.dumps(value, ensure_ascii=False)
    if len(text) > MAX_CONTRACT_FIELD_CHARS:
        raise ValueError(f"{info.field_name} is {len(text)} characters of JSON (at most {MAX_CONTRACT_FIELD_CHARS})")
    return value


class NestedCallSpec(BaseModel):
    """The host's bounded view of a nested call frame: what the lifecycle may act on and store."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["tool", "delegate"]
    role: RoleName
    method: MethodName
    purpose: str | None = Field(None, max_length=MAX_PURPOSE_CHARS)
    deliverable: JsonValue = None
    acceptance: JsonValue = None
    failure_policy: JsonValue = None
    #: ``delegate(role, ..., files={"takes": [...], "produces": [...]})``: the files of its contract
    files: ToolFiles | None = None

    _fields = field_validator("deliverable", "acceptance", "failure_policy")(_bounded_json_field)


def nested_call_spec(target: Any, method: str) -> NestedCallSpec | str:
    """The checked spec of a call frame's target and method, or a one-line reason it is refused."""
    fields = {
        "kind": getattr(target, "kind", None), "role": getattr(target, "name", None), "method": method,
        "purpose": getattr(target, "purpose", None), "deliverable": getattr(target, "deliverable", None),
        "acceptance": getattr(target, "acceptance", None), "failure_policy": getattr(target, "failure_policy", None),
        "files": getattr(target, "files", None),
    }  # fmt: skip
    try:
        return NestedCallSpec(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "call"
        if where == "role":
            return f"invalid tool name: a role matches {ROLE_PATTERN} (letters, digits, _ . -; at most 64)"
        if where == "method":
            return f"invalid method name: a method matches {METHOD_PATTERN} (letters, digits, _; at most 64)"
        if err["type"] == "string_unicode":
            return f"invalid delegate contract: {where}: not valid unicode (a lone surrogate)"
        return f"invalid delegate contract: {where}: {err['msg']}"
