"""Red-team tests of what issue 38 newly allows: underscore attributes decided by the object's class, read-only
names of classes and functions, program-defined decorators, string annotations kept as strings, computed
getattr/setattr/hasattr, ``__name__``. Each attack walks from the new construct toward frames, globals, code
objects or real modules, and each names what stops it:

- ``compiler``: the restricted compiler refuses the program (``sandbox_violation`` before it runs);
- ``guard``: the run-time guard (``sandbox/inside/guards.py``) refuses the read or write as it happens;
- ``proxy``: the module proxy withholds the name (a sticky ``sandbox_violation``);
- ``generator``: the class generators' name check (``generators.check_generated_names``).

Run on the subprocess backend and on docker (the container's interpreter and the image's runner).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import pytest

from sandforge.sandbox import ErrorType, ExecutionRequest, Sandbox, SandboxConfig


@pytest.fixture(scope="module", params=["subprocess", pytest.param("docker", marks=pytest.mark.docker)])
def sb(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    with Sandbox(SandboxConfig(backend=request.param, pool_size=1)) as sandbox:
        yield sandbox


_UNDERSCORE = "starts with"
_NOT_SET = "cannot set or delete"

#: (name, stopped by, program, a text the refusal's message contains)
ATTACKS: list[tuple[str, str, str, str]] = [
    # --- underscore attributes: only the program's own objects and classes ---
    ("module private", "guard", "import random\nreturn random._os", _UNDERSCORE),
    ("module private by computed name", "guard", "import random\nreturn getattr(random, '_' + 'os')", _UNDERSCORE),
    ("json's private decoder", "guard", "import json\nreturn json._default_decoder", _UNDERSCORE),
    ("library object private", "guard", "import random\nreturn random.Random(1)._randbelow(6)", _UNDERSCORE),
    (
        "library base class private from a program subclass",
        "guard",
        "import random\nclass R(random.Random):\n    def f(self):\n        return self._randbelow(6)\nreturn R(1).f()",
        _UNDERSCORE,
    ),
    (
        "library private through super()",
        "guard",
        "import random\nclass R(random.Random):\n    def f(self):\n        return super()._randbelow(6)\n"
        "return R(1).f()",
        _UNDERSCORE,
    ),
    (
        "ABCMeta's cache in a program class",
        "guard",
        "import abc\nclass S(abc.ABC):\n    pass\nreturn S._abc_impl",
        _UNDERSCORE,
    ),
    (
        "metaclass method through a program class",
        "guard",
        "import abc\nclass S(abc.ABC):\n    pass\nreturn S._dump_registry",
        _UNDERSCORE,
    ),
    (
        "enum internals",
        "guard",
        "import enum\nclass C(enum.Enum):\n    A = 1\nreturn getattr(C, '_member_map_')",
        "invalid attribute name",
    ),
    (
        "enum internals, literal",
        "compiler",
        "import enum\nclass C(enum.Enum):\n    A = 1\nreturn C._member_map_",
        "invalid attribute name",
    ),
    ("function attribute read", "guard", "def f():\n    pass\nreturn f._cache", _UNDERSCORE),
    ("function attribute write", "guard", "def f():\n    pass\nf._cache = {}\nreturn 1", _NOT_SET),
    ("library object private write", "guard", "import random\nsetattr(random.Random(), '_x', 1)\nreturn 1", _NOT_SET),
    (
        "shadowing a library private method on a program subclass",
        "guard",
        "import random\nclass R(random.Random):\n    pass\nr = R()\nr._randbelow = len\nreturn 1",
        _NOT_SET,
    ),
    (
        "namedtuple API written on a library namedtuple class",
        "guard",
        "import urllib.parse\nurllib.parse.ParseResult._make = print\nreturn 1",
        _NOT_SET,
    ),
    (
        "a typing ForwardRef's evaluation",
        "guard",
        "import typing\nref = typing.get_args(typing.List['os'])[0]\nreturn ref._evaluate",
        _UNDERSCORE,
    ),
    (
        "frame of a program generator method",
        "compiler",
        "class A:\n    def _g(self):\n        yield 1\nreturn A()._g().gi_frame",
        "gi_frame",
    ),
    (
        "frame of a program generator method, computed",
        "guard",
        "class A:\n    def _g(self):\n        yield 1\nreturn getattr(A()._g(), 'gi_' + 'frame')",
        "restricted name",
    ),
    (
        "globals of a namedtuple method",
        "guard",
        "import collections\nP = collections.namedtuple('P', 'a')\nreturn getattr(P._make, '__glo' + 'bals__')",
        "invalid attribute name",
    ),
    (
        "mangled private of a library class",
        "guard",
        "import html.parser\nreturn getattr(html.parser.HTMLParser, '_HTMLParser__starttag_text')",
        _UNDERSCORE,
    ),
    (
        "a dataclass field named after the generated code's own helper",
        "generator",
        "from dataclasses import dataclass, field\n@dataclass\nclass D:\n    _HAS_DEFAULT_FACTORY: int = 1\nreturn 1",
        "_HAS_DEFAULT_FACTORY",
    ),
    (
        "a dataclass field named like a generated type local",
        "generator",
        "from dataclasses import dataclass\n@dataclass\nclass D:\n    _type_x: int = 1\nreturn 1",
        "_type_x",
    ),
    # --- the own-object fast path: a method's writes and ``_x`` reads on its own ``self`` are native when
    # ``self``'s class is the program's (``lowering._OwnWrites``, ``guards.OwnedClasses``); anything else
    # still meets the guard ---
    (
        "a method's private read called on a library object",
        "guard",
        "import random\nclass A:\n    def peek(self):\n        return self._randbelow\nreturn A.peek(random.Random(1))",
        _UNDERSCORE,
    ),
    (
        "a method's private write called on a library object",
        "guard",
        "import random\nclass A:\n    def poke(self):\n        self._x = 1\nA.poke(random.Random())\nreturn 1",
        _NOT_SET,
    ),
    (
        "a method's public write called on a library object",
        "guard",
        "import random\nclass A:\n    def poke(self):\n        self.seed = 1\nA.poke(random.Random())\nreturn 1",
        _NOT_SET,
    ),
    (
        "a private read in a comprehension of a method called on a library object",
        "guard",
        "import random\nclass A:\n    def peek(self):\n        return [self._randbelow for _ in 'a']\n"
        "return A.peek(random.Random(1))",
        _UNDERSCORE,
    ),
    (
        "a library base's private through the subclass's own self, += form",
        "guard",
        "import random\nclass R(random.Random):\n    def f(self):\n        self._randbelow += 1\nR(1).f()\nreturn 1",
        _UNDERSCORE,
    ),
    (
        "ABCMeta's cache through a method's own self",
        "guard",
        "import abc\nclass S(abc.ABC):\n    def f(self):\n        return self._abc_impl\nreturn S().f()",
        _UNDERSCORE,
    ),
    (
        "ABCMeta's cache name on a class without a library base",
        "guard",
        "class S:\n    def f(self):\n        return self._abc_impl\nreturn S().f()",
        _UNDERSCORE,
    ),
    (
        "a program __setattr__ smuggling a native private write onto a library object",
        "guard",
        "import random\nR = random.Random()\nclass A:\n    def __setattr__(self, name, value):\n"
        "        setattr(R, name, value)\n    def f(self):\n        self._x = 1\nA().f()\nreturn 1",
        _NOT_SET,
    ),
    (
        "a program __setattr__ turning a native write into a dunder write",
        "guard",
        "class A:\n    def __setattr__(self, name, value):\n        setattr(self, '__cla' + 'ss__', value)\n"
        "    def f(self):\n        self._x = int\nA().f()\nreturn 1",
        "invalid attribute name",
    ),
    (
        "a library base's private read through a name of a program subclass's instance",
        "guard",
        "import random\nclass R(random.Random):\n    pass\nr = R(1)\nreturn r._randbelow",
        _UNDERSCORE,
    ),
    (
        "a library base's private written through a name of a program subclass's instance",
        "guard",
        "import random\nclass R(random.Random):\n    pass\nr = R(1)\nr._randbelow = len\nreturn 1",
        _NOT_SET,
    ),
    (
        "a program class's private read through a name bound to a library object",
        "guard",
        "import random\nclass A:\n    pass\nx = A()\nx._ok = 1\nx = random.Random(1)\nreturn x._randbelow",
        _UNDERSCORE,
    ),
    (
        "a library class held in a name, written at the top level",
        "guard",
        "import random\nR = random.Random\nR.seed = print\nreturn 1",
        _NOT_SET,
    ),
    (
        "a library object held in a name, written with +=",
        "guard",
        "import random\nr = random.Random(1)\nr.VERSION += 1\nreturn 1",
        _NOT_SET,
    ),
    (
        "a str subclass name equal to 'format' asking a string for its class",
        "guard",
        "class N(str):\n    def __eq__(self, other):\n        return True\n    def __hash__(self):\n        return 0\n"
        "return getattr('x', N('__class__'))",
        "must be a string",
    ),
    (
        "a class's module rewritten after its level was decided",
        "guard",
        "class A:\n    def f(self):\n        return self._x\na = A()\na._x = 1\na.f()\n"
        "setattr(A, '__mod' + 'ule__', 'random')\nreturn 1",
        "invalid attribute name",
    ),
    (
        "a library class passed off as the program's",
        "guard",
        "import random\nsetattr(random.Random, '__mod' + 'ule__', __name__)\nreturn 1",
        "invalid attribute name",
    ),
    # --- read-only names: strings only, never written, never the class ---
    ("write __name__", "compiler", "def f():\n    pass\nf.__name__ = 'g'\nreturn 1", "can be read but not set"),
    (
        "setattr __name__",
        "guard",
        "def f():\n    pass\nsetattr(f, '__name__', 'g')\nreturn 1",
        "invalid attribute name",
    ),
    ("delete __doc__", "compiler", "class A:\n    pass\ndel A.__doc__\nreturn 1", "can be read but not set"),
    ("bare __class__", "compiler", "return [].__class__", "__class__"),
    ("class hierarchy from __class__", "compiler", "return [].__class__.__base__", "__base__"),
    ("attribute of a class name", "compiler", "return [].__class__.__name__.__class__", "__class__"),
    (
        "a non-string __name__ from a program __getattr__",
        "guard",
        "class A:\n    def __getattr__(self, name):\n        return [1]\nreturn A().__name__",
        "not a string",
    ),
    ("__class__ by computed name", "guard", "return getattr(1, '__cla' + 'ss__')", "invalid attribute name"),
    (
        "__globals__ of a function",
        "guard",
        "def f():\n    pass\nreturn getattr(f, '__glob' + 'als__')",
        "invalid attribute name",
    ),
    ("__name__ assigned", "compiler", "__name__ = '__main__'\nreturn 1", "__name__"),
    # --- program-defined decorators: they run restricted code only ---
    (
        "decorator reads the function's code",
        "compiler",
        "def d(f):\n    return f.__code__\n@d\ndef g():\n    pass\nreturn g",
        "__code__",
    ),
    (
        "decorator reads the function's globals by name",
        "guard",
        "def d(f):\n    return getattr(f, '__' + 'globals__')\n@d\ndef g():\n    pass\nreturn g",
        "invalid attribute name",
    ),
    (
        "decorator hands the function to update_wrapper",
        "proxy",
        "import functools\ndef d(f):\n    return functools.update_wrapper(f, len)\n@d\ndef g():\n    pass\nreturn 1",
        "withheld",
    ),
    # --- computed getattr/setattr/hasattr ---
    (
        "getattr of a traceback's frame",
        "guard",
        "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    return getattr(getattr(e, '__traceback__'), 'tb_frame')",
        "invalid attribute name",
    ),
    ("getattr through map", "guard", "return list(map(getattr, [1], ['__class__']))", "invalid attribute name"),
    (
        "setattr of a dunder by computed name",
        "guard",
        "class A:\n    pass\nsetattr(A, '__init' + '_subclass__', 1)",
        "invalid attribute name",
    ),
    (
        "getattr of a module proxy's loader",
        "guard",
        "import json\nreturn getattr(json, '__load' + 'er__')",
        "invalid attribute name",
    ),
    ("getattr of a withheld name", "proxy", "import json\nname = 'lo' + 'ad'\nreturn getattr(json, name)", "withheld"),
    # --- string annotations: kept as strings, their evaluators withheld ---
    (
        "type hints of a class",
        "proxy",
        "import typing\nclass A:\n    x: 'os' = 1\nreturn typing.get_type_hints(A)",
        "withheld",
    ),
    ("forward reference class", "proxy", "import typing\nreturn typing.ForwardRef('os')", "withheld"),
    (
        "singledispatch of an annotated function",
        "proxy",
        "import functools\n@functools.singledispatch\ndef f(x: 'os'):\n    return 1\nreturn 1",
        "withheld",
    ),
    ("annotations of a class", "compiler", "class A:\n    x: 'os' = 1\nreturn A.__annotations__", "__annotations__"),
]


@pytest.mark.parametrize(
    ("stopper", "code", "needle"), [pytest.param(s, c, n, id=f"{s}: {name}") for name, s, c, n in ATTACKS]
)
def test_attack_is_stopped(sb: Sandbox, stopper: str, code: str, needle: str) -> None:
    out = sb.execute(ExecutionRequest(code=code))
    assert not out.ok, f"the attack returned {out.value!r}"
    message = out.error_message or ""
    assert needle in message, message
    if stopper in ("compiler", "proxy", "generator"):
        assert out.error_type == ErrorType.SANDBOX_VIOLATION, (out.error_type, message)
    else:  # the guard raises as Python would for a missing attribute or a read-only object
        assert out.error_type == ErrorType.EXECUTION, (out.error_type, message)
        assert "AttributeError" in message or "TypeError" in message, message


def test_string_annotations_are_never_evaluated(sb: Sandbox) -> None:
    """A string annotation that would reach ``os`` if evaluated runs as the plain string it is: function
    annotations are dropped before compilation, class-body ones stay strings nobody evaluates."""
    code = textwrap.dedent(
        """
        class Trap:
            note: "print('evaluated') or [c for c in ().__class__.__base__.__subclasses__()]" = 1
            nxt: "Trap" = None

        def h(x: "print('evaluated')") -> "Trap":
            return x

        return [h(2), Trap.note, Trap.nxt]
        """
    )
    out = sb.execute(ExecutionRequest(code=code))
    assert out.ok, out.error_message
    assert out.value == [2, 1, None]
    assert "evaluated" not in (out.stdout or "")


def test_hasattr_of_a_refused_name_is_false_and_no_violation(sb: Sandbox) -> None:
    code = "import random\nreturn [hasattr(random, '_os'), hasattr(1, '__class__'), hasattr(len, '__name__')]"
    out = sb.execute(ExecutionRequest(code=code))
    assert out.ok, out.error_message
    assert out.value == [False, False, True]


def test_main_guard_is_skipped(sb: Sandbox) -> None:
    code = "ran = []\nif __name__ == '__main__':\n    ran.append(1)\nreturn [ran, __name__]"
    out = sb.execute(ExecutionRequest(code=code))
    assert out.ok, out.error_message
    assert out.value == [[], "sandforge_tool"]
