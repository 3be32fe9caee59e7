"""The outer wall's inner-wall rules (policies/default/rules/inner_wall.yaml, withheld_name): the red-team
programs of issue 13 and their variations are flagged, honest programs are not, and the policy's list of
withheld names is the runner's own."""

from __future__ import annotations

import textwrap

import pytest

from sandforge.runtime.guardrails import default_policy, validate
from sandforge.runtime.guardrails.plugins.inner_wall import withheld_qualnames
from sandforge.sandbox.inside import compilation, world


def fired(source: str) -> set[str]:
    return {v.violation_type for v in validate(textwrap.dedent(source), default_policy()).violations}


FLAGGED = [
    # the two red-team escapes, as found
    (
        """
        import functools, calendar
        def f():
            pass
        functools.update_wrapper(f, calendar.isleap, assigned=(), updated=("__globals__",))
        """,
        {"dunder_string_argument", "withheld_name"},
    ),
    (
        """
        import functools
        @functools.singledispatch
        def handle(x):
            return 0
        @handle.register
        def h(x: "print.__self__"):
            return 1
        """,
        {"withheld_name", "decorator_call"},
    ),
    # variations: aliases, from-imports, the decorator form, keyword tuples, nested containers
    ("from functools import update_wrapper as uw\nuw(args, kwargs)", {"withheld_name"}),
    ("import functools as ft\nsd = ft.singledispatchmethod", {"withheld_name"}),
    (
        "import functools, calendar\n@functools.wraps(calendar.isleap, updated=('__globals__',))\ndef f():\n    pass",
        {"withheld_name", "dunder_string_argument"},
    ),
    ("x = sorted(args, key=len, reverse=bool(['__class__']))", {"dunder_string_argument"}),
    ("x = dict(**{'__dict__': 1})", {"dunder_string_argument"}),
    ("x = max(args, default=('a', ('__globals__',)))", {"dunder_string_argument"}),
    ("x = len('\uff3f\uff3fglobals\uff3f\uff3f')", {"dunder_string_argument"}),  # fullwidth low lines fold to _
    ("import copy\ntable = copy.dispatch_table", {"withheld_name"}),
    ("import time\ntime.clock_settime(0, 0)", {"withheld_name"}),
    ("import base64\nbase64.main()", {"withheld_name"}),
    ("import xml.etree.ElementTree as ET\nET.dump(ET.fromstring(args[0]))", {"withheld_name"}),
    ("import io\nf = io.open", {"withheld_name"}),  # io is allow-listed: StringIO and BytesIO only
    ("from io import FileIO", {"withheld_name"}),
    # canonicalize opening files and descriptors
    ("import xml.etree.ElementTree as ET\nreturn ET.canonicalize(from_file='/proc/self/status')", {"file_argument"}),
    ("import xml.etree.ElementTree as ET\nreturn ET.canonicalize(from_file=3)", {"file_argument"}),
    (
        "import xml.etree.ElementTree as ET\np = '/etc/' + 'passwd'\nreturn ET.canonicalize(from_file=p)",
        {"file_argument"},
    ),
    ("from xml.etree.ElementTree import canonicalize as c\nreturn c(from_file=args[0])", {"file_argument"}),
]


@pytest.mark.parametrize(("source", "rules"), FLAGGED, ids=[s.strip().splitlines()[-1][:50] for s, _ in FLAGGED])
def test_flagged(source: str, rules: set[str]) -> None:
    got = fired(source)
    assert rules <= got, f"missing {rules - got}; got {got}"


HONEST = [
    "import functools\ndef deco(f):\n    @functools.wraps(f)\n    def inner(*a):\n        return f(*a)\n"
    "    return inner",
    "return {'name': '__init__'}",  # a dunder-looking string as data, not passed to a call
    "def f(x: int, *, y: list[int] = None) -> dict[str, int]:\n    return {}",
    "def mode(x: Literal['fast', 'slow']) -> Annotated[int, 'meta']:\n    return 1",
    "import xml.etree.ElementTree as ET\nreturn ET.canonicalize(xml_data=args[0])",
    "import csv\nimport xml.etree.ElementTree as ET\nreturn ET.canonicalize(from_file=csv.StringIO(args[0]))",
    "print('__main__ is not special here'.upper())",
]


@pytest.mark.parametrize("source", HONEST)
def test_honest(source: str) -> None:
    inner = {"dunder_string_argument", "file_argument", "withheld_name"}
    assert not fired(source) & inner


def test_the_policy_withholds_exactly_what_the_runner_withholds() -> None:
    names = withheld_qualnames()
    for module in world.ALLOWED_MODULES:
        for name in world.withheld(module):
            assert f"{module}.{name}" in names
    assert {"functools.update_wrapper", "functools.singledispatch", "json.load", "copy.dispatch_table"} <= set(names)
    # and each is flagged by the rule, with the runner's reason in the message
    for qualname, reason in names.items():
        module, _, name = qualname.rpartition(".")
        result = validate(f"import {module}\nx = {qualname}", default_policy())
        hits = [v for v in result.violations if v.violation_type == "withheld_name"]
        assert hits, qualname
        assert reason in hits[0].message


#: String annotations everywhere an annotation can be (issue 38): kept as strings, never evaluated.
STRING_ANNOTATIONS = [
    "def f(x: 'os') -> int:\n    return 1",
    "def f(x) -> list['Item']:\n    return []",
    "def f(*, x: f'{args}'):\n    return 1",
    "def f(*xs: 'x', **kw: 'y'):\n    return 1",
    "class A:\n    n: 'int' = 1",
    "def f(x: Annotated['int', 'meta']):\n    return x",
]


@pytest.mark.parametrize("source", STRING_ANNOTATIONS)
def test_the_runner_and_the_policy_accept_string_annotations(source: str) -> None:
    import ast

    assert compilation.inner_wall_refusal(ast.parse(source)) is None, source
    code, refusals = compilation.compile_checked(source)
    assert code is not None and not refusals, refusals
    assert "string_annotation" not in fired(source)
