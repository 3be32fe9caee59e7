"""The run-time guards and the builtins a program runs with.

The compiler (``compilation``) checks attribute names statically and emits native operations wherever a
guard would check nothing; what needs a decision at run time calls into this module: attribute writes
(``write_guard``: whose object is it?), ``getattr``/``setattr``/``delattr``/``hasattr`` with computed names,
and ``str.format``/``format_map`` (plain fields only).

RestrictedPython's own pieces are used where they behave as the sandbox needs: its ``safe_builtins`` (the
base of the builtins), its ``PrintCollector`` (the print target) and its transformer's
``INSPECT_ATTRIBUTES``. Its guard variants in ``RestrictedPython.Guards`` are not: each differs from what
programs rely on here. ``full_write_guard`` wraps every object but dicts and lists (a program's own
instances, ``defaultdict``, ``deque`` would refuse writes); ``guarded_setattr``/``guarded_delattr`` do not
check the name; ``safer_getattr`` returns None for a missing attribute (Python raises AttributeError),
refuses ``str.format`` outright (here: plain fields allowed) and misses ``__roles__`` suffixes; the
unpacking and iteration guards check nothing the compiler has not already ruled out (``_getiter_`` is
native here).
"""

from __future__ import annotations

import abc
import builtins as py_builtins
import collections
import string
import types
from typing import Any

from . import fetching, packages
from .bridge import Bridge, OutcomeFactory, ToolHandle, delegate
from .lazycontext import LazyContext
from .lowering import GUARDED_READS, LIBRARY_PRIVATE, NAMEDTUPLE_API, OWNED_TABLE, READ_ONLY_NAMES, is_private
from .world import PROGRAM_MODULE, BoundedText, SandboxViolation, _guarded_import, _words

# --- the restricted language (issue 15): what programs may write, and the guards, at close to C speed ---
#
# RestrictedPython's default transformer turns every attribute read, item access, iteration and unpacking
# into a call of a guard. For us those guards check nothing the compiler cannot check once: attribute names
# are constants in the source, and item access, iteration and unpacking have no policy at all here. So the
# transformer (``compilation._policy_class``) keeps RestrictedPython's static checks and emits native operations
# for them; only what needs a decision at run time stays a call: attribute writes (``_write_``: whose
# object is it?), ``getattr``/``setattr``/``delattr``/``hasattr`` with computed names, and ``format``/
# ``format_map`` of strings (plain fields only). The OS boundary is the wall; this is defence in depth.


#: Library objects whose public attributes are meant to be set, by (module, class name).
SETTABLE_ATTRIBUTES: dict[tuple[str, str], frozenset[str]] = {
    ("xml.etree.ElementTree", "Element"): frozenset({"text", "tail", "tag", "attrib"}),
    ("decimal", "Context"): frozenset({"prec", "rounding", "Emin", "Emax", "capitals", "clamp", "traps", "flags"}),
    ("configparser", "ConfigParser"): frozenset({"optionxform"}),  # ``config.optionxform = str`` keeps case
    ("configparser", "RawConfigParser"): frozenset({"optionxform"}),
    ("logging", "Logger"): frozenset({"propagate", "disabled"}),  # ``log.propagate = False``
    ("logging", "RootLogger"): frozenset({"propagate", "disabled"}),
    ("textwrap", "TextWrapper"): frozenset(
        _words(
            "width initial_indent subsequent_indent expand_tabs replace_whitespace fix_sentence_endings "
            "break_long_words drop_whitespace break_on_hyphens tabsize max_lines placeholder"
        )
    ),
}
#: Mutable built-in containers: their instances (and library subclasses: defaultdict, Counter,
#: OrderedDict, deque) take writes as they are.
_WRITABLE_BASES: tuple[type, ...] = (dict, list, set, bytearray, collections.deque)
_WRITABLE_TYPES: frozenset[type] = frozenset(
    {dict, list, set, bytearray, collections.deque, collections.defaultdict, collections.OrderedDict,
     collections.Counter, LazyContext}
)  # fmt: skip
_FUNCTION = types.FunctionType


class _ReadOnly:
    """What ``_write_`` returns for an object the program may not write: every write is a TypeError."""

    __slots__ = ("kind",)
    kind: str

    def __init__(self, ob: Any) -> None:
        object.__setattr__(self, "kind", type(ob).__name__)

    def _refuse(self, name: str, *_: Any) -> None:
        raise TypeError(
            f"cannot set or delete attribute {name!r} of a {self.kind} object in the sandbox: only the "
            "program's own objects (and a few library objects meant to be set) take attribute writes"
        )

    __setattr__ = _refuse
    __delattr__ = _refuse


class _Settable:
    """A library object's write proxy that passes on writes of the attributes meant to be set."""

    __slots__ = ("names", "ob")
    names: frozenset[str]
    ob: Any

    def __init__(self, ob: Any, names: frozenset[str]) -> None:
        object.__setattr__(self, "ob", ob)
        object.__setattr__(self, "names", names)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self.names:
            _ReadOnly(self.ob)._refuse(name)
        setattr(self.ob, name, value)

    def __delattr__(self, name: str) -> None:
        _ReadOnly(self.ob)._refuse(name)


def write_guard(ob: Any) -> Any:
    """``_write_``: the object itself when the program may write its attributes, else a refusing proxy.

    Writable: instances of the program's own classes, those classes and functions themselves (their
    ``__module__`` is the program's; a program cannot set ``__module__``), and mutable built-in containers.
    Attribute names are checked by the compiler (no ``_`` names); item assignment is native.
    """
    kind = type(ob)
    if kind in _WRITABLE_TYPES or kind.__module__ == PROGRAM_MODULE:
        return ob
    if isinstance(ob, type) or kind is _FUNCTION:
        if getattr(ob, "__module__", None) == PROGRAM_MODULE:
            return ob
    elif kind is LazyContext or isinstance(ob, _WRITABLE_BASES):
        return ob
    names = SETTABLE_ATTRIBUTES.get((kind.__module__, kind.__qualname__))
    if names is not None:
        return _Settable(ob, names)
    return _ReadOnly(ob)


def _namedtuple(obj: Any) -> bool:
    """Whether ``obj`` is a namedtuple or a namedtuple class (``collections.namedtuple``'s, ``typing.NamedTuple``'s,
    a library's such as ``urllib.parse``'s results): its ``_asdict`` is namedtuple's own function."""
    cls = obj if isinstance(obj, type) else type(obj)
    if not issubclass(cls, tuple):
        return False
    for klass in cls.__mro__:
        found = klass.__dict__.get("_asdict")
        if found is not None:
            # namedtuple's own function (its name and module; never its code object, which the tripwire
            # guards): a program copying those names onto its own function (functools.wraps) gains nothing,
            # its classes are its own anyway and it cannot write a library class
            # (namedtuple names its methods after the class: ``ParseResult._asdict``)
            return (type(found) is _FUNCTION and found.__name__ == "_asdict"
                    and found.__qualname__.endswith("._asdict") and found.__module__ == "collections")  # fmt: skip
    return False


def _program_mro(obj: Any) -> tuple[type, ...] | None:
    """The classes an attribute of ``obj`` is looked up in, when ``obj`` is the program's own: an instance of
    a class the program defined, such a class, or ``super()`` bound to one; None for anything else."""
    kind = type(obj)
    if kind is super:
        owner = obj.__self_class__
        mro = owner.__mro__ if isinstance(owner, type) else ()
        start = obj.__thisclass__
        return mro[mro.index(start) + 1 :] if start in mro and start.__module__ == PROGRAM_MODULE else None
    cls = obj if isinstance(obj, type) else kind
    return cls.__mro__ if cls.__module__ == PROGRAM_MODULE else None


def private_allowed(obj: Any, name: str, *, reading: bool = True) -> bool:
    """Whether the program may use ``obj._name`` (issue 38): the object is the program's own (see
    ``_program_mro``) and the first class that has the name is one the program defined, or no class has it
    (an instance's own attribute, set by the program's methods); or, for reads, ``name`` is namedtuple's
    documented API on a namedtuple. A library base class's private attributes stay unreachable, and so do
    every library object's and module's (``random._os``)."""
    if _LEVELS and _LEVELS[0][type(obj)] == 2 and is_private(name) and name not in LIBRARY_PRIVATE:
        return True  # an instance of a level-2 class (``OwnedClasses``): what the walk below decides
    if reading and name in NAMEDTUPLE_API and _namedtuple(obj):
        return True
    if not is_private(name) or name in LIBRARY_PRIVATE:
        return False
    mro = _program_mro(obj)
    if mro is None:
        return False
    for klass in mro:
        if name in klass.__dict__:
            return bool(klass.__module__ == PROGRAM_MODULE)
    return not isinstance(obj, type)  # a class's missing name would come from its metaclass (the library's)


def write_private(ob: Any, name: str) -> Any:
    """``_write_private_``: ``ob`` when the program may set or delete ``ob._name``, else a refusing proxy."""
    return ob if private_allowed(ob, name, reading=False) else _ReadOnly(ob)


#: ``type.__flags__``' bit of a type whose dict nothing can change (the built-in types: ``object``,
#: ``Exception``, ``dict``...).
_IMMUTABLE_TYPE = 1 << 8


class OwnedClasses(dict[type, int]):
    """``_owned_``: per class, how much its instances are the program's own, decided once per class and run
    (a method's first parameter's class is looked up at each call, ``lowering._OwnWrites``):

    - 2: the class is the program's, not a metaclass, and every class in its lineage is the program's or a
      built-in type without a single-underscore name: ``private_allowed`` allows every ``_x`` on its
      instances (the first class holding it is the program's, or none does): writes and ``_x`` reads are native;
    - 1: the class is the program's (``write_guard`` returns its instances as they are): public writes are
      native, private names stay the guard's (a library base's ``_randbelow``);
    - 0: anything else: the guards decide.

    The level cannot go stale: a class's ``__module__``, ``__bases__`` and ``__mro__`` are never written by
    a program (dunder writes are refused by the compiler and by ``setattr``'s guard), an instance's
    ``__class__`` neither, and a built-in type's dict cannot be changed by anyone.
    """

    def __missing__(self, cls: type) -> int:
        level = 0
        if cls.__module__ == PROGRAM_MODULE:
            # not a metaclass: an instance that is a class looks its missing names up in its metaclass
            pure = not issubclass(cls, type) and all(_own_lineage(klass) for klass in cls.__mro__)
            level = 2 if pure else 1
        self[cls] = level
        return level


#: The running execution's class levels (``build_globals`` puts each run's table here too): the
#: guards' shortcut for the program's own instances. One table at a time, so a run's classes go with it.
_LEVELS: list[OwnedClasses] = []


#: Built-in types with no single-underscore name in their dicts (``object``, ``Exception``...), once per process.
_CLEAN_BUILTINS: dict[type, bool] = {}


def _own_lineage(klass: type) -> bool:
    """A class of an own lineage: the program's, or a built-in type that cannot hold a ``_x`` (its dict
    is immutable and has none)."""
    if klass.__module__ == PROGRAM_MODULE:
        return True
    clean = _CLEAN_BUILTINS.get(klass)
    if clean is None:
        clean = bool(klass.__flags__ & _IMMUTABLE_TYPE) and not any(is_private(name) for name in vars(klass))
        if klass.__flags__ & _IMMUTABLE_TYPE:
            _CLEAN_BUILTINS[klass] = clean
    return clean


def class_of(obj: Any) -> type:
    """``_class_of_``: the class whose name ``x.__class__.__name__`` reads (``dict`` for ``context``)."""
    kind = type(obj)
    return dict if kind is LazyContext else kind


_INSPECT_ATTRIBUTES: frozenset[str] = frozenset()
_FORMATTER_PARSE: Any = None


def _prime() -> None:
    """The run-time guards' tables: RestrictedPython's INSPECT_ATTRIBUTES and the format parser (set once,
    after RestrictedPython is importable: in a container its path comes with the boot frame)."""
    global _INSPECT_ATTRIBUTES, _FORMATTER_PARSE
    if _FORMATTER_PARSE is None:
        from RestrictedPython.transformer import INSPECT_ATTRIBUTES

        _INSPECT_ATTRIBUTES = frozenset(INSPECT_ATTRIBUTES)
        _FORMATTER_PARSE = string.Formatter().parse


def _check_attribute_name(name: Any) -> None:
    """Refuse a name that is never read or written by name at run time (``_`` names are decided per
    object by the callers)."""
    if type(name) is not str:
        raise TypeError("attribute name must be a string")
    if name[:1] == "_":
        raise AttributeError(f'"{name}" is an invalid attribute name because it starts with "_"')
    if name in _INSPECT_ATTRIBUTES or name.endswith("__roles__"):
        raise AttributeError(f'"{name}" is a restricted name, that is forbidden to access in RestrictedPython.')
    packages.check_attribute_name(name)


def _plain_fields(template: str) -> None:
    """Refuse format fields that read attributes or items (``{0.__class__}``, ``{x[k]}``)."""
    for _literal, field, spec, _conversion in _FORMATTER_PARSE(template):
        if field is None:
            continue
        if field and not (field.isdigit() or field.isidentifier()):
            raise NotImplementedError(
                f"format field {{{field}}} reads an attribute or an item, which the sandbox does not allow "
                "in format strings; compute the value first and format it with a plain field"
            )
        if spec:
            _plain_fields(spec)


#: Templates (exact ``str``, whose equality no program can override) ``_plain_fields`` accepted: a loop
#: formatting with the same template parses it once. Bounded: emptied when full.
_PLAIN_TEMPLATES: dict[str, None] = {}


def _checked_format(text: str, method: str) -> Any:
    unbound = getattr(str, method)

    def format(*args: Any, **kwargs: Any) -> Any:
        if type(text) is not str or text not in _PLAIN_TEMPLATES:
            _plain_fields(text)
            if type(text) is str:
                if len(_PLAIN_TEMPLATES) >= 1024:
                    _PLAIN_TEMPLATES.clear()
                _PLAIN_TEMPLATES[text] = None
        return unbound(text, *args, **kwargs)

    return format


def _checked_unbound_format(method: str) -> Any:
    unbound = getattr(str, method)

    def format(text: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(text, str):
            _plain_fields(text)
        return unbound(text, *args, **kwargs)

    return format


_STR_FORMATS: dict[Any, str] = {str.format: "format", str.format_map: "format_map"}


def _format_checked(value: Any) -> Any:
    """``value`` as read, unless it is ``str.format``/``format_map`` (bound to a string, however reached:
    ``s.format``, ``super(S, s).format``, ``str.format``): then the checked version of it."""
    method = getattr(value, "__name__", None)
    if method in ("format", "format_map"):
        owner = getattr(value, "__self__", None)
        if type(value) is types.BuiltinMethodType and isinstance(owner, str):
            return _checked_format(owner, method)
        if value in _STR_FORMATS:
            return _checked_unbound_format(_STR_FORMATS[value])
    return value


def _abc_register_refused(value: Any) -> Any:
    """``value``, unless it is ``ABCMeta.register`` bound to a class (``abc.ABC.register(str)``,
    ``typing.Mapping.register(C)``): registering a virtual subclass changes ``isinstance`` for every caller
    in the process, the runner included, and ``ABCMeta`` is withheld."""
    if type(value) is types.MethodType and value.__func__ is abc.ABCMeta.register:
        raise SandboxViolation("ABCMeta.register is withheld in the sandbox: it registers a virtual subclass "
                               "for every caller in the process; subclass the ABC instead")  # fmt: skip
    return value


def guarded_getattr(obj: Any, name: str, *default: Any) -> Any:
    """``getattr`` (and the compiler's ``_getattr_`` for ``format``-like names) with the static rules
    checked at run time, Python's semantics for a missing attribute (AttributeError unless a default is
    given), and ``str.format``/``format_map`` limited to plain fields."""
    if len(default) > 1:
        raise TypeError(f"getattr expected at most 3 arguments, got {2 + len(default)}")
    if type(obj) is str and type(name) is str and (name == "format" or name == "format_map"):
        # what the general path below returns for a string's own method (both exact ``str``: no program
        # ``__eq__`` can make another name compare equal)
        return _checked_format(obj, name)
    if type(name) is str and name[:1] == "_":
        return _underscore_read(obj, name, default)
    _check_attribute_name(name)
    if name in GUARDED_READS:
        if isinstance(obj, string.Formatter) or (isinstance(obj, type) and issubclass(obj, string.Formatter)):
            raise NotImplementedError("Using string.Formatter methods is not safe")
        return _abc_register_refused(_format_checked(getattr(obj, name, *default)))
    if default:
        return getattr(obj, name, default[0])
    return getattr(obj, name)


def _underscore_read(obj: Any, name: str, default: tuple[Any, ...]) -> Any:
    """``obj._name`` or ``obj.__name__``-like reads (issue 38): a read-only name yields only a string (None
    for a missing ``__doc__``, or the caller's default), a ``_name`` only what ``private_allowed`` allows."""
    if name in READ_ONLY_NAMES:
        value = getattr(obj, name, *default)
        if type(value) is str or value is None or (default and value is default[0]):
            return value
        raise AttributeError(f"{name} of a {type(obj).__name__} object is not a string in the sandbox")
    if not (is_private(name) or name in NAMEDTUPLE_API):
        _check_attribute_name(name)  # a dunder or a RestrictedPython name: never
    if not private_allowed(obj, name):
        raise AttributeError(
            f'"{name}" starts with "_": the sandbox allows such attributes only on the program\'s own objects '
            "and classes (and namedtuple's documented _asdict, _replace, _fields, _make)"
        )
    return getattr(obj, name, *default)


def _write_target(obj: Any, name: Any) -> Any:
    if type(name) is str and is_private(name):
        return write_private(obj, name)
    _check_attribute_name(name)
    return write_guard(obj)


def guarded_setattr(obj: Any, name: str, value: Any) -> None:
    setattr(_write_target(obj, name), name, value)


def guarded_delattr(obj: Any, name: str) -> None:
    delattr(_write_target(obj, name), name)


def _safe_hasattr(obj: Any, name: str) -> bool:
    try:
        guarded_getattr(obj, name)
    except (AttributeError, NotImplementedError):
        return False
    return True


class _TypeMeta(type):
    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, type)

    def __subclasscheck__(cls, subclass: Any) -> bool:
        return issubclass(subclass, type)


class SandboxType(metaclass=_TypeMeta):
    """The program's ``type``: ``type(obj)`` for an object that is not a class, and ``isinstance(x, type)``.

    Not three-argument ``type(name, bases, namespace)``, and not ``type(cls)``: a metaclass would create
    classes from a namespace dict, around the class statement's checks (underscore names, special methods).
    """

    def __new__(cls, *args: Any) -> Any:
        if len(args) != 1:
            raise TypeError("the sandbox's type() takes exactly one argument; define classes with a class statement")
        kind = type(args[0])
        if kind is LazyContext:
            return dict
        if issubclass(kind, type):
            raise TypeError("type() of a class is not available in the sandbox")
        return kind


def compat_builtins() -> dict[str, Any]:
    """The builtins programs are written with, beyond RestrictedPython's safe set (issue 15)."""
    names = _words(
        "zip property classmethod staticmethod super object bytes bin ascii NotImplemented Ellipsis "
        "AssertionError NameError UnboundLocalError UnicodeDecodeError UnicodeEncodeError LookupError "
        "StopIteration ArithmeticError "
        "StopAsyncIteration aiter anext"  # issue 38: async for over the program's own async iterators
    )
    table = {name: getattr(py_builtins, name) for name in names}
    table.update(type=SandboxType, getattr=guarded_getattr, setattr=guarded_setattr, delattr=guarded_delattr,
                 hasattr=_safe_hasattr)  # fmt: skip
    return table


_BASE_BUILTINS: dict[str, Any] = {}
_PRINTER: Any = None


def _base_builtins() -> dict[str, Any]:
    """The builtins every program gets, built once per process (a run copies the dict, ~2 us)."""
    if not _BASE_BUILTINS:
        from RestrictedPython.Guards import safe_builtins

        table = dict(safe_builtins)
        # Not RestrictedPython's limited_builtins: resource limits are the OS's job, and its range() caps at 1000.
        for extra in (
            "range", "tuple", "dict", "list", "set", "frozenset", "sum", "min", "max", "enumerate", "map",
            "filter", "reversed", "any", "all", "iter", "next", "sorted", "bytearray", "format",
            "ArithmeticError", "AttributeError", "Exception", "IndexError", "KeyError", "LookupError",
            "NotImplementedError", "RuntimeError", "StopIteration", "TypeError", "ValueError",
            "ZeroDivisionError", "OverflowError", "RecursionError", "UnicodeError",
        ):  # fmt: skip
            table[extra] = getattr(py_builtins, extra)
        table.update(compat_builtins())
        # the same for every execution: fetch() reaches the host through ``fetching.bind``'s sender
        table["Outcome"] = OutcomeFactory
        table["fetch"] = fetching.fetch
        errors: list[type[fetching.FetchError]] = [fetching.FetchError, *fetching.ERRORS.values()]
        for error in errors:
            table[error.__name__] = error
        _BASE_BUILTINS.update(table)
    return _BASE_BUILTINS


def _printer_class() -> Any:
    global _PRINTER
    if _PRINTER is None:
        from RestrictedPython.PrintCollector import PrintCollector

        class Printer(PrintCollector):
            """RestrictedPython's print target, mirrored into the bounded stdout capture."""

            stdout: BoundedText

            def write(self, text: str) -> None:
                self.txt.append(text)
                self.stdout.write(text)

        _PRINTER = Printer
    return _PRINTER


def _apply(f: Any, *args: Any, **kwargs: Any) -> Any:
    """``_apply_``: RestrictedPython's call of ``f(*args, **kwargs)``; nothing to check here."""
    return f(*args, **kwargs)


#: The import function of the last proxies built (one set per runner process): made once, not per run.
_IMPORTS: list[tuple[dict[str, Any], Any]] = []


def _import_for(proxies: dict[str, types.SimpleNamespace]) -> Any:
    if not _IMPORTS or _IMPORTS[0][0] is not proxies:  # held here, so ``is`` cannot match a new dict
        _IMPORTS[:] = [(proxies, _guarded_import(proxies))]
    return _IMPORTS[0][1]


def prime(proxies: dict[str, types.SimpleNamespace]) -> None:
    """Build what ``build_globals`` makes once per process (the guards' tables, the printer class, the base
    builtins, the import of ``proxies``) now: in a zygote, once for every runner it forks, instead of in each."""
    _prime()
    _printer_class()
    _base_builtins()
    _import_for(proxies)


def build_globals(proxies: dict[str, types.SimpleNamespace], stdout: BoundedText, bridge: Bridge) -> dict[str, Any]:
    """The program's globals, once per execution: a copy of the builtins with this run's import, ``tool``
    and ``delegate``, the guards, and a fresh table of class levels (``OwnedClasses``)."""
    _prime()
    printer = _printer_class()

    def make_printer(_getattr_: Any = None) -> Any:
        collector = printer(_getattr_)
        collector.stdout = stdout
        return collector

    builtins = dict(_base_builtins())
    builtins["__import__"] = _import_for(proxies)
    builtins["tool"] = lambda name: ToolHandle(bridge, {"kind": "tool", "name": str(name)})
    builtins["delegate"] = lambda role, *contract, **fields: delegate(bridge, role, *contract, **fields)
    fetching.bind(bridge.fetch if bridge is not None else None)  # None: compiled outside an execution
    namespace = _GLOBALS.copy()
    namespace["__builtins__"] = builtins
    namespace[OWNED_TABLE] = levels = OwnedClasses()
    _LEVELS[:] = [levels]
    namespace["_print_"] = make_printer
    return namespace


#: The globals every execution starts from (``build_globals`` adds its builtins, class levels and printer).
_GLOBALS: dict[str, Any] = {
    "__builtins__": None,
    "__name__": "sandforge_tool",
    "__metaclass__": type,
    "_getattr_": guarded_getattr,
    "_write_": write_guard,
    "_write_private_": write_private,
    "_class_of_": class_of,
    "_type_": type,
    OWNED_TABLE: None,
    "_print_": None,
    "_apply_": _apply,
}
