"""pydantic-ai: sandforge's tools as a toolset (``pip install 'sandforge[pydantic-ai]'``).

:func:`sandforge_toolset` is a ``FunctionToolset`` holding the code-execution tool (``run_code``) and one tool
per role method, each declared with its JSON Schema (typed from the contract's ``inputs``), for any
``pydantic_ai.Agent(toolsets=[...])``. The role methods are read when it is built: build it per run to offer
tools stored since.

A failure is what pydantic-ai expects of a tool: one the model can correct (a refused program, wrong
arguments) raises ``ModelRetry`` with the error and the policy's fix (counted against the toolset's
``max_retries``, which pydantic-ai enforces by ending the run); any other raises ``ToolFailed``, which the
model reads and adapts to, with no retry counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic_ai import FunctionToolset, ModelRetry, Tool, ToolFailed

from sandforge.integrations.core import SandforgeTools, ToolSpec

__all__ = ["sandforge_toolset"]


def _function(forge: SandforgeTools, spec: ToolSpec) -> Callable[..., str]:
    def use(**arguments: Any) -> str:  # pydantic-ai runs a plain function on a thread: the loop never blocks
        answer = forge.use(spec.name, arguments)
        if answer.ok:
            return answer.text
        raise ModelRetry(answer.text) if answer.recoverable else ToolFailed(answer.text)

    return use


def sandforge_toolset(forge: SandforgeTools, *, max_retries: int = 3) -> FunctionToolset[Any]:
    """``run_code`` and the workspace's role methods as one pydantic-ai toolset."""
    tools = [Tool.from_schema(_function(forge, s), name=s.name, description=s.description, json_schema=s.schema)
             for s in forge.specs()]  # fmt: skip
    return FunctionToolset(tools, max_retries=max_retries)
