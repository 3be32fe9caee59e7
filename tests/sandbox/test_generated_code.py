"""Issue 36, items 1, 5 and 6, attacked on every backend: names a program computes at run time reaching the
standard library's class generators (``dataclasses`` ``exec``-s its field names with the real builtins,
``namedtuple`` ``eval``-s them, ``enum``'s functional API installs member names as special methods),
``ABCMeta.register`` reached through ``abc.ABC``/``typing.Mapping``, and RestrictedPython's two published
escapes (positional-only parameters shadowing the guards, ``string.Formatter``'s field traversal).

Every attack must end as ``sandbox_violation``, never as a value; ordinary uses of each generator keep working.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import textwrap
import typing
from collections.abc import Iterator

import pytest

from sandforge.sandbox import ErrorType, ExecutionRequest, Sandbox, SandboxConfig
from sandforge.sandbox.inside import generators, world
from tests.conftest import BACKEND_PARAMS, _require_backend


@pytest.fixture(
    scope="module",
    params=BACKEND_PARAMS,
)
def sb(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """One sandbox per backend for the whole module (each execution still gets a fresh process)."""
    _require_backend(request.param)
    with Sandbox(SandboxConfig(backend=request.param, pool_size=1)) as sandbox:
        yield sandbox


def run(sandbox: Sandbox, code: str) -> object:
    return sandbox.execute(ExecutionRequest(code=textwrap.dedent(code)))


#: The text an injected generator body runs: it hands the real ``sys`` back in an exception.
ESCAPE = 'q"\\nimport sys\\nraise ValueError(sys.version)\\ndef k():\\n return "'

#: (attack, a fragment of the refusal)
ATTACKS = {
    # --- item 1: dataclasses exec()s field names ---
    "dataclass of a functional TypedDict": (
        f"""
        import dataclasses, typing
        T = typing.TypedDict("T", {{'{ESCAPE}': int}})
        try:
            dataclasses.dataclass(T, init=False, eq=False)
        except ValueError as exc:
            return str(exc)
        """,
        "dataclasses.dataclass",
    ),
    "@dataclass on a subclass of a functional TypedDict": (
        f"""
        import typing
        from dataclasses import dataclass
        T = typing.TypedDict("T", {{'{ESCAPE}': int}})
        try:
            @dataclass(init=False, eq=False)
            class C(T):
                pass
        except ValueError as exc:
            return str(exc)
        """,
        "dataclasses.dataclass",
    ),
    "dataclass __init__ injection (a default value)": (
        """
        import dataclasses, typing
        T = typing.TypedDict("T", {"a=0):\\n  import sys\\n  raise ValueError(sys.version)\\n def x(self, b": int})
        C = dataclasses.dataclass(T, repr=False, eq=False)
        return 1
        """,
        "not an identifier",
    ),
    "dataclass field named like its helpers": (
        """
        import dataclasses, typing
        T = typing.TypedDict("T", {"__dataclass_builtins_object__": int})
        dataclasses.dataclass(T, frozen=True)
        return 1
        """,
        "starts with '_'",
    ),
    "dataclass field that is a keyword": (
        "import dataclasses, typing\ndataclasses.dataclass(typing.TypedDict('T', {'lambda': int}))\nreturn 1",
        "a keyword",
    ),
    "dataclass field that is not a string": (
        "import dataclasses, typing\ndataclasses.dataclass(typing.TypedDict('T', {7: int}))\nreturn 1",
        "not a string",
    ),
    "dataclass field that is a str subclass": (
        """
        import dataclasses, typing
        class S(str):
            def __format__(self, spec):
                return 'x=0):\\n  pass\\n def y(self'
        dataclasses.dataclass(typing.TypedDict('T', {S('a'): int}))
        return 1
        """,
        "not a string",
    ),
    "dataclass field NFKC-normalised to self": (
        "import dataclasses, typing\n"
        "dataclasses.dataclass(typing.TypedDict('T', {'\\uff53\\uff45\\uff4c\\uff46': int}))\nreturn 1",
        "not an identifier",
    ),
    # --- item 1: namedtuple eval()s its field names ---
    "namedtuple field NFKC-normalised": (
        "from collections import namedtuple\n"
        "namedtuple('P', ['\\uff4c\\uff41\\uff4d\\uff42\\uff44\\uff41', 'a'])\nreturn 1",
        "collections.namedtuple",
    ),
    "typing.NamedTuple field NFKC-normalised": (
        "import typing\ntyping.NamedTuple('N', [('\\uff53\\uff45\\uff4c\\uff46', int)])\nreturn 1",
        "collections.namedtuple",
    ),
    "namedtuple field from an object's __str__": (
        """
        from collections import namedtuple
        class F:
            def __str__(self):
                return '\\uff43\\uff4c\\uff53'
        namedtuple('P', [F()])
        return 1
        """,
        "collections.namedtuple",
    ),
    # --- item 5: enum's functional API installs special methods ---
    "Enum __del__": ("import enum\nenum.Enum('E', {'__del__': lambda self: 1, 'A': 1})\nreturn 1", "'__del__'"),
    "Enum __init_subclass__ (computed)": (
        "import enum\nn = '_' * 2 + 'init_subclass' + '_' * 2\nenum.Enum('E', [(n, classmethod(len)), ('A', 1)])\n"
        "return 1",
        "__init_subclass__",
    ),
    "Enum __set_name__": ("import enum\nenum.Enum('E', {'__set_name__': len, 'A': 1})\nreturn 1", "__set_name__"),
    "Enum __reduce_ex__": ("import enum\nenum.Enum('E', {'__reduce_ex__': len, 'A': 1})\nreturn 1", "__reduce_ex__"),
    "Enum __getattribute__ hook": (
        """
        import enum
        seen = []
        def hook(self, name):
            seen.append(name)
            return 1
        enum.Enum('E', {'__getattribute__': hook, 'A': 1})
        return seen
        """,
        "__getattribute__",
    ),
    "Enum _missing_ hook": ("import enum\nenum.Enum('E', {'_missing_': len, 'A': 1})\nreturn 1", "_missing_"),
    "Enum names as a string": ("import enum\nenum.Enum('E', 'A __del__')\nreturn 1", "__del__"),
    "Enum reached through re.RegexFlag.mro()": (
        "import re\nE = re.RegexFlag.mro()[5]\nE('E', {'__del__': len, 'A': 1})\nreturn 1",
        "__del__",
    ),
    "Enum subclass of the program": (
        "from enum import IntEnum\nclass Base(IntEnum):\n    pass\nBase('E', [('__del__', 1)])\nreturn 1",
        "__del__",
    ),
    "Enum names that change on the second reading": (
        """
        import enum
        class Names:
            def __init__(self):
                self.calls = 0
            def __iter__(self):
                self.calls += 1
                return iter([('A', 1)] if self.calls == 1 else [('__del__', len)])
        E = enum.Enum('E', Names())
        return [m.name for m in E] + ['__del__' if hasattr(E, 'x') else 'kept']
        """,
        None,
    ),
    # --- item 5: ABCMeta.register though ABCMeta is withheld ---
    "abc.ABC.register(str)": ("import abc\nabc.ABC.register(str)\nreturn isinstance('x', abc.ABC)", "register"),
    "typing.Mapping.register": (
        "import typing\nclass M:\n    pass\ntyping.Mapping.register(M)\nreturn isinstance(M(), typing.Mapping)",
        "register",
    ),
    "getattr(ABC, 'register')": ("import abc\nreturn getattr(abc.ABC, 'register')(int)", "register"),
    "@register as a decorator": (
        "import typing\n@typing.Sequence.register\nclass S:\n    pass\nreturn 1",
        "register",
    ),
    "register on the program's own ABC": (
        "from abc import ABC\nclass A(ABC):\n    pass\nA.register(str)\nreturn 1",
        "register",
    ),
    # --- item 6: RestrictedPython's advisories ---
    "positional-only parameter shadows _write_ (RestrictedPython < 8.3)": (
        "import json\ndef f(_write_=lambda ob: ob, /):\n    json.x = 1\n    return json.x\nreturn f()",
        "_write_",
    ),
    "positional-only parameter shadows _getattr_ (RestrictedPython < 8.3)": (
        "def f(_getattr_=lambda ob, name: ob, /):\n    return '{0.__class__}'.format(1)\nreturn f()",
        "_getattr_",
    ),
    "positional-only lambda parameter shadows _print_": (
        "f = lambda _print_, /: 1\nreturn f(1)",
        "_print_",
    ),
    "string.Formatter's field traversal (RestrictedPython < 8.4)": (
        "import string\nreturn string.Formatter().get_field('0.__class__.__base__', [1], {})[0]",
        "Formatter",
    ),
    "from string import Formatter": ("from string import Formatter\nreturn 1", "Formatter"),
    "str.format attribute traversal": ("return '{0.__class__.__base__}'.format(1)", "format field"),
    "str.format_map item traversal": ("return '{a[x]}'.format_map({'a': {'x': 1}})", "format field"),
    "str.format reached unbound": ("f = str.format\nreturn f('{0.__class__}', 1)", "format field"),
}

#: Attacks whose refusal is an error other than sandbox_violation (the program's own mistake, or a
#: compile-time refusal reported as such).
NOT_VIOLATIONS: dict[str, ErrorType] = {
    "str.format attribute traversal": ErrorType.EXECUTION,
    "str.format_map item traversal": ErrorType.EXECUTION,
    "str.format reached unbound": ErrorType.EXECUTION,
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_is_refused(sb: Sandbox, name: str) -> None:
    code, fragment = ATTACKS[name]
    out = run(sb, code)
    if fragment is None:  # names read once: the first reading is the one used
        assert out.ok, (out.error_type, out.error_message)
        assert out.value == ["A", "kept"]
        return
    expected = NOT_VIOLATIONS.get(name, ErrorType.SANDBOX_VIOLATION)
    assert out.error_type == expected, (out.error_type, out.error_message, out.value)
    assert fragment in (out.error_message or ""), out.error_message
    assert out.value is None
    assert "\n" not in (out.error_message or "").strip()


ORDINARY = {
    "dataclass with normal fields": (
        """
        import dataclasses
        @dataclasses.dataclass(order=True)
        class D:
            a: int
            b: str = "x"
            c: list = dataclasses.field(default_factory=list)
        @dataclasses.dataclass(frozen=True)
        class F:
            n: int = 3
        return [repr(D(1)).split(".")[-1], D(1) == D(1), D(1) < D(2), F().n, [f.name for f in dataclasses.fields(D)]]
        """,
        ["D(a=1, b='x', c=[])", True, True, 3, ["a", "b", "c"]],
    ),
    "namedtuple": (
        """
        from collections import namedtuple
        P = namedtuple("P", "x, y", defaults=[0])
        Q = namedtuple("Q", ["a", "def", "a"], rename=True)
        return [list(P(1)), P(1, 2).y, list(Q(1, 2, 3)), repr(Q(1, 2, 3))]
        """,
        [[1, 0], 2, [1, 2, 3], "Q(a=1, _1=2, _2=3)"],
    ),
    "typing.NamedTuple and TypedDict": (
        """
        import typing
        N = typing.NamedTuple("N", [("a", int), ("b", str)])
        class M(typing.NamedTuple):
            x: int
            y: int = 2
        T = typing.TypedDict("T", {"content-type": str})
        return [N(1, "x").b, M(1).y, T(**{"content-type": "a"})]
        """,
        ["x", 2, {"content-type": "a"}],
    ),
    "Enum functional API": (
        """
        import enum
        Color = enum.Enum("Color", "RED GREEN")
        Level = enum.IntEnum("Level", ["LOW", "HIGH"], start=10)
        Pairs = enum.Enum("Pairs", [("ONE", 1), ("TWO", 2)])
        Mapped = enum.Enum("Mapped", {"X": "x"})
        return [Color.GREEN.value, Color["RED"].name, Level.HIGH.value, Pairs(2).name, Mapped.X.value]
        """,
        [2, "RED", 11, "TWO", "x"],
    ),
    "Enum with computed names": (
        """
        import enum
        names = [word.upper() for word in "north south east".split()]
        D = enum.Enum("Direction", [(n, i) for i, n in enumerate(names)])
        return [m.name for m in D]
        """,
        ["NORTH", "SOUTH", "EAST"],
    ),
    "ABCs by subclassing and isinstance": (
        """
        import abc, typing
        class A(abc.ABC):
            @abc.abstractmethod
            def f(self):
                pass
        class B(A):
            def f(self):
                return 1
        return [B().f(), isinstance({}, typing.Mapping), isinstance(B(), A)]
        """,
        [1, True, True],
    ),
}


@pytest.mark.parametrize("name", list(ORDINARY))
def test_ordinary_use_still_works(sb: Sandbox, name: str) -> None:
    code, expected = ORDINARY[name]
    out = run(sb, code)
    assert out.ok, (out.error_type, out.error_message)
    assert out.value == expected


# --- the check itself, in this process ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["a b", "1a", "def", "match", "_x", "__del__", "\uff53\uff45\uff4c\uff46", 7, None, "", "a\nb"], ids=repr
)
def test_check_refuses(name: object) -> None:
    with pytest.raises(world.SandboxViolation, match="refused in the sandbox"):
        generators.check_generated_names("test", [name])


def test_check_accepts_identifiers() -> None:
    generators.check_generated_names("test", ["a", "RED", "content_type", "x1", "café"])


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The generators wrapped in this process, and unwrapped afterwards."""
    monkeypatch.setattr(generators, "_INSTALLED", [])
    monkeypatch.setattr(dataclasses, "_process_class", dataclasses._process_class)  # type: ignore[attr-defined]
    monkeypatch.setattr(collections, "namedtuple", collections.namedtuple)
    monkeypatch.setattr(enum.EnumType, "_create_", vars(enum.EnumType)["_create_"])
    generators.install()
    yield
    world.VIOLATIONS.clear()
    world.VIOLATION_EVENTS.clear()


def test_generators_keep_the_callers_module(installed: None) -> None:
    """The wrappers add a frame; the classes they make still name the caller's module, as CPython's do."""
    color = enum.Enum("Color", "RED GREEN")
    point = collections.namedtuple("Point", "x y")
    nt = typing.NamedTuple("NT", [("a", int)])  # noqa: UP014 - the functional form is under test
    assert (color.__module__, point.__module__, nt.__module__) == (__name__,) * 3
    assert enum.Enum("Other", "A", module="elsewhere").__module__ == "elsewhere"


def test_the_refusal_is_a_security_event(installed: None) -> None:
    with pytest.raises(world.SandboxViolation):
        dataclasses.dataclass(typing.TypedDict("T", {"a b": int}))  # type: ignore[operator]
    assert world.VIOLATION_EVENTS == [generators.GENERATED_NAME_EVENT]


def test_library_dataclasses_keep_private_fields(installed: None) -> None:
    """A package's dataclass with ``_private`` fields, defined after install, still works; its names are
    still identifiers (nothing but a class statement makes a library class)."""

    @dataclasses.dataclass
    class Library:
        _cache: int = 0

    assert Library()._cache == 0
