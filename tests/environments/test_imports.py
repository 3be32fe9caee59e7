"""Undeclared third-party imports (the guardrail's pieces) and the prompt note."""

from __future__ import annotations

from sandforge.runtime.environments.imports import (
    declare_hint,
    imported_top_level,
    prompt_note,
    third_party,
    undeclared_imports,
)
from sandforge.runtime.environments.policy import DependencyPolicy

PROGRAM = """
from __future__ import annotations
import json, xml.etree.ElementTree as ET
from dateutil import parser
import bs4.element
from . import sibling
def inner():
    import yaml
return parser.parse(args[0])
"""
PROVIDES = {"python-dateutil": ("dateutil",), "beautifulsoup4": ("bs4",), "soupsieve": ("soupsieve",)}


def test_imports_are_found_everywhere_in_the_program_in_source_order() -> None:
    assert imported_top_level(PROGRAM) == ["json", "xml", "dateutil", "bs4", "yaml"]
    assert third_party(imported_top_level(PROGRAM)) == ["dateutil", "bs4", "yaml"]
    assert imported_top_level("def broken(:\n") == []


def test_an_import_no_declared_distribution_provides_is_reported() -> None:
    assert undeclared_imports(PROGRAM, PROVIDES) == ["yaml"]
    assert undeclared_imports(PROGRAM, {}) == ["dateutil", "bs4", "yaml"]
    assert undeclared_imports("import json\nreturn 1\n", {}) == []


def test_the_hint_and_the_prompt_name_what_the_policy_allows() -> None:
    policy = DependencyPolicy(allow=("pyyaml", "requests"), block=())
    hint = declare_hint(["yaml"], policy)
    assert "imports yaml" in hint and "# /// script" in hint and "pyyaml" in hint and "requests" not in hint
    assert "pyyaml" in prompt_note(policy) and "requests" not in prompt_note(policy).split("HTTP")[0]
    assert "only the standard library" in prompt_note(DependencyPolicy())
