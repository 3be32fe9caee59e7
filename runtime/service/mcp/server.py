"""The MCP server of one tenant: six fixed tools plus every healthy persisted tool method.

Built on the official SDK's :class:`MCPServer`. The fixed tools are registered once with their input and
output schemas and annotations; the persisted methods change while the server runs (a call may forge or
retire one), so :meth:`TenantMCP.list_tools` and :meth:`TenantMCP.call_tool` read them from the tenant's
store each time. A typed failure is an ``isError`` result with the failure in its text and no structured
content (``failure_result``: valid for every client); nothing else (no traceback, no host path) leaves the
server.

Nothing of the tools' work (the agent, the store, the sandbox: ``operations``, ``persisted``) is imported
before ``initialize`` is answered: an MCP host waits for that answer, and some give up on a slow one. Over
stdio the work is imported and the tenant's store and sandbox warmed up on a thread right after the handshake
(:meth:`TenantMCP.warm_up`); whatever comes first, a call or the warm-up, builds each part once.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import inspect
import json
import logging
import re
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import anyio.to_thread
from mcp.server.caching import CacheHint
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp_types import (
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    InputRequiredResult,
    ListToolsResult,
    PaginatedRequestParams,
    ServerCapabilities,
    TextContent,
    ToolAnnotations,
)
from mcp_types import Tool as MCPTool
from pydantic import BaseModel, Field, JsonValue, ValidationError

from sandforge import __version__
from sandforge.runtime.errors import SandforgeError
from sandforge.runtime.files.media import shown_as_image
from sandforge.runtime.names import valid_role
from sandforge.runtime.service.audit import note
from sandforge.runtime.service.mcp.changes import POLL_S, ToolListWatch, declare_list_changed
from sandforge.runtime.service.mcp.models import (
    CallOutcome,
    Failed,
    PolicyPage,
    RunResult,
    ToolDetail,
    ToolFailure,
    ToolList,
    ValidationReport,
)
from sandforge.runtime.service.mcp.tenant import TenantPort

if TYPE_CHECKING:
    from sandforge.runtime.service.mcp.persisted import Exposed

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "sandforge runs Python tool programs in disposable sandboxes after validating them against a policy. "
    "run_tool_code runs one program body (context, args, kwargs in scope; `return` gives the result); "
    "validate_code only checks it; list_tools/get_tool read the tool store; call_stored_tool calls role.method "
    "through the full lifecycle; explain_policy explains a rule. Every healthy stored tool method is also a "
    "tool of its own, named role.method."
)
#: The resource template of a role's committed context.
CONTEXT_URI = "sandforge://roles/{role}/context"
#: The resource template of a stored file (``runtime/service/uploads.py``: kept in sync there).
FILE_URI = "sandforge://files/{id}"
#: What a client sends before it uses the server (the store is not read for these).
HANDSHAKE = frozenset({"initialize", "notifications/initialized", "ping"})
_PATHS = re.compile(r"(?:/[\w.@+-]+){2,}")


def error_result(failure: ToolFailure) -> CallToolResult:
    """``failure_result.error_result``, imported with the first failure (it classifies with the store's
    failure classes, which load the store)."""
    from sandforge.runtime.service.mcp.failure_result import error_result as result

    return result(failure)


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def ok_result(model: BaseModel) -> CallToolResult:
    data = model.model_dump(mode="json")
    content: list[Any] = [TextContent(type="text", text=_text(data))]
    if isinstance(model, (RunResult, CallOutcome)):
        content += [_file_content(info.name, info.media_type, model._bytes[info.name]) for info in model.files]
    return CallToolResult(content=content, structured_content=data)


def _file_content(name: str, media_type: str, body: bytes) -> ImageContent | EmbeddedResource:
    """One output file as a content item: an image a client renders (only bytes that really are that image, and an
    SVG with nothing active: ``runtime.files.media``), or a resource (``sandforge://outputs/NAME``, a name only:
    nothing is fetched from it later)."""
    data = base64.b64encode(body).decode()
    if shown_as_image(media_type, body):
        return ImageContent(type="image", data=data, mime_type=media_type)
    contents = BlobResourceContents(uri=f"sandforge://outputs/{name}", mime_type=media_type, blob=data)
    return EmbeddedResource(type="resource", resource=contents)


def _scrub(message: str) -> str:
    """One line, no host paths: what a client may see of an unexpected refusal."""
    first = message.splitlines()[0] if message else ""
    return _PATHS.sub("<path>", first)[:500]


def _invalid(exc: ValidationError) -> ToolFailure:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "arguments"
    return ToolFailure(error_type="invalid_request", error_message=f"{where}: {err['msg']}")


def _http_state(context: Context[Any, Any] | None) -> dict[str, Any] | None:
    """The ``scope["state"]`` of the HTTP request carrying this MCP request (None over stdio): the audit
    record of that request is written from it."""
    try:
        request = context.request_context.request if context is not None else None
    except ValueError:  # no request context
        return None
    state = getattr(request, "scope", {}).get("state") if request is not None else None
    return state if isinstance(state, dict) else None


def _hearing_build(ctx: Context[Any, Any] | None, work: Callable[[], BaseModel]) -> Callable[[], BaseModel]:
    """``work`` with a first build of the program's environment reported as progress notifications."""
    from sandforge.runtime.service.progress import hearing

    progress = _build_progress(ctx)

    def heard() -> BaseModel:
        with hearing(progress):
            return work()

    return heard


def _build_progress(ctx: Context[Any, Any] | None) -> Callable[[str], None] | None:
    """Each step of an environment build as ``notifications/progress`` (the SDK sends them only when the
    request carries a ``progressToken``): the step's number as progress, no total, the step as message."""
    if ctx is None:
        return None
    from sandforge.runtime.service.progress import on_loop

    steps = iter(range(1, 1 << 30))

    async def deliver(message: str) -> None:
        with contextlib.suppress(Exception):  # a client gone, a closed stream: the run goes on
            await ctx.report_progress(next(steps), None, _scrub(message))

    return on_loop(deliver)


#: Runs one execution's blocking work (a sandbox run, a lifecycle call) and returns its result: a worker
#: thread for stdio; the service's admission (quotas, execution slots) over HTTP. It may raise Failed.
Executor = Callable[[Callable[[], BaseModel]], Awaitable[BaseModel]]


async def in_thread(work: Callable[[], BaseModel]) -> BaseModel:
    return await anyio.to_thread.run_sync(work)


def guarded(work: Callable[[], BaseModel]) -> CallToolResult:
    """Run one tool's work; every failure becomes a typed ``isError`` result."""
    return catching(work)


def catching(work: Callable[[], BaseModel]) -> CallToolResult:
    try:
        return ok_result(work())
    except Failed as exc:
        return error_result(exc.failure)
    except SandforgeError as exc:
        return error_result(ToolFailure(error_type="refused", error_message=_scrub(str(exc))))
    except ValidationError as exc:
        return error_result(_invalid(exc))
    except OSError as exc:
        log.warning("tool state could not be read or written: %s", exc)
        return error_result(ToolFailure(error_type="store_error", error_message="the tool store could not be used"))


class _Held(BaseModel):
    """A finished tool result carried back through the executor."""

    model_config = {"arbitrary_types_allowed": True}

    result: CallToolResult


class PersistedArguments(BaseModel):
    model_config = {"extra": "forbid"}

    args: list[JsonValue] = Field(default_factory=list)
    kwargs: dict[str, JsonValue] = Field(default_factory=dict)


Code = Annotated[str, Field(description="a tool program body: context, args, kwargs in scope; `return` the result")]
Args = Annotated[list[JsonValue], Field(description="positional arguments (JSON values)")]
Kwargs = Annotated[dict[str, JsonValue], Field(description="keyword arguments (JSON values)")]
Role = Annotated[str, Field(description="the tool's role, as list_tools names it")]
Method = Annotated[str, Field(description="the method name")]
InlineFiles = Annotated[dict[str, str], Field(description="input files by name, each base64: read-only as inputs/NAME")]
FileRefs = Annotated[
    dict[str, str], Field(description="input files by name, each a stored file's resource URI (sandforge://files/ID)")
]


def _annotations(title: str, *, read_only: bool, open_world: bool, destructive: bool = False) -> ToolAnnotations:
    return ToolAnnotations(
        title=title,
        read_only_hint=read_only,
        destructive_hint=None if read_only else destructive,
        idempotent_hint=read_only,
        open_world_hint=open_world,
    )


class TenantMCP(MCPServer[Any]):
    """The MCP server of one tenant (one :class:`TenantPort`)."""

    def __init__(
        self, runtime: TenantPort, *, name: str = "sandforge", executor: Executor = in_thread, poll_s: float = POLL_S
    ) -> None:
        super().__init__(
            name=name,
            version=__version__,
            instructions=INSTRUCTIONS,
            cache_hints={"tools/list": CacheHint(ttl_ms=0, scope="private")},
            log_level="WARNING",
        )
        self.runtime = runtime
        self.executor = executor
        #: tells clients when the persisted tools change (notifications/tools/list_changed)
        self.changes = ToolListWatch(self._signature, self._subscriptions, poll_s=poll_s)
        declare_list_changed(self._lowlevel_server)
        self._declare_only_served()
        self.middleware.append(self._after_handshake)
        self._register_fixed()
        self._register_context()
        #: stdio: warm the tools up once the handshake is done (``run_stdio_async``); HTTP: the service does
        self._warm_after_handshake = False
        self._warming: threading.Thread | None = None

    def _declare_only_served(self) -> None:
        """Declare ``resources`` and ``prompts`` only when there are some: the SDK declares both whenever it
        routes their methods, which it always does, and a client that sees them declared asks for lists that
        are always empty."""
        lowlevel = self._lowlevel_server
        derive = lowlevel.get_capabilities

        def capabilities(*args: Any, **kwargs: Any) -> ServerCapabilities:
            declared = derive(*args, **kwargs)
            resources = self._resource_manager.list_resources() or self._resource_manager.list_templates()
            update = {"resources": declared.resources if resources else None,
                      "prompts": declared.prompts if self._prompt_manager.list_prompts() else None}  # fmt: skip
            return declared.model_copy(update=update)

        lowlevel.get_capabilities = capabilities  # type: ignore[method-assign]

    async def _after_handshake(self, ctx: ServerRequestContext[Any], call_next: CallNext) -> HandlerResult:
        """Any message but the handshake's lets the tool-list watch read the store (ToolListWatch.watch); the
        client's ``notifications/initialized`` (or any later message) starts the warm-up."""
        if ctx.method not in HANDSHAKE:
            self.changes.used()
        if self._warm_after_handshake and ctx.method != "initialize" and self._warming is None:
            self._warming = threading.Thread(target=self.warm_up, name="sandforge-mcp-warm-up", daemon=True)
            self._warming.start()
        return await call_next(ctx)

    def warm_up(self) -> None:
        """Import the tools' work and build the tenant's parts a call uses (its store, its workspace with the
        sandbox and warm pools), so the first call does not pay for them. A part that fails to build is left
        for the call to build again and report as its typed error."""
        from sandforge.runtime.service.mcp import operations, persisted  # noqa: F401

        try:
            self._exposed()
            _ = self.runtime.workspace
        except Exception as exc:  # the call that needs the part reports it; nothing is cached
            log.info("warm-up left for the first call: %s", _scrub(str(exc)))

    def _signature(self) -> frozenset[tuple[str, ...]]:
        return frozenset(
            (name, e.role, e.method, e.entry.contract_fingerprint or "") for name, e in self._exposed().items()
        )

    async def run_stdio_async(self) -> None:
        """stdio, with the watch for changes made by other processes beside it, and the warm-up after the
        handshake."""
        self._warm_after_handshake = True
        async with anyio.create_task_group() as group:
            group.start_soon(self.changes.watch)
            await super().run_stdio_async()
            group.cancel_scope.cancel()

    async def _handle_list_tools(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        self.changes.remember(getattr(ctx, "session", None))
        return await super()._handle_list_tools(ctx, params)

    async def executing(self, work: Callable[[], BaseModel], *, store_calls: bool = True) -> CallToolResult:
        """``work`` through the executor (admission, slots); every failure a typed ``isError`` result.
        ``store_calls``: the work calls stored tools (so the list of persisted tools may change)."""

        def run() -> BaseModel:
            return _Held(result=catching(work))

        try:
            held = await self.executor(run)
        except Failed as exc:
            return error_result(exc.failure)
        assert isinstance(held, _Held)
        if store_calls:
            await self.changes.refresh()  # a call may forge, prove or degrade a stored method
        return held.result

    # --- the fixed tools ---

    def _register_fixed(self) -> None:
        rt = self.runtime
        egress = rt.egress_granted

        async def run_tool_code(  # noqa: PLR0913 - the tool's arguments, and the request's context
            code: Code,
            context: Annotated[dict[str, JsonValue], Field(description="the tool's state (JSON object)")] = {},  # noqa: B006
            args: Args = [],  # noqa: B006
            kwargs: Kwargs = {},  # noqa: B006
            timeout_s: Annotated[float | None, Field(gt=0, description="wall-clock limit, seconds")] = None,
            memory_mb: Annotated[int | None, Field(ge=32, description="memory limit, MB")] = None,
            files: InlineFiles = {},  # noqa: B006
            file_refs: FileRefs = {},  # noqa: B006
            ctx: Context[Any, Any] | None = None,
        ) -> Annotated[CallToolResult, RunResult]:
            """Validate a tool program against the tenant's policy and run it once in a fresh sandbox.

            Returns the value, the new context (not kept anywhere) and the output; the files it wrote to outputs/
            follow as content items (PNG, JPEG and SVG as images, the rest as resources). A refused or failed
            program is an error result whose error_type says why (guardrail_violation, timeout, execution, ...)."""
            from sandforge.runtime.service.mcp import operations as ops

            inputs = ops.InputFiles(files, file_refs)
            run = functools.partial(ops.run_tool_code, rt, code, context, args, kwargs, timeout_s, memory_mb, inputs)
            return await self.executing(_hearing_build(ctx, run), store_calls=False)

        def validate_code(code: Code) -> Annotated[CallToolResult, ValidationReport]:
            """The guardrail report of a tool program under the tenant's policy; nothing runs."""
            from sandforge.runtime.service.mcp import operations as ops

            return guarded(lambda: ops.validate_code(rt, code))

        def list_tools() -> Annotated[CallToolResult, ToolList]:
            """The tools in the tenant's tool store (roles, purposes, methods, usage)."""
            from sandforge.runtime.service.mcp import operations as ops

            return guarded(lambda: ops.list_tools(rt))

        def get_tool(
            role: Role, method: Annotated[str | None, Field(description="one method (adds its code)")] = None
        ) -> Annotated[CallToolResult, ToolDetail]:
            """A stored tool's contract and the health of its methods, or one method with its code."""
            from sandforge.runtime.service.mcp import operations as ops

            return guarded(lambda: ops.get_tool(rt, role, method, self._names()))

        async def call_stored_tool(
            role: Role,
            method: Method,
            args: Args = [],  # noqa: B006
            kwargs: Kwargs = {},  # noqa: B006
        ) -> Annotated[CallToolResult, CallOutcome]:
            """Call role.method(*args, **kwargs) through the full lifecycle with the tenant's provider, store and
            policy: a healthy stored artifact runs without the model; otherwise one is generated, validated,
            run and kept when it works."""
            from sandforge.runtime.service.mcp import operations as ops

            return await self.executing(lambda: ops.call_stored_tool(rt, role, method, args, kwargs))

        def explain_policy(
            name: Annotated[str, Field(description="a rule id, capability tag or violation type")],
        ) -> Annotated[CallToolResult, PolicyPage]:
            """What a policy rule (or capability, or violation type) catches, why, and what to do instead."""
            from sandforge.runtime.service.mcp import operations as ops

            return guarded(lambda: ops.explain_policy(rt, name))

        read = {"read_only": True, "open_world": False}
        write = {"read_only": False, "open_world": egress}
        for fn, title, hints in (
            (run_tool_code, "Run a tool program", write),
            (validate_code, "Validate a tool program", read),
            (list_tools, "List stored tools", read),
            (get_tool, "Show a stored tool", read),
            (call_stored_tool, "Call a stored tool", write),
            (explain_policy, "Explain a policy rule", read),
        ):
            # the docstring without its indentation: clients show descriptions as they are
            self.add_tool(fn, description=inspect.cleandoc(fn.__doc__ or ""), annotations=_annotations(title, **hints))

    # --- the committed contexts (issue 37) ---

    def _register_context(self) -> None:
        """``sandforge://roles/{role}/context``: a role's committed context, as ``GET /v1/roles/{role}/context``
        returns it (a resource, not a tool: reading it runs nothing and changes nothing)."""
        rt = self.runtime

        async def role_context(role: str) -> str:
            if not valid_role(role):
                raise ResourceNotFoundError(f"no such role: {_scrub(role)[:64]!r}")
            committed = await anyio.to_thread.run_sync(lambda: rt.state.read(role))
            return _text(committed.snapshot.to_dict())

        description = (
            "The committed context (tool state) of a role of this tenant: a JSON object, {} before its first "
            "commit. Written by the role's calls and by PUT /v1/roles/{role}/context."
        )
        title = "A role's committed context"
        register = self.resource(
            CONTEXT_URI, name="role_context", title=title, description=description, mime_type="application/json"
        )
        register(role_context)

        async def stored_file(id: str) -> bytes:
            from sandforge.runtime.service.uploads import file_id_of

            file_id = file_id_of(id)
            found = await anyio.to_thread.run_sync(lambda: rt.uploads.read(file_id)) if file_id else None
            if found is None:
                raise ResourceNotFoundError("no such stored file")
            return found[1]

        register = self.resource(
            FILE_URI, name="stored_file", title="A stored file",
            description="A file this tenant stored (POST /v1/files, or an output of POST /v1/exec); give its URI "
            "to run_tool_code's file_refs to hand it to a program as an input file.",
            mime_type="application/octet-stream",
        )  # fmt: skip
        register(stored_file)

    # --- the persisted tools ---

    def _exposed(self) -> dict[str, Exposed]:
        from sandforge.runtime.service.mcp.persisted import exposed

        try:
            return exposed(self.runtime.store, self.runtime.policy)
        except (OSError, SandforgeError) as exc:
            log.warning("the tool store could not be listed: %s", exc)
            return {}

    def _names(self) -> dict[tuple[str, str], str]:
        return {(e.role, e.method): name for name, e in self._exposed().items()}

    def _persisted_tool(self, item: Exposed) -> MCPTool:
        return MCPTool(
            name=item.name,
            title=f"{item.role}.{item.method}",
            description=item.description,
            input_schema=item.input_schema,
            output_schema=item.output_schema,
            annotations=ToolAnnotations(
                title=f"{item.role}.{item.method}",
                read_only_hint=False,
                destructive_hint=False,
                idempotent_hint=False,
                open_world_hint=self.runtime.egress_granted,
            ),
        )

    async def list_tools(self) -> list[MCPTool]:
        fixed = await super().list_tools()
        persisted = await anyio.to_thread.run_sync(self._exposed)
        return fixed + [self._persisted_tool(item) for _, item in sorted(persisted.items())]

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        from sandforge.runtime.agent.contracts import arguments_problem  # jsonschema: after the handshake
        from sandforge.runtime.service.mcp import operations as ops

        if self._tool_manager.get_tool(name) is not None:
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as exc:
                if isinstance(exc.__cause__, ValidationError):  # arguments the input schema refuses
                    return error_result(_invalid(exc.__cause__))
                raise
        item = (await anyio.to_thread.run_sync(self._exposed)).get(name)
        if item is None:  # never stored, not healthy, or another tenant's: the same answer
            return error_result(ToolFailure(error_type="unknown_tool", error_message=f"no tool named {name!r}"))
        note(_http_state(context), tool_role=item.role, tool_method=item.method)
        taken = item.take_files(arguments)  # the contract's declared input files (issue 41), when it has any
        if isinstance(taken, str):
            return error_result(ToolFailure(error_type="invalid_request", error_message=taken))
        arguments, files = taken
        typed = item.parameters
        if typed is not None:  # named arguments checked against the contract's schema, then positional again
            problem = arguments_problem(item.arguments_schema, arguments)
            if problem is not None:
                return error_result(ToolFailure(error_type="invalid_request", error_message=problem))
            args = item.positional(arguments) or []
            return await self.executing(
                lambda: ops.call_stored_tool(self.runtime, item.role, item.method, args, {}, files)
            )
        try:
            parsed = PersistedArguments.model_validate(arguments)
        except ValidationError as exc:
            return error_result(_invalid(exc))
        return await self.executing(
            lambda: ops.call_stored_tool(self.runtime, item.role, item.method, parsed.args, parsed.kwargs, files)
        )
