"""smolagents: a ``CodeAgent`` whose code steps run in sandforge (``pip install 'sandforge[smolagents]'``).

smolagents lets a ``CodeAgent`` take any executor implementing its ``PythonExecutor`` interface
(``send_tools``, ``send_variables``, ``__call__``), the seam its remote executors (E2B, Docker, Modal)
plug into. :class:`SandforgeExecutor` is one: each code step is validated by the workspace's policy and run
in a fresh sandbox (:meth:`SandforgeTools.run_code`). The agent's tools stay on the host: the step's program
gets a stand-in per tool that makes a nested ``tool(name)`` call, which the executor answers by calling the
real tool, so a tool never runs inside the sandbox and the program never sees more than its JSON result.
:func:`role_method_tools` offers the workspace's role methods as smolagents tools the same way.

What smolagents expects of an executor, and what this one does:

- a step that fails raises; the agent turns it into an error the model reads next step. A refused program
  raises :class:`ProgramFailed` whose text carries the policy's fix;
- ``final_answer(...)`` ends the step as the final answer (the stand-in reports it to the host, then stops
  the program);
- the value of the step's last expression is its output.

Each step runs in a fresh sandbox, so variables do not survive a step; ``context`` (a dict) does (it is
committed when a step succeeds), which :data:`INSTRUCTIONS` tells the model.
"""

from __future__ import annotations

import ast
import json
import keyword
from collections.abc import Iterable, Mapping
from typing import Any

from smolagents import CodeAgent, Model, Tool
from smolagents.local_python_executor import CodeOutput, PythonExecutor

from sandforge.integrations.core import RoleMethod, SandforgeTools
from sandforge.sandbox.inside.compilation import parse as parse_program

__all__ = ["INSTRUCTIONS", "ProgramFailed", "SandforgeExecutor", "code_agent", "role_method_tools"]

#: Added to the CodeAgent's system prompt: how a sandforge step differs from smolagents' local Python.
INSTRUCTIONS = (
    "Your code runs in a sandforge sandbox after a policy checks it. Each code step starts fresh: variables do "
    "not survive a step, but the dict `context` does (it is saved when a step succeeds), so keep what later "
    "steps need in it. A refused step comes back with the fix to apply: apply it and try again."
)

_STOP = "sandforge: final answer given"
_HELPER = f'''def sandforge_call(name, args, kwargs):
    result = tool(name).call(*args, **kwargs)
    if not result.ok:
        raise RuntimeError(f"{{result.error_type}}: {{result.error_message}}")
    return result.value
def final_answer(*args, **kwargs):
    sandforge_call("final_answer", args, kwargs)
    raise RuntimeError("{_STOP}")
'''


class ProgramFailed(Exception):
    """A code step sandforge refused or that failed: its text (error and fix) is what the model reads."""


def _json(value: Any) -> Any:
    """A tool's result as JSON (what crosses into the sandbox): anything else as its text."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


def _returning_last_expression(code: str) -> str:
    """``code`` with its last top-level expression returned (smolagents' step output), when it ends in one."""
    try:
        body = parse_program(code).body
    except SyntaxError:
        return code  # the policy reports it, with its line
    if not body or not isinstance(body[-1], ast.Expr):
        return code
    lines = code.splitlines()
    last = body[-1].lineno - 1
    line = lines[last].encode()  # the column is in UTF-8 bytes: after a `;`, the expression starts mid-line
    col = body[-1].col_offset
    lines[last] = (line[:col] + b"return " + line[col:]).decode()
    return "\n".join(lines)


#: Names a tool's stand-in must not rebind: the program's own (a tool named ``tool`` would make every call
#: recurse, one named ``context`` would drop the step's state) and the helper's.
_RESERVED = frozenset({"tool", "context", "args", "kwargs", "delegate", "sandforge_call", "final_answer"})


def _bindable(name: str) -> bool:
    """A tool name the step can use as a plain name (any other is still ``tool(name).call(...)``)."""
    return name.isidentifier() and not keyword.iskeyword(name) and name not in _RESERVED


class SandforgeExecutor(PythonExecutor):  # type: ignore[misc]  # smolagents ships no type information
    """smolagents' executor interface over :class:`SandforgeTools` (see the module docstring)."""

    def __init__(self, forge: SandforgeTools) -> None:
        self.forge = forge
        self._tools: dict[str, Tool] = {}
        self._variables: list[str] = []
        self._final: list[Any] = []

    def send_tools(self, tools: Mapping[str, Tool]) -> None:
        """The agent's tools become host tools of the same name (the program calls them through stand-ins)."""
        self._tools = dict(tools)
        for name in self._tools:
            self.forge.host_tools[name] = self._host_call(name)

    def send_variables(self, variables: Mapping[str, Any]) -> None:
        """The run's variables (``additional_args``) go into ``context``; each step binds them by name."""
        for name, value in variables.items():
            if name.isidentifier() and not name.startswith("_"):
                self.forge.context[name] = _json(value)
                self._variables.append(name)

    def _host_call(self, name: str) -> Any:
        def call(method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
            value = self._tools[name](*args, **kwargs)
            if name == "final_answer":
                self._final.append(value)
            return _json(value)

        return call

    def program(self, code_action: str) -> str:
        """The step as a sandforge program: the tools' stand-ins, the run's variables, then the step."""
        stand_ins = [f"{n} = lambda *args, **kwargs: sandforge_call({n!r}, args, kwargs)"
                     for n in self._tools if _bindable(n)]  # fmt: skip
        bound = [f"{n} = context.get({n!r})" for n in dict.fromkeys(self._variables)]
        return "\n".join([_HELPER.rstrip(), *stand_ins, *bound, _returning_last_expression(code_action)])

    def __call__(self, code_action: str) -> CodeOutput:
        self._final.clear()
        answer = self.forge.run_code(self.program(code_action))
        if self._final:
            return CodeOutput(output=self._final[-1], logs=answer.stdout, is_final_answer=True)
        if not answer.ok:
            raise ProgramFailed(answer.text)
        return CodeOutput(output=answer.value, logs=answer.stdout, is_final_answer=False)


_SMOLAGENTS_TYPES = {"string", "boolean", "integer", "number", "array", "object", "null"}


def _input(schema: Mapping[str, Any], required: bool) -> dict[str, Any]:
    kind = schema.get("type")
    entry: dict[str, Any] = {
        "type": kind if isinstance(kind, str) and kind in _SMOLAGENTS_TYPES else "any",
        "description": str(schema.get("description") or json.dumps(dict(schema), ensure_ascii=False)),
    }
    if not required:
        entry["nullable"] = True
    return entry


class RoleMethodTool(Tool):  # type: ignore[misc]  # smolagents ships no type information
    """One role method as a smolagents tool: typed inputs from its contract, run through the lifecycle."""

    skip_forward_signature_validation = True
    output_type = "any"

    def __init__(self, forge: SandforgeTools, method: RoleMethod) -> None:
        self.forge, self.method = forge, method
        self.name, self.description = method.name, method.description
        properties: Mapping[str, Any] = method.schema["properties"]
        required = set(method.schema.get("required", []))
        self.inputs = {k: _input(v, k in required) for k, v in properties.items()}
        super().__init__()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        names = list(self.method.schema["properties"])
        answer = self.forge.call(self.method, {**dict(zip(names, args, strict=False)), **kwargs})
        if not answer.ok:
            raise ProgramFailed(answer.text)
        return answer.value


def role_method_tools(forge: SandforgeTools) -> list[Tool]:
    """The workspace's role methods as smolagents tools."""
    return [RoleMethodTool(forge, m) for m in forge.methods()]


def code_agent(forge: SandforgeTools, model: Model, tools: Iterable[Tool] = (), **kwargs: Any) -> CodeAgent:
    """A ``CodeAgent`` on ``model`` whose steps run in sandforge, with ``tools`` and the role methods."""
    instructions = "\n".join(filter(None, [kwargs.pop("instructions", None), INSTRUCTIONS]))
    return CodeAgent(tools=[*tools, *role_method_tools(forge)], model=model, executor=SandforgeExecutor(forge),
                     instructions=instructions, **kwargs)  # fmt: skip
