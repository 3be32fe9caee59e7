"""An in-memory sandbox for fast lifecycle unit tests (like httpx's MockTransport): it runs nothing.

Each program the lifecycle sends is looked up by its exact code in a table of handlers, which answer
the :class:`ExecutionRequest` (and may use the attempt's bridge for nested calls, as a running program
would). It has :class:`sandforge.sandbox.Sandbox`'s ``execute`` signature (``runtime.gate.SandboxPort``).
Only unit tests of the call loop use it; every acceptance test runs on real sandboxes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue

from sandforge.sandbox import BridgeHandler, ErrorType, ExecutionOutcome, ExecutionRequest
from sandforge.sandbox.config import BackendName

Handler = Callable[[ExecutionRequest, BridgeHandler | None], ExecutionOutcome]


def context_of(request: ExecutionRequest) -> dict[str, Any]:
    """The context the program would see, decoded."""
    return request.context.to_dict()


def returns(value: JsonValue, **context: JsonValue) -> Handler:
    """A program that returns ``value`` and sets the given context keys (the others stay as they were)."""

    def run(request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        new = context_of(request)
        new.update(context)
        return ExecutionOutcome(status="ok", value=value, context=new, backend="memory")

    return run


def raises(exception: str, message: str) -> Handler:
    """A program that raised ``exception`` (the execution-repair lane)."""

    def run(request: ExecutionRequest, bridge: BridgeHandler | None) -> ExecutionOutcome:
        return ExecutionOutcome.failure(
            ErrorType.EXECUTION, message, retriable=False, backend="memory", metadata={"exception": exception}
        )

    return run


@dataclass
class MemorySandbox:
    programs: dict[str, Handler]
    requests: list[ExecutionRequest] = field(default_factory=list)

    def execute(
        self, request: ExecutionRequest, *, backend: BackendName | None = None, bridge: BridgeHandler | None = None
    ) -> ExecutionOutcome:
        self.requests.append(request)
        handler = self.programs.get(request.code)
        if handler is None:
            return ExecutionOutcome.failure(
                ErrorType.SANDBOX_UNAVAILABLE, "the memory sandbox has no such program", backend="memory"
            )
        return handler(request, bridge)

    def ran(self) -> list[str]:
        return [r.code for r in self.requests]
