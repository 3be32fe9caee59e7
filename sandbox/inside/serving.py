"""Serving one execution: prepare (imports, proxies, a warm compiler), lock down, report ``ready``, read the
``execute`` frame, run the program, write exactly one ``result`` (and one frame per changed context key).

Results go to a dedicated channel (``--result-fd N``, or in a container the original stdout, which the
entry point re-points at stderr before any program runs), so printing can never forge a result: ``print``
output is captured, bounded, into the result's ``stdout``.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import sys
import types
from dataclasses import dataclass
from typing import Any

from . import bundle, envmodules, files, generators, packages, standins, tripwire
from .bridge import _ITIMER_REAL, _SETITIMER, BACKSTOP_GRACE_S, Bridge, InvalidContract, ToolOutcome, pause_backstop
from .channel import (
    Channel,
    FileBody,
    PassedTextError,
    handoff_ready,
    read_execute,
    result_socket,
    write_frame,
    write_frames,
)
from .compilation import compile_program, shipped_code
from .fetching import error_kind
from .guards import build_globals, prime
from .lazycontext import ContextText, LazyContext, NotJson, dump_json, encode
from .lockdown import lock_down
from .preload import rewarm
from .wire import FETCH_ERROR_KINDS, HEADER, PROTOCOL_VERSION, valid_text
from .wire import error as _error
from .world import (
    ACTIVE_SEAL,
    INTERNAL_IMPORTS,
    TOOL_FILENAME,
    TOOL_FUNCTION,
    VIOLATION_EVENTS,
    VIOLATIONS,
    BoundedText,
    GlobalsSeal,
    OutputLimitExceeded,
    SandboxViolation,
    build_module_proxies,
    check_inner_wall,
    forget_lockdown_modules,
    program_streams,
)

#: What the result needs from ``resource`` after it is forgotten (``world.forget_lockdown_modules``).
_GETRUSAGE, _RUSAGE_SELF = resource.getrusage, resource.RUSAGE_SELF


def _describe(exc: BaseException) -> str:
    """``str(exc)``, which runs the program's code (its ``__str__``, its arguments' ``__repr__``): whatever
    that raises or returns, the runner still writes its result."""
    try:
        return str(exc)
    except BaseException:
        return "(the exception's message could not be computed)"


def _tool_line(tb: types.TracebackType | None) -> int | None:
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == TOOL_FILENAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _classify_exception(exc: BaseException) -> str:
    fetch_kind = error_kind(exc)  # a brokered request's failure the program did not catch
    if fetch_kind is not None:
        return fetch_kind
    if isinstance(exc, MemoryError):
        return "memory_limit"
    if isinstance(exc, OutputLimitExceeded):
        return "output_limit"
    if isinstance(exc, ImportError) and "not allowed in the sandbox" in str(exc):
        return "sandbox_violation"
    if isinstance(exc, OSError) and exc.errno in (errno.EPERM, errno.EACCES, errno.EROFS):
        return "sandbox_violation"
    if isinstance(exc, NotJson):
        return "non_serializable_result"
    if isinstance(exc, SandboxViolation):
        return "sandbox_violation"
    if isinstance(exc, InvalidContract):
        return "invalid_contract"
    return "execution"


#: Error kinds whose message starts with the exception's name.
_NAMED_KINDS = frozenset({"execution", *FETCH_ERROR_KINDS})


class Result:
    """The one result: the header frame's fields, the return value's JSON text, the changed keys' texts."""

    def __init__(self) -> None:
        self.header: dict[str, Any] = {"type": "result", "status": "error"}
        self.value: bytes = b"null"
        self.changed: list[tuple[str, bytes]] = []
        self.files: list[tuple[str, files.Body]] = []  # the output files of an ok run, after the changed keys

    def fail(self, error: dict[str, Any]) -> None:
        self.header.update(status="error", error=error, context_changed=[], context_deleted=[])
        files.release(self.files)
        self.value, self.changed, self.files = b"null", [], []


#: The canary (``sandforge doctor``): code from a program-like frame (``<tool>``) that causes an event the
#: armed tripwire must stop (``sys._getframe``). Compiled before arming; run only when the host's execute
#: frame asks for it (``canary``), which no program, context value or tool contract can set.
_CANARY_SOURCE = "def canary(getframe):\n    return getframe()\n"


def _canary() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(_CANARY_SOURCE, TOOL_FILENAME, "exec"), namespace)  # noqa: S102 - the runner's own text
    return namespace


def _arm(
    frame: dict[str, Any], armed: bool, out_fd: int, compiled: Any, stdout: Any, limits: Any,
    area: files.FileArea | None = None, namespace: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Give the program its files' ``open`` (with an ``area``), arm the tripwire (when installed); the
    canary's namespace, compiled before arming, if asked for."""
    if namespace is not None:
        files.expose(namespace, area)
    canary = _canary() if frame.get("canary") is True else {}
    if armed:
        where = (area.inputs, area.outputs) if area is not None else None
        tripwire.arm(out_fd, compiled, stdout, int(limits["max_message_bytes"]), where)
    return canary


def _succeeded(result: Result, value: Any, context: LazyContext, area: files.FileArea | None, limits: Any) -> Any:
    """Fill an ok result: the value's text, the context's changes, the output files; the error that fails
    the run instead (``output_limit``, ``sandbox_violation``: an output file out of bounds, or not a file)."""
    result.value = dump_json(value, "the return value")
    result.changed, deleted = context.delta()
    result.files, error = files.collect(area, limits)
    result.header.update(status="ok", context_deleted=deleted)
    return error


def _run_canary(canary: Any) -> None:
    canary(sys._getframe)  # the tripwire ends the process here
    raise SandboxViolation("the tripwire did not stop the canary", "canary_not_stopped")


@dataclass
class ProgramGlobals:
    """The program's stdout capture and globals: one execution's, never reused. ``serve`` builds them before the
    execute frame comes (while the worker waits in its pool), so the run does not wait for them: copying the
    builtins writes a reference count on each, a page copied from the zygote per object (~100 faults)."""

    stdout: BoundedText
    namespace: dict[str, Any]


def program_globals(proxies: dict[str, Any], limits: dict[str, Any], bridge: Bridge) -> ProgramGlobals:
    stdout = BoundedText(int(limits["max_output_bytes"]))
    return ProgramGlobals(stdout, build_globals(proxies, stdout, bridge))


def execute(
    frame: dict[str, Any], raw_context: dict[str, ContextText], boot: dict[str, Any], built: ProgramGlobals, *,
    out_fd: int = -1, armed: bool = False, inputs: list[tuple[str, files.Body]] | None = None,
) -> Result:  # fmt: skip
    """Run the program in ``built`` (its globals: ``program_globals``); with ``armed``, the installed tripwire is
    armed first (on ``out_fd``). With ``inputs`` (a list, maybe empty) the program gets its files: ``inputs/``
    and ``outputs/`` in the working directory."""
    limits = boot["limits"]
    stdout = built.stdout
    result = Result()
    compiled = shipped_code(frame)
    error = None
    if compiled is None:
        compiled, error = compile_program(str(frame.get("code", "")))
    args, kwargs = frame.get("args"), frame.get("kwargs")
    if error is None and not (isinstance(args, list) and isinstance(kwargs, dict)):
        error = _error("invalid_request", "args must be a list and kwargs an object")
    area, error = files.prepare(inputs) if error is None else (None, error)
    if error is None:
        assert compiled is not None
        namespace = built.namespace
        context = LazyContext(raw_context)
        canary = _arm(frame, armed, out_fd, compiled, stdout, limits, area, namespace)
        try:
            if canary:
                _run_canary(canary["canary"])
            exec(compiled, namespace)  # noqa: S102 - RestrictedPython-compiled, inside the sandbox
            ACTIVE_SEAL[:] = [GlobalsSeal(namespace)]
            with program_streams(stdout):
                value = namespace[TOOL_FUNCTION](context, args, kwargs)
            check_inner_wall()
            if isinstance(value, ToolOutcome):
                if not value.ok:
                    error = _error("tool_error", value.error_message or value.error_type or "tool error",
                                   tool_error_type=value.error_type, retriable=value.retriable)  # fmt: skip
                value = value.value
            if error is None:
                error = _succeeded(result, value, context, area, limits)
        except BaseException as exc:
            kind = _classify_exception(exc)
            name = type(exc).__name__
            message = _describe(exc) if kind != "memory_limit" else f"memory limit of {limits['memory_mb']} MB exceeded"
            error = _error(kind, f"{name}: {message}" if kind in _NAMED_KINDS else message,
                           exception=name, line=_tool_line(exc.__traceback__))  # fmt: skip
    if stdout.overflowed:
        error = _error("output_limit", f"the program printed more than {limits['max_output_bytes']} bytes")
    if VIOLATIONS:  # without a tripwire (the tests' seam): still reported, caught or not
        event = {"source": "inner_wall", "event": VIOLATION_EVENTS[0], "detail": VIOLATIONS[0][:200]}
        error = _error("sandbox_violation", VIOLATIONS[0], security_event=event)
    if error is not None:
        result.fail(error)
    result.header["stdout"] = stdout.getvalue()
    result.header["stdout_truncated"] = stdout.overflowed
    usage = _GETRUSAGE(_RUSAGE_SELF)
    result.header["cpu_time_s"] = usage.ru_utime + usage.ru_stime
    result.header["peak_memory_mb"] = usage.ru_maxrss / 1024
    return result


def _encode_result(result: Result, max_bytes: int, passing: bool = False) -> tuple[list[bytes | FileBody], list[int]]:
    """The result's frames: the header (the value's text spliced in, not encoded twice), then one frame per
    changed key and one per output file (a large one sent from its file), and the descriptors to attach to
    the header: with ``passing`` (the result channel carries descriptors, the disk is in memory), each large
    output file goes as the descriptor the collector checked (``files_passed``), not as a frame. A result
    that does not fit ``max_bytes`` in all becomes an output_limit error."""
    header = result.header
    header["context_changed"] = [[key, len(body)] for key, body in result.changed]
    passed = [(name, body) for name, body in result.files if passing and isinstance(body, FileBody)]
    if result.files:
        header["files"] = [[name, len(body)] for name, body in result.files]
    if passed:
        header["files_passed"] = [name for name, _ in passed]
    header["stdout"] = valid_text(header.get("stdout", ""))
    try:
        rest = encode(header)
    except (TypeError, ValueError) as exc:  # a context key that is not valid text (a lone surrogate)
        result.fail(_error("non_serializable_result", f"the context cannot be sent back: {exc}"))
        header["context_changed"] = []
        header.pop("files", None)
        header.pop("files_passed", None)
        passed = []
        try:
            rest = encode(header)
        except (TypeError, ValueError):
            error = _error("non_serializable_result", str(exc))
            return [encode({"type": "result", "status": "error", "error": error})], []
    body = b'{"value":' + result.value + b"," + rest[1:]
    texts: list[bytes | FileBody] = [text for _, text in result.changed]
    texts += [data for name, data in result.files
              if isinstance(data, bytes | FileBody) and all(name != other for other, _ in passed)]  # fmt: skip
    total = len(body) + sum(HEADER.size + len(text) for text in texts)
    if total <= max_bytes:
        return [body, *texts], [fd_body.fd for _, fd_body in passed if isinstance(fd_body, FileBody)]
    files.release(result.files)
    return [encode({
        "type": "result", "status": "error", "stdout": "", "stdout_truncated": bool(header.get("stdout")),
        "error": _error("output_limit", f"the result is {total} bytes; the limit is {max_bytes}"),
        "cpu_time_s": header.get("cpu_time_s", 0.0), "peak_memory_mb": header.get("peak_memory_mb", 0.0),
    })], []  # fmt: skip


def prepare(boot: dict[str, Any]) -> dict[str, types.SimpleNamespace]:
    """Everything that must happen before lock-down: imports, module proxies, a warm compiler."""
    sys.path[:0] = [p for p in boot.get("sys_path", []) if isinstance(p, str)]
    import RestrictedPython  # noqa: F401 - import before lock-down: nothing is importable after it

    for name in INTERNAL_IMPORTS:
        __import__(name)

    # With a chroot (subprocess backend) nothing is importable after lock-down: import every allowed module
    # now. In a container the root stays the image, so modules are imported on first use.
    generators.install()  # before any proxy is filled: the collections proxy copies the checked namedtuple
    proxies = build_module_proxies(lazy=not boot.get("chroot", False))
    for name, module in standins.build().items():  # the broker-backed urllib.request / requests
        proxies[name] = module
        parent, _, child = name.rpartition(".")
        if parent in proxies:
            setattr(proxies[parent], child, module)
    compile_program("return 1")  # warm RestrictedPython's lazily imported parts
    prime(proxies)  # in a zygote: once for all its runners
    return proxies


def _no_check(*_args: Any, **_kwargs: Any) -> None:
    return None


#: The runner's own layers a test may revert through the seam (``module.function`` -> its stand-in): the name
#: check before every class generator (items 1 and 5's fix), and the packages' layers (item 3's fix): withheld
#: names and modules, the wrappers (``numpy.load`` without ``allow_pickle``), the unpickling floor.
_REVERTIBLE: dict[str, tuple[Any, str, Any]] = {
    "generators.check_generated_names": (generators, "check_generated_names", _no_check),
    "packages.refuse_value": (packages, "refuse_value", _no_check),
    "packages.check_import": (packages, "check_import", _no_check),
    "packages.wrapped": (packages, "wrapped", lambda value: value),
    "packages.disarm_unpickling": (packages, "disarm_unpickling", _no_check),
}


def _unwrap(proxies: dict[str, Any], names: list[Any]) -> None:
    """The tests' seam (``sandforge.sandbox.seam``, never configuration): put the real ``module.name`` back on
    its proxy in place of the runner's wrapper, or revert one of the runner's own layers (`_REVERTIBLE`), so a
    test shows what the tripwire stops without it."""
    for dotted in names:
        if dotted in _REVERTIBLE:
            module_object, attribute, stand_in = _REVERTIBLE[dotted]
            setattr(module_object, attribute, stand_in)
            continue
        module, _, name = str(dotted).rpartition(".")
        if module in proxies:
            getattr(proxies[module], name, None)  # a lazy proxy imports its module first
            setattr(proxies[module], name, getattr(sys.modules[module], name))


def _env_id(boot: dict[str, Any]) -> str | None:
    environment = boot.get("environment")
    return environment.get("env_id") if isinstance(environment, dict) else None


def serve(in_fd: int, out_fd: int, boot: dict[str, Any], proxies: dict[str, types.SimpleNamespace]) -> int:
    """Lock down, report ready, run the one program, write the one result."""
    max_bytes = int(boot["limits"]["max_message_bytes"])
    channel = Channel(in_fd)  # before lock-down; it lives until the process exits
    seam: dict[str, Any] = boot["seam"] if isinstance(boot.get("seam"), dict) else {}
    armed = not seam.get("tripwire_off") and tripwire.install()
    _unwrap(proxies, seam.get("unwrapped") or [])
    bundle.uninstall()  # what is imported from here on comes from its file, as without a bundle
    protections, errors = lock_down(boot, host_channel_fd=in_fd)
    protections["audit_tripwire"] = armed
    handoff = handoff_ready(boot)
    ready = {"type": "ready", "version": PROTOCOL_VERSION, "pid": os.getpid(), "protections": protections,
             "errors": errors, "handoff": handoff is not None}  # fmt: skip
    if (environment := envmodules.mount_status(boot)) is not None:
        ready["environment"] = environment
        proxies = dict(proxies)  # a zygote's children share its proxies: each adds its own environment's
        envmodules.expose(boot, proxies)
    write_frame(out_fd, ready)
    built = program_globals(proxies, boot["limits"], Bridge(channel, out_fd, max_bytes))  # no program known yet
    rewarm(in_fd)  # a runner of an environment zygote: its packages' first use, while it waits
    inputs: list[tuple[str, files.Body]] = []
    passed: dict[int, int] = {}  # the input files' sealed memfds, by index, until files.receive takes them
    try:
        frame, raw_context = read_execute(channel, max_bytes, handoff, passed)
        inputs = files.receive(channel, frame, max_bytes, passed, handoff, int(boot["limits"]["max_files_bytes"]))
    except PassedTextError as exc:
        frame, raw_context = {"type": "invalid", "error": str(exc)}, {}
    except (EOFError, ValueError, json.JSONDecodeError):
        return 3
    out_sock = result_socket(out_fd)  # with one, large outputs go back as descriptors
    forget_lockdown_modules()
    if frame.get("type") != "execute" or frame.get("env_id") != _env_id(boot):
        result = Result()
        wrong_env = frame.get("type") == "execute" and "a program prepared for another environment"
        result.fail(_error("invalid_request", str(frame.get("error") or wrong_env or "expected an execute frame")))
    else:
        _SETITIMER(_ITIMER_REAL, float(boot["limits"]["timeout_s"]) + BACKSTOP_GRACE_S)
        result = execute(frame, raw_context, boot, built, out_fd=out_fd, armed=armed, inputs=inputs)
        pause_backstop()
    files.release(inputs)  # already closed once the file area holds them (before the program ran)
    write_frames(out_fd, *_encode_result(result, max_bytes, out_sock is not None), sock=out_sock)
    return 0
