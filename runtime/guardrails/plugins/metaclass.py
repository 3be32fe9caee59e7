"""Metaclasses run code when classes are created and inspected, with no call in sight."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field

from sandforge.runtime.guardrails.globs import GlobSet
from sandforge.runtime.guardrails.plugins import register
from sandforge.runtime.guardrails.program import Finding, Program


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bases: list[str] = Field(
        default_factory=lambda: ["type", "abc.ABCMeta", "enum.EnumMeta", "enum.EnumType"],
        description="qualified names of metaclasses; subclassing one defines a metaclass",
    )


@register("metaclass_definition", options=Options, fields=("name",))
def metaclass_definition(program: Program, options: Options) -> Iterator[Finding]:
    """A class statement with a ``metaclass=`` keyword or ``**`` keywords, or a class that subclasses a
    metaclass such as ``type``.

    A metaclass's ``__call__``, ``__instancecheck__``, ``__getattr__`` and friends run implicitly, when
    the class is created, instantiated, used in ``isinstance``, ``except`` or a ``match`` class pattern,
    so code runs without a visible call.
    """
    bases = GlobSet(options.bases)
    for node in program.nodes(ast.ClassDef):
        keywords = any(kw.arg in ("metaclass", None) for kw in node.keywords)
        subclasses = any(bases.first_match(program.qualnames(base)) for base in node.bases)
        if keywords or subclasses:
            yield Finding(node, {"name": node.name})
