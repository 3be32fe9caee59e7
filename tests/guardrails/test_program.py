"""Program analysis: one walk, names resolved once, attribute reads found wherever they hide."""

from __future__ import annotations

import ast
import textwrap

import pytest

from sandforge.runtime.guardrails.program import Program, format_field_attributes


def program(source: str) -> Program:
    text = textwrap.dedent(source)
    return Program(text, ast.parse(text), max_depth=200)


def last_expression(p: Program) -> ast.expr:
    statement = p.tree.body[-1]
    assert isinstance(statement, ast.Expr)
    return statement.value


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os as o\no.system", {"os.system"}),
        ("from os import path as p\np.join", {"os.path.join"}),
        ("import os.path\nos.path.join", {"os.path.join"}),
        ("import os.path as p\np.join", {"os.path.join"}),
        ("from xml.etree import ElementTree as ET\nET.fromstring", {"xml.etree.ElementTree.fromstring"}),
        ("import builtins as b\nb.eval", {"eval"}),
        ("from builtins import eval as e\ne", {"eval"}),
        ("import os\ngetattr(os, 'system')", {"os.system"}),
        ("__import__('os').system", {"os.system"}),
        ("import importlib\nimportlib.import_module('subprocess').run", {"subprocess.run"}),
        ("t = tool('x')\nt.fetch", {"tool().fetch", "t.fetch"}),
        ("from pathlib import Path\nPath('x').write_text", {"pathlib.Path().write_text"}),
        ("''.join", {"str.join"}),
        ("().__class__", {"tuple.__class__"}),
        ("import os, sys\nm = os if x else sys\nm.path", {"os.path", "sys.path", "m.path"}),
        ("import json, os\nfor m in (json, os):\n    pass\nm.dumps", {"json.dumps", "os.dumps", "m.dumps"}),
        ("import os\n(o := os).sep\no.sep", {"os.sep", "o.sep"}),
        ("import os\na, b = os, 1\na.sep", {"os.sep", "a.sep"}),
        ("(a + b).format", {"<expr>.format"}),
        ("x.y().z", {"x.y().z"}),
    ],
)
def test_qualified_names(source: str, expected: set[str]) -> None:
    p = program(source)
    assert set(p.qualnames(last_expression(p))) == expected


def expression_in(p: Program, marker: str) -> ast.expr:
    """The attribute expression ending in `marker` (there is exactly one in these programs)."""
    found = [n for n in ast.walk(p.tree) if isinstance(n, ast.Attribute) and n.attr == marker]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os\ndef f(m=os):\n    return m.target", {"os.target", "m.target"}),
        ("import os\ndef f(m=os):\n    pass\nm.target", {"m.target"}),
        ("import os, json\nx = os\ndef f():\n    x = json\n    return x.target", {"json.target", "x.target"}),
        ("import os\nx = os\ndef f():\n    return x.target", {"os.target", "x.target"}),
        ("import os\ndef f():\n    global x\n    x = os\nx.target", {"os.target", "x.target"}),
        (
            "import os\ndef f():\n    x = 1\n    def g():\n        nonlocal x\n        x = os\n    return x.target",
            {"int.target", "os.target", "x.target"},
        ),
        ("import os\nms = [m for m in (os,)]\nm.target", {"m.target"}),
        ("import os\nms = [m.target for m in (os,)]", {"os.target", "m.target"}),
        ("import os\nys = [(y := os) for _ in args]\ny.target", {"os.target", "y.target"}),
        ("import os\nclass C:\n    x = os\n    def f(self):\n        return x.target", {"x.target"}),
        ("import os\nclass C:\n    x = os\n    y = x.target", {"os.target", "x.target"}),
        ("import os\nf = lambda m=os: m.target", {"os.target", "m.target"}),
    ],
)
def test_names_follow_python_scopes(source: str, expected: set[str]) -> None:
    p = program(source)
    assert set(p.qualnames(expression_in(p, "target"))) == expected


def test_names_bound_only_by_imports_do_not_resolve_to_themselves() -> None:
    p = program("import json as os\nos.loads")
    assert p.qualnames(last_expression(p)) == ("json.loads",)


def test_calls_are_indexed_by_resolved_callee() -> None:
    p = program("import os as o\ng = getattr\no.system('x')\ng(o, 'sep')\n")
    assert [c.lineno for c in p.calls["os.system"]] == [3]
    assert [c.lineno for c in p.calls["getattr"]] == [4]


def test_alias_cycles_terminate() -> None:
    p = program("a = b\nb = a\na.x")
    assert set(p.qualnames(last_expression(p))) == {"a.x", "b.x"}


def test_long_alias_chains_do_not_recurse() -> None:
    source = "import os\na0 = os\n" + "".join(f"a{i + 1} = a{i}\n" for i in range(3000)) + "a3000.system\n"
    p = program(source)
    assert "os.system" in p.qualnames(last_expression(p))


def test_qualified_names_are_capped() -> None:
    source = "".join(f"import m{i} as x\n" for i in range(40)) + "x.y\n"
    p = program(source)
    assert len(p.qualnames(last_expression(p))) == 16


@pytest.mark.parametrize(
    ("source", "attribute", "via"),
    [
        ("x.__class__", "__class__", "attribute"),
        ("getattr(x, '__class__')", "__class__", "getattr"),
        ("setattr(x, 'f_back', 1)", "f_back", "setattr"),
        ("hasattr(x, 'gi_frame')", "gi_frame", "hasattr"),
        ("import operator\noperator.attrgetter('a.__dict__')(x)", "__dict__", "operator.attrgetter"),
        ("from operator import methodcaller\nmethodcaller('mro')", "mro", "operator.methodcaller"),
        ("'{0.__globals__}'.format(x)", "__globals__", "format string"),
        ("'{a[0].f_locals}'.format_map(m)", "f_locals", "format string"),
        ("str.format('{0.tb_frame}', x)", "tb_frame", "format string"),
        ("'{0:{1.co_code}}'.format(1, x)", "co_code", "format string"),
        ("t = '{0.gi_code}'\nt.format(x)", "gi_code", "format string"),
        ("match x:\n    case C(__dict__=d):\n        pass", "__dict__", "match pattern"),
        ("getattr(x, '\uff4d\uff52\uff4f')", "mro", "getattr"),  # fullwidth "mro"
    ],
)
def test_attribute_reads_without_attribute_nodes(source: str, attribute: str, via: str) -> None:
    p = program(source)
    assert attribute in p.attributes, sorted(p.attributes)
    assert via in {fact.via for fact in p.attributes[attribute]}


def test_string_contents_and_comments_are_not_facts() -> None:
    p = program("# x.__class__ os.system\ns = 'x.__class__ {0.__class__}'\nt = f'{s}'\n")
    assert "__class__" not in p.attributes
    assert not p.imports
    assert "os.system" not in p.refs


@pytest.mark.parametrize(
    ("field", "attributes"),
    [
        ("0", []),
        ("0.a", ["a"]),
        ("name.a.b", ["a", "b"]),
        ("0[1].a", ["a"]),
        ("0[x.y].z", ["z"]),
        ("0.a[1].b[2]", ["a", "b"]),
        ("0[unterminated", []),
        ("0.", [""]),
    ],
)
def test_format_field_attributes(field: str, attributes: list[str]) -> None:
    assert list(format_field_attributes(field)) == attributes


def test_imports_including_dynamic_ones() -> None:
    p = program("import a.b as c, d\nfrom .. import e\nfrom f.g import h\nfrom j import *\n__import__('i')\n")
    facts = [(f.module, f.names, f.via) for f in p.imports]
    assert facts == [
        ("a.b", (), "import"),
        ("d", (), "import"),
        ("..", ("e",), "from"),
        ("f.g", ("h",), "from"),
        ("j", ("*",), "from"),
        ("i", (), "__import__"),
    ]


def test_depth_limit_records_the_first_deep_node() -> None:
    p = Program("x = " + "-" * 50 + "1", ast.parse("x = " + "-" * 50 + "1"), max_depth=20)
    assert p.too_deep is not None
    shallow = program("x = -1")
    assert shallow.too_deep is None


def test_columns_and_constructs() -> None:
    p = program("é = x.__class__\n")
    node = p.attributes["__class__"][0].node
    assert p.column(1, getattr(node, "col_offset", 0)) == 5
    assert p.construct(node) == "x.__class__"
