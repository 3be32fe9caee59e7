"""The standard-library modules agent tools use every day (issue 38): ``uuid``, ``zoneinfo``, ``logging``,
``traceback``, ``configparser``, ``email.utils``, ``queue``, ``stat``. Each was audited like ``world``'s own
(docs/security.md, "The audit"): what it exposes, what is withheld and why, what is replaced; ``world``
merges these tables into its own. Standard library only; the runner's other modules are imported where
used (``world`` imports this module).
"""

from __future__ import annotations

import os
from typing import Any

#: Modules added to the program's world (module -> names withheld with the generic reason; the reasons
#: programs are told are in ``IDIOM_WITHHELD``).
IDIOM_MODULES: dict[str, frozenset[str]] = {
    name: frozenset()
    for name in (
        "uuid", "zoneinfo", "logging", "traceback", "configparser", "email.utils", "queue", "stat", "asyncio", "sys"
    )
}

_LOCATION = "the machine's network interfaces (MAC address): it runs ifconfig/ip/arp or asks the kernel"
#: Public names the audit withholds, with the reason a program is told.
IDIOM_WITHHELD: dict[str, dict[str, str]] = {
    "uuid": {"uuid1": f"reads {_LOCATION}; use uuid4()", "getnode": f"reads {_LOCATION}"},
    "zoneinfo": {
        "available_timezones": "walks and opens every file of the time-zone database",
        "reset_tzpath": "changes the process-wide time-zone search path",
    },
    "logging": {
        "FileHandler": "opens files; log to the execution's stderr (StreamHandler) or a StringIO",
        "currentframe": "returns the caller's interpreter frame",
        "StrFormatStyle": "formats replacement fields that read attributes; use Formatter(fmt, style='{')",
        "GenericAlias": "builds aliases of arbitrary objects that forward attribute reads",
    },
    "configparser": {"SafeConfigParser": "a deprecated alias of ConfigParser; use ConfigParser"},
    "email.utils": {"make_msgid": "looks up the host's name (socket.getfqdn)"},
}
#: Modules exposed by allow-list: ``traceback`` formats exceptions, and hands out nothing that holds a frame
#: (``extract_tb``, ``walk_stack``, ``TracebackException``, ``StackSummary`` do, or read locals).
IDIOM_EXPOSED_ONLY: dict[str, frozenset[str]] = {
    "traceback": frozenset({"format_exc", "format_exception", "format_exception_only", "print_exc", "print_exception"}),
    # facts about the interpreter, and the execution's output streams: not modules, path, frames, hooks
    "sys": frozenset(
        """version_info version hexversion maxsize maxunicode byteorder platform float_info int_info
        getsizeof getrecursionlimit stdout stderr""".split()  # noqa: SIM905 - a word list
    ),
    # coroutines, tasks and their synchronisation, on a loop without sockets (``run``): not the streams,
    # servers, subprocesses, threads, event-loop policies or loops of the real module
    "asyncio": frozenset(
        """run gather sleep wait wait_for as_completed create_task ensure_future shield timeout timeout_at
        current_task all_tasks get_running_loop iscoroutine iscoroutinefunction Task Future TaskGroup Queue
        PriorityQueue LifoQueue QueueEmpty QueueFull Lock Event Condition Semaphore BoundedSemaphore Barrier
        BrokenBarrierError TimeoutError CancelledError InvalidStateError LimitOverrunError
        IncompleteReadError FIRST_COMPLETED FIRST_EXCEPTION ALL_COMPLETED""".split()  # noqa: SIM905 - a word list
    ),
}


#: What ``world`` binds here (``bind``): its sticky ``SandboxViolation`` and the program's file name. This
#: module imports nothing of the runner's, so ``world`` can merge its tables without an import cycle.
_RUNNER: dict[str, Any] = {"violation": PermissionError, "tool_file": "<tool>"}


def bind(violation: type[Exception], tool_file: str) -> None:
    _RUNNER.update(violation=violation, tool_file=tool_file)


def _violation(message: str) -> Exception:
    return _RUNNER["violation"](message)  # type: ignore[no-any-return]


# --- traceback: formatting without frames ------------------------------------------------------------------


def _program_only(exc: BaseException, limit: int | None, chain: bool) -> Any:
    """``exc`` as a ``TracebackException`` whose stacks keep only the program's own frames (its file is
    ``<tool>``; the runner's and the library's frames are left out, so no source line of theirs is read),
    with no locals and no source lines looked up in advance."""
    import traceback

    program_file = _RUNNER["tool_file"]
    summary = traceback.TracebackException(
        type(exc), exc, exc.__traceback__, limit=limit, lookup_lines=False, capture_locals=False, compact=not chain
    )
    seen: set[int] = set()
    pending = [summary]
    while pending:
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        item.stack = traceback.StackSummary.from_list([f for f in item.stack if f.filename == program_file])
        pending.extend(e for e in (item.__cause__, item.__context__) if e is not None)
        pending.extend(getattr(item, "exceptions", None) or ())
    return summary


def _exception(exc: Any, value: Any, tb: Any) -> BaseException | None:
    """The exception of ``format_exception(exc)`` or of the old three-argument form (the type, the value,
    a traceback that must be the value's own)."""
    if isinstance(exc, BaseException):
        return exc
    if isinstance(value, BaseException):
        if tb is not None and tb is not value.__traceback__:
            raise TypeError("the sandbox formats an exception with its own traceback only")
        return value
    return None


_NONE: Any = object()


def format_exception(exc: Any, /, value: Any = _NONE, tb: Any = _NONE, limit: int | None = None,
                     chain: bool = True) -> list[str]:  # fmt: skip
    """``traceback.format_exception``: the program's own frames only."""
    error = _exception(exc, None if value is _NONE else value, None if tb is _NONE else tb)
    if error is None:
        return [f"{exc.__name__ if isinstance(exc, type) else 'NoneType'}: None\n"]
    return list(_program_only(error, limit, chain).format(chain=chain))


def format_exception_only(exc: Any, /, value: Any = _NONE) -> list[str]:
    """``traceback.format_exception_only``: reads no frame at all."""
    import traceback

    error = _exception(exc, None if value is _NONE else value, None)
    if error is None:
        return traceback.format_exception_only(exc if isinstance(exc, type) else type(None), None)
    return traceback.format_exception_only(type(error), error)


def format_exc(limit: int | None = None, chain: bool = True) -> str:
    """``traceback.format_exc``: the exception being handled, the program's own frames only."""
    import sys

    error = sys.exc_info()[1]
    if error is None:
        return "NoneType: None\n"
    return "".join(_program_only(error, limit, chain).format(chain=chain))


def print_exception(exc: Any, /, value: Any = _NONE, tb: Any = _NONE, limit: int | None = None, file: Any = None,
                    chain: bool = True) -> None:  # fmt: skip
    """``traceback.print_exception`` to ``file`` or the execution's stderr."""
    import sys

    text = "".join(format_exception(exc, value, tb, limit=limit, chain=chain))
    (sys.stderr if file is None else file).write(text)


def print_exc(limit: int | None = None, file: Any = None, chain: bool = True) -> None:
    """``traceback.print_exc`` to ``file`` or the execution's stderr."""
    import sys

    (sys.stderr if file is None else file).write(format_exc(limit, chain))


# --- logging: no files, no frames, plain format fields --------------------------------------------------


def _plain_format(fmt: Any, style: Any) -> None:
    """The rule of the program's ``str.format`` (``guards``): plain fields only (``{}``, ``{0}``, ``{name}``,
    with plain nested specs), never ``{x.attr}`` or ``{x[key]}``."""
    if style != "{" or not isinstance(fmt, str):
        return
    import string

    for _literal, field, spec, _conversion in string.Formatter().parse(fmt):
        if field and not (field.isdigit() or field.isidentifier()):
            raise NotImplementedError(
                f"format field {{{field}}} reads an attribute or an item, which the sandbox does not allow "
                "in logging formats; use plain fields such as {levelname} and {message}"
            )
        if spec:
            _plain_format(spec, style)


def _proxy_logging(module: Any) -> None:
    """``Formatter`` and ``basicConfig`` whose ``{``-style formats have plain fields only (the real ones run
    ``fmt.format(**record.__dict__)``: ``{exc_info[2].tb_frame.f_globals}`` printed the runner's globals),
    and ``basicConfig`` without ``filename=`` (it opens the file)."""
    real_formatter, real_basic_config = module.Formatter, module.basicConfig

    class Formatter(real_formatter):  # type: ignore[misc, valid-type]
        __module__ = "logging"

        def __init__(self, fmt: Any = None, datefmt: Any = None, style: Any = "%", *args: Any, **kwargs: Any) -> None:
            _plain_format(fmt, style)
            super().__init__(fmt, datefmt, style, *args, **kwargs)

    def basicConfig(**kwargs: Any) -> None:
        if "filename" in kwargs or "filemode" in kwargs:
            raise _violation("logging.basicConfig(filename=...) opens a file in the sandbox: log to the "
                             "execution's stderr (the default) or a stream such as io.StringIO()")  # fmt: skip
        _plain_format(kwargs.get("format"), kwargs.get("style", "%"))
        real_basic_config(**kwargs)

    module.Formatter = Formatter
    module.basicConfig = basicConfig


# --- zoneinfo: the image's / host's tz database, read only ----------------------------------------------


def _proxy_zoneinfo(module: Any) -> None:
    """``ZoneInfo(key)`` from the time-zone database of the image (containers) or the host (bound read-only
    into the subprocess backend's private root: ``tz_binds``), never from the ``tzdata`` package (importing
    it is not part of the audited set): an unknown key is ``ZoneInfoNotFoundError`` straight away."""
    from zoneinfo import _tzpath

    real, not_found = module.ZoneInfo, module.ZoneInfoNotFoundError
    found: set[str] = set()  # keys already found in the database (a lookup is a stat per TZPATH entry)

    def check(key: Any) -> None:
        if type(key) is str and key in found:
            return
        if type(key) is not str or _tzpath.find_tzfile(key) is None:  # ValueError for a path outside TZPATH
            raise not_found(f"No time zone found with key {key}")
        found.add(key)

    class ZoneInfo(real):  # type: ignore[misc, valid-type]
        __module__ = "zoneinfo"

        def __new__(cls, key: Any) -> Any:
            check(key)
            return super().__new__(cls, key)

        @classmethod
        def no_cache(cls, key: Any) -> Any:
            check(key)
            return super().no_cache(key)

    module.ZoneInfo = ZoneInfo


#: Where ``zoneinfo`` looks for the time-zone database (CPython's default ``TZPATH`` on Linux; the runner
#: runs isolated from ``PYTHONTZPATH``): bound read-only into the subprocess backend's private root, and the
#: only files besides the libraries that the tripwire lets the runner's ``ZoneInfo`` open (read-only).
TZ_ROOTS = ("/usr/share/zoneinfo", "/usr/lib/zoneinfo", "/usr/share/lib/zoneinfo", "/etc/zoneinfo")


def tz_binds() -> list[tuple[str, str]]:
    """The time-zone database to bind read-only into the subprocess backend's private root (at its own
    path), so ``zoneinfo`` finds it there as in a container: the first existing ``TZ_ROOTS`` entry."""
    for path in TZ_ROOTS:
        real = os.path.realpath(path)
        if os.path.isdir(real):  # noqa: PTH112 - the runner avoids pathlib (import cost)
            return [(real, path)]
    return []


# --- configparser: no file names --------------------------------------------------------------------------


def _proxy_configparser(module: Any) -> None:
    """``ConfigParser``/``RawConfigParser`` whose ``read(filenames)`` is refused (it opens every path it is
    given); ``read_string``, ``read_file`` (a StringIO), ``read_dict`` and ``write`` to a stream are the same."""

    def refuse(self: Any, filenames: Any, encoding: Any = None) -> list[str]:
        raise _violation("configparser's read(filenames) opens files in the sandbox: use read_string(text) "
                         "or read_file(io.StringIO(text))")  # fmt: skip

    for name in ("RawConfigParser", "ConfigParser"):
        real = getattr(module, name)
        setattr(module, name, type(name, (real,), {"read": refuse, "__module__": "configparser",
                                                   "__doc__": real.__doc__}))  # fmt: skip


# --- asyncio: a loop that needs no socket ----------------------------------------------------------------


class _Timer:
    """The sandbox loop's selector: there is no descriptor to wait for, only the next timer. Waiting with
    nothing scheduled would wait forever (every task waits on something that can never happen)."""

    def select(self, timeout: float | None = None) -> list[Any]:
        import time

        if timeout is None:
            raise RuntimeError("the event loop has nothing left to run: every task waits for something that "
                               "never happens (the sandbox has no sockets, threads or subprocesses)")  # fmt: skip
        if timeout > 0:
            time.sleep(timeout)
        return []

    def close(self) -> None:
        return None


_LOOP: list[Any] = []


def _loop_class() -> Any:
    """``asyncio.BaseEventLoop`` with no self-pipe (the real loop makes a ``socketpair`` at creation, which
    the sandbox need not have) and no I/O: timers and ready callbacks only. Threads (``run_in_executor``,
    ``getaddrinfo``), sockets, pipes, subprocesses and signal handlers are refused."""
    if _LOOP:
        return _LOOP[0]
    import asyncio

    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the sandbox's event loop runs coroutines and timers only: no sockets, "
                                  "threads, pipes, subprocesses or signal handlers")  # fmt: skip

    class SandboxEventLoop(asyncio.BaseEventLoop):
        def __init__(self) -> None:
            super().__init__()
            self._selector = _Timer()

        def _process_events(self, event_list: Any) -> None:
            return None

        def _write_to_self(self) -> None:
            return None

        async def shutdown_default_executor(self) -> None:
            return None  # there is never an executor

    for name in ("run_in_executor", "set_default_executor", "getaddrinfo", "getnameinfo", "create_connection",
                 "create_server", "create_unix_connection", "create_unix_server", "create_datagram_endpoint",
                 "connect_accepted_socket", "connect_read_pipe", "connect_write_pipe", "subprocess_shell",
                 "subprocess_exec", "add_reader", "add_writer", "add_signal_handler", "sock_recv", "sock_sendall",
                 "sock_connect", "sock_accept", "sendfile", "start_tls"):  # fmt: skip
        setattr(SandboxEventLoop, name, refuse)
    _LOOP.append(SandboxEventLoop)
    return SandboxEventLoop


def _proxy_asyncio(module: Any) -> None:
    """``asyncio.run`` on the sandbox's loop (``_loop_class``)."""
    import asyncio

    loop_class = _loop_class()

    def run(main: Any, *, debug: Any = None) -> Any:
        """``asyncio.run``: run the coroutine ``main`` to completion on a fresh loop without sockets."""
        with asyncio.Runner(debug=debug, loop_factory=loop_class) as runner:
            return runner.run(main)

    module.run = run


# --- sys: facts, and the program's own streams ------------------------------------------------------------


class _Stream:
    """``sys.stdout``/``sys.stderr`` as the program sees them: write-only, to whatever the runner points that
    stream at while the program runs (its capture, the execution's stderr), never the runner's own."""

    def __init__(self, name: str) -> None:
        self.name = name

    def write(self, text: str) -> int:
        import sys

        return int(getattr(sys, self.name).write(str(text)))

    def flush(self) -> None:
        return None


def _proxy_sys(module: Any) -> None:
    module.stdout, module.stderr = _Stream("stdout"), _Stream("stderr")


IDIOM_ADJUSTMENTS: dict[str, Any] = {
    "sys": _proxy_sys,
    "asyncio": _proxy_asyncio,
    "logging": _proxy_logging,
    "zoneinfo": _proxy_zoneinfo,
    "configparser": _proxy_configparser,
}
#: Replacements of the same contract, minus the unsafe part.
IDIOM_WRAPPERS: dict[str, dict[str, Any]] = {
    "traceback": {
        "format_exc": format_exc,
        "format_exception": format_exception,
        "format_exception_only": format_exception_only,
        "print_exc": print_exc,
        "print_exception": print_exception,
    },
}
