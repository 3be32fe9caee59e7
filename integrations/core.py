"""What every framework adapter shares: run a program in sandforge, and call a workspace's role methods.

The adapters (``smolagents``, ``langchain``, ``openai_agents``, ``pydantic_ai``) are thin: each turns a
:class:`SandforgeTools` into its framework's tool objects and a :class:`ToolAnswer` into what that framework
shows its model. Nothing here imports a framework.

- :meth:`SandforgeTools.run_code` validates a program body with the workspace's policy and runs it in the
  workspace's sandbox (``runtime/agent/program_exec.py``, as ``sandforge exec``). Its nested
  ``tool(role).method(...)`` calls are the workspace's role methods; ``host_tools`` adds functions of the
  framework's own (smolagents' tools) under names of their own. ``context`` persists between runs: it is
  committed when a run succeeds, as a tool's state is.
- :meth:`SandforgeTools.methods` lists the role methods (the workspace's contracts and the ToolStore's
  tools), each with a JSON Schema for its arguments built from its contract's typed ``inputs``
  (``runtime.agent.contracts.input_schema``, the schema MCP clients see); :meth:`SandforgeTools.call` runs
  one through the lifecycle, so a healthy stored program is reused and no model is asked.

A failure is never an exception: it is a :class:`ToolAnswer` whose text names the error and, for a refused
program, the fix the policy asks for (each violation's ``required_correction``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from sandforge.runtime.agent.contracts import (
    InvalidContract,
    Parameter,
    arguments_problem,
    input_schema,
    method_description,
    method_parameters,
    positional_arguments,
)
from sandforge.runtime.agent.egress import StandaloneBridge
from sandforge.runtime.agent.outcome import Outcome
from sandforge.runtime.agent.program_exec import execute_program
from sandforge.runtime.agent.runs import RunClock, run_record
from sandforge.runtime.agent.workspace import Workspace
from sandforge.runtime.errors import SandforgeError
from sandforge.runtime.service.scrub import Scrubber, host_prefixes
from sandforge.runtime.store.models import ToolContract
from sandforge.sandbox import ExecutionOutcome, ExecutionRequest
from sandforge.sandbox.protocol import BridgeReply, CallFrame

__all__ = ["RUN_CODE", "HostTool", "RoleMethod", "SandforgeTools", "ToolAnswer", "ToolSpec", "tool_name"]

#: A function of the framework's own a program may call by name (``tool(name).METHOD(...)``): it gets the
#: call's method, positional and keyword arguments (JSON values) and answers a JSON value, or
#: raises to answer an error the program sees.
HostTool = Callable[[str, list[JsonValue], dict[str, JsonValue]], JsonValue]

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_MAX_NAME = 64  # OpenAI's function names (and so the frameworks' tool names): ^[A-Za-z0-9_-]{1,64}$
_MAX_TEXT = 4000
#: a host tool's error message loses the host's directories (as the service's responses do)
_SCRUB = Scrubber(host_prefixes())

RUN_CODE_DESCRIPTION = """\
Run a Python program in a sandforge sandbox (validated by a policy first; nothing runs if it is refused).
The program is the BODY of a function: `return` gives the result, print() output is returned too.
In scope: `context` (a dict that persists between runs, saved only when a run succeeds), `args`, `kwargs`.
Call a tool from the program with tool("ROLE").METHOD(...); it returns an outcome with .ok, .value,
.error_type and .error_message. A refused program comes back with the fix to apply: change the program
as it says and run it again."""


#: The code-execution tool's name and argument schema (the same in every framework).
RUN_CODE = "run_code"
RUN_CODE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "the program: the body of a function"}},
    "required": ["code"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class ToolSpec:
    """One tool as every framework declares it: a name, what the model reads, a JSON Schema of its arguments
    (the adapter's own copy: a framework may rewrite it, as the OpenAI Agents SDK's strict mode does)."""

    name: str
    description: str
    schema: dict[str, Any]


class ToolAnswer(BaseModel):
    """What one use of a sandforge tool answers the framework's model: a value, or an error and its fix."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    value: JsonValue = None
    stdout: str = ""
    error_type: str | None = None
    message: str | None = None
    #: what the policy asks to change (a refused program's violations' ``required_correction``)
    fixes: list[str] = Field(default_factory=list)
    #: where a role method's program came from (``persisted``: a stored tool reused, no model asked)
    program_source: str | None = None

    @property
    def text(self) -> str:
        """The answer as the model reads it: the value as JSON (after the program's output), or one
        ``error [type]: message`` line followed by a ``fix:`` line per correction."""
        if self.ok:
            value = json.dumps(self.value, ensure_ascii=False)
            return _bounded(f"{self.stdout.rstrip()}\n{value}" if self.stdout.strip() else value)
        lines = [f"error [{self.error_type or 'execution'}]: {self.message or self.error_type or 'failed'}"]
        lines += [f"fix: {fix}" for fix in self.fixes]
        if self.stdout.strip():
            lines.append(f"output before the error:\n{self.stdout.rstrip()}")
        return _bounded("\n".join(lines))

    @property
    def recoverable(self) -> bool:
        """A refusal the model can fix itself (the policy named a correction, or the arguments were wrong)."""
        return not self.ok and (bool(self.fixes) or self.error_type == "invalid_arguments")


def _bounded(text: str) -> str:
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 30] + "\n[... truncated by sandforge]"


def _fixes(metadata: Mapping[str, Any]) -> list[str]:
    found = metadata.get("violations")
    fixes: list[str] = []
    for v in found if isinstance(found, list) else []:
        if isinstance(v, dict):
            fix = v.get("required_correction") or v.get("fix") or v.get("message")
            if isinstance(fix, str) and fix and fix not in fixes:
                fixes.append(fix)
    return fixes


def execution_answer(outcome: ExecutionOutcome) -> ToolAnswer:
    """A program run's outcome as an answer (the violations' fixes when the policy refused it)."""
    if outcome.ok:
        return ToolAnswer(ok=True, value=outcome.value, stdout=outcome.stdout)
    error_type = outcome.error_type.value if outcome.error_type else "execution"
    return ToolAnswer(ok=False, error_type=error_type, message=outcome.error_message, stdout=outcome.stdout,
                      fixes=_fixes(outcome.metadata))  # fmt: skip


def outcome_answer(outcome: Outcome) -> ToolAnswer:
    """A role method's outcome as an answer."""
    source = outcome.metadata.get("program_source")
    program_source = str(source) if source is not None else None
    if outcome.ok:
        return ToolAnswer(ok=True, value=outcome.value, program_source=program_source)
    return ToolAnswer(ok=False, error_type=outcome.error_type, message=outcome.error_message,
                      fixes=_fixes(outcome.metadata), program_source=program_source)  # fmt: skip


def tool_name(role: str, method: str, taken: Collection[str] = ()) -> str:
    """A framework-safe tool name for ``role.method``: ``role__method`` when it is one and says which pair it
    is, else a slug with a digest (``[A-Za-z0-9_-]``, at most 64 characters, not in ``taken``). A ``__`` in
    either part would make ``a__b__c`` name ``a.b__c`` or ``a__b.c`` depending on which is listed first, so a
    role stored later could take over a name the model already uses."""
    plain = f"{role}__{method}"
    one_split = "__" not in role and "__" not in method and not role.endswith("_") and not method.startswith("_")
    if one_split and len(plain) <= _MAX_NAME and not _NAME_UNSAFE.search(plain) and plain not in taken:
        return plain
    digest = hashlib.sha256(f"{role}\0{method}".encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{_NAME_UNSAFE.sub('_', plain).strip('_')[: _MAX_NAME - 11] or 'tool'}-{digest}"


@dataclass(frozen=True)
class RoleMethod:
    """One role method offered as a framework tool: its name there, what the model reads, its arguments."""

    name: str
    role: str
    method: str
    contract: ToolContract
    parameters: list[Parameter] | None

    @property
    def schema(self) -> dict[str, Any]:
        """The arguments as one JSON Schema object (typed parameters, or ``{args, kwargs}``)."""
        return input_schema(self.parameters)

    @property
    def description(self) -> str:
        headline = f"{self.role}.{self.method}: a sandforge tool (its program runs sandboxed; a stored one is reused)."
        return method_description(headline, self.contract, typed=self.parameters is not None)

    def arguments(self, given: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]] | str:
        """The call's positional and keyword arguments, or why ``given`` does not fit :attr:`schema`."""
        named = dict(given)
        problem = arguments_problem(self.schema, named)
        if problem is not None:
            return problem
        if self.parameters is not None:
            return positional_arguments(self.parameters, named), {}
        return list(named.get("args") or []), dict(named.get("kwargs") or {})


def _host_reply(name: str, host: HostTool, frame: CallFrame) -> BridgeReply:
    """A host tool's answer to a nested call. Its failure is an error outcome the program (and so the model)
    reads: one line, the host's directories scrubbed (``<host>``), never a traceback or a value's repr."""
    try:
        value = host(frame.method, list(frame.args), dict(frame.kwargs))
    except Exception as exc:  # the framework's tool failed: the program sees it as an error outcome
        return BridgeReply.error("tool_error", _SCRUB.text(f"{type(exc).__name__}: {exc}")[:2000])
    try:
        return BridgeReply(status="ok", value=value)
    except ValidationError:  # not JSON (an object, a cycle): the host tool's fault, said without its repr
        return BridgeReply.error("tool_error", f"the host tool {name!r} answered a value that is not JSON")


@dataclass
class _Bridge(StandaloneBridge):
    """A code run's bridge: nested calls answered by :class:`SandforgeTools`, fetches brokered as ``exec``'s."""

    answer: Callable[[CallFrame], BridgeReply]

    def __call__(self, frame: CallFrame) -> BridgeReply:
        return self.answer(frame)


class SandforgeTools:
    """A workspace offered to an agent framework: a code-execution tool and its role methods.

    ``roles`` limits the role methods offered (default: every role the workspace or its store knows);
    ``host_tools`` are the framework's own functions a program may call by name; ``context`` is the
    programs' starting state (a copy is kept and committed after each successful run)."""

    def __init__(
        self,
        workspace: Workspace,
        *,
        roles: Collection[str] | None = None,
        host_tools: Mapping[str, HostTool] | None = None,
        context: Mapping[str, JsonValue] | None = None,
    ) -> None:
        self.workspace = workspace
        self.roles = frozenset(roles) if roles is not None else None
        self.host_tools: dict[str, HostTool] = dict(host_tools or {})
        self.context: dict[str, JsonValue] = dict(context or {})
        self._runs = threading.Lock()  # runs commit ``context`` in turn (frameworks run tool calls at once)

    # --- what an adapter needs: the tools, and one entry point ---

    def specs(self) -> list[ToolSpec]:
        """The code-execution tool, then one per role method (listed afresh: a newly stored tool appears)."""
        code = ToolSpec(RUN_CODE, self.run_code_description, copy.deepcopy(RUN_CODE_SCHEMA))
        return [code, *(ToolSpec(m.name, m.description, copy.deepcopy(m.schema)) for m in self.methods())]

    def use(self, name: str, arguments: Mapping[str, Any]) -> ToolAnswer:
        """Run the tool ``name`` (one of :meth:`specs`) with the model's arguments; never raises for them."""
        if name == RUN_CODE:
            code = arguments.get("code")
            if not isinstance(code, str) or set(arguments) - {"code"}:
                return ToolAnswer(ok=False, error_type="invalid_arguments", message="run_code takes one string, code",
                                  fixes=['call run_code with {"code": "<program body>"}'])  # fmt: skip
            return self.run_code(code)
        method = next((m for m in self.methods() if m.name == name), None)
        if method is None:
            return ToolAnswer(ok=False, error_type="tool_not_found", message=f"no tool named {name!r}")
        return self.call(method, arguments)

    # --- the code-execution tool ---

    @property
    def run_code_description(self) -> str:
        """What the model reads about the code-execution tool: the program contract and the tools in reach."""
        names = [f"{m.role}.{m.method}" for m in self.methods()] + sorted(self.host_tools)
        reach = f"\nTools a program can call: {', '.join(names)}." if names else ""
        return RUN_CODE_DESCRIPTION + reach

    def run_code(self, code: str, *, args: list[JsonValue] | None = None,
                 kwargs: dict[str, JsonValue] | None = None) -> ToolAnswer:  # fmt: skip
        """Validate ``code`` (a program body) and run it; never raises for what the program or its input did."""
        ws = self.workspace
        bridge = _Bridge(StandaloneBridge.of(ws.policy).fetches, self._nested)
        with self._runs:
            try:
                request = ExecutionRequest(code=code, context=self.context, args=args or [], kwargs=kwargs or {},
                                           limits=ws.limits)  # fmt: skip
            except ValidationError as exc:
                err = exc.errors()[0]
                where = ".".join(str(p) for p in err["loc"]) or "the program"
                return ToolAnswer(ok=False, error_type="invalid_arguments", message=f"{where}: {err['msg']}")
            clock = RunClock()
            outcome, verdict = execute_program(ws.sandbox, request, policy=ws.policy, backend=ws.backend,
                                               bridge=bridge, environments=ws.environments)  # fmt: skip
            outcome = bridge.fetches.attach(outcome)
            ws.log.append(run_record(outcome, verdict, request, source="framework", clock=clock))  # failed or not
            if outcome.ok and outcome.context is not None:
                self.context = dict(outcome.context)
        return execution_answer(outcome)

    def _nested(self, frame: CallFrame) -> BridgeReply:
        """A program's ``tool(name).method(...)``: a host tool of that name, else the workspace's role."""
        name = frame.target.name
        if frame.target.kind == "delegate":  # a contract of the program's own would need the agent's transaction
            return BridgeReply.error("delegate_unavailable", f"delegate({name!r}) is not available to a run_code "
                                     "program: call tool(ROLE) for a role this workspace offers")  # fmt: skip
        host = self.host_tools.get(name)
        if host is not None:
            return _host_reply(name, host, frame)
        if not self._offers(name) or name not in self._contracts():  # offered: a role known, never a new one
            return BridgeReply.error("tool_not_found", f"no tool {name!r} is offered to this program")
        answer = self._call(name, frame.method, list(frame.args), dict(frame.kwargs))
        if answer.ok:
            return BridgeReply(status="ok", value=answer.value)
        return BridgeReply.error(answer.error_type or "execution", answer.message or "failed")

    # --- role methods ---

    def _offers(self, role: str) -> bool:
        return self.roles is None or role in self.roles

    def _contracts(self) -> dict[str, tuple[ToolContract, list[str]]]:
        """role -> (contract, stored method names): the store's tools, then the workspace's newer contracts."""
        found: dict[str, tuple[ToolContract, list[str]]] = {}
        store = self.workspace.tool_store
        for entry in store.list_tools() if store is not None else []:
            found[entry.role] = (entry.contract(), list(entry.methods))
        for role, contract in self.workspace.tools.items():
            found[role] = (contract, found.get(role, (contract, []))[1])
        return {role: held for role, held in found.items() if self._offers(role)}

    def methods(self) -> list[RoleMethod]:
        """Every role method offered: those the contract types (``inputs``) and those stored, sorted by name."""
        listed: list[RoleMethod] = []
        taken: set[str] = set()
        for role, (contract, stored) in sorted(self._contracts().items()):
            typed = list(contract.inputs) if isinstance(contract.inputs, dict) else []
            for method in dict.fromkeys([*typed, *stored]):
                try:
                    parameters = method_parameters(contract.inputs, method)
                except InvalidContract:
                    parameters = None
                name = tool_name(role, method, taken)
                taken.add(name)
                listed.append(RoleMethod(name, role, method, contract, parameters))
        return sorted(listed, key=lambda m: m.name)

    def call(self, method: RoleMethod, arguments: Mapping[str, Any]) -> ToolAnswer:
        """``role.method`` with the model's named arguments, through the lifecycle (a stored program reused)."""
        parsed = method.arguments(arguments)
        if isinstance(parsed, str):
            schema = json.dumps(method.schema, ensure_ascii=False)
            return ToolAnswer(ok=False, error_type="invalid_arguments", message=parsed,
                              fixes=[f"call {method.name} with arguments matching {schema}"])  # fmt: skip
        return self._call(method.role, method.method, *parsed)

    def _call(self, role: str, method: str, args: list[Any], kwargs: dict[str, Any]) -> ToolAnswer:
        try:
            outcome = self.workspace.call(role, method, *args, **kwargs)
        except (TypeError, ValueError, SandforgeError) as exc:  # arguments the call refuses before it starts
            return ToolAnswer(ok=False, error_type="invalid_arguments", message=str(exc).split("\n")[0][:500])
        return outcome_answer(outcome)
