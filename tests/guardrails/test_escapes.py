"""The default policy against the well-known sandbox-escape families, and against honest programs.

Each escape case names the rule that must fire and its classification; ADR 0016 makes every mechanism
violation recoverable (a rewrite can avoid it) and only ungranted capabilities terminal.
"""

from __future__ import annotations

import textwrap

import pytest

from sandforge.runtime.guardrails import ValidationResult, default_policy, validate


def fullwidth(ascii_text: str) -> str:
    """ASCII to FULLWIDTH LATIN letters, which NFKC folds back to ASCII as the parser does for identifiers."""
    return "".join(chr(ord(c) + 0xFEE0) for c in ascii_text)


ESCAPES: dict[str, list[tuple[str, str, str]]] = {
    # family: [(program, rule that must fire, classification of that violation)]
    "class hierarchy walk": [
        ("().__class__.__base__.__subclasses__()", "dunder_attribute", "recoverable"),
        ("type(args).__mro__[-1].__subclasses__()", "dunder_attribute", "recoverable"),
        ("classes = object.__subclasses__()", "dunder_attribute", "recoverable"),
        ("chain = int.mro()", "introspection_attribute", "recoverable"),
        ("base = getattr((), '__class__')", "dunder_attribute", "recoverable"),
    ],
    "frame and traceback walking": [
        ("g = (i for i in args)\nglobals_ = g.gi_frame.f_back.f_globals", "introspection_attribute", "recoverable"),
        (
            "try:\n    1 / 0\nexcept Exception as exc:\n    frame = exc.__traceback__.tb_frame",
            "introspection_attribute",
            "recoverable",
        ),
        ("def f():\n    yield\nb = f().gi_frame.f_builtins", "introspection_attribute", "recoverable"),
        ("code = (lambda: 0).__code__.co_code", "dunder_attribute", "recoverable"),
        ("frame = getattr(args, 'f_back')", "introspection_attribute", "recoverable"),
    ],
    "format-string attribute access": [
        ('return "{0.__class__}".format(args)', "dunder_attribute", "recoverable"),
        ('return "{x.__init__.__globals__}".format_map({"x": args})', "dunder_attribute", "recoverable"),
        ('return str.format("{0.__class__}", args)', "dunder_attribute", "recoverable"),
        ('return "{0:{1.__class__}}".format(1, args)', "dunder_attribute", "recoverable"),
        ('fmt = "{0.gi_frame}"\nreturn fmt.format(args)', "introspection_attribute", "recoverable"),
        ('return string.Formatter().vformat("{0.__class__}", [args], {})', "str_format", "recoverable"),
    ],
    # getattr/setattr/hasattr/delattr with computed names are checked by the runner's guard as they run
    # (issue 38): tests/sandbox/test_idiom_attacks.py attacks them
    "attribute readers by computed name": [
        ("import operator\nget = operator.attrgetter(args[0])", "dynamic_evaluation", "recoverable"),
        ("import operator\ncall = operator.methodcaller(args[0])", "dynamic_evaluation", "recoverable"),
    ],
    "__import__, importlib and loader tricks": [
        ("os = __import__('os')", "dunder_name", "recoverable"),
        ("os = __import__('os')", "forbidden_module", "recoverable"),
        ("m = __import__('o' + 's')", "dynamic_evaluation", "recoverable"),
        ("import importlib\nos = importlib.import_module('os')", "forbidden_module", "recoverable"),
        ("from importlib import import_module as im\nm = im(args[0])", "dynamic_evaluation", "recoverable"),
        ("os = __loader__.load_module('os')", "loader_access", "recoverable"),
        ("imp = __builtins__['__import__']", "dunder_name", "recoverable"),
        ("spec = args[0]\nspec.loader.exec_module(spec)", "loader_access", "recoverable"),
    ],
    "dangerous imports": [
        ("import os", "forbidden_module", "recoverable"),
        ("import sys\nmodules = sys.modules", "withheld_name", "recoverable"),
        ("import sys\nframe = sys._getframe(0)", "private_attribute", "recoverable"),
        ("import subprocess", "forbidden_module", "recoverable"),
        ("import subprocess", "capability_not_granted", "terminal"),
        ("import ctypes", "forbidden_module", "recoverable"),
        ("import gc", "forbidden_module", "recoverable"),
        ("import inspect", "forbidden_module", "recoverable"),
        ("import pickle", "forbidden_module", "recoverable"),
        ("import marshal", "forbidden_module", "recoverable"),
        ("import builtins", "forbidden_module", "recoverable"),
        ("import os.path as p", "forbidden_module", "recoverable"),
        ("from os import system as run\nrun('id')", "capability_not_granted", "terminal"),
        ("from subprocess import *", "forbidden_module", "recoverable"),
        ("import socket", "capability_not_granted", "terminal"),
        ("import _thread", "forbidden_module", "recoverable"),
        ("import typing\nmodules = typing.sys.modules", "module_reexport", "recoverable"),
        ("import random\nos = random._os", "private_attribute", "recoverable"),
        ("import requests", "module_not_allowed", "recoverable"),
    ],
    "breakpoint and interactive builtins": [
        ("breakpoint()", "interactive_builtin", "recoverable"),
        ("bp = breakpoint\nbp()", "interactive_builtin", "recoverable"),
        ("import pdb\npdb.set_trace()", "forbidden_module", "recoverable"),
        ("answer = input()", "interactive_builtin", "recoverable"),
    ],
    "decorators that call without a call node": [
        ("@exec\n@lambda _: 'x = 1'\ndef f():\n    pass", "decorator_call", "recoverable"),
        ("@exec\n@lambda _: 'x = 1'\ndef f():\n    pass", "dynamic_evaluation", "recoverable"),
        ("@print\nclass Loud:\n    pass", "decorator_call", "recoverable"),
        ("@args[0]\ndef f():\n    pass", "decorator_call", "recoverable"),
    ],
    "match class patterns that read attributes": [
        ("match args:\n    case object(__class__=cls):\n        pass", "dunder_attribute", "recoverable"),
        ("match args:\n    case object(gi_frame=frame):\n        pass", "introspection_attribute", "recoverable"),
        ("match args:\n    case str(format=f):\n        pass", "sandbox_restriction", "recoverable"),
        ("class P:\n    __match_args__ = ('__class__',)", "dunder_definition", "recoverable"),
    ],
    "implicit calls through special methods and metaclasses": [
        ("class A:\n    def __getattribute__(self, name):\n        return name", "dunder_definition", "recoverable"),
        ("class A:\n    def __del__(self):\n        pass", "dunder_definition", "recoverable"),
        ("class Meta(type):\n    pass", "metaclass_definition", "recoverable"),
        ("class A(metaclass=args[0]):\n    pass", "metaclass_definition", "recoverable"),
        ("A = type('A', (), {'__getattr__': print})", "dynamic_class_creation", "recoverable"),
    ],
    "dynamic evaluation and namespaces": [
        ("eval('1')", "dynamic_evaluation", "recoverable"),
        ("run = exec\nrun('x = 1')", "dynamic_evaluation", "recoverable"),
        ("code = compile('1', 'x', 'eval')", "dynamic_evaluation", "recoverable"),
        ("import builtins as b\nb.eval('1')", "dynamic_evaluation", "recoverable"),
        ("scope = globals()", "namespace_introspection", "recoverable"),
        ("v = vars(args)", "namespace_introspection", "recoverable"),
    ],
    "unicode identifiers (NFKC)": [
        (f"{fullwidth('eval')}('1')", "dynamic_evaluation", "recoverable"),
        (f"import {fullwidth('os')}", "forbidden_module", "recoverable"),
        (f"c = args.__{fullwidth('class')}__", "dunder_attribute", "recoverable"),
        (f"f = getattr(args, '{fullwidth('gi')}_frame')", "introspection_attribute", "recoverable"),
        (f"return '{{0.{fullwidth('f')}_globals}}'.format(args)", "introspection_attribute", "recoverable"),
        (f"b = {fullwidth('breakpoint')}", "interactive_builtin", "recoverable"),
    ],
    "delegated tools and context (ADR 0016)": [
        ("t = tool('summarizer')\nt.summarize = lambda text: text", "delegated_tool_mutation", "recoverable"),
        ("setattr(tool('summarizer'), 'summarize', print)", "delegated_tool_mutation", "recoverable"),
        ("d = delegate('researcher', purpose='p')\ndel d.ask", "delegated_tool_mutation", "recoverable"),
        ("t = tool('x')\nt.run.retries = 3", "delegated_tool_mutation", "recoverable"),
        ("context['tools']['f'] = lambda: 1", "callable_in_context", "recoverable"),
        ("def f():\n    pass\ncontext.update(f=f)", "callable_in_context", "recoverable"),
        ("tools = context['tools']\ntools['f'] = print", "callable_in_context", "recoverable"),
        ("context['t'] = [tool('summarizer')]", "callable_in_context", "recoverable"),
        ("class K:\n    pass\ncontext.setdefault('tools', {})['k'] = K", "callable_in_context", "recoverable"),
        ("context['gen'] = (i for i in args)", "callable_in_context", "recoverable"),
        ("import json\ncontext['json'] = json", "callable_in_context", "recoverable"),
    ],
    "ungranted capabilities": [
        ("page = tool('web_fetcher').fetch(url=args[0])", "capability_not_granted", "terminal"),
        ("import urllib.request\nurllib.request.urlopen(args[0])", "capability_not_granted", "terminal"),
        ("data = open('/etc/passwd').read()", "capability_not_granted", "terminal"),
        ("opener = open\nf = opener(args[0], 'w')", "capability_not_granted", "terminal"),
        ("import httpx", "capability_not_granted", "terminal"),
    ],
}

CASES = [
    pytest.param(source, rule, classification, id=f"{family}: {rule}: {source.splitlines()[0][:40]}")
    for family, cases in ESCAPES.items()
    for source, rule, classification in cases
]


@pytest.mark.parametrize(("source", "rule", "classification"), CASES)
def test_escape_is_rejected(source: str, rule: str, classification: str) -> None:
    result = validate(source, default_policy())
    hits = [v for v in result.violations if v.violation_type == rule]
    assert hits, f"{rule} did not fire; got {[v.violation_type for v in result.violations]}"
    assert {v.classification for v in hits} == {classification}
    assert result.verdict != "approved"
    if classification == "terminal":
        assert result.verdict == "terminal"


def test_terminal_wins_over_recoverable() -> None:
    result = validate("import os\nimport subprocess\n", default_policy())
    assert {v.classification for v in result.violations} == {"recoverable", "terminal"}
    assert result.verdict == "terminal"


def test_violation_carries_adr_0016_feedback_fields() -> None:
    result = validate("x = 1\nimport os as o\n", default_policy())
    violation = next(v for v in result.violations if v.violation_type == "forbidden_module")
    assert violation.location is not None
    assert (violation.location.line, violation.location.column) == (2, 1)
    assert violation.location.source_line == "import os as o"
    assert "os" in violation.message
    assert violation.required_correction.startswith("Remove the import of os")
    dumped = result.model_dump(mode="json")
    assert set(dumped["violations"][0]) == {
        "violation_type",
        "message",
        "location",
        "classification",
        "required_correction",
    }


def test_columns_count_characters_not_bytes() -> None:
    result = validate("é = 'ü'; x = args.__class__\n", default_policy())
    violation = next(v for v in result.violations if v.violation_type == "dunder_attribute")
    assert violation.location is not None
    assert violation.location.column == len("é = 'ü'; x = ") + 1


HONEST_PROGRAMS = {
    "rss headlines": """
        import xml.etree.ElementTree as ET
        from collections import Counter

        def clean(text):
            return " ".join((text or "").split())

        root = ET.fromstring(args[0])
        items = []
        for item in root.iter("item"):
            items.append({"title": clean(item.findtext("title")), "link": item.findtext("link")})
        context["seen"] = context.get("seen", 0) + len(items)
        return Outcome.ok({"items": items, "initials": dict(Counter(i["title"][:1] for i in items))})
    """,
    "csv statistics": """
        import csv
        import statistics

        rows = list(csv.DictReader(args[0].splitlines()))
        prices = [float(row["price"]) for row in rows if row.get("price")]
        if not prices:
            return Outcome.error("invalid_input", "no prices", retriable=False)
        return {"mean": round(statistics.mean(prices), 2), "label": f"{len(prices)} rows"}
    """,
    "classes and comparisons": """
        import functools

        @functools.total_ordering
        class Version:
            def __init__(self, text):
                self.parts = tuple(int(p) for p in text.split("."))

            def __eq__(self, other):
                return self.parts == other.parts

            def __lt__(self, other):
                return self.parts < other.parts

            @property
            def major(self):
                return self.parts[0]

        return max(Version(v) for v in args).major
    """,
    "tool delegation": """
        summarizer = tool("summarizer")
        summary = summarizer.summarize(text=args[0], max_words=kwargs.get("max_words", 50))
        context["tools"] = sorted(set(context.get("tools", [])) | {"summarizer"})
        return summary
    """,
    "comments and strings mention everything": '''
        # import os; eval(x); ().__class__.__subclasses__(); breakpoint()
        """Docstring: __import__('os').system('id'), getattr(x, name), "{0.__class__}"."""
        note = "open('/etc/passwd') and subprocess.run are not used here"
        pattern = r"__class__|gi_frame|f_globals"
        return {"note": note, "pattern": pattern}
    ''',
    "match without attribute patterns": """
        match args:
            case [first, *rest]:
                return {"first": first, "rest": len(rest)}
            case {"title": str(title)}:
                return title
            case _:
                return None
    """,
    "literal getattr and json": """
        import json

        data = json.loads(args[0])
        title = getattr(data, "title", None) or data.get("title")
        return json.dumps({"title": title}, sort_keys=True)
    """,
}


@pytest.mark.parametrize("name", list(HONEST_PROGRAMS))
def test_honest_program_is_approved(name: str) -> None:
    result: ValidationResult = validate(textwrap.dedent(HONEST_PROGRAMS[name]), default_policy())
    assert result.violations == []
    assert result.verdict == "approved"
