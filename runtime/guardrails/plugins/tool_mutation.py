"""Delegated tool objects are the host's; a program calls them, it does not reshape them."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field

from sandforge.runtime.guardrails.plugins import register
from sandforge.runtime.guardrails.program import Finding, Program

MUTATORS = ("setattr", "delattr", "object.__setattr__", "object.__delattr__")


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    factories: list[str] = Field(default_factory=lambda: ["tool", "delegate"], min_length=1)


@register("delegated_tool_mutation", options=Options, fields=("target",))
def delegated_tool_mutation(program: Program, options: Options) -> Iterator[Finding]:
    """Assigning, replacing or deleting attributes of an object returned by ``tool(...)`` or
    ``delegate(...)``, directly or through a name bound to it: ``t = tool("x"); t.fetch = f``,
    ``del t.cache``, ``t.fetch.retries = 3``, ``setattr(t, "fetch", f)``.

    This is how a program defines singleton methods on a delegated tool. The tool's methods belong to
    its own artifact and registry entry (ADR 0012); patching them in one call changes behaviour that the
    next caller never sees, and the patch disappears when the attempt is rolled back (ADR 0016).
    """
    results = tuple(f"{factory}()" for factory in options.factories)

    def is_tool(node: ast.AST) -> bool:
        return any(q in results or q.startswith(tuple(r + "." for r in results)) for q in program.qualnames(node))

    for node in program.nodes(ast.Attribute):
        if not isinstance(node.ctx, ast.Load) and is_tool(node.value):
            yield Finding(node, {"target": program.construct(node.value)})
    for mutator in MUTATORS:
        for call in program.calls.get(mutator, ()):
            if call.args and is_tool(call.args[0]):
                yield Finding(call, {"target": program.construct(call.args[0])})
