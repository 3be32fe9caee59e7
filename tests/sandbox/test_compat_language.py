"""The language models write runs in the sandbox (issue 15), each construct on its own: one failing test
says which construct broke, where the corpus (tests/compat) only says how many programs still pass."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sandforge.sandbox import ErrorType, ExecutionRequest, Sandbox, SandboxConfig


@pytest.fixture(scope="module")
def sb() -> Iterator[Sandbox]:
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=2)) as sandbox:
        yield sandbox


def run(sb: Sandbox, code: str, **request: Any) -> Any:
    out = sb.execute(ExecutionRequest(code=code, **request))
    assert out.ok, (out.error_type, out.error_message)
    return out.value


CASES = [
    (
        "own attributes",
        "class A:\n    def __init__(self, x):\n        self.x = x\na = A(1)\na.y = 2\ndel a.x\n"
        "return [a.y, hasattr(a, 'x')]",
        [2, False],
    ),
    ("class attribute +=", "class C:\n    n = 0\n    def __init__(self):\n        C.n += 1\nC(); C()\nreturn C.n", 2),
    (
        "attribute += keeps in-place semantics",
        "class B:\n    def __init__(self):\n        self.items = []\n"
        "b = B()\nalias = b.items\nb.items += [1]\nreturn [alias, b.items is alias]",
        [[1], True],
    ),
    (
        "attribute += evaluates the target once",
        "calls = []\nclass B:\n    v = 1\nb = B()\ndef get():\n"
        "    calls.append(1)\n    return b\nget().v += 5\nreturn [b.v, len(calls)]",
        [6, 1],
    ),
    ("function attributes", "def f():\n    return 1\nf.calls = 3\nreturn f.calls", 3),
    (
        "setattr/getattr on own objects",
        "class A:\n    pass\na = A()\nsetattr(a, 'k', 5)\ndelattr(a, 'k')\nsetattr(a, 'k', 6)\nreturn getattr(a, 'k')",
        6,
    ),
    (
        "ElementTree text",
        "import xml.etree.ElementTree as ET\nr = ET.Element('r')\nET.SubElement(r, 'c').text = 'x'\n"
        "r.tail = '!'\nreturn ET.tostring(r, encoding='unicode')",
        "<r><c>x</c></r>!",
    ),
    (
        "decimal precision",
        "import decimal\ndecimal.getcontext().prec = 6\nreturn str(decimal.Decimal(1) / 7)",
        "0.142857",
    ),
    (
        "dict subclasses take item writes",
        "from collections import defaultdict, Counter, OrderedDict\n"
        "d = defaultdict(int)\nd['a'] += 1\nc = Counter()\nc['x'] += 2\no = OrderedDict()\no['k'] = 1\n"
        "del o['k']\nreturn [d['a'], c['x'], len(o)]",
        [1, 2, 0],
    ),
    ("own dict subclass", "class D(dict):\n    pass\nd = D()\nd['a'] = 1\nd['a'] += 1\nreturn d", {"a": 2}),
    (
        "builtins",
        "return [list(zip([1], [2])), bin(5), bytes([65]).decode(), type(1) is int, isinstance(int, type),"
        " type(object()) is object]",
        [[[1, 2]], "0b101", "A", True, True, True],
    ),
    ("type(context) is dict", "return type(context) is dict", True),
    (
        "property, classmethod, staticmethod",
        "class P:\n    def __init__(self):\n        self.v = 2\n"
        "    @property\n    def double(self):\n        return self.v * 2\n    @classmethod\n    def make(cls):\n"
        "        return cls()\n    @staticmethod\n    def one():\n        return 1\nreturn [P.make().double, P.one()]",
        [4, 1],
    ),
    (
        "special methods",
        "class V:\n    def __init__(self, x):\n        self.x = x\n    def __repr__(self):\n"
        "        return f'V({self.x})'\n"
        "    def __eq__(self, o):\n        return self.x == o.x\n    def __lt__(self, o):\n"
        "        return self.x < o.x\n    def __hash__(self):\n        return hash(self.x)\n    def __len__(self):\n"
        "        return self.x\n    def __add__(self, o):\n        return V(self.x + o.x)\n"
        "return [repr(sorted([V(2), V(1)])), V(1) == V(1), len(V(3)), repr(V(1) + V(2)), len({V(1), V(1)})]",
        ["[V(1), V(2)]", True, 3, "V(3)", 1],
    ),
    (
        "super().__init__ of HTMLParser",
        "from html.parser import HTMLParser\nclass P(HTMLParser):\n"
        "    def __init__(self):\n        super().__init__()\n        self.tags = []\n"
        "    def handle_starttag(self, tag, attrs):\n        self.tags.append(tag)\np = P()\np.feed('<a><b></b></a>')\n"
        "return p.tags",
        ["a", "b"],
    ),
    (
        "two-argument super",
        "class A:\n    def __init__(self):\n        self.a = 1\nclass B(A):\n    def __init__(self):\n"
        "        super(B, self).__init__()\n        self.b = 2\nb = B()\nreturn [b.a, b.b]",
        [1, 2],
    ),
    (
        "program-local underscore names",
        "_CACHE = {}\ndef _key(x):\n    return str(x * 2)\n_CACHE[_key(2)] = 1\nreturn _CACHE",
        {"4": 1},
    ),
    (
        "match: literal, capture, sequence, mapping, class, or, guard",
        "from dataclasses import dataclass\n"
        "@dataclass\nclass P:\n    x: int\n    y: int\ndef f(v):\n    match v:\n        case 0 | 1:\n"
        "            return 'small'\n        case [a, b, *rest]:\n            return ['seq', a, b, len(rest)]\n"
        "        case {'k': value, **others}:\n            return ['map', value, sorted(others)]\n"
        "        case P(x=0, y=y):\n            return ['p', y]\n        case P(x, y) if x > y:\n"
        "            return ['pos', x]\n        case str() as s:\n            return s.upper()\n        case _:\n"
        "            return None\n"
        "return [f(1), f([1, 2, 3, 4]), f({'k': 1, 'z': 2}), f(P(0, 5)), f(P(3, 1)), f('a'), f(2.5)]",
        ["small", ["seq", 1, 2, 2], ["map", 1, ["z"]], ["p", 5], ["pos", 3], "A", None],
    ),
    (
        "nonlocal",
        "def outer():\n    n = 0\n    def inc():\n        nonlocal n\n        n += 1\n    inc(); inc()\n"
        "    return n\nreturn outer()",
        2,
    ),
    (
        "annotated assignments",
        "total: float = 0.0\ncount: int\nfor v in [1, 2]:\n    total += v\n"
        "def f(a: int, *b: str, c: undefined_name = 1, **d: dict) -> list[int]:\n"
        "    z: also_undefined = a\n    return z\n"
        "return [total, f(3)]",
        [3.0, 3],
    ),
    (
        "typing",
        "from typing import List, Dict, Optional, NamedTuple, TypedDict, Union\nclass N(NamedTuple):\n"
        "    a: int\n    b: str = 'x'\n"
        "class T(TypedDict):\n    k: int\ndef f(x: Optional[List[int]]) -> Dict[str, int]:\n"
        "    return {'n': len(x or [])}\nreturn [f([1]), N(1).b, T(k=1)]",
        [{"n": 1}, "x", {"k": 1}],
    ),
    (
        "dataclasses",
        "from dataclasses import dataclass, field, asdict\n@dataclass(order=True)\nclass D:\n    a: int\n"
        "    tags: list = field(default_factory=list)\n    def __post_init__(self):\n        self.tags.append(self.a)\n"
        "return [asdict(D(1)), D(1) < D(2)]",
        [{"a": 1, "tags": [1]}, True],
    ),
    (
        "enum",
        "from enum import Enum, IntEnum, auto\nclass C(Enum):\n    R = auto()\n    G = auto()\n"
        "class P(IntEnum):\n    LO = 1\n    HI = 2\nreturn [C.R.name, C(2).name, [c.value for c in C], P.HI > P.LO]",
        ["R", "G", [1, 2], True],
    ),
    (
        "abc",
        "from abc import ABC, abstractmethod\nclass S(ABC):\n    @abstractmethod\n    def area(self):\n"
        "        ...\nclass Q(S):\n    def area(self):\n        return 4\ntry:\n    S()\n    refused = False\n"
        "except TypeError:\n    refused = True\nreturn [Q().area(), refused]",
        [4, True],
    ),
    (
        "io.StringIO with csv",
        "import csv, io\nbuf = io.StringIO()\ncsv.writer(buf).writerow([1, 'a'])\n"
        "return [buf.getvalue(), list(csv.reader(io.StringIO('x,y')))]",
        ["1,a\r\n", [["x", "y"]]],
    ),
    (
        "strptime",
        "from datetime import datetime\nimport time\nreturn [datetime.strptime('2024-02-03', '%Y-%m-%d').day,"
        " time.strptime('2024', '%Y').tm_year]",
        [3, 2024],
    ),
    (
        "str.format and format_map with plain fields",
        "t = '{} + {b} = {:>{w}}'\nreturn [t.format(1, 3, b=2, w=3),"
        " '{x}'.format_map({'x': 5}), str.format('{0}', 7), f'{3.14159:.2f}']",
        ["1 + 2 =   3", "5", "7", "3.14"],
    ),
    (
        "tuples in results and context are lists",
        "from collections import Counter\ncontext['t'] = (1, (2, 3))\nreturn Counter('aab').most_common(1)",
        [["a", 2]],
    ),
    (
        "tuple swap and unpacking",
        "a, b = 1, 2\na, b = b, a\npairs = [(1, 'x'), (2, 'y')]\n"
        "out = [n for n, _ in pairs]\n"
        "for i, (n, s) in enumerate(pairs):\n    out.append(s * n)\nfirst, *rest = [1, 2, 3]\n"
        "return [a, b, out, rest]",
        [2, 1, [1, 2, "x", "yy"], [2, 3]],
    ),
    (
        "context manager class",
        "class M:\n    def __enter__(self):\n        return 'in'\n"
        "    def __exit__(self, *exc):\n        return False\nwith M() as v:\n    pass\nreturn v",
        "in",
    ),
]


@pytest.mark.parametrize(("code", "value"), [pytest.param(c, v, id=name) for name, c, v in CASES])
def test_construct_runs(sb: Sandbox, code: str, value: Any) -> None:
    assert run(sb, code) == value


def test_a_raising_exception_message_still_gives_a_result(sb: Sandbox) -> None:
    code = "class E(Exception):\n    def __str__(self):\n        raise ValueError('no')\nraise E()"
    out = sb.execute(ExecutionRequest(code=code))
    assert out.error_type == ErrorType.EXECUTION and "could not be computed" in (out.error_message or "")


def test_a_frozen_dataclass_stays_frozen(sb: Sandbox) -> None:
    code = ("from dataclasses import dataclass\n@dataclass(frozen=True)\nclass K:\n    a: int\nk = K(1)\n"
            "try:\n    k.a = 2\nexcept Exception as e:\n    return str(e)\n")  # fmt: skip
    assert "cannot assign to field" in run(sb, code)
