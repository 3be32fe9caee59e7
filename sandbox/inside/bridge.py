"""Nested calls: ``tool(name)`` and ``delegate(role, ...)`` handles, ``Outcome``, and the frames they
exchange with the host while the program runs (a ``call`` or ``declare`` frame out, a ``call_result``
back, synchronously).
"""

from __future__ import annotations

import functools
import json
import signal
from typing import Any

from .channel import Channel, close_fds, read_bytes_frame, read_frame, write_frame
from .handing import given, received
from .lazycontext import NotJson, check_json, dump_json, encode
from .wire import MAX_CONTRACT_FIELD_CHARS, MAX_PURPOSE_CHARS
from .world import check_inner_wall

#: The runner's own wall-clock backstop: SIGALRM (default action: terminate) this long after the host's
#: deadline, paused while a nested call is answered. The host kills at its deadline; this only matters when
#: the host cannot (killed, hung).
BACKSTOP_GRACE_S = 2.0
#: What the backstop timer needs from ``signal`` after it is forgotten (``world.forget_lockdown_modules``).
_SETITIMER, _ITIMER_REAL = signal.setitimer, signal.ITIMER_REAL


class ToolOutcome:
    """``Outcome.ok(value)`` / ``Outcome.error(type, message, retriable=...)`` returned by a program."""

    __slots__ = ("error_message", "error_type", "retriable", "status", "value")

    def __init__(self, status: str, value: Any, error_type: Any, error_message: Any, retriable: bool) -> None:
        self.status, self.value, self.retriable = status, value, bool(retriable)
        self.error_type = None if error_type is None else str(error_type)[:200]
        self.error_message = None if error_message is None else str(error_message)[:4096]

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ToolOutcome:
        return cls(
            "ok" if data.get("status") == "ok" else "error",
            data.get("value"),
            data.get("error_type"),
            data.get("error_message"),
            bool(data.get("retriable")),
        )

    def __repr__(self) -> str:
        if self.ok:
            return f"Outcome.ok({self.value!r})"
        return f"Outcome.error({self.error_type!r}, {self.error_message!r})"


class OutcomeFactory:
    """What programs see as ``Outcome``."""

    @staticmethod
    def ok(value: Any = None) -> ToolOutcome:
        return ToolOutcome("ok", value, None, None, False)

    @staticmethod
    def error(error_type: str, message: str = "", retriable: bool = False) -> ToolOutcome:
        return ToolOutcome("error", None, error_type, message, retriable)


class Bridge:
    """Nested dynamic calls: a ``call`` frame out, a ``call_result`` frame back, synchronously."""

    def __init__(self, channel: int | Channel, out_fd: int, max_bytes: int) -> None:
        self.channel, self.out_fd, self.max_bytes = channel, out_fd, max_bytes
        self.next_id = 0
        self.next_declare_id = 0
        self.next_fetch_id = 0
        self.fetch_receipt: str | None = None  # the last fetch_result's, echoed by the next fetch frame

    def fetch(self, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """One brokered request (``fetching.send``): a ``fetch`` frame out, a ``fetch_result`` frame back,
        followed, for a response, by its body as one raw frame of exactly ``body_bytes`` bytes. Time spent
        is the execution's (the host charges it: the backstop keeps running)."""
        check_inner_wall()
        fetch_id, self.next_fetch_id = self.next_fetch_id, self.next_fetch_id + 1
        frame: dict[str, Any] = {"type": "fetch", "id": fetch_id, "request": request}
        if self.fetch_receipt is not None:
            frame["receipt"] = self.fetch_receipt
        write_frame(self.out_fd, frame)
        reply = read_frame(self.channel, self.max_bytes)
        self._no_descriptors("a fetch's reply")
        if reply.get("type") != "fetch_result" or reply.get("id") != fetch_id:
            raise RuntimeError("host sent an unexpected reply to a fetch")
        receipt = reply.get("receipt")
        self.fetch_receipt = receipt if isinstance(receipt, str) else None
        body = b""
        response = reply.get("response")
        if isinstance(response, dict):
            size = response.get("body_bytes")
            body = read_bytes_frame(self.channel, self.max_bytes)
            self._no_descriptors("a fetch's body")
            if type(size) is not int or len(body) != size:
                raise RuntimeError("host sent a fetch body of another length than announced")
        check_inner_wall()
        return reply, body

    def _no_descriptors(self, what: str) -> None:
        if isinstance(self.channel, Channel) and (self.channel.fds or self.channel.truncated):
            close_fds(self.channel.take_fds()[0])
            raise RuntimeError(f"host passed descriptors with {what}")

    def call(self, target: dict[str, Any], method: str, args: list[Any], kwargs: dict[str, Any],
             files: dict[str, str] | None = None) -> ToolOutcome:  # fmt: skip
        """One nested call; ``files`` (name -> base64: ``handing.given``) become the callee's ``inputs/``, and
        the outputs of a callee that committed are written into ``outputs/`` (``handing.received``)."""
        check_inner_wall()
        check_json(args, "nested call arguments")
        check_json(kwargs, "nested call arguments")
        call_id, self.next_id = self.next_id, self.next_id + 1
        frame = {"type": "call", "id": call_id, "target": target, "method": method, "args": args, "kwargs": kwargs}
        if files is not None:  # call_with_files, even handing none: the callee's outputs come back
            frame["files"] = files
        body = encode(frame)
        left = pause_backstop()  # the host does not charge nested calls to this one's deadline
        write_frame(self.out_fd, body)
        reply = read_frame(self.channel, self.max_bytes)
        resume_backstop(left)
        if isinstance(self.channel, Channel) and (self.channel.fds or self.channel.truncated):
            close_fds(self.channel.take_fds()[0])
            raise RuntimeError("host passed descriptors with a nested call's reply")
        if reply.get("type") != "call_result" or reply.get("id") != call_id:
            raise RuntimeError("host sent an unexpected reply to a nested call")
        outcome = reply.get("outcome")
        check_inner_wall()
        result = ToolOutcome.from_wire(outcome if isinstance(outcome, dict) else {})
        if result.ok and isinstance(outcome, dict):
            received(outcome.get("files"))
        return result

    def declare(self, target: dict[str, Any]) -> ToolOutcome:
        """Stage a ``delegate(...)`` contract with this attempt (a ``declare`` frame, answered like a call).
        Declarations are numbered on their own: nested calls keep their consecutive ids."""
        check_inner_wall()
        call_id, self.next_declare_id = self.next_declare_id, self.next_declare_id + 1
        write_frame(self.out_fd, {"type": "declare", "id": call_id, "target": target})
        reply = read_frame(self.channel, self.max_bytes)
        if isinstance(self.channel, Channel) and (self.channel.fds or self.channel.truncated):
            close_fds(self.channel.take_fds()[0])
            raise RuntimeError("host passed descriptors with a declaration's reply")
        if reply.get("type") != "call_result" or reply.get("id") != call_id:
            raise RuntimeError("host sent an unexpected reply to a declaration")
        outcome = reply.get("outcome")
        check_inner_wall()
        return ToolOutcome.from_wire(outcome if isinstance(outcome, dict) else {})


class InvalidContract(TypeError):
    """``delegate(...)`` got a contract the runtime cannot accept (not JSON, too long, refused by the host)."""


def delegate_target(
    role: Any, purpose: Any = None, deliverable: Any = None, acceptance: Any = None, failure_policy: Any = None,
    files: Any = None,
) -> dict[str, Any]:  # fmt: skip
    """The wire target of ``delegate(...)``; InvalidContract for a field that is not JSON or too long."""
    if purpose is not None and not isinstance(purpose, str):
        raise InvalidContract(f"delegate(): purpose must be a string, not {type(purpose).__name__}")
    if purpose is not None and len(purpose) > MAX_PURPOSE_CHARS:
        raise InvalidContract(f"delegate(): purpose is longer than {MAX_PURPOSE_CHARS} characters")
    target = {"kind": "delegate", "name": str(role), "purpose": purpose}
    fields = [("deliverable", deliverable), ("acceptance", acceptance), ("failure_policy", failure_policy)]
    for name, value in fields if files is None else [*fields, ("files", files)]:  # files: only when declared
        try:
            dump_json(value, f"delegate() {name}")
        except NotJson as exc:
            raise InvalidContract(
                f"{exc}; contract fields are JSON values (dict with str keys, list, str, int, float, bool, None)"
            ) from None
        if value is not None and len(json.dumps(value, ensure_ascii=False)) > MAX_CONTRACT_FIELD_CHARS:
            raise InvalidContract(f"delegate(): {name} is longer than {MAX_CONTRACT_FIELD_CHARS} characters of JSON")
        target[name] = value
    return target


def delegate(bridge: Bridge, role: Any, *contract: Any, **fields: Any) -> ToolHandle:
    """``delegate(role, purpose=..., ...)``: declare the contract (staged with the attempt), return a handle."""
    target = delegate_target(role, *contract, **fields)
    reply = bridge.declare(target)
    if not reply.ok:
        raise InvalidContract(f"delegate({target['name']!r}): {reply.error_message or reply.error_type}")
    return ToolHandle(bridge, target)


class ToolHandle:
    """What ``tool(name)`` and ``delegate(role, ...)`` return: every public method is a nested call."""

    __slots__ = ("_bridge", "_target")
    _bridge: Bridge
    _target: dict[str, Any]

    def __init__(self, bridge: Bridge, target: dict[str, Any]) -> None:
        object.__setattr__(self, "_bridge", bridge)
        object.__setattr__(self, "_target", target)

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        bridge, target = self._bridge, self._target
        if method == "call_with_files":
            return functools.partial(_call_with_files, bridge, target)

        def invoke(*args: Any, **kwargs: Any) -> ToolOutcome:
            return bridge.call(target, method, list(args), kwargs)

        invoke.__name__ = method
        return invoke

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("tool handles are read-only; define behaviour in the tool, not on its handle")

    def __repr__(self) -> str:
        return f"<tool {self._target.get('name')!r}>"


def _call_with_files(bridge: Bridge, target: dict[str, Any], method: Any, files: Any, /, *args: Any,
                     **kwargs: Any) -> ToolOutcome:  # fmt: skip
    """``handle.call_with_files(method, files, *args, **kwargs)``: the call, handed ``files`` (``handing``)."""
    if type(method) is not str or not method or method.startswith("_"):
        raise TypeError("call_with_files(method, files, ...): method is the name of a tool method")
    return bridge.call(target, method, list(args), kwargs, files=given(files, bridge.max_bytes // 2))


def pause_backstop() -> float:
    """Stop the wall-clock backstop (while the host answers a nested call); returns the seconds left."""
    left, _ = _SETITIMER(_ITIMER_REAL, 0)
    return left


def resume_backstop(left: float) -> None:
    if left > 0:
        _SETITIMER(_ITIMER_REAL, left)
