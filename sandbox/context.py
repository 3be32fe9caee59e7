"""The context snapshot: each top-level key of a program's context, kept as its own encoded JSON text.

Carrying state a program does not touch must cost no more than moving its bytes: a snapshot is encoded once
(when a caller hands in a dict), travels to the runner key by key without being re-encoded, and comes back
as a delta (the keys the program changed or deleted). Deriving the next snapshot shares every unchanged
key's bytes, and a key is decoded only when someone asks for its value.

The encoding is fixed (``wire.dumps``: ``ensure_ascii=False``, ``allow_nan=False`` and compact separators,
as UTF-8), the very one the runner uses, so "re-encodes to the same bytes" means "unchanged".
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NoReturn, TypeVar

import pydantic_core

from sandforge.sandbox.inside import wire

#: A key's text at least this long may travel to the runner as a sealed memfd instead of a frame.
SEALED_MIN_BYTES = 1 << 16
#: Seals that make a memfd's contents immutable for everyone (the host included) and forbid new seals.
SEALS = wire.APPLIED_SEALS
_SHARED_LOCK = threading.Lock()
T = TypeVar("T")


class ContextError(ValueError):
    """A context (or one of its values) is not JSON. Callers report it as an invalid request."""


def _not_json(value: object) -> NoReturn:
    raise TypeError(f"a value of type {type(value).__name__} is not JSON")


def encode_value(value: Any, what: str = "a context value") -> bytes:
    """One value's canonical JSON text; ContextError if it is not JSON.

    ``json.dumps`` (C) is the check: it refuses NaN/Infinity and every non-JSON type. pydantic's JsonValue
    walk, which this replaces, was far slower on large contexts (docs/benchmarks.md, "Numbers behind the
    code"). What json.dumps normalizes rather than refuses
    (non-string dict keys below the top level become strings, tuples become lists) is normalized here too,
    as ``Workspace`` always did with ``json.loads(json.dumps(...))``; the runner, which must report a
    program's mistakes, checks those exactly.
    """
    try:
        text = wire.dumps(value, _not_json)
        return text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:
        raise ContextError(f"{what} is not JSON: {exc}") from None


_SHAPE = bytearray(b" " * 256)
for _digit in b"0123456789":
    _SHAPE[_digit] = ord("0")
_SHAPE[ord("e")] = _SHAPE[ord("E")] = ord("e")
_SHAPE[ord("+")] = ord("+")
_NUMBER_SHAPE = bytes(_SHAPE)


def may_hold_non_finite(body: bytes) -> bool:
    """Whether JSON text can parse to a non-finite float: a NaN/Infinity token, a number with an exponent,
    or one with 309 or more digits in a row. Checked at C speed on the bytes (a translate and a few
    searches), so the exact check (``ensure_finite``, a walk of the parsed value) runs only when needed."""
    if b"NaN" in body or b"Infinity" in body:
        return True
    shape = body.translate(_NUMBER_SHAPE)
    return b"0e0" in shape or b"0e+0" in shape or b"0" * 309 in shape


def _may_hold_non_finite(body: bytes) -> bool:
    return may_hold_non_finite(body if isinstance(body, (bytes, bytearray)) else bytes(body))


def decode_value(body: bytes, what: str = "a context value") -> Any:
    """Parse one key's JSON text strictly (UTF-8, no NaN/Infinity); ContextError otherwise."""
    try:
        value = pydantic_core.from_json(body, allow_inf_nan=False)
        if not (value is None or isinstance(value, (str, int))) and _may_hold_non_finite(body):
            # An overflowing literal (1e400) parses to inf even so; json.dumps (in C) refuses it.
            json.dumps(value, allow_nan=False, ensure_ascii=False, check_circular=False)
        return value
    except ValueError as exc:
        raise ContextError(f"{what} is not JSON: {exc}") from None


class SealedText:
    """One key's text in a sealed memfd: no one can change, grow or shrink it any more.

    Read-only by construction, so it can be handed to any number of sandboxes (SCM_RIGHTS) instead of
    copying the bytes through a pipe. The descriptor is closed when the last snapshot sharing it is gone.
    """

    __slots__ = ("__weakref__", "fd", "size")

    def __init__(self, text: bytes, name: str = "sandforge-context") -> None:
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(text)
            while view:
                view = view[os.write(fd, view) :]
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.size = fd, len(text)
        weakref.finalize(self, os.close, fd)


class ContextSnapshot(Mapping[str, bytes]):
    """An immutable mapping from top-level context key to that key's JSON text (UTF-8 bytes).

    ``value(key)`` decodes one key, ``to_dict()`` the whole context; ``nbytes`` is the total size of the
    values' texts, known without encoding anything.
    """

    __slots__ = ("_items", "_nbytes", "_shared")

    def __init__(self, items: Mapping[str, bytes] | None = None) -> None:
        """Wrap already-encoded texts as they are (trusted: use ``from_dict`` for values, ``validated``
        for bytes from elsewhere)."""
        self._items: dict[str, bytes] = dict(items or {})
        self._nbytes = sum(len(body) for body in self._items.values())
        self._shared: dict[str, dict[Callable[[bytes], Any], Any]] = {}

    def shared(self, key: str, make: Callable[[bytes], T]) -> T | None:
        """``make(text of key)``, made on first use and shared with every snapshot derived from this one that
        keeps the key unchanged (a sealed memfd, a hand-off file: made once, not per execution); None when
        ``make`` fails with OSError."""
        with _SHARED_LOCK:
            made = self._shared.setdefault(key, {})
            if make not in made:
                try:
                    made[make] = make(self._items[key])
                except (OSError, AttributeError):  # AttributeError: no os.memfd_create on this platform
                    return None
            return made[make]  # type: ignore[no-any-return]

    def sealed(self, key: str) -> SealedText | None:
        """``key``'s text as a sealed memfd; None where memfds are unavailable."""
        return self.shared(key, SealedText)

    @classmethod
    def from_dict(cls, context: Mapping[str, Any]) -> ContextSnapshot:
        """Encode a context dict key by key; ContextError if it is not a JSON object."""
        if isinstance(context, ContextSnapshot):
            return context
        if not isinstance(context, Mapping):
            raise ContextError(f"a context is a JSON object, not {type(context).__name__}")
        items: dict[str, bytes] = {}
        for key, value in context.items():
            if not isinstance(key, str):
                raise ContextError(f"context keys are strings, not {type(key).__name__}")
            items[key] = encode_value(value, f"context value {key!r}")
        return cls(items)

    @classmethod
    def coerce(cls, context: Any) -> ContextSnapshot:
        """A snapshot as is, a mapping encoded, None as the empty context."""
        return cls() if context is None else cls.from_dict(context)

    def with_changes(self, changed: Mapping[str, bytes], deleted: Iterable[str] = ()) -> ContextSnapshot:
        """A new snapshot with ``changed`` keys set (trusted texts) and ``deleted`` keys removed.

        Unchanged keys share their bytes with this snapshot; a changed key keeps its position, a new key
        goes to the end (dict order, as in the program's ``context``)."""
        items = dict(self._items)
        for key in deleted:
            items.pop(key, None)
        items.update(changed)
        derived = ContextSnapshot(items)
        with _SHARED_LOCK:
            derived._shared = {k: v for k, v in self._shared.items() if k in items and k not in changed}
        return derived

    def value(self, key: str) -> Any:
        """The decoded value of one key (a fresh object on every call)."""
        return json.loads(self._items[key])

    def to_dict(self) -> dict[str, Any]:
        """The whole context decoded (fresh objects)."""
        return {key: json.loads(body) for key, body in self._items.items()}

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __getitem__(self, key: str) -> bytes:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ContextSnapshot):
            return self._items == other._items
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ContextSnapshot({len(self._items)} keys, {self._nbytes} bytes)"
