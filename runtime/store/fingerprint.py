"""Integrity checksums and contract fingerprints: stable sha256 hex digests."""

from __future__ import annotations

import hashlib
import json

from pydantic import JsonValue

FINGERPRINT_VERSION = 1


def code_checksum(code: str) -> str:
    """sha256 of the exact program text (UTF-8). Any byte changed, the artifact is not executed."""
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


def _normalize(value: JsonValue) -> JsonValue:
    """Whitespace runs inside strings collapse to one space, so re-wrapping a purpose is not a new contract."""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    if isinstance(value, dict):
        return {" ".join(k.split()): _normalize(v) for k, v in value.items()}
    return value


def canonical_json(value: JsonValue) -> str:
    """Key-sorted, separator-minimal JSON: equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def contract_fingerprint(
    role: str,
    purpose: str | None,
    deliverable: JsonValue = None,
    acceptance: JsonValue = None,
    failure_policy: JsonValue = None,
    inputs: JsonValue = None,
    files: JsonValue = None,
) -> str:
    """Stable hash of a delegation contract (ADR 0012 section 3): the staleness signal of artifacts.

    Key order of dicts and whitespace inside strings do not matter; the role is part of the contract.
    """
    payload: dict[str, JsonValue] = {
        "v": FINGERPRINT_VERSION,
        "role": role,
        "purpose": _normalize(purpose),
        "deliverable": _normalize(deliverable),
        "acceptance": _normalize(acceptance),
        "failure_policy": _normalize(failure_policy),
    }
    if inputs is not None:  # typed inputs (issue 37); absent, every fingerprint stays what it was
        payload["inputs"] = _normalize(inputs)
    if files is not None:  # declared files (issue 41); absent, likewise
        payload["files"] = _normalize(files)
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()
