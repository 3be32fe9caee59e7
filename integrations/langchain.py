"""LangChain: sandforge's tools as ``StructuredTool`` objects (``pip install 'sandforge[langchain]'``).

:func:`langchain_tools` gives the code-execution tool (``run_code``) and one tool per role method, each with
its JSON Schema as ``args_schema`` (typed from the contract's ``inputs``), for any LangChain or LangGraph agent
(``model.bind_tools(tools)``, ``create_react_agent(model, tools)``).

A failure is what LangChain expects of a tool the model may correct: a ``ToolException`` the tool handles
(``handle_tool_error=True``), so the agent loop gets a ``ToolMessage`` with ``status="error"`` whose content is
the error and the policy's fix, and goes on.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool, ToolException

from sandforge.integrations.core import SandforgeTools, ToolSpec

__all__ = ["langchain_tools"]


def _tool(forge: SandforgeTools, spec: ToolSpec) -> StructuredTool:
    def run(**arguments: Any) -> str:
        answer = forge.use(spec.name, arguments)
        if not answer.ok:
            raise ToolException(answer.text)
        return answer.text

    async def arun(**arguments: Any) -> str:  # a sandbox run blocks: off the event loop
        return await asyncio.to_thread(run, **arguments)

    return StructuredTool(name=spec.name, description=spec.description, args_schema=spec.schema, func=run,
                          coroutine=arun, handle_tool_error=True)  # fmt: skip


def langchain_tools(forge: SandforgeTools) -> list[BaseTool]:
    """``run_code`` and the workspace's role methods as LangChain tools."""
    return [_tool(forge, spec) for spec in forge.specs()]
