"""The wire between the host and the inside: one source for what both sides must agree on.

Frames are a 4-byte big-endian length (``HEADER``) plus UTF-8 JSON, encoded canonically (``dumps``). The
host (``sandbox/protocol.py``, ``sandbox/context.py``, ``sandbox/exchange.py``) imports these constants
from here instead of keeping copies, so a change is made once. Standard library only: the inside imports
this module too, before lock-down.
"""

from __future__ import annotations

import fcntl
import json
import struct
from collections.abc import Callable
from typing import Any, Final, NotRequired, TypedDict

#: The wire protocol both sides speak (a ``ready`` frame states it; the host refuses any other).
PROTOCOL_VERSION: Final = 3
#: The length prefix of every frame.
HEADER: Final = struct.Struct(">I")
#: Where a ready environment is mounted read-only in every sandbox (``runtime/environments`` compiles its
#: bytecode for this path; the image has it as an empty directory, for the read-only root).
ENV_MOUNT_PATH: Final = "/sandforge/env"
#: The largest boot frame: the host sends no larger one, the inside reads no more.
MAX_BOOT_BYTES: Final = 1 << 20
#: The exit status of a runner that ended on a security event (the tripwire, or an inner-wall violation):
#: it wrote its one ``sandbox_violation`` result first, then exited at once with this status.
VIOLATION_EXIT_STATUS: Final = 86
#: The file of a container's hand-off directory that holds the boot frame's token: finding it there proves
#: that the directory mounted is the one the host prepared.
HANDOFF_PROOF_FILE: Final = "token"
#: At most this many descriptors (sealed memfds of context values and input files) come with the execute frame.
MAX_PASSED_FDS: Final = 16
#: What makes a passed memfd immutable: no writes, no shrinking, no growing, by anyone. The inside refuses
#: a descriptor without them.
REQUIRED_SEALS: Final = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
#: What the host applies: the required seals, and the seal on the seals.
APPLIED_SEALS: Final = REQUIRED_SEALS | fcntl.F_SEAL_SEAL
#: A frame nests at most this deep (the host's JSON parser's limit), so a value inside a frame (a result,
#: a context value, a nested call's argument list) at most one level less.
MAX_FRAME_DEPTH: Final = 201
MAX_VALUE_DEPTH: Final = MAX_FRAME_DEPTH - 1
#: Longest ``purpose`` and longest JSON text of each other field of a ``delegate(...)`` contract.
MAX_PURPOSE_CHARS: Final = 1000
MAX_CONTRACT_FIELD_CHARS: Final = 2000
#: Longest error message and exception or error-type name a result frame carries.
MAX_ERROR_MESSAGE: Final = 4096
MAX_NAME: Final = 200
#: Files in the transaction (issue 41): the program reads its input files under ``INPUTS_DIR`` and writes its
#: outputs under ``OUTPUTS_DIR``, both in its working directory. A file's name is one path segment of this
#: pattern (no ``/``, no leading dot, so never ``..``, never absolute), on both sides of the boundary.
INPUTS_DIR: Final = "inputs"
OUTPUTS_DIR: Final = "outputs"
FILE_NAME_PATTERN: Final = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}"


def dumps(value: Any, default: Callable[[Any], Any] | None = None) -> str:
    """``value``'s canonical JSON text, the encoding of every frame and every context text: strict JSON (no
    NaN/Infinity), UTF-8 as it is, no spaces, so the host and the inside encode a value to the same bytes.
    TypeError/ValueError when it is not JSON."""
    encoder = _ENCODERS.get(default)
    if encoder is None:  # one encoder per hook: ``json.dumps`` with options builds a new one on every call
        encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=default)
        if len(_ENCODERS) < 16:  # the hooks are module functions; a stray closure is never kept
            _ENCODERS[default] = encoder
    return encoder.encode(value)


#: ``dumps``' encoders by ``default`` hook (stateless between calls, so shared; a handful of hooks exist).
_ENCODERS: dict[Callable[[Any], Any] | None, json.JSONEncoder] = {}


class ErrorKind:
    """The error types of one execution (the host's ``ErrorType`` enumerates these very strings)."""

    TIMEOUT: Final = "timeout"
    MEMORY_LIMIT: Final = "memory_limit"
    OUTPUT_LIMIT: Final = "output_limit"
    EXECUTION: Final = "execution"
    INVALID_CODE: Final = "invalid_code"
    NON_SERIALIZABLE_RESULT: Final = "non_serializable_result"
    SANDBOX_VIOLATION: Final = "sandbox_violation"
    SANDBOX_UNAVAILABLE: Final = "sandbox_unavailable"
    INVALID_REQUEST: Final = "invalid_request"
    TOOL_ERROR: Final = "tool_error"
    GUARDRAIL_VIOLATION: Final = "guardrail_violation"
    INVALID_CONTRACT: Final = "invalid_contract"
    # A brokered request failed and the program did not catch it (the host checks it did fail so).
    EGRESS_DENIED: Final = "egress_denied"
    EGRESS_LIMIT: Final = "egress_limit"
    NETWORK_ERROR: Final = "network_error"
    MISSING_CREDENTIALS: Final = "missing_credentials"
    INVALID_FETCH: Final = "invalid_fetch"
    # Preparing the program's environment failed on the host (issue 19): nothing ran; never the inside's to claim.
    INVALID_DEPENDENCY_MANIFEST: Final = "invalid_dependency_manifest"
    DEPENDENCY_POLICY_VIOLATION: Final = "dependency_policy_violation"
    DEPENDENCY_RESOLUTION_FAILED: Final = "dependency_resolution_failed"
    DEPENDENCY_INSTALL_FAILED: Final = "dependency_install_failed"
    ENVIRONMENT_PREPARING: Final = "environment_preparing"


#: The kinds of a brokered request's failure (``fetch_result`` frames' ``error.kind``). A program that does
#: not catch one ends with it as its error type, which the host accepts only when it answered a fetch of
#: that execution with an error of that very kind (else the program forged it: an ``execution`` error).
FETCH_ERROR_KINDS: Final = frozenset({
    ErrorKind.EGRESS_DENIED, ErrorKind.EGRESS_LIMIT, ErrorKind.NETWORK_ERROR, ErrorKind.MISSING_CREDENTIALS,
    ErrorKind.INVALID_FETCH,
})  # fmt: skip

#: The error types the inside may report. The others are the host's own observations (``timeout``,
#: ``sandbox_unavailable``, ``guardrail_violation``): a result frame claiming one is forged.
INSIDE_ERROR_KINDS: Final = frozenset({
    ErrorKind.EXECUTION, ErrorKind.INVALID_CODE, ErrorKind.NON_SERIALIZABLE_RESULT, ErrorKind.SANDBOX_VIOLATION,
    ErrorKind.MEMORY_LIMIT, ErrorKind.OUTPUT_LIMIT, ErrorKind.TOOL_ERROR, ErrorKind.INVALID_REQUEST,
    ErrorKind.INVALID_CONTRACT,
}) | FETCH_ERROR_KINDS  # fmt: skip


class CompiledProgram(TypedDict):
    """The program compiled on the host by the inside's own ``compile_checked``: the bytecode magic and the
    base64 of the marshalled code object."""

    magic: str
    marshal: str


class ExecuteFrame(TypedDict):
    """The ``execute`` frame, as the host builds it and the inside reads it (a plain dict on the wire).

        One frame per context key follows it, in ``context_keys`` order (the key's JSON text), except for keys
        announced as ``[key, length, i]``: their text is descriptor ``i`` of those attached to this frame
        (SCM_RIGHTS), a sealed, read-only memfd of exactly ``length`` bytes; where the inside confirmed a
        hand-off directory at boot, file ``i`` in that directory instead. ``compiled``: the program compiled on
        the host, used when its magic is the inside's own (else the inside compiles ``code`` itself). ``env_id``:
    the environment the program was prepared for, which must be the runner's own (absent: none). ``canary``:
    ``sandforge doctor``'s tripwire check (``protocol.tripwire_canary``). ``files``: the input files as
    ``[name, length]``, each one's bytes a frame of its own after the context texts, or as ``[name, length,
    i]``: descriptor ``i`` of this frame (a sealed memfd) or hand-off file ``i``, as a context key's."""

    type: str
    code: str
    args: list[Any]
    kwargs: dict[str, Any]
    context_keys: list[list[Any]]
    compiled: NotRequired[CompiledProgram]
    env_id: NotRequired[str]
    canary: NotRequired[bool]
    files: NotRequired[list[list[Any]]]


def error(kind: str, message: str, **extra: Any) -> dict[str, Any]:
    """A result frame's ``error`` object, within the host's bounds (message and names cut, valid UTF-8)."""
    body = {"type": kind, "message": valid_text(message[:4000]), **{k: v for k, v in extra.items() if v is not None}}
    for name in ("exception", "tool_error_type"):  # the host accepts names of up to MAX_NAME characters
        if isinstance(body.get(name), str):
            body[name] = valid_text(body[name][:MAX_NAME])
    return body


def valid_text(text: str) -> str:
    """``text`` as valid UTF-8: a lone surrogate (which no frame can carry) becomes ``?``, the byte that
    the bounded stdout capture counted for it, instead of making the whole result unencodable."""
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode()
