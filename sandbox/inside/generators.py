"""The standard library's class generators, with every name the program chose checked before it reaches them
(issue 36, items 1 and 5).

``dataclasses`` writes each field name into source text and ``exec``-s it with the real builtins;
``collections.namedtuple`` ``eval``-s its field names; ``enum``'s functional API (``Enum("E", names)``)
puts each member name into the new class's namespace, so ``__del__``, ``__init_subclass__`` or a
``__getattribute__`` hook become special methods. A class statement's names are identifiers the compiler
checked, but the same generators take names as run-time strings (``TypedDict("T", {'q"\\n...': int})``
then ``@dataclass``). ``install`` wraps each generator's entry point in the real modules (whichever route
reaches it: the proxy, ``typing.NamedTuple``, a subclass) so every name goes through
``check_generated_names`` first.

``typing``'s forward references only ``compile`` (never evaluate: ``get_type_hints``, ``ForwardRef`` and
``_evaluate`` are withheld), ``functools``, ``string.Template`` and ``abc`` generate no source.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import keyword
import sys
import unicodedata
from collections.abc import Iterable
from typing import Any

from .lowering import is_private
from .world import PROGRAM_MODULE, SandboxViolation

#: The security event of a refused name (``SecurityEvent.event``).
GENERATED_NAME_EVENT = "generated_name"
_INSTALLED: list[bool] = []


#: The generated code's own ``_`` names (dataclasses' ``__init__`` locals): never a program's field name.
_GENERATOR_HELPERS = frozenset({"_HAS_DEFAULT_FACTORY", "_return_type", "_cls", "_tuple_new"})


def _own_private(name: str) -> bool:
    """A single-underscore field name of the program's own dataclass (``_items``; issue 38): an identifier,
    so it cannot carry code into the generated source, and not one of the generator's own names."""
    return is_private(name) and name not in _GENERATOR_HELPERS and not name.startswith("_type_")


def check_generated_names(
    generator: str, names: Iterable[object], *, underscore: bool = False, private: bool = False
) -> None:
    """Refuse (``SandboxViolation``) any name a class generator would use that a class statement could not
    have written: not exactly a ``str``, not an identifier, a keyword, changed by NFKC normalisation (the
    parser normalises identifiers: fullwidth ``self`` is ``self``) or, unless ``underscore``, starting with ``_``
    (special methods, ``_sunder_`` enum hooks, the generators' own helper names); ``private`` lets a program's
    dataclass have single-underscore fields (``_own_private``). The one check every
    generator entry point calls (a seam of the tripwire's tests replaces it)."""
    for name in names:
        if type(name) is not str:
            problem = f"a {type(name).__name__}, not a string"
        elif not name.isidentifier() or unicodedata.normalize("NFKC", name) != name:
            problem = "not an identifier"
        elif keyword.iskeyword(name) or keyword.issoftkeyword(name):
            problem = "a keyword"
        elif name.startswith("_") and not underscore and not (private and _own_private(name)):
            problem = "starts with '_'"
        else:
            continue
        shown = repr(name)[:80] if type(name) is str else problem
        raise SandboxViolation(
            f"{generator}: the name {shown} is refused in the sandbox ({problem}): field and member names must "
            "be identifiers not starting with '_'",
            GENERATED_NAME_EVENT,
        )


def _dataclass_field_names(cls: Any) -> list[object]:
    """The names ``dataclasses`` will write into source for ``cls``: its own annotations' keys and its
    dataclass bases' fields (read from the class dicts, so no program hook runs)."""
    names: list[object] = []
    for base in getattr(cls, "__mro__", (cls,)):
        namespace = vars(base) if isinstance(base, type) else {}
        fields = namespace.get("__dataclass_fields__")
        if base is not cls and isinstance(fields, dict):
            names.extend(fields)
            names.extend(getattr(field, "name", None) for field in fields.values())
    own = vars(cls).get("__annotations__") if isinstance(cls, type) else None
    if isinstance(own, dict):
        names.extend(own)
    return names


def _checked_process_class(real: Any) -> Any:
    def _process_class(cls: Any, *args: Any, **kwargs: Any) -> Any:
        # A library's dataclass (defined after install, in a package the program imports) may have _private
        # fields; a program's class (the proxy's dataclass() takes no other) may not.
        library = isinstance(cls, type) and vars(cls).get("__module__") != PROGRAM_MODULE
        check_generated_names("dataclasses.dataclass", _dataclass_field_names(cls), underscore=library, private=True)
        return real(cls, *args, **kwargs)

    return _process_class


def _checked_namedtuple(real: Any) -> Any:
    def namedtuple(typename: Any, field_names: Any, *, rename: bool = False, defaults: Any = None,
                   module: Any = None) -> Any:  # fmt: skip
        """``collections.namedtuple`` with its field names (after ``rename``) checked; the names are read
        once and handed on as a list, so an iterable cannot answer differently the second time."""
        if isinstance(field_names, str):
            field_names = field_names.replace(",", " ").split()
        names = list(map(str, field_names))
        if rename:  # as CPython does: invalid names become _<index>, which namedtuple itself made
            seen: set[str] = set()
            for index, name in enumerate(names):
                if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_") or name in seen:
                    names[index] = f"_{index}"
                seen.add(name)
        # namedtuple refuses _ names itself, but those rename made
        check_generated_names("collections.namedtuple", names, underscore=True)
        if module is None:  # the caller's module, as namedtuple finds it (one frame further out here)
            with contextlib.suppress(AttributeError, ValueError):
                module = sys._getframe(1).f_globals.get("__name__", "__main__")
        return real(typename, names, rename=rename, defaults=defaults, module=module)

    namedtuple.__doc__ = real.__doc__
    return namedtuple


def _enum_items(names: Any) -> Any:
    """``Enum(..., names)``'s names read once, in the forms ``_create_`` takes: a list of strings (values
    generated) or a list of ``(name, value)`` pairs."""
    if names is None:
        return ()
    if isinstance(names, str):
        return names.replace(",", " ").split()
    if isinstance(names, tuple | list) and names and isinstance(names[0], str):
        return list(names)
    items = []
    for item in names:
        if isinstance(item, str):
            items.append((item, names[item]))
        else:
            member_name, member_value = item
            items.append((member_name, member_value))
    return items


def _checked_enum_create(real: Any) -> Any:
    def _create_(cls: Any, class_name: Any, names: Any, *, module: Any = None, **options: Any) -> Any:
        """``EnumType._create_`` (the functional API) with every member name checked first."""
        items = _enum_items(names)
        check_generated_names("enum functional API", [item if isinstance(item, str) else item[0] for item in items])
        if module is None:  # the caller of EnumType.__call__, as _create_ finds it (one frame further out)
            with contextlib.suppress(AttributeError, ValueError, KeyError):
                module = sys._getframe(2).f_globals["__name__"]
        return real(cls, class_name, items, module=module, **options)

    return _create_


def install() -> None:
    """Wrap the generators' entry points in the real modules, once per process (before any proxy is
    filled, so the ``collections`` proxy copies the checked ``namedtuple``)."""
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    dataclasses_module: Any = dataclasses
    dataclasses_module._process_class = _checked_process_class(dataclasses_module._process_class)
    collections.namedtuple = _checked_namedtuple(collections.namedtuple)
    enum_type: Any = enum.EnumType
    enum_type._create_ = _checked_enum_create(enum_type.__dict__["_create_"])
