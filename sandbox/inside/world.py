"""The program's world: the modules it may import (each a sealed read-only proxy), the names withheld from
them, the inner wall's violations and the seal on the program's globals.

Every public callable of every allowed module was audited (docs/security.md, "The inner wall's real
guarantees"); what failed the audit is withheld (``WITHHELD_NAMES``) or replaced (``MODULE_WRAPPERS``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import types
from typing import Any

from . import envmodules, tripwire
from .lazycontext import LazyContext

#: The file name of the program's code (its tracebacks' lines are the program's own).
TOOL_FILENAME = "<tool>"
#: The function the program's body becomes.
TOOL_FUNCTION = "sandforge_tool"


#: What a program may import. Each is imported before lock-down and exposed through a read-only proxy that
#: hides sub-modules and private names, so e.g. ``typing.sys`` or ``random._os`` cannot be reached.
ALLOWED_MODULES: dict[str, frozenset[str]] = {
    # module name -> public names withheld from the proxy (bypass attribute guards or touch files)
    "base64": frozenset(),
    "bisect": frozenset(),
    "calendar": frozenset(),
    "cmath": frozenset(),
    "collections": frozenset(),
    "copy": frozenset(),
    "csv": frozenset(),
    "datetime": frozenset(),
    "decimal": frozenset(),
    "fractions": frozenset(),
    "functools": frozenset(),
    "hashlib": frozenset({"file_digest"}),
    "heapq": frozenset(),
    "html": frozenset(),
    "html.parser": frozenset(),
    "itertools": frozenset(),
    "json": frozenset({"load", "dump"}),
    "math": frozenset(),
    "operator": frozenset({"attrgetter", "methodcaller"}),
    "random": frozenset(),
    "re": frozenset(),
    "statistics": frozenset(),
    "string": frozenset({"Formatter"}),
    "textwrap": frozenset(),
    "time": frozenset(),
    "unicodedata": frozenset(),
    "urllib.parse": frozenset(),
    "xml.etree.ElementTree": frozenset({"parse", "iterparse", "ElementTree", "XMLPullParser"}),
}


# --- the inner wall: what each allowed module exposes, and what the runner checks around the program --------
#
# Every public callable of every allowed module was audited (docs/security.md, "The inner wall's real
# guarantees") for: attribute access with caller-chosen names, eval/exec/compile of caller strings, file or
# descriptor opening, implicit calls with runner objects, and process-global side effects. What failed the
# audit is withheld (WITHHELD_NAMES) or replaced (MODULE_WRAPPERS); a module added to ALLOWED_MODULES must be
# audited the same way and listed in AUDITED_MODULES (a test enforces it).

#: Allowed modules whose whole public surface has been audited (see docs/security.md).
AUDITED_MODULES = frozenset({
    "base64", "bisect", "calendar", "cmath", "collections", "copy", "csv", "datetime", "decimal", "fractions",
    "functools", "hashlib", "heapq", "html", "html.parser", "itertools", "json", "math", "operator", "random",
    "re", "statistics", "string", "textwrap", "time", "unicodedata", "urllib.parse", "xml.etree.ElementTree",
    # audited by issue 15 (h-compat's COMPAT_MODULES, with their own withheld names)
    "abc", "dataclasses", "enum", "io", "typing",
    # audited by issue 38 (idiom_modules.IDIOM_MODULES, with their own withheld names and wrappers)
    "uuid", "zoneinfo", "logging", "traceback", "configparser", "email.utils", "queue", "stat", "asyncio", "sys",
})  # fmt: skip

#: Public names the audit withholds, per module, with the reason a program is told when it uses one. These
#: come on top of ALLOWED_MODULES' own withheld names (same effect, same message).
WITHHELD_NAMES: dict[str, dict[str, str]] = {
    "base64": {
        "main": "reads the runner's protocol channel (sys.stdin) and sys.argv",
        "test": "reads the runner's protocol channel (sys.stdin) and sys.argv",
    },
    "calendar": {
        "main": "parses a command line and writes to the runner's own stdout",
        "different_locale": "changes the process-wide locale",
        "LocaleTextCalendar": "changes the process-wide locale",
        "LocaleHTMLCalendar": "changes the process-wide locale",
    },
    "copy": {"dispatch_table": "a process-wide registry whose entries copy() calls, setting attributes by name"},
    "datetime": {"datetime_CAPI": "a raw C-API capsule"},
    "functools": {
        "update_wrapper": "copies and updates attributes named by the caller (such as __globals__)",
        "singledispatch": "evaluates annotations with eval() outside the sandbox's compiler",
        "singledispatchmethod": "evaluates annotations with eval() outside the sandbox's compiler",
        "WRAPPER_ASSIGNMENTS": "only meaningful for update_wrapper",
        "WRAPPER_UPDATES": "only meaningful for update_wrapper",
        "GenericAlias": "builds aliases of arbitrary objects that forward attribute reads",
        "RLock": "a threading primitive",
        "get_cache_token": "an abc-internal token",
        "recursive_repr": "wraps special methods by name",
    },
    "time": {
        "clock_settime": "sets the system clock",
        "clock_settime_ns": "sets the system clock",
        "tzset": "re-reads the process environment and changes process-wide state",
    },
    "xml.etree.ElementTree": {"dump": "writes to the runner's own stdout; use tostring()"},
}

_STRINGY = (str, bytes, bytearray, int, os.PathLike)
_MISSING_ARG: Any = object()


class SandboxViolation(Exception):
    """The program used something the inner wall refuses. Final: while a program runs, creating one hands
    it to the armed tripwire (``tripwire.VIOLATION``), which writes the ``sandbox_violation`` result and ends
    the process at once, so nothing the program does afterwards (catching it, clearing ``VIOLATIONS``)
    can change the verdict. Outside an execution it is only recorded in ``VIOLATIONS``."""

    def __init__(self, message: str, event: str = "withheld_name") -> None:
        super().__init__(message)
        sys.audit(tripwire.VIOLATION, message[:1000], event)
        if len(VIOLATIONS) < 16:
            VIOLATIONS.append(message[:1000])
            VIOLATION_EVENTS.append(event)


#: The violations of this execution (one runner process serves one execution).
VIOLATIONS: list[str] = []
#: The inner-wall check behind each of ``VIOLATIONS`` (the security event's name: ``withheld_name``,
#: ``globals_rewritten``...).
VIOLATION_EVENTS: list[str] = []


def withheld(module: str) -> dict[str, str]:
    """Every name withheld from ``module``'s proxy, with its reason."""
    names = dict.fromkeys(ALLOWED_MODULES.get(module, ()), "it bypasses the attribute guards or touches files")
    names.update(WITHHELD_NAMES.get(module, {}))
    exposed = EXPOSED_ONLY.get(module)
    if exposed is not None and module in sys.modules:  # allow-listed modules: everything else is withheld
        for name in vars(sys.modules[module]):
            if not name.startswith("_") and name not in exposed:
                names.setdefault(name, f"only {', '.join(sorted(exposed))} of {module} are available")
    return names


def withheld_name(module: str, name: str) -> SandboxViolation:
    reason = withheld(module).get(name, "it is not part of the audited surface")
    return SandboxViolation(
        f"module {module!r} has no attribute {name!r}: {module}.{name} is withheld in the sandbox: {reason}"
    )


def _safe_wraps(wrapped: Any, assigned: Any = _MISSING_ARG, updated: Any = _MISSING_ARG) -> Any:
    """``functools.wraps`` for decorators: copies only ``__name__``, ``__qualname__``, ``__doc__`` and
    ``__module__`` (strings) onto a function the program defined. The real one copies and updates any
    attribute the caller names (``updated=("__globals__",)`` copied a module's globals into the program's)."""
    if assigned is not _MISSING_ARG or updated is not _MISSING_ARG:
        raise SandboxViolation("functools.wraps(assigned=..., updated=...) is withheld in the sandbox: it copies "
                               "attributes named by the caller; use @functools.wraps(func)")  # fmt: skip

    def decorate(wrapper: Any) -> Any:
        if type(wrapper) is not types.FunctionType or wrapper.__code__.co_filename != TOOL_FILENAME:
            raise TypeError("functools.wraps in the sandbox decorates functions the program defines")
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            value = getattr(wrapped, attr, None)
            if type(value) is str:
                setattr(wrapper, attr, value)
        return wrapper

    return decorate


def _safe_canonicalize(xml_data: Any = None, *, out: Any = None, from_file: Any = None, **options: Any) -> Any:
    """``xml.etree.ElementTree.canonicalize`` without file opening: ``from_file`` must be an object with a
    ``read`` method (as ``io.StringIO`` is), never a path or a descriptor number, which the real one opens."""
    import xml.etree.ElementTree as ET

    if from_file is not None and (isinstance(from_file, _STRINGY) or not callable(getattr(from_file, "read", None))):
        raise SandboxViolation(
            "xml.etree.ElementTree.canonicalize(from_file=...) takes a file-like object with a read() method in "
            "the sandbox, never a path or descriptor; pass the text as xml_data"
        )
    return ET.canonicalize(xml_data, out=out, from_file=from_file, **options)


#: Public names replaced by a runner function of the same contract, minus the unsafe part.
MODULE_WRAPPERS: dict[str, dict[str, Any]] = {
    "functools": {"wraps": _safe_wraps},
    "xml.etree.ElementTree": {"canonicalize": _safe_canonicalize},
}


#: Every sealed proxy's module name, by ``id`` of the proxy (kept off the proxy, where the program would see it).
_PROXY_MODULES: dict[int, str] = {}


class ModuleProxy(types.SimpleNamespace):
    """A namespace proxy once sealed: reading a withheld name is a ``SandboxViolation``; any other missing
    name an ``AttributeError``."""

    def __getattr__(self, attr: str) -> Any:
        module = _PROXY_MODULES.get(id(self), "module")
        if attr in withheld(module):
            raise withheld_name(module, attr)
        raise AttributeError(f"module {module!r} has no attribute {attr!r}")


def _withheld_getattr(module: str) -> Any:
    """A module proxy's ``__getattr__`` (PEP 562: consulted only for names the proxy does not have)."""

    def __getattr__(attr: str) -> Any:
        if attr in withheld(module):
            raise withheld_name(module, attr)
        raise AttributeError(f"module {module!r} has no attribute {attr!r}")

    return __getattr__


def seal_proxy(proxy: Any, module: str) -> None:
    """Apply the inner wall to a freshly filled proxy of ``module``, whatever kind of object the proxy is:
    remove every withheld name, put ``MODULE_WRAPPERS``' replacements in place, and make reading a withheld
    name a ``SandboxViolation`` (a namespace proxy changes class; a module-object proxy gets a module-level
    ``__getattr__``).

    A module that withholds nothing gets no ``__getattr__``: CPython's own miss (``module 'math' has no
    attribute 'x'``) is the same AttributeError, and only a module without one has its reads specialised
    (``LOAD_ATTR_MODULE``; with a ``__getattr__`` in its dict ``math.pi`` costs twice as much)."""
    names = withheld(module)
    for name in names:
        if name in vars(proxy):
            delattr(proxy, name)
    for name, wrapper in MODULE_WRAPPERS.get(module, {}).items():
        if name in vars(proxy):
            setattr(proxy, name, wrapper)
    _PROXY_MODULES[id(proxy)] = module
    if isinstance(proxy, types.ModuleType):
        if names or module in EXPOSED_ONLY:
            vars(proxy)["__getattr__"] = _withheld_getattr(module)
    elif isinstance(proxy, types.SimpleNamespace) and not isinstance(proxy, ModuleProxy):
        proxy.__class__ = ModuleProxy


def _real_module(value: types.ModuleType) -> bool:
    """An imported module (it has a spec, or is in ``sys.modules`` as itself), not a runner-made proxy."""
    return vars(value).get("__spec__") is not None or sys.modules.get(value.__name__) is value


class GlobalsSeal:
    """What the runner put into the program's globals, checked after the program returns and before each
    nested call is answered: the same objects under the runner's names, the same builtins dict with the
    same contents, and no real module object anywhere in the globals (programs only ever get proxies).
    A difference means the program rewrote its own namespace (``update_wrapper(..., updated=("__globals__",))``
    did, importing ``sys`` and the real builtins): ``sandbox_violation``."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self.installed = dict(namespace)
        builtins = namespace.get("__builtins__")
        self.builtins = builtins
        self.builtin_items = dict(builtins) if isinstance(builtins, dict) else {}

    def add(self, name: str) -> None:
        """Seal one more runner-installed name (the program function, once defined)."""
        self.installed[name] = self.namespace.get(name)

    def check(self) -> None:
        namespace = self.namespace
        for name, value in self.installed.items():
            if namespace.get(name, _MISSING_ARG) is not value:
                raise SandboxViolation(f"the program's globals were rewritten: {name!r} is not the runner's",
                                       "globals_rewritten")
        builtins = self.builtins
        if isinstance(builtins, dict) and (
            len(builtins) != len(self.builtin_items)
            or any(builtins.get(key, _MISSING_ARG) is not value for key, value in self.builtin_items.items())
        ):
            raise SandboxViolation("the program's builtins were rewritten", "globals_rewritten")
        for name, value in namespace.items():
            if isinstance(value, types.ModuleType) and name not in self.installed and _real_module(value):
                raise SandboxViolation(
                    f"the program's globals hold the real module {value.__name__!r} as {name!r}", "globals_rewritten"
                )


#: Modules the runner needs only until lock-down. Afterwards they are dropped from ``sys.modules`` and from
#: the runner's own globals, so an escaped program does not find them there (memory-mapping, foreign
#: calls, sockets, limits and signals). What still needs them later keeps only the values it uses.
FORGOTTEN_MODULES = ("ctypes", "_ctypes", "mmap", "resource", "socket", "_socket", "select", "fcntl", "signal")
#: Of those, the ones the runner's own code no longer uses once the program runs (the channel still uses
#: ``socket`` and may use ``select``): their names in the globals of every module of this package are
#: cleared too.
_RUNNER_FORGETS = ("ctypes", "mmap", "resource", "fcntl", "signal")


#: What ``forget_lockdown_modules`` finds in ``sys.modules``, found once by a zygote (``plan_forgetting``):
#: the number of modules then, the names to drop, this package's modules. Walking every module costs a
#: runner forked from an environment zygote ~2 ms: 700+ modules, and each name and module it touches (a
#: reference count written) is a page copied on write.
_FORGET_PLAN: list[tuple[int, tuple[str, ...], tuple[types.ModuleType, ...]]] = []


def plan_forgetting() -> None:
    """In a zygote, before it forks: what its runners will forget, unless ``sys.modules`` changed since the last
    plan (its size: nothing between the plan and ``forget_lockdown_modules`` removes a module, so any new
    one makes it larger; a runner that finds another size walks the modules itself)."""
    if not _FORGET_PLAN or _FORGET_PLAN[0][0] != len(sys.modules):
        _FORGET_PLAN[:] = [(len(sys.modules), *_to_forget())]


def _to_forget() -> tuple[tuple[str, ...], tuple[types.ModuleType, ...]]:
    """The names of ``FORGOTTEN_MODULES`` and their sub-modules in ``sys.modules``, and this package's modules."""
    names = tuple(name for name in list(sys.modules) if name.split(".")[0] in FORGOTTEN_MODULES)
    package = __name__.rpartition(".")[0]
    own = tuple(module for name, module in list(sys.modules.items())
                if module is not None and (name == package or name.startswith(package + ".")))  # fmt: skip
    return names, own


def forget_lockdown_modules() -> list[str]:
    """Drop ``FORGOTTEN_MODULES`` (and their sub-modules) from ``sys.modules``, and ``_RUNNER_FORGETS`` from
    the globals of this package's modules; return the names dropped from ``sys.modules``. Called once per
    execution, after lock-down and after the execute frame was read (mapping context values needs ``fcntl``
    and ``mmap``), before the program runs. Never in the zygote, which locks down each child it forks (it
    only plans it: ``plan_forgetting``)."""
    planned = _FORGET_PLAN and _FORGET_PLAN[0][0] == len(sys.modules)
    names, own = _FORGET_PLAN[0][1:] if planned else _to_forget()
    dropped = []
    for name in names:
        if name in sys.modules:
            del sys.modules[name]
            dropped.append(name)
    for module in own:
        here = vars(module)
        for name in _RUNNER_FORGETS:
            if isinstance(here.get(name), types.ModuleType):
                here[name] = None
    return sorted(dropped)


#: The seal of the running program's globals, checked before each nested call goes out and is answered.
ACTIVE_SEAL: list[GlobalsSeal] = []


def check_inner_wall() -> None:
    """Refuse to go on after a violation or with rewritten globals (nested calls ask this first)."""
    if VIOLATIONS:
        raise SandboxViolation(f"the program already violated the sandbox: {VIOLATIONS[0]}")
    for seal in ACTIVE_SEAL:
        seal.check()


class _ProgramStdout:
    """``sys.stdout`` while the program runs: standard-library code that prints (``calendar.prmonth``,
    ``re.DEBUG``) writes into the program's bounded capture, not onto the runner's own descriptors."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def write(self, text: str) -> int:
        return int(self.target.write(str(text)))

    def flush(self) -> None:
        return None


class _ProgramStderr(_ProgramStdout):
    """``sys.stderr`` while the program runs: write-only, each write flushed (the runner may end with
    ``os._exit``, which flushes nothing)."""

    def write(self, text: str) -> int:
        written = int(self.target.write(str(text)))
        self.target.flush()
        return written


@contextlib.contextmanager
def program_streams(stdout: Any) -> Any:
    """Point ``sys.stdout`` at the program's capture, ``sys.stderr`` at a write-only view of the execution's
    stderr (``logging``'s default handler, ``traceback.print_exc``: the host captures it, bounded), and take
    ``sys.stdin`` (the runner's protocol channel on a container) away while the program runs."""
    saved = sys.stdout, sys.stdin, sys.stderr
    sys.stdout, sys.stdin, sys.stderr = _ProgramStdout(stdout), None, _ProgramStderr(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stdin, sys.stderr = saved


def _import_without_tls(name: str) -> None:
    """Import ``name`` (``asyncio``) with ``ssl`` unimportable meanwhile: asyncio takes ``ssl`` only for TLS
    transports, which the sandbox's loop refuses (it has no sockets), and does without it (``ssl = None``), as on
    an interpreter built without OpenSSL. A runner then loads neither libssl nor libcrypto at start-up (under
    gVisor ~13 ms of machine CPU, docs/benchmarks.md). ``ssl`` itself stays importable afterwards."""
    blocked = "ssl" not in sys.modules
    if blocked:
        sys.modules["ssl"] = None  # type: ignore[assignment]  # the import system's own "not importable" mark
    try:
        __import__(name)
    finally:
        if blocked and "ssl" in sys.modules and sys.modules["ssl"] is None:
            del sys.modules["ssl"]


def _populate(proxy: Any, name: str) -> None:
    """Import ``name`` and copy its public names (minus the withheld ones and sub-modules) onto ``proxy``."""
    if name == "asyncio":
        _import_without_tls(name)
    else:
        __import__(name)
    withheld = ALLOWED_MODULES[name]
    for key, value in vars(sys.modules[name]).items():
        if not key.startswith("_") and key not in withheld and not isinstance(value, types.ModuleType):
            setattr(proxy, key, value)
    adjust = _PROXY_ADJUSTMENTS.get(name)
    if adjust is not None:
        adjust(proxy)
    seal_proxy(proxy, name)


#: Allowed modules imported before lock-down even where the others are imported on first use (containers):
#: importing ``asyncio`` runs code the tripwire would stop once armed (lock-down-only modules, code objects
#: made by its dependencies), none of which it does again once imported (issue 38; ~20-40 ms of a start).
IMPORTED_BEFORE_LOCKDOWN = frozenset({"asyncio"})

#: Proxies whose module is still to be imported (lazy mode), by ``id`` of the proxy.
_PENDING: dict[int, str] = {}


class LazyModuleProxy(types.ModuleType):
    """A module proxy that imports its module the first time a missing attribute is read.

    Used where modules stay importable after lock-down (containers: the root file system is the image's),
    so a container imports only what its program uses: importing every allowed module costs about 20 ms
    of each container's start, a third of it. Once filled it becomes a plain module object again.
    """

    def __getattr__(self, attr: str) -> Any:
        name = _PENDING.pop(id(self), None)
        if name is None:
            raise AttributeError(f"module has no attribute {attr!r}")
        _populate(self, name)
        self.__class__ = types.ModuleType  # type: ignore[assignment]  # reads specialise as module reads
        return getattr(self, attr)


def _new_proxy(name: str) -> Any:
    """An empty proxy: a plain module object (not a SimpleNamespace) because the interpreter reads a
    module's attributes fastest (``LOAD_ATTR_MODULE``): ``math.pi`` or ``json.dumps`` costs what it
    costs outside the sandbox. It is never in ``sys.modules``, and its dunder names stay unreachable."""
    return types.ModuleType(name)


def build_module_proxies(*, lazy: bool = False) -> dict[str, Any]:
    """A proxy per allowed module: filled now (``lazy=False``: nothing can be imported after a lock-down
    that changes the root), or on first use.

    Dotted modules hang under their parents' proxies, so ``import xml.etree.ElementTree as ET`` works.
    """
    proxies: dict[str, Any] = {}
    for name in sorted(ALLOWED_MODULES):
        if lazy and name not in IMPORTED_BEFORE_LOCKDOWN:
            proxy: Any = LazyModuleProxy(name)
            _PENDING[id(proxy)] = name
        else:
            proxy = _new_proxy(name)
            _populate(proxy, name)
        proxies[name] = proxy
    for name in sorted(ALLOWED_MODULES, key=lambda n: n.count(".")):
        parts = name.split(".")
        for depth in range(1, len(parts)):
            parent = ".".join(parts[:depth])
            proxies.setdefault(parent, _new_proxy(parent))
        for depth in range(1, len(parts)):
            parent, child = ".".join(parts[:depth]), ".".join(parts[: depth + 1])
            setattr(proxies[parent], parts[depth], proxies[child])
    return proxies


class BoundedText:
    """A print target that stops accepting text at its limit and remembers that it overflowed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0
        self.overflowed = False

    def write(self, text: str) -> int:
        encoded = len(text.encode("utf-8", "replace"))
        if self.size + encoded > self.limit:
            room = max(self.limit - self.size, 0)
            self.parts.append(text.encode("utf-8", "replace")[:room].decode("utf-8", "ignore"))
            self.size = self.limit
            self.overflowed = True
            raise OutputLimitExceeded(f"output exceeded {self.limit} bytes")
        self.parts.append(text)
        self.size += encoded
        return len(text)

    def getvalue(self) -> str:
        return "".join(self.parts)


class OutputLimitExceeded(Exception):
    """The program printed more than the output limit allows."""


def _proxy_json(module: types.SimpleNamespace) -> None:
    """The ``json`` a program imports encodes its ``context`` (a LazyContext) like the dict it stands for."""

    class JSONEncoder(json.JSONEncoder):
        def default(self, o: Any) -> Any:
            if type(o) is LazyContext:
                return o._resolved()
            return super().default(o)

    def dumps(obj: Any, **kwargs: Any) -> str:
        user_default = kwargs.pop("default", None)
        if user_default is not None:
            kwargs["default"] = lambda o: o._resolved() if type(o) is LazyContext else user_default(o)
        kwargs.setdefault("cls", JSONEncoder)
        return json.dumps(obj, **kwargs)

    module.JSONEncoder = JSONEncoder
    module.dumps = dumps


_PROXY_ADJUSTMENTS: dict[str, Any] = {"json": _proxy_json}


_INTERNAL_IMPORT_DONE = types.SimpleNamespace()


def _guarded_import(proxies: dict[str, types.SimpleNamespace]) -> Any:
    def guarded_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if not fromlist and level == 0 and type(name) is str and "." not in name:
            # ``import math``: what the general path below returns for an undotted allowed name that is
            # neither the interpreter's internal import nor an environment package (imported on first use)
            proxy = proxies.get(name)
            if proxy is not None and name not in INTERNAL_IMPORTS and not envmodules.exposed(name):
                return proxy
        if level == 0 and name in INTERNAL_IMPORTS and name in sys.modules:
            # The interpreter's own lazy import from C (PyImport_Import), which ignores what this returns and
            # takes the module from sys.modules: the program never gets the real module from here.
            return _INTERNAL_IMPORT_DONE
        if level == 0 and envmodules.exposed(name):
            proxy = envmodules.import_for_program(name)
        elif level != 0 or name not in proxies:
            raise ImportError(f"import of {name!r} is not allowed in the sandbox")
        else:
            proxy = proxies[name]
        if fromlist:
            _check_fromlist(proxy, name, fromlist)
            return proxy
        return proxies[name.split(".")[0]]

    return guarded_import


def _check_fromlist(proxy: Any, name: str, fromlist: Any) -> None:
    """Every name of ``from name import a, b`` read from the proxy here. Left to the interpreter, a name the
    proxy lacks would be looked up in ``sys.modules`` as ``name.a``: the real module (``from json import
    decoder``)."""
    for attr in fromlist:
        if getattr(proxy, attr, _MISSING_ARG) is _MISSING_ARG:
            if f"{name}.{attr}" in sys.modules:
                raise ImportError(f"import of {name + '.' + attr!r} is not allowed in the sandbox")
            raise ImportError(f"cannot import name {attr!r} from {name!r}")


def _words(text: str) -> list[str]:
    return text.split()


#: The module name the program's code runs under: every class and function it defines carries it.
PROGRAM_MODULE = "sandforge_tool"


#: Withheld: whatever evaluates strings (``typing.get_type_hints``, ``ForwardRef``), creates classes from a
#: namespace dict or a metaclass (``make_dataclass``, ``EnumType``, ``ABCMeta``), or writes attributes onto
#: any object it is given (``typing.final``, ``dataclass_transform``, ``enum.global_enum``...).
COMPAT_MODULES: dict[str, frozenset[str]] = {
    "abc": frozenset({"ABCMeta", "update_abstractmethods", "get_cache_token"}),
    "dataclasses": frozenset({"make_dataclass"}),
    "enum": frozenset(
        _words(
            "EnumMeta EnumType global_enum global_enum_repr global_str global_flag_repr show_flag_values "
            "pickle_by_enum_name pickle_by_global_name"
        )
    ),
    "typing": frozenset(
        _words(
            "get_type_hints ForwardRef dataclass_transform no_type_check no_type_check_decorator final "
            "reveal_type get_overloads clear_overloads TypeAliasType evaluate_forward_ref override"
        )
    ),
    "io": frozenset(),
}
#: Modules exposed by allow-list rather than by withholding: only these names.
EXPOSED_ONLY: dict[str, frozenset[str]] = {"io": frozenset({"StringIO", "BytesIO"})}
#: Modules the interpreter imports lazily from C on the program's behalf (``datetime.strptime`` imports
#: ``_strptime`` through the importing frame's ``__import__``): imported before lock-down, handed only to
#: that import, never importable by the program (import statements of ``_`` names are refused).
INTERNAL_IMPORTS: frozenset[str] = frozenset({"_strptime"})


def _only(names: frozenset[str]) -> Any:
    def adjust(proxy: types.SimpleNamespace) -> None:
        for key in list(vars(proxy)):
            if key not in names and not key.startswith("_"):
                delattr(proxy, key)

    return adjust


def _proxy_dataclasses(module: types.SimpleNamespace) -> None:
    """``dataclass`` on the program's own classes only: on a library class it would rewrite the library's
    methods in place (``@dataclass`` sets ``__init__``, ``__eq__``... on the class it is given)."""
    real = module.dataclass

    def dataclass(cls: Any = None, /, **options: Any) -> Any:
        def wrap(target: Any) -> Any:
            if not (isinstance(target, type) and getattr(target, "__module__", None) == PROGRAM_MODULE):
                raise TypeError("dataclass() applies to the program's own classes only")
            return real(**options)(target)

        return wrap if cls is None else wrap(cls)

    module.dataclass = dataclass


ALLOWED_MODULES.update(COMPAT_MODULES)
_PROXY_ADJUSTMENTS.update({name: _only(names) for name, names in EXPOSED_ONLY.items()})
_PROXY_ADJUSTMENTS["dataclasses"] = _proxy_dataclasses


# issue 38: the modules agent tools use every day, audited in their own module
from .idiom_modules import (  # noqa: E402 - merged into the tables above
    IDIOM_ADJUSTMENTS,
    IDIOM_EXPOSED_ONLY,
    IDIOM_MODULES,
    IDIOM_WITHHELD,
    IDIOM_WRAPPERS,
)
from .idiom_modules import bind as _bind_idiom_modules  # noqa: E402

_bind_idiom_modules(SandboxViolation, TOOL_FILENAME)

ALLOWED_MODULES.update(IDIOM_MODULES)
WITHHELD_NAMES.update(IDIOM_WITHHELD)
MODULE_WRAPPERS.update(IDIOM_WRAPPERS)
EXPOSED_ONLY.update(IDIOM_EXPOSED_ONLY)
_PROXY_ADJUSTMENTS.update({name: _only(names) for name, names in IDIOM_EXPOSED_ONLY.items()})
_PROXY_ADJUSTMENTS.update(IDIOM_ADJUSTMENTS)
