"""What travels between the caller and a node's sandbox host: plain dicts of JSON values, str and bytes.

Ray carries these between trusted processes (the caller and the node's actor); nothing of it enters a sandbox
as it is: the node rebuilds an ``ExecutionRequest`` from it, and its own exchange speaks the JSON-only channel
to the sandbox. Large context texts travel once per node: a text of ``LARGE_BYTES`` or more is sent as a
reference (its SHA-256) to a node known to hold it, and the node answers ``missing`` for one it lost.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sandforge.sandbox.context import SEALED_MIN_BYTES, ContextSnapshot
from sandforge.sandbox.protocol import ExecutionOutcome, ExecutionRequest

#: A context text this large travels to a node once (then by reference), as it is handed to sandboxes once.
LARGE_BYTES = SEALED_MIN_BYTES
#: What a node keeps of large texts (bytes, least recently used first out).
NODE_CACHE_BYTES = 256 * 1024 * 1024

Wire = dict[str, Any]


class WireError(ValueError):
    """A message between caller and node is malformed (a bug or a version mismatch, never the program)."""


def digest(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()


def request_to_wire(request: ExecutionRequest, known: set[str] | None = None) -> tuple[Wire, dict[str, bytes]]:
    """The request as a wire dict, and the large texts it refers to by digest (key: digest). A large text
    whose digest is in ``known`` (the node holds it) is not included."""
    snapshot = ContextSnapshot.coerce(request.context)
    texts: dict[str, bytes | str] = {}
    blobs: dict[str, bytes] = {}
    for key, text in snapshot.items():
        if len(text) >= LARGE_BYTES:
            ref = digest(text)
            texts[key] = ref
            if known is None or ref not in known:
                blobs[ref] = text
        else:
            texts[key] = text
    fields = request.model_dump(mode="json", exclude={"context", "files"})
    return {"request": fields, "context": texts, "files": dict(request.files)}, blobs  # files as bytes, not base64


def request_from_wire(message: Wire, cache: dict[str, bytes]) -> ExecutionRequest | list[str]:
    """The request a wire dict describes, or the digests it refers to that ``cache`` lacks."""
    try:
        texts: dict[str, bytes | str] = message["context"]
        fields: dict[str, Any] = message["request"]
    except (KeyError, TypeError) as exc:
        raise WireError(f"malformed request message: {exc}") from None
    missing = [ref for ref in texts.values() if isinstance(ref, str) and ref not in cache]
    if missing:
        return missing
    items = {key: cache[value] if isinstance(value, str) else bytes(value) for key, value in texts.items()}
    snapshot = ContextSnapshot(items)  # trusted: the caller's own snapshot
    files = {name: bytes(body) for name, body in (message.get("files") or {}).items()}
    return ExecutionRequest.model_validate({**fields, "context": snapshot, "files": files})


def outcome_to_wire(outcome: ExecutionOutcome, base: ContextSnapshot) -> Wire:
    """The outcome as a wire dict; of its context only the keys whose text differs from ``base`` (the
    request's) and the keys it deleted travel."""
    fields = {name: getattr(outcome, name) for name in _OUTCOME_FIELDS}
    fields["usage"] = outcome.usage.model_dump(mode="json")
    fields["error_type"] = None if outcome.error_type is None else str(outcome.error_type)
    fields["files"] = dict(outcome.files)  # an ok outcome's output files (issue 41), as bytes
    snapshot = outcome.context_snapshot
    if snapshot is None:
        return {"outcome": fields, "changed": None, "deleted": []}
    changed = {key: text for key, text in snapshot.items() if base.get(key) != text}
    deleted = [key for key in base if key not in snapshot]
    return {"outcome": fields, "changed": changed, "deleted": deleted}


def outcome_from_wire(message: Wire, base: ContextSnapshot) -> ExecutionOutcome:
    """The outcome a node sent, its context rebuilt on ``base`` (the request's snapshot)."""
    try:
        fields: dict[str, Any] = dict(message["outcome"])
        changed: dict[str, bytes] | None = message["changed"]
        deleted: list[str] = message["deleted"]
    except (KeyError, TypeError) as exc:
        raise WireError(f"malformed outcome message: {exc}") from None
    if changed is None:
        return ExecutionOutcome.model_validate(fields)
    fields.pop("context", None)
    # the node's exchange checked these texts
    new = base.with_changes({key: bytes(text) for key, text in changed.items()}, deleted)
    return ExecutionOutcome.model_validate({**fields, "context_snapshot": new})


_OUTCOME_FIELDS = (
    "status", "value", "error_type", "error_message", "retriable", "stdout", "stderr", "stdout_truncated",
    "stderr_truncated", "duration_s", "backend", "protections", "metadata",
)  # fmt: skip
