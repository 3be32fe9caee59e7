"""The OpenAI Agents SDK: sandforge's tools as ``FunctionTool`` objects (``pip install 'sandforge[openai-agents]'``).

:func:`function_tools` gives the code-execution tool (``run_code``) and one function tool per role method,
each with its JSON Schema as ``params_json_schema`` (typed from the contract's ``inputs``), for any
``agents.Agent(tools=...)``. A schema the SDK's strict mode accepts (every property required, no open object)
is declared strict.

A failure is what the SDK expects of a tool the model may correct: the tool returns the error, with the
policy's fix, as its output (an exception would end the run), and the model reads it on its next turn.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents import FunctionTool, Tool
from agents.tool_context import ToolContext

from sandforge.integrations.core import SandforgeTools, ToolAnswer, ToolSpec

__all__ = ["function_tools"]


def _strict(schema: dict[str, Any]) -> bool:
    """Does the SDK's strict mode hold the schema as it is (all required, no property an open object)?"""
    properties: dict[str, Any] = schema.get("properties", {})
    closed = all(p.get("type") != "object" and "type" in p for p in properties.values())
    return closed and set(schema.get("required", [])) == set(properties)


def _tool(forge: SandforgeTools, spec: ToolSpec) -> FunctionTool:
    async def invoke(ctx: ToolContext[Any], arguments: str) -> str:
        try:
            parsed = json.loads(arguments or "{}")
        except (ValueError, RecursionError) as exc:  # nested too deep: an answer too, never an exception
            parsed = f"the arguments are not JSON: {exc}"
        if not isinstance(parsed, dict):
            bad = parsed if isinstance(parsed, str) else "the arguments must be a JSON object"
            return ToolAnswer(ok=False, error_type="invalid_arguments", message=bad).text
        answer = await asyncio.to_thread(forge.use, spec.name, parsed)  # a sandbox run blocks: off the loop
        return answer.text

    return FunctionTool(name=spec.name, description=spec.description, params_json_schema=spec.schema,
                        on_invoke_tool=invoke, strict_json_schema=_strict(spec.schema))  # fmt: skip


def function_tools(forge: SandforgeTools) -> list[Tool]:
    """``run_code`` and the workspace's role methods as function tools of the OpenAI Agents SDK."""
    return [_tool(forge, spec) for spec in forge.specs()]
