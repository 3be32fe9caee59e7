"""What an allowed package may hand a program (issue 36): its audited surface, never a loader that builds
objects from bytes or runs text as code.

A package's own code runs unrestricted, so whatever it returns is the program's. A loader that constructs
objects named by its input (pickle, a YAML loader with Python tags) or an evaluator of text (``pandas.eval``)
hands the program whatever the input names: ``numpy.load(io.BytesIO(pickle_bytes), allow_pickle=True)``
returned the real ``os``. Three layers, each holding on its own:

1. **Withheld names** (``WITHHELD``): the environment's proxies (``envmodules``) never hand out these
   modules, names or the objects they name, under any path (``numpy.lib.npyio.NpzFile`` is the object
   ``numpy.lib._npyio_impl.NpzFile``: withheld by identity). Reading one is a sticky ``SandboxViolation``.
   ``WRAPPED`` replaces a few by the same function minus the unsafe part (``numpy.load`` without
   ``allow_pickle``, ``yaml.load`` with a safe loader only).
2. **Disarmed in the process** (``DISARMED_METHODS``): methods that instances reach without any proxy
   (``DataFrame.to_pickle``, ``DataFrame.query``, ``DataFrame.eval``, pandas' string dispatch
   ``df.agg("query", ...)``) are replaced on the real classes by a refusal, once the package is imported. The
   runner is one disposable process per execution, so nothing outlives the run.
3. **The unpickling floor** (``disarm_unpickling``): before any package is imported, ``pickle``'s loaders
   refuse to construct any object named by a global (``find_class``), whatever package calls them.

``REFUSED_ATTRIBUTES`` are attribute names the compiler and ``getattr`` refuse on any object: a C type's
attribute cannot be withheld any other way (``ndarray.ctypes`` hands out ctypes types: raw memory).
The audit of every top-level name of the default allow list's packages is in docs/security.md,
"What allowed packages expose" (``tests/sandbox/test_package_loaders.py`` checks it against the real
packages).
"""

from __future__ import annotations

import builtins
import sys
import types
from typing import Any

#: Dotted names (a module: it and everything under it; or a module's attribute) the program never gets.
WITHHELD: dict[str, str] = {
    # numpy
    "numpy.ctypeslib": "foreign-function types read and write raw memory",
    "numpy.testing": "test helpers: numpy.testing.measure() runs text as code, others start processes",
    "numpy.f2py": "builds and loads extension modules (runs compilers)",
    "numpy.core": "a deprecated alias of numpy's private numpy._core",
    "numpy.distutils": "builds extension modules",
    "numpy.memmap": "maps files into memory",
    "numpy.DataSource": "opens files and URLs",
    "numpy.lib.npyio.DataSource": "opens files and URLs",
    "numpy.lib.npyio.NpzFile": "unpickles its members with allow_pickle=True; use numpy.load",
    "numpy.lib.format.read_array": "unpickles with allow_pickle=True; use numpy.load",
    "numpy.lib.format.open_memmap": "maps files into memory",
    "numpy.lib.stride_tricks.as_strided": "makes views of arbitrary memory (no bounds check)",
    "numpy.lib.stride_tricks.DummyArray": "wraps an array-interface dict: views of arbitrary memory",
    # pandas
    "pandas.read_pickle": "unpickles: constructs any object its input names",
    "pandas.io.pickle": "unpickles: constructs any object its input names",
    "pandas.compat.pickle_compat": "unpickles: constructs any object its input names",
    "pandas.eval": "evaluates text as Python expressions (attribute reads included)",
    "pandas.core.computation": "evaluates text as Python expressions (pandas.eval, DataFrame.query)",
    "pandas.read_clipboard": "runs a clipboard program (xclip, xsel)",
    "pandas.io.clipboard": "runs a clipboard program (xclip, xsel)",
    "pandas.io.clipboards": "runs a clipboard program (xclip, xsel)",
    "pandas.set_option": "process-wide options name modules to import (plotting.backend)",
    "pandas.option_context": "process-wide options name modules to import (plotting.backend)",
    "pandas.reset_option": "process-wide options name modules to import (plotting.backend)",
    "pandas.options": "process-wide options name modules to import (plotting.backend)",
    # pyyaml: everything that constructs Python objects named by tags (safe_load, SafeLoader stay)
    "yaml.unsafe_load": "constructs any Python object its input names; use yaml.safe_load",
    "yaml.unsafe_load_all": "constructs any Python object its input names; use yaml.safe_load_all",
    "yaml.full_load": "returns Python objects its input names (python/name); use yaml.safe_load",
    "yaml.full_load_all": "returns Python objects its input names (python/name); use yaml.safe_load_all",
    "yaml.Loader": "constructs any Python object its input names; use yaml.SafeLoader",
    "yaml.FullLoader": "returns Python objects its input names; use yaml.SafeLoader",
    "yaml.UnsafeLoader": "constructs any Python object its input names; use yaml.SafeLoader",
    "yaml.CLoader": "constructs any Python object its input names; use yaml.CSafeLoader",
    "yaml.CFullLoader": "returns Python objects its input names; use yaml.CSafeLoader",
    "yaml.CUnsafeLoader": "constructs any Python object its input names; use yaml.CSafeLoader",
    "yaml.constructor.FullConstructor": "returns Python objects its input names",
    "yaml.constructor.UnsafeConstructor": "constructs any Python object its input names",
    "yaml.constructor.Constructor": "constructs any Python object its input names",
    "yaml.YAMLObject": "its loader sets any attribute (special ones included) of the object it builds",
    "yaml.YAMLObjectMetaclass": "registers constructors that set any attribute of the object they build",
}

#: Attribute names refused on every object, statically and by ``getattr``: C types' attributes.
REFUSED_ATTRIBUTES: dict[str, str] = {
    "ctypes": "numpy's ndarray.ctypes hands out foreign-function types, which read and write raw memory",
}

#: Objects of other modules a package might re-export that a program must never hold, by origin module.
_FOREIGN_ORIGINS = frozenset({
    "pickle", "_pickle", "marshal", "copyreg", "shelve", "os", "posix", "subprocess", "_posixsubprocess",
    "ctypes", "_ctypes", "mmap", "socket", "_socket", "signal", "_signal", "sys", "gc", "inspect", "importlib",
    "importlib._bootstrap", "importlib._bootstrap_external", "runpy", "code", "codeop", "threading", "_thread",
    "multiprocessing", "pty", "resource", "fcntl", "select",
})  # fmt: skip
_ABSENT: Any = object()
_BUILTIN_ESCAPES = (
    "eval", "exec", "compile", "open", "__import__", "getattr", "setattr", "delattr", "globals", "locals", "vars",
    "breakpoint", "input", "help", "memoryview", "type", "super", "object",
)  # fmt: skip


def _violation(message: str) -> Exception:
    """The sticky ``world.SandboxViolation`` every inner-wall refusal raises. Looked up, not imported:
    ``world`` imports this module (through ``envmodules``), and is always loaded before a program runs."""
    world: Any = sys.modules[__name__.rpartition(".")[0] + ".world"]
    return world.SandboxViolation(message, "withheld_name")  # type: ignore[no-any-return]


def withheld_reason(dotted: str) -> str | None:
    """Why ``dotted`` (a module or a module's attribute) is withheld, or None: a name under a withheld
    module is withheld with it."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        reason = WITHHELD.get(".".join(parts[:end]))
        if reason is not None:
            return reason
    return None


_IDS: dict[int, str] = {}
_RESOLVED: set[str] = set()


def _withheld_objects() -> dict[int, str]:
    """``id`` -> dotted name of every withheld attribute whose module is imported (resolved once each)."""
    for dotted in WITHHELD:
        if dotted in _RESOLVED:
            continue
        module, _, attr = dotted.rpartition(".")
        real = sys.modules.get(module)
        if real is None or dotted in sys.modules:
            continue
        _RESOLVED.add(dotted)
        value = vars(real).get(attr)
        if value is not None and not isinstance(value, (int, float, str, bool)):
            _IDS[id(value)] = dotted
            _KEEP.append(value)  # ids stay unique while the object lives: keep it alive
    return _IDS


_KEEP: list[Any] = []


def refuse_value(owner: str, attr: str, value: Any) -> None:
    """Raise a sticky violation when ``owner.attr`` (its value already read) is withheld: by name, by
    identity with a withheld object, as a module under a withheld one, or as a foreign object of an origin a
    program never holds (a package re-exporting ``pickle.loads`` or ``eval``)."""
    dotted = f"{owner}.{attr}"
    reason = withheld_reason(dotted)
    if reason is None and isinstance(value, types.ModuleType):
        reason = withheld_reason(value.__name__)
    if reason is None:
        known = _withheld_objects().get(id(value))
        reason = WITHHELD[known] if known is not None else None
    if reason is None and _foreign(value):
        reason = "it is an object of the standard library's unsafe surface, re-exported by a package"
    if reason is not None:
        raise _violation(f"{dotted} is withheld in the sandbox: {reason}")


def _foreign(value: Any) -> bool:
    if any(value is getattr(builtins, name, _ABSENT) for name in _BUILTIN_ESCAPES):
        return True
    if not callable(value):
        return False
    origin = getattr(value, "__module__", None)
    return isinstance(origin, str) and origin in _FOREIGN_ORIGINS


def check_import(name: str) -> None:
    """Refuse ``import name`` of a withheld module (``import numpy.ctypeslib``)."""
    reason = withheld_reason(name)
    if reason is not None:
        raise _violation(f"import of {name!r} is withheld in the sandbox: {reason}")


def check_attribute_name(name: str) -> None:
    """Refuse a ``REFUSED_ATTRIBUTES`` name read through ``getattr`` (the compiler refuses the literal)."""
    reason = REFUSED_ATTRIBUTES.get(name)
    if reason is not None:
        raise _violation(f"attribute {name!r} is withheld in the sandbox: {reason}")


# --- wrappers: the same function minus the unsafe part ---


def _numpy_load(file: Any, mmap_mode: Any = None, allow_pickle: bool = False, **options: Any) -> Any:
    """``numpy.load`` without unpickling (``allow_pickle=True`` builds any object its input names) or
    memory-mapped files."""
    if allow_pickle is not False or mmap_mode is not None:
        raise _violation(
            "numpy.load(allow_pickle=True) and numpy.load(mmap_mode=...) are withheld in the "
            "sandbox: unpickling constructs any object its input names; save arrays without objects"
        )
    return sys.modules["numpy"].load(file, allow_pickle=False, **options)


def _safe_loader(loader: Any, function: str) -> None:
    constructors: Any = sys.modules["yaml.constructor"]  # imported with yaml (never by this module: inside/)
    BaseConstructor, FullConstructor = constructors.BaseConstructor, constructors.FullConstructor
    if not (isinstance(loader, type) and issubclass(loader, BaseConstructor)) or issubclass(loader, FullConstructor):
        raise _violation(f"{function}() takes yaml.SafeLoader, yaml.CSafeLoader or yaml.BaseLoader (or a subclass) "
                         "in the sandbox: other loaders construct Python objects their input names; use "
                         "yaml.safe_load")  # fmt: skip


def _yaml_load(stream: Any, Loader: Any = None) -> Any:
    """``yaml.load`` with a safe loader only (``Loader`` is required by pyyaml itself)."""
    _safe_loader(Loader, "yaml.load")
    return sys.modules["yaml"].load(stream, Loader)


def _yaml_load_all(stream: Any, Loader: Any = None) -> Any:
    _safe_loader(Loader, "yaml.load_all")
    return sys.modules["yaml"].load_all(stream, Loader)


#: Replacements by dotted name of the real object (found by identity under any path).
WRAPPED: dict[str, Any] = {"numpy.load": _numpy_load, "yaml.load": _yaml_load, "yaml.load_all": _yaml_load_all}
_WRAPPED_IDS: dict[int, Any] = {}


def wrapped(value: Any) -> Any:
    """``value``, or its `WRAPPED` replacement when it is one of the wrapped objects."""
    for dotted in WRAPPED:
        if dotted not in _RESOLVED:
            module, _, attr = dotted.rpartition(".")
            real = sys.modules.get(module)
            if real is not None and attr in vars(real):
                _RESOLVED.add(dotted)
                _KEEP.append(vars(real)[attr])
                _WRAPPED_IDS[id(vars(real)[attr])] = WRAPPED[dotted]
    return _WRAPPED_IDS.get(id(value), value)


# --- disarmed in the process ---

#: Methods of package classes that instances reach without a proxy, replaced by a refusal:
#: (module, class) -> method -> reason.
DISARMED_METHODS: dict[tuple[str, str], dict[str, str]] = {
    ("pandas.core.generic", "NDFrame"): {
        "to_pickle": "pickles to a file (and read_pickle unpickles: withheld)",
        "to_clipboard": "runs a clipboard program (xclip, xsel)",
    },
    ("pandas.core.frame", "DataFrame"): {
        "query": "evaluates text as Python expressions (attribute reads included); filter with a boolean mask",
        "eval": "evaluates text as Python expressions (attribute reads included); compute with columns",
    },
    ("pandas.core.apply", "Apply"): {},  # string dispatch: see _checked_apply_str
    ("yaml.constructor", "SafeConstructor"): {
        "construct_yaml_object": "sets any attribute (special ones included) of an object of any class",
    },
}
_DISARMED: set[tuple[str, str]] = set()


def _refusal(qualified: str, reason: str) -> Any:
    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise _violation(f"{qualified} is withheld in the sandbox: {reason}")

    refused.__name__ = qualified.rsplit(".", 1)[-1]
    return refused


def _checked_apply_str(original: Any) -> Any:
    """pandas' ``agg("name")``/``apply("name")`` reads ``getattr(obj, name)``: no private or special names."""

    def _apply_str(self: Any, obj: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(func, str) or func[:1] == "_" or func in REFUSED_ATTRIBUTES:
            raise _violation(f"pandas string dispatch of {func!r} is withheld in the sandbox: it reads the "
                             "attribute of that name, which the sandbox does not allow")  # fmt: skip
        return original(self, obj, func, *args, **kwargs)

    return _apply_str


def disarm() -> None:
    """Apply `DISARMED_METHODS` to every imported class not yet disarmed (after each package import)."""
    for key, methods in DISARMED_METHODS.items():
        module_name, class_name = key
        module = sys.modules.get(module_name)
        if key in _DISARMED or module is None or not isinstance(vars(module).get(class_name), type):
            continue
        _DISARMED.add(key)
        cls = vars(module)[class_name]
        for method, reason in methods.items():
            setattr(cls, method, _refusal(f"{class_name}.{method}", reason))
        if key == ("pandas.core.apply", "Apply") and "_apply_str" in vars(cls):
            cls._apply_str = _checked_apply_str(vars(cls)["_apply_str"])


def disarm_unpickling() -> None:
    """The floor under every package: ``pickle``'s loaders construct no object named by a global. Data-only
    pickles (numbers, strings, containers) need no global; anything else is a sticky violation. Called
    before the program runs with an environment (a package that imports ``loads`` by name gets this one)."""
    import _pickle
    import pickle

    def find_class(_self: Any, module: str, name: str) -> Any:
        raise _violation(f"unpickling {module}.{name} is withheld in the sandbox: unpickling constructs any "
                         "object its input names")  # fmt: skip

    unpickler: Any = type("Unpickler", (pickle.Unpickler,), {"find_class": find_class})

    def load(file: Any, **options: Any) -> Any:
        return unpickler(file, **options).load()

    def loads(data: Any, /, **options: Any) -> Any:
        import io

        return unpickler(io.BytesIO(data), **options).load()

    targets: tuple[Any, ...] = (pickle, _pickle)
    for module in targets:
        module.Unpickler, module.load, module.loads = unpickler, load, loads
    pure: Any = pickle
    pure._Unpickler.find_class = find_class
    pure._load, pure._loads = load, loads


#: The audit of the default allow list's packages' top-level sub-modules (docs/security.md, "What allowed
#: packages expose"): each is reviewed and exposed, or in `WITHHELD`. A test fails on a new one.
AUDITED_SUBMODULES: dict[str, frozenset[str]] = {
    "numpy": frozenset({"char", "dtypes", "emath", "exceptions", "fft", "lib", "linalg", "ma", "polynomial",
                        "random", "rec", "strings", "typing"}),
    "pandas": frozenset({"api", "arrays", "compat", "core", "errors", "io", "offsets", "plotting", "testing",
                         "tseries", "util", "pandas"}),
    "yaml": frozenset({"composer", "constructor", "cyaml", "dumper", "emitter", "error", "events", "loader",
                       "nodes", "parser", "reader", "representer", "resolver", "scanner", "serializer", "tokens"}),
    "dateutil": frozenset({"easter", "parser", "relativedelta", "rrule", "tz", "utils", "zoneinfo"}),
    "bs4": frozenset({"builder", "css", "dammit", "element", "filter", "formatter", "exceptions"}),
}  # fmt: skip


def audit(top: str) -> dict[str, str]:
    """Each public top-level name of the imported package ``top``: ``withheld: reason``, ``sub-module``
    (audited), ``own`` (the package's own code), ``data``, or ``UNAUDITED ...`` (a test fails on it)."""
    real = sys.modules[top]
    out: dict[str, str] = {}
    for name in sorted(n for n in dir(real) if not n.startswith("_")):
        try:
            value = getattr(real, name)
        except Exception as exc:  # a lazy attribute that fails to load (numpy's expired aliases)
            out[name] = f"absent ({type(exc).__name__})"
            continue
        try:
            refuse_value(top, name, value)
        except Exception as exc:
            out[name] = f"withheld: {exc}"
            continue
        if isinstance(value, types.ModuleType):
            if value.__name__.split(".")[0] != top:  # envmodules never hands out another package's module
                out[name] = f"unreachable (module {value.__name__})"
            else:
                audited = name in AUDITED_SUBMODULES.get(top, frozenset())
                out[name] = "sub-module" if audited else f"UNAUDITED module {value.__name__}"
            continue
        origin = getattr(value, "__module__", None)
        if not callable(value) or not isinstance(origin, str):
            out[name] = "data"
        elif origin.split(".")[0] == top or origin in ("builtins", "typing", "enum", "functools", "datetime"):
            out[name] = "own" if origin.split(".")[0] == top else f"standard ({origin})"
        else:
            out[name] = f"UNAUDITED origin {origin}"
    return out
