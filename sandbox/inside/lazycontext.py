"""The program's ``context`` and the JSON values that cross the wire.

Each top-level context key arrives as its own JSON text (a frame, or a sealed memfd mapped read-only) and
stays undecoded until the program reads it (``LazyContext``): carrying state a program does not touch costs
moving its bytes, nothing more. At the end only changed keys travel back, canonically encoded
(``dump_json``: exactly JSON, or ``NotJson`` saying what is not).
"""

from __future__ import annotations

import collections.abc
import json
from typing import TYPE_CHECKING, Any

from . import wire

if TYPE_CHECKING:
    import mmap


class MappedText:
    """A context key's JSON text in a sealed memfd, mapped read-only; copied out once, on first use."""

    __slots__ = ("map", "size", "text")

    def __init__(self, mapped: mmap.mmap | None, size: int) -> None:
        self.map, self.size, self.text = mapped, size, b"" if mapped is None else None

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes:
        if self.text is None:
            assert self.map is not None
            self.text = self.map[:]
            self.map.close()
            self.map = None
        return self.text


ContextText = bytearray | MappedText


def _json_default(value: Any) -> Any:
    """``json.dumps``' hook: a LazyContext is encoded as the dict it stands for; nothing else is JSON."""
    if type(value) is LazyContext:
        return value._resolved()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def encode(frame: dict[str, Any]) -> bytes:
    text = wire.dumps(frame, _json_default)
    return text.encode()


class NotJson(TypeError):
    pass


#: A value (a result, a context value, a nested call's argument list) nests at most this many lists and
#: objects: the host parses frames up to ``wire.MAX_FRAME_DEPTH`` levels and a value sits one level
#: inside its frame. Deeper is the program's error (non_serializable_result), never a protocol violation.
MAX_VALUE_DEPTH = wire.MAX_VALUE_DEPTH


def json_key(key: Any, what: str) -> str:
    """The string ``json.dumps`` makes of a dict key (issue 38: ``{year: total}`` is a JSON object, as every
    JSON encoder sends it): a str as it is, ``True``/``False``/``None`` as ``"true"``/``"false"``/``"null"``,
    an int or a finite float as its ``repr``. NotJson for any other key."""
    if isinstance(key, str):
        return key
    if key is True or key is False or key is None:
        return "true" if key is True else "false" if key is False else "null"
    if isinstance(key, int):
        return int.__repr__(key)
    if isinstance(key, float):
        if key != key or key in (float("inf"), float("-inf")):
            raise NotJson(f"{what} has a non-finite float dict key")
        return float.__repr__(key)
    raise NotJson(f"{what} has a dict key of type {type(key).__name__}; JSON keys are strings, numbers, "
                  "booleans or None")  # fmt: skip


def json_keys(mapping: Any, what: str) -> dict[str, Any]:
    """``mapping`` with its keys as ``json.dumps`` writes them; NotJson when two keys become the same string
    (``{1: "a", "1": "b"}``): JSON would keep one of them silently, so neither is sent."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        text = json_key(key, what)
        if text in out:
            raise NotJson(f"{what} has dict keys that both become {text!r} in JSON; rename one of them")
        out[text] = value
    return out


def check_json(value: Any, what: str, _depth: int = 0) -> None:
    """Only what JSON round-trips exactly: dicts with str keys (or int, float, bool, None keys, which become
    strings, none two alike), lists (tuples become lists), str, int, finite float, bool, None."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth >= MAX_VALUE_DEPTH and isinstance(item, (list, dict)):
            raise NotJson(f"{what} is nested more than {MAX_VALUE_DEPTH} levels deep")
        if item is None or isinstance(item, (bool, int, str)):
            continue
        if isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                raise NotJson(f"{what} contains a non-finite float")
            continue
        if isinstance(item, list | tuple):  # a tuple is sent as a list, as every JSON boundary does
            stack.extend((child, depth + 1) for child in item)
            continue
        if isinstance(item, dict):
            if not all(type(key) is str for key in item):
                json_keys(item, what)
            stack.extend((child, depth + 1) for child in item.values())
            continue
        raise NotJson(f"{what} contains a value of type {type(item).__name__}, which is not JSON")


#: A changed value whose text has more brackets than this may be nested deeper than the host accepts, so
#: it is walked (``check_json``) to report that precisely; anything with fewer brackets cannot be.
MAX_DEPTH_BRACKETS = 200


def dump_json(value: Any, what: str) -> bytes:
    """The canonical JSON text of ``value`` (as the host encodes it); NotJson unless it is exactly JSON.

    ``json.dumps`` in C refuses NaN/Infinity and non-JSON types. What it converts (tuples to lists, int,
    float, bool and None dict keys to strings) is checked by decoding the text again and comparing, also in
    C; only when that differs is the value rebuilt as JSON would see it (``_as_json``), which refuses two
    keys that become one string, and compared again. Only on a failure, or when the value may be deeper
    than 200 levels, does the slow ``check_json`` walk run, to say exactly what is wrong.
    """
    try:
        text = wire.dumps(value, _json_default)
        body = text.encode()
        decoded = json.loads(text)
        exact = decoded == value or decoded == _as_json(value, what)
    except (TypeError, ValueError, RecursionError) as exc:
        check_json(value, what)
        raise NotJson(f"{what} is not JSON: {exc}") from None
    if not exact or body.count(b"[") + body.count(b"{") > MAX_DEPTH_BRACKETS:
        check_json(value, what)
        if not exact:
            raise NotJson(f"{what} is not JSON")
    return body


def _as_json(value: Any, what: str) -> Any:
    """``value`` as its JSON text decodes: every tuple a list, every dict key a string (``json_keys``:
    NotJson, a TypeError, when two keys collide). Only called when the plain comparison fails."""
    if isinstance(value, list | tuple):
        return [_as_json(item, what) for item in value]
    if isinstance(value, dict):
        return {key: _as_json(item, what) for key, item in json_keys(value, what).items()}
    if type(value) is LazyContext:
        return _as_json(value._resolved(), what)
    return value


def _fast_dump(value: Any) -> bytes | None:
    """The canonical text if ``json.dumps`` accepts the value at all (None otherwise), without the checks."""
    try:
        text = wire.dumps(value, _json_default)
        return text.encode()
    except (TypeError, ValueError, RecursionError):
        return None


class _Encoded:
    """A context key's JSON text, not yet decoded. Only the runner creates these; programs never see one."""

    __slots__ = ("body",)

    def __init__(self, body: ContextText) -> None:
        self.body = body


def _text(body: ContextText) -> bytes | bytearray:
    return body.read() if isinstance(body, MappedText) else body


class _ContextKeys(collections.abc.KeysView):  # type: ignore[type-arg]
    """``context.keys()``: a live view of the keys, like ``dict_keys``."""

    __slots__ = ()

    def __reversed__(self) -> Any:
        return reversed(self._mapping)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"dict_keys({list(self)!r})"


class LazyContext:
    """The program's ``context``: a mutable mapping that decodes a key's JSON text on first access.

    Not a dict subclass on purpose: C code (``dict(x)``, ``{**x}``, ``json.dumps``) reads a dict subclass's
    storage directly and would see the undecoded placeholders. Every path to a value goes through
    ``_value``; whole-mapping operations (values, items, copy, equality, repr) decode everything first and
    then use the real dict. ``isinstance(context, dict)`` still holds (``__class__``), as programs expect.

    At the end, ``delta`` reports what changed: a key never read is unchanged by construction; a key read
    is re-encoded and compared byte for byte with its original text; assigned or new keys are changed.
    """

    __slots__ = ("_items", "_original")
    #: RestrictedPython's write guard lets objects that say so handle their own writes (as dicts do).
    _guarded_writes = True

    def __init__(self, raw: dict[str, ContextText]) -> None:
        self._original = raw
        self._items: dict[Any, Any] = {key: _Encoded(body) for key, body in raw.items()}

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(context, dict) must hold for programs
        return dict

    # --- decoding ---

    def _value(self, key: Any) -> Any:
        value = self._items[key]
        if type(value) is _Encoded:
            value = self._items[key] = json.loads(_text(value.body))
        return value

    def _resolved(self) -> dict[Any, Any]:
        """The underlying dict with every key decoded (no placeholder left in it)."""
        for key, value in self._items.items():
            if type(value) is _Encoded:
                self._items[key] = json.loads(_text(value.body))
        return self._items

    # --- the mapping protocol ---

    def __getitem__(self, key: Any) -> Any:
        return self._value(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._items[key] = value

    def __delitem__(self, key: Any) -> None:
        del self._items[key]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Any:
        return iter(self._items)

    def __reversed__(self) -> Any:
        return reversed(self._items)

    def keys(self) -> Any:
        return _ContextKeys(self)  # not the dict's view: its ``.mapping`` would show the placeholders

    def values(self) -> Any:
        return self._resolved().values()

    def items(self) -> Any:
        return self._resolved().items()

    def get(self, key: Any, default: Any = None) -> Any:
        return self._value(key) if key in self._items else default

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key in self._items:
            return self._value(key)
        self._items[key] = default
        return default

    _MISSING: Any = object()

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        if key in self._items:
            value = self._value(key)
            del self._items[key]
            return value
        if default is LazyContext._MISSING:
            raise KeyError(key)
        return default

    def popitem(self) -> tuple[Any, Any]:
        if not self._items:
            raise KeyError("popitem(): dictionary is empty")
        key = next(reversed(self._items))
        return key, self.pop(key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._items.update(*args, **kwargs)

    def clear(self) -> None:
        self._items.clear()

    def copy(self) -> dict[Any, Any]:
        return dict(self._resolved())

    def __copy__(self) -> dict[Any, Any]:
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        import copy

        return copy.deepcopy(self._resolved(), memo)

    @staticmethod
    def fromkeys(keys: Any, value: Any = None) -> dict[Any, Any]:
        return dict.fromkeys(keys, value)

    def __eq__(self, other: object) -> bool:
        return bool(self._resolved() == _plain(other))

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __or__(self, other: Any) -> Any:
        if not isinstance(other, dict):
            return NotImplemented
        return self._resolved() | _plain(other)

    def __ror__(self, other: Any) -> Any:
        if not isinstance(other, dict):
            return NotImplemented
        return other | self._resolved()

    def __ior__(self, other: Any) -> LazyContext:
        self._items.update(_plain(other))
        return self

    def __repr__(self) -> str:
        return repr(self._resolved())

    # --- the end of the execution ---

    def delta(self) -> tuple[list[tuple[str, bytes]], list[str]]:
        """The keys to send back (changed or new, with their texts) and the keys the program deleted."""
        changed: list[tuple[str, bytes]] = []
        items = self._items
        if not all(type(key) is str for key in items):  # ``context[2024] = total``: the key "2024"
            items = json_keys(items, "the new context")
        for key, value in items.items():
            if type(value) is _Encoded:
                continue  # never read: the original text, unchanged by construction
            original = self._original.get(key)
            text = _fast_dump(value)
            if original is not None and text is not None and len(original) == len(text) and _text(original) == text:
                continue  # read (perhaps mutated and restored), but the same JSON as before
            changed.append((key, dump_json(value, "the new context")))
        deleted = [key for key in self._original if key not in items]
        return changed, deleted


def _plain(value: Any) -> Any:
    """A LazyContext as its decoded dict (for C code that needs a real dict); anything else as it is."""
    return value._resolved() if type(value) is LazyContext else value
