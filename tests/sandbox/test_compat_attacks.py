"""Red-team tests of what issue 15 newly allows: each construct and module is attacked for what it exposes
(underscore/dunder attributes, classes made from a namespace, frames and tracebacks, string evaluation,
writes to library objects). Every attack must end in a refusal, never in a value."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandforge.sandbox import ErrorType, ExecutionRequest, Sandbox, SandboxConfig


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=2)) as sandbox:
        yield sandbox


#: (name, program, a text the refusal's message contains)
ATTACKS = [
    # --- type(), super(), special methods ---
    ("three-argument type", "return type('X', (), {'y': 1})", "exactly one argument"),
    ("type of a class is a metaclass", "return type(int)('X', (), {})", "type() of a class"),
    ("metaclass of an enum", "from enum import Enum\nclass C(Enum):\n    A = 1\nreturn type(C)", "type() of a class"),
    ("metaclass of an ABC", "from abc import ABC\nreturn type(ABC)", "type() of a class"),
    ("metaclass keyword", "class X(metaclass=type):\n    pass\nreturn 1", "metaclass"),
    ("super().__class__", "class A:\n    def f(self):\n        return super().__class__\nreturn A().f()", "__class__"),
    (
        "super().__setattr__",
        "class A:\n    def f(self):\n        super().__setattr__('__class__', int)\nA().f()",
        "__setattr__",
    ),
    (
        "super().__getattribute__",
        "class A:\n    def f(self):\n        return super().__getattribute__('__dict__')\nreturn A().f()",
        "__getattribute__",
    ),
    (
        "super().__reduce_ex__",
        "class A:\n    def f(self):\n        return super().__reduce_ex__(2)\nreturn A().f()",
        "__reduce_ex__",
    ),
    ("special method outside a class", "def __init__(self):\n    pass\nreturn 1", "__init__"),
    (
        "__getattribute__ definition",
        "class A:\n    def __getattribute__(self, n):\n        return 1\nreturn 1",
        "__getattribute__",
    ),
    (
        "__init_subclass__ definition",
        "class A:\n    def __init_subclass__(cls):\n        pass\nreturn 1",
        "__init_subclass__",
    ),
    ("__del__ definition", "class A:\n    def __del__(self):\n        pass\nreturn 1", "__del__"),
    ("dunder class attribute", "class A:\n    __module__ = 'json'\nreturn 1", "__module__"),
    ("__slots__ and __match_args__", "class A:\n    __match_args__ = ('__class__',)\nreturn 1", "__match_args__"),
    ("reading a special method", "class A:\n    pass\nreturn A().__init__", "__init__"),
    ("__class__ cell", "class A:\n    def f(self):\n        return __class__\nreturn A().f()", "__class__"),
    # --- program-local names never reach the runtime's ---
    ("runtime guard name", "_getattr_ = 1\nreturn 1", "_getattr_"),
    ("print collector name", "_print = 1\nreturn 1", "_print"),
    ("temporary name", "_tmp0 = 1\nreturn 1", "_tmp0"),
    ("import of an underscore module", "import _strptime\nreturn _strptime.locale", "_strptime"),
    ("from-import of an underscore module", "from _strptime import locale\nreturn 1", "_strptime"),
    ("from-import as underscore", "from json import dumps as _d\nreturn 1", "_d"),
    ("import of a private name", "from json import _default_encoder\nreturn 1", "_default_encoder"),
    # --- attribute writes ---
    ("write to a module proxy", "import json\njson.dumps = None\nreturn 1", "cannot set or delete attribute"),
    ("setattr on a module proxy", "import json\nsetattr(json, 'loads', len)\nreturn 1", "cannot set or delete"),
    (
        "write to a library class",
        "from html.parser import HTMLParser\nHTMLParser.feed = None\nreturn 1",
        "cannot set or delete",
    ),
    ("write to a library function", "import json\njson.loads.x = 1\nreturn 1", "cannot set or delete"),
    (
        "write a non-settable attribute",
        "import xml.etree.ElementTree as ET\nET.Element('a').makeelement = 1\nreturn 1",
        "cannot set or delete",
    ),
    ("setattr of a dunder", "class A:\n    pass\nsetattr(A(), '__class__', int)\nreturn 1", "invalid attribute name"),
    ("setattr of an underscore name of a library object", "import random\nsetattr(random.Random(), '_x', 1)\nreturn 1",
     "cannot set or delete"),
    ("delattr of a dunder", "class A:\n    pass\ndelattr(A, '__init__')\nreturn 1", "invalid attribute name"),
    ("attribute write of a dunder", "class A:\n    pass\nA.__eq__ = None\nreturn 1", "__eq__"),
    ("augmented dunder write", "class A:\n    pass\nA.__doc__ += 'x'\nreturn 1", "__doc__"),
    ("write to a built-in", "x = 1\nx.real = 2\nreturn 1", "cannot set or delete"),
    (
        "dataclass on a library class",
        "import dataclasses, json\ndataclasses.dataclass(json.JSONEncoder)\nreturn 1",
        "program's own classes",
    ),
    (
        "dataclass(...) on a library class",
        "from dataclasses import dataclass\nfrom html.parser import HTMLParser\n"
        "dataclass(eq=False)(HTMLParser)\nreturn 1",
        "program's own classes",
    ),
    (
        "own method on a library object",
        "import json\nclass A:\n    def set(self, v):\n        self.dumps = v\nA.set(json, 1)\nreturn 1",
        "cannot set or delete",
    ),
    (
        "own method += on a library object",
        "import json\nclass A:\n    def inc(self):\n        self.n += 1\nA.inc(json)\nreturn 1",
        "has no attribute",
    ),
    (
        "own method on a settable library object",
        "import xml.etree.ElementTree as ET\nclass A:\n"
        "    def f(self):\n        self.text = 'ok'\n        self.makeelement = 1\nA.f(ET.Element('a'))\nreturn 1",
        "cannot set or delete attribute 'makeelement'",
    ),
    (
        "method rebinding self",
        "import json\nclass A:\n    def f(self, other):\n        self = other\n"
        "        self.dumps = 1\nA().f(json)\nreturn 1",
        "cannot set or delete",
    ),
    (
        "method rebinding self in a nested scope",
        "import json\nclass A:\n    def f(self, other):\n"
        "        def swap():\n            nonlocal self\n            self = other\n        swap()\n"
        "        self.dumps = 1\nA().f(json)\nreturn 1",
        "cannot set or delete",
    ),
    # --- reads through getattr and native reads ---
    ("getattr of a frame", "def g():\n    yield 1\nreturn getattr(g(), 'gi_frame')", "restricted name"),
    ("frame attribute", "def g():\n    yield 1\nreturn g().gi_frame", "gi_frame"),
    ("traceback attribute", "try:\n    1 / 0\nexcept Exception as e:\n    return e.__traceback__", "__traceback__"),
    ("getattr with a non-string name", "return getattr(1, 5)", "must be a string"),
    ("getattr of __class__", "return getattr(1, '__class__')", "invalid attribute name"),
    ("hasattr of a dunder is false", "return 1 if not hasattr(1, '__class__') else 1/0", None),
    # --- format strings ---
    ("format field attribute", "return '{0.__class__}'.format(1)", "reads an attribute"),
    ("format field item", "return '{0[x]}'.format({'x': 1})", "reads an attribute"),
    ("nested format spec attribute", "return '{0:{1.real}}'.format(1, 2)", "reads an attribute"),
    ("format_map field attribute", "return '{a.real}'.format_map({'a': 1})", "reads an attribute"),
    ("unbound str.format", "return str.format('{0.__class__}', 1)", "reads an attribute"),
    (
        "format through super()",
        "class S(str):\n    pass\nreturn super(S, S('{0.__class__}')).format(1)",
        "reads an attribute",
    ),
    ("format through getattr", "return getattr('{0.__class__}', 'format')(1)", "reads an attribute"),
    ("format through map", "return list(map(str.format, ['{0.__class__}'], [1]))", "reads an attribute"),
    ("format via type()", "return type('')('{0.__class__}').format(1)", "reads an attribute"),
    ("f-string attribute", "x = 1\nreturn f'{x.__class__}'", "__class__"),
    # --- match ---
    ("match class keyword dunder", "match 1:\n    case int(__class__=c):\n        return c\nreturn 0", "__class__"),
    (
        "match value dunder",
        "class A:\n    pass\nmatch 1:\n    case A.__name__:\n        return 1\nreturn 0",
        "__name__",
    ),
    ("match capture of a runtime name", "match 1:\n    case _getattr_:\n        return 1\nreturn 0", "_getattr_"),
    ("match rest of a runtime name", "match {}:\n    case {**_write_}:\n        return 1\nreturn 0", "_write_"),
    # --- nonlocal, annotations, except* ---
    ("nonlocal of a runtime name", "def f():\n    nonlocal _print\nreturn 1", "_print"),
    ("except star", "try:\n    pass\nexcept* ValueError:\n    pass\nreturn 1", "TryStar"),
    # --- typing, dataclasses, enum, abc, io: withheld names ---
    ("typing.get_type_hints", "import typing\nreturn typing.get_type_hints", "has no attribute"),
    ("typing.ForwardRef", "from typing import ForwardRef\nreturn 1", "ForwardRef"),
    ("typing.final", "import typing\nreturn typing.final", "has no attribute"),
    ("typing.dataclass_transform", "import typing\nreturn typing.dataclass_transform", "has no attribute"),
    ("typing.reveal_type", "import typing\nreturn typing.reveal_type", "has no attribute"),
    ("typing.Type cannot create classes", "import typing\nreturn typing.Type('X', (), {})", "cannot be instantiated"),
    ("dataclasses.make_dataclass", "import dataclasses\nreturn dataclasses.make_dataclass", "has no attribute"),
    ("enum.EnumType", "import enum\nreturn enum.EnumType", "has no attribute"),
    ("enum.global_enum", "import enum\nreturn enum.global_enum", "has no attribute"),
    ("abc.ABCMeta", "import abc\nreturn abc.ABCMeta", "has no attribute"),
    ("io.open", "import io\nreturn io.open", "has no attribute"),
    ("io.FileIO", "import io\nreturn io.FileIO", "has no attribute"),
    ("enum internals", "from enum import Enum\nclass C(Enum):\n    A = 1\nreturn C._member_map_", "_member_map_"),
    (
        "dataclass internals",
        "from dataclasses import dataclass\n@dataclass\nclass D:\n    a: int\nreturn D.__dataclass_fields__",
        "__dataclass_fields__",
    ),
    (
        "enum _missing_ hook",
        "from enum import Enum\nclass C(Enum):\n    A = 1\n    def _missing_(cls, v):\n        return 1\nreturn 1",
        "_missing_",
    ),
    (
        "namedtuple field names",
        "from collections import namedtuple\nreturn namedtuple('P', ['__class__'])",
        "ValueError",
    ),
]


@pytest.mark.parametrize(("code", "needle"), [pytest.param(c, n, id=name) for name, c, n in ATTACKS])
def test_attack_is_refused(sb: Sandbox, code: str, needle: str | None) -> None:
    out = sb.execute(ExecutionRequest(code=code))
    if needle is None:
        assert out.ok and out.value == 1, (out.error_type, out.error_message)
        return
    assert not out.ok, f"the attack returned {out.value!r}"
    assert out.error_type in (ErrorType.SANDBOX_VIOLATION, ErrorType.EXECUTION), out.error_type
    assert needle in (out.error_message or ""), out.error_message


def test_super_cannot_reinitialise_what_it_does_not_own(sb: Sandbox) -> None:
    """super(C, obj) needs obj to be a C: a program class cannot reach a library object's own methods."""
    code = "import json\nclass C:\n    pass\nreturn super(C, json.JSONEncoder()).__init__()"
    out = sb.execute(ExecutionRequest(code=code))
    assert out.error_type == ErrorType.EXECUTION and "TypeError" in (out.error_message or "")


def test_dataclass_generated_code_sees_field_names_only(sb: Sandbox) -> None:
    """dataclass exec()s generated methods from field names: names are identifiers, so no code injection;
    a program's own underscore field is its own attribute (issue 38)."""
    code = "from dataclasses import dataclass\n@dataclass\nclass D:\n    _x: int = 1\nd = D(_x=2)\nreturn d._x"
    out = sb.execute(ExecutionRequest(code=code))
    assert out.ok and out.value == 2, out.error_message
