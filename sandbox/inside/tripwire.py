"""The tripwire: a PEP 578 audit hook that ends the execution at the first event a program confined to its
proxies could never cause (docs/security.md, "The tripwire").

The inner wall (RestrictedPython, the module proxies) is enumerated: each hole found in the standard library
was closed one at a time. The tripwire does not depend on having found the hole: whatever an escaped program
then does with the real world (opens a file, imports a module, calls ``os.*``, compiles text, walks frames)
raises an audit event first, and the hook writes a ``sandbox_violation`` result on the result channel and
ends the process with ``wire.VIOLATION_EXIT_STATUS`` before the event completes.

What nothing the program can reach may change:

- the hook cannot be removed from Python (``sys.addaudithook`` has no inverse; adding another hook is itself
  an event that trips);
- its state lives only in its own closure, and the hook function is referenced by nothing but the
  interpreter's hook list (``gc.get_objects``/``get_referrers`` are events that trip before they return);
- it is armed, and told where to write, by an audit event (``ARM``) that only the runner raises, exactly
  once: a second arming trips. There is no disarming: after arming, the runner writes its result and exits.

Inner-wall violations (``world.SandboxViolation``) reach the same writer through ``VIOLATION``, so the first
one is final too, whatever the program does afterwards.

Decisions read the interpreter's frames (``sys._getframe`` inside the hook raises its own event: a
re-entrancy flag makes the hook ignore events caused by itself). A frame is the program's (``<tool>``),
generated (any other ``<...>`` file name but the frozen standard library), the runner's (this package),
library code (the standard library, the environment, RestrictedPython) or the import machinery.
"""

# ruff: noqa: PTH100, PTH120, UP031, SIM905
# (the runner avoids pathlib (import cost); the result is formatted with C ``str %`` only: see _result_writer;
# the tables are word lists)

from __future__ import annotations

import io
import keyword
import os
import sys
import tokenize
from typing import Any

from .idiom_modules import TZ_ROOTS
from .wire import VIOLATION_EXIT_STATUS

#: Audit events only the runner raises (``sys.audit``): the self-test before arming, the arming itself (with
#: the result channel, the program's code object, its output capture and the result's byte limit), an
#: inner-wall violation (``message``, ``event``), and the canary's check that the hook is armed.
SELF_TEST = "sandforge.tripwire.self_test"
ARM = "sandforge.tripwire.arm"
VIOLATION = "sandforge.violation"

#: The program's file name (``world.TOOL_FILENAME``; ``world`` imports this module, not the reverse).
_TOOL = "<tool>"
#: The module name the program's classes carry (``world.PROGRAM_MODULE``).
_PROGRAM_MODULE = "sandforge_tool"


class SelfTestPassed(Exception):
    """Raised by the installed hook on ``SELF_TEST`` before it is armed: proof that it sees events."""


# --- what ordinary programs cause ---------------------------------------------------------------------------

#: Events ordinary programs cause that reach nothing: ``id()``, ``time.sleep`` (bounded by the timeout),
#: and the interpreter's notification that it reports an exception nobody could catch (a generator that
#: ignores ``GeneratorExit``); the last two are notifications, not capabilities.
_HARMLESS = frozenset({"builtins.id", "time.sleep", "sys.unraisablehook", "sys.excepthook"})

#: Modules an allowed module may import, lazily (containers import allowed modules on first use): every
#: module that importing all of ``world.ALLOWED_MODULES`` and ``world.INTERNAL_IMPORTS`` loads, the same on
#: the host's Python 3.11.7 and the image's 3.11.2 (``tests/sandbox/test_tripwire.py`` checks it), minus the
#: lock-down-only modules the runner forgets (``world.FORGOTTEN_MODULES``): importing those again trips.
AUDITED_IMPORTS = frozenset(
    """__future__ _abc _ast _bisect _blake2 _codecs _collections _collections_abc _csv _datetime _decimal
    _elementtree _frozen_importlib _frozen_importlib_external _functools _hashlib _heapq _imp _io _json _locale
    _markupbase _opcode _operator _random _sha512 _signal _sre _stat _statistics _string _strptime _struct
    _thread _typing _warnings _weakref _weakrefset abc array ast base64 binascii bisect builtins calendar cmath
    codecs collections collections.abc contextlib copy copyreg csv dataclasses datetime decimal dis encodings
    encodings.aliases encodings.ascii encodings.cp1252 encodings.iso8859_15 encodings.iso8859_2
    encodings.latin_1 encodings.utf_16 encodings.utf_8 encodings.utf_8_sig enum errno fractions functools
    genericpath hashlib heapq html html.entities html.parser http importlib importlib._abc importlib._bootstrap
    importlib._bootstrap_external importlib.machinery importlib.util inspect io ipaddress itertools json
    json.decoder json.encoder json.scanner keyword linecache locale marshal math numbers opcode operator os
    os.path platform posix posixpath pyexpat pyexpat.errors pyexpat.model random re re._casefix re._compiler
    re._constants re._parser reprlib selectors stat statistics string struct sys textwrap threading time token
    tokenize types typing typing.io typing.re unicodedata urllib urllib.parse warnings weakref xml xml.etree
    xml.etree.ElementPath xml.etree.ElementTree zipimport
    _asyncio _contextvars _posixsubprocess _queue _ssl _sysconfigdata__linux_x86_64-linux-gnu
    _sysconfigdata__x86_64-linux-gnu _uuid _zoneinfo
    asyncio asyncio.base_events asyncio.base_futures asyncio.base_subprocess asyncio.base_tasks asyncio.constants
    asyncio.coroutines asyncio.events asyncio.exceptions asyncio.format_helpers asyncio.futures asyncio.locks
    asyncio.log asyncio.mixins asyncio.protocols asyncio.queues asyncio.runners asyncio.selector_events
    asyncio.sslproto asyncio.staggered asyncio.streams asyncio.subprocess asyncio.taskgroups asyncio.tasks
    asyncio.threads asyncio.timeouts asyncio.transports asyncio.trsock asyncio.unix_events atexit concurrent
    concurrent.futures concurrent.futures._base configparser contextvars email email._parseaddr
    email.base64mime email.charset email.encoders email.errors email.quoprimime email.utils logging queue quopri
    ssl subprocess sysconfig traceback uuid zoneinfo zoneinfo._common zoneinfo._tzpath""".split()
)
#: (The second block: issue 38's modules, ``idiom_modules``.) Lock-down-only modules that ``asyncio`` and
#: ``email.utils`` import at module level: imported again (a container imports allowed modules on first use)
#: only while one of those packages' own module bodies is importing. Importing is not using: every use of a
#: socket, a signal handler or a descriptor operation is an event of its own that trips.
REIMPORTED_BY_LIBRARIES = frozenset({"socket", "_socket", "select", "fcntl", "signal"})
_REIMPORTING_PACKAGES = ("asyncio" + os.sep, "email" + os.sep)

#: Modules the audited ones try to import and do without where they do not exist (``copy`` looks for
#: Jython's ``org.python.core``).
_OPTIONAL_IMPORTS = frozenset({"org", "org.python", "org.python.core", "msvcrt", "_winapi"})  # subprocess: Windows

#: Standard-library functions that may call ``sys._getframe`` (to name the caller's module for a class they
#: create); the frame never leaves them. (file name, function name).
_GETFRAME_SITES = frozenset({
    ("collections/__init__.py", "namedtuple"), ("enum.py", "_create_"), ("typing.py", "_caller"),
    ("logging/__init__.py", "<lambda>"),  # currentframe(), for Logger.findCaller: it returns file and line only
})  # fmt: skip
#: ``asyncio``'s event loop installs (and restores) the interpreter's async-generator hooks while it runs.
_ASYNCGEN_HOOK_SITES = frozenset({("asyncio/base_events.py", "run_forever")})

#: The runner's wrappers of those generators (``generators.py``), which name the caller's module the same way
#: before checking the names and handing them on.
_RUNNER_GETFRAME_SITES = frozenset({("generators.py", "namedtuple"), ("generators.py", "_create_")})

#: Standard-library functions that set special attributes (``__module__``, ``__doc__``, ``__qualname__``,
#: ``__bases__``, ``__defaults__``) on the class or function they are creating for the program.
_SETATTR_SITES = frozenset({
    ("collections/__init__.py", "namedtuple"), ("dataclasses.py", "_process_class"), ("typing.py", "__new__"),
    ("typing.py", "_make_nmtuple"), ("enum.py", "__new__"), ("enum.py", "_create_"), ("abc.py", "__new__"),
})  # fmt: skip

#: What libraries read to size themselves (pandas' ``read_csv`` reads the cgroup CPU quota, numpy and
#: threadpools the CPU and memory counts): read-only and from library code only; the OS wall decides what
#: these show inside a sandbox.
_SYSTEM_INFO = (
    "/sys/fs/cgroup", "/sys/devices/system/cpu", "/proc/self/status", "/proc/self/cgroup", "/proc/self/mountinfo",
    "/proc/cpuinfo", "/proc/meminfo",
)  # fmt: skip

#: Attribute reads (``object.__getattr__``) that hand out frames or code: never from the program.
_FRAME_ATTRIBUTES = frozenset({
    "tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_code", "__code__", "gi_code", "cr_code", "ag_code",
})  # fmt: skip

#: The names generated dataclass methods and namedtuple constructors use besides the field names, the
#: generator's own local names and keywords: a NAME token outside this vocabulary trips.
_GENERATOR_VOCABULARY = frozenset(
    """self other cls name value __create_fn__ __class__ __dataclass_self__ __dataclass_builtins_object__
    __dataclass_builtins_hash__ __setattr__ __delattr__ __init__ __repr__ __eq__ __lt__ __le__ __gt__ __ge__
    __hash__ __post_init__ __qualname__ _HAS_DEFAULT_FACTORY _return_type MISSING NotImplemented
    FrozenInstanceError BUILTINS hash tuple type super _cls _tuple_new""".split()
)

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _relative(path: str, roots: tuple[str, ...]) -> str | None:
    """``path`` relative to the first of ``roots`` it lies under (normalised first), else None."""
    path = os.path.normpath(path)
    for root in roots:
        if path == root or path.startswith(root + os.sep):
            return path[len(root) + 1 :]
    return None


def library_roots() -> tuple[str, ...]:
    """Where read-only library code lives: the standard library (and its extension directory), the
    environment's mount, and RestrictedPython's directory."""
    from .wire import ENV_MOUNT_PATH

    stdlib = os.path.dirname(os.__file__)
    roots = [stdlib, ENV_MOUNT_PATH]
    for entry in sys.path:
        if entry.endswith("lib-dynload"):
            roots.append(entry)
    restricted_file = getattr(sys.modules.get("RestrictedPython"), "__file__", None)
    if isinstance(restricted_file, str):
        roots.append(os.path.dirname(os.path.dirname(restricted_file)))
    return tuple(os.path.normpath(root) for root in roots)


def _result_writer() -> Any:
    """``write(out_fd, message, security_event, stdout, max_bytes)``: the final ``sandbox_violation`` result
    frame, built and written only with functions bound here, at installation (C functions and a struct of
    its own): rebinding ``json``, ``os.write`` or the runner's encoders afterwards changes nothing."""
    import _json
    import resource
    import struct

    quote = _json.encode_basestring_ascii
    pack = struct.Struct(">I").pack
    write = os.write
    getrusage, rusage_self = resource.getrusage, resource.RUSAGE_SELF

    def captured(stdout: Any) -> tuple[str, bool]:
        try:
            text, overflowed = stdout.getvalue(), stdout.overflowed
        except BaseException:
            return "", True
        if type(text) is not str:
            return "", True
        return text.encode("utf-8", "replace").decode("utf-8"), overflowed is True

    def write_result(out_fd: int, message: str, event: dict[str, str], stdout: Any, max_bytes: int) -> None:
        text, truncated = captured(stdout) if stdout is not None else ("", False)
        try:
            usage = getrusage(rusage_self)
            cpu, memory = usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024
        except BaseException:
            cpu, memory = 0.0, 0.0
        error = '{"type":"sandbox_violation","message":%s,"security_event":{"source":%s,"event":%s,"detail":%s}}' % (
            quote(message[:4000]),
            quote(event["source"]),
            quote(event["event"]),
            quote(event["detail"]),
        )
        head = (
            '{"type":"result","status":"error","value":null,"context_changed":[],"context_deleted":[],"error":%s,'
            % error
        )
        tail = ',"cpu_time_s":%r,"peak_memory_mb":%r}' % (float(cpu), float(memory))
        body = (
            '%s"stdout":%s,"stdout_truncated":%s%s' % (head, quote(text), "true" if truncated else "false", tail)
        ).encode()
        if len(body) > max_bytes:
            body = ('%s"stdout":"","stdout_truncated":true%s' % (head, tail)).encode()
        data = memoryview(pack(len(body)) + body)
        while data:
            data = data[write(out_fd, data) :]

    return write_result


def _classifier(runner_dir: str, library: tuple[str, ...]) -> tuple[Any, Any]:
    """``kind(code)`` (whose frame: program, generated, runner, library, import) and ``site(code)`` (a standard
    library function as (file relative to the standard library, function name)), bound to these roots."""
    relative, tool, stdlib = _relative, _TOOL, library[0]

    def kind(code: Any) -> str:
        filename = code.co_filename
        if filename == tool:
            return "program"
        if filename.startswith("<frozen importlib"):
            return "import"
        if filename.startswith("<frozen "):
            return "library"
        if filename.startswith("<"):
            return "generated"
        if relative(filename, (runner_dir,)) is not None:
            return "runner"
        return "library" if relative(filename, library) is not None else "generated"

    def site(code: Any) -> tuple[str, str] | None:
        where = relative(code.co_filename, (stdlib,))
        return (where, code.co_name) if where is not None else None

    return kind, site


def _generator_check(site: Any) -> Any:  # noqa: C901 - closures bound once: see the module doc
    """``generator_compile(frame, source)``: why a ``compile`` from an audited generator is refused, or None
    when every name in the generated text checks out (the generator's own frames say which names it took)."""
    generate_tokens, name_token, token_error, string_io = (
        tokenize.generate_tokens, tokenize.NAME, tokenize.TokenError, io.StringIO,
    )  # fmt: skip
    str_isidentifier, iskeyword, vocabulary = str.isidentifier, keyword.iskeyword, _GENERATOR_VOCABULARY

    def generated_names_ok(source: Any, names: set[str]) -> bool:
        """Every NAME token of generated source is a keyword, the generator's vocabulary or ``names``."""
        if type(source) not in (str, bytes):
            return False
        try:
            text = source.decode("utf-8") if type(source) is bytes else source
            for token in generate_tokens(string_io(text).readline):
                if token.type == name_token and not (
                    iskeyword(token.string) or token.string in vocabulary or token.string in names
                ):
                    return False
        except (token_error, SyntaxError, UnicodeDecodeError):
            return False
        return True

    def identifiers(values: Any) -> set[str] | None:
        """The values as a set when every one is a plain ``str`` identifier that is not a keyword."""
        out: set[str] = set()
        for value in values:
            if type(value) is not str or not str_isidentifier(value) or iskeyword(value):
                return None
            out.add(value)
        return out

    def dataclass_names(frame: Any) -> set[str] | None:
        """The field names of the class ``dataclasses._process_class`` is making, with ``_create_fn``'s locals
        and the method's name; None when one of them is not an identifier."""
        outer = frame.f_back
        while outer is not None and site(outer.f_code) != ("dataclasses.py", "_process_class"):
            outer = outer.f_back
        fields = outer.f_locals.get("fields") if outer is not None else None
        names = identifiers(fields) if type(fields) is dict else None
        local_names = frame.f_locals.get("locals")
        extra = identifiers(local_names) if type(local_names) is dict else set()
        if names is None or extra is None:
            return None
        method = frame.f_locals.get("name")
        return names | extra | ({method} if type(method) is str else set())

    def generator_compile(frame: Any, source: Any) -> str | None:
        where = site(frame.f_code)
        if where == ("dataclasses.py", "_create_fn"):
            names = dataclass_names(frame)
            if names is None:
                return "a dataclass field name that is not an identifier"
            return None if generated_names_ok(source, names) else "generated dataclass code with foreign names"
        if where == ("collections/__init__.py", "namedtuple"):
            names = identifiers([frame.f_locals.get("typename"), *(frame.f_locals.get("field_names") or [None])])
            if names is None:
                return "a namedtuple field name that is not an identifier"
            return None if generated_names_ok(source, names) else "generated namedtuple code with foreign names"
        if where == ("typing.py", "__init__") and type(source) in (str, bytes):
            return None  # typing.ForwardRef compiles its text (never run: evaluating it is an ``exec`` event)
        if where == ("ast.py", "parse"):
            return None  # a tree, never code (numpy.load's literal_eval of its header); compiling one is another event
        return "compile() of text that no audited generator produced"

    return generator_compile


#: A rule: ``(event, caller frame, whose frame, the event's arguments) -> why it trips, or None``.
_Rule = Any


def _frame_rules(kind: Any, site: Any, env_root: str) -> dict[str, _Rule]:  # noqa: C901 - closures, as above
    """The rules for events that hand out or change frames, code and special attributes."""
    relative, frame_attributes, program_module = _relative, _FRAME_ATTRIBUTES, _PROGRAM_MODULE
    setattr_sites, getframe_sites, runner_getframe_sites = _SETATTR_SITES, _GETFRAME_SITES, _RUNNER_GETFRAME_SITES
    asyncgen_hook_sites = _ASYNCGEN_HOOK_SITES
    type_dict, module_type, guards_file = type.__dict__["__dict__"].__get__, type(sys), os.sep + "guards.py"

    def frame_attribute(event: str, caller: Any, who: str, args: tuple[Any, ...]) -> str | None:
        name = args[1] if len(args) > 1 else None
        if type(name) is not str or name not in frame_attributes:
            return None
        reader: Any = caller
        while who == "runner" and reader.f_code.co_filename.endswith(guards_file):
            reader = reader.f_back  # the runner's attribute guard, reading on the program's behalf
            who = kind(reader.f_code) if reader is not None else "program"
        return f"read of a frame or code attribute ({name}) by the program" if who in ("program", "generated") else None

    def special_attribute(event: str, caller: Any, who: str, args: tuple[Any, ...]) -> str | None:
        target = args[0] if args else None
        if issubclass(type(target), type):
            module = type_dict(target).get("__module__")
            if type(module) is str and module == program_module:
                return None
        if who == "library" and site(caller.f_code) in setattr_sites:
            return None
        if who == "runner" and args[1:2] == ("__class__",) and issubclass(type(target), module_type):
            return None  # a lazy module proxy becoming a plain module once filled (world.LazyModuleProxy)
        return "a special attribute set on a class or function the program did not define"

    def asyncgen_hooks(event: str, caller: Any, who: str, args: tuple[Any, ...]) -> str | None:
        if who == "library" and site(caller.f_code) in asyncgen_hook_sites:
            return None
        return "async-generator hooks set outside asyncio's event loop"

    def getframe(event: str, caller: Any, who: str, args: tuple[Any, ...]) -> str | None:
        code = caller.f_code
        if who == "library" and (site(code) in getframe_sites or relative(code.co_filename, (env_root,))):
            return None
        if who == "runner" and (code.co_filename.rpartition(os.sep)[2], code.co_name) in runner_getframe_sites:
            return None
        return "sys._getframe() outside the audited standard-library callers"

    return {
        "object.__getattr__": frame_attribute,
        "object.__setattr__": special_attribute,
        "object.__delattr__": special_attribute,
        "sys._getframe": getframe,
        "sys.set_asyncgen_hook_firstiter": asyncgen_hooks,
        "sys.set_asyncgen_hook_finalizer": asyncgen_hooks,
    }


def _files_rule(state: list[Any]) -> Any:
    """``area(rule)``: ``rule`` (the file rule) preceded by the program's file area's, bound to the hook's state
    (its directories arrive with the arming)."""
    dirname, basename, join, write_flags = os.path.dirname, os.path.basename, os.path.join, _WRITE_FLAGS

    def rule(event: str, path: str, args: tuple[Any, ...], who: str) -> str | None:
        """The files surface (``files.py``): an ``open`` of ``inputs/NAME`` without write flags, of
        ``outputs/NAME`` in any mode, by the runner's frames or a library's (``pandas.read_csv``,
        ``savefig`` given the program's path, relative to the working directory); a listing of ``outputs/``
        by the runner; "" for anything else (the other rules decide). The runner's ``open`` checked the name
        already; this holds without it."""
        inputs, outputs = state[6]
        if path[:1] != "/":
            path = join(dirname(inputs), path.removeprefix("./"))  # the work directory may be "/" (subprocess)
        folder, name = dirname(path), basename(path)
        if event == "os.scandir" and path == outputs and who == "runner":
            return None
        if event != "open" or folder not in (inputs, outputs) or name[:1] in ("", "."):
            return ""
        flags = args[2] if len(args) > 2 else 0
        mode = args[1] if len(args) > 1 else None
        writing = (type(mode) is str and any(c in mode for c in "wax+")) or (type(flags) is int and flags & write_flags)
        return "an input file opened for writing" if folder == inputs and writing else None

    def area(other: _Rule) -> _Rule:
        def checked(event: str, caller: Any, who: str, args: tuple[Any, ...]) -> str | None:
            path = args[0] if args else None
            if who in ("runner", "library") and state[6] and type(path) is str:
                why = rule(event, path, args, who)
                if why != "":
                    return why
            decided: str | None = other(event, caller, who, args)
            return decided

        return checked

    return area


def _sendmsg(event: str, caller: Any, who: str, args: tuple[Any, ...]) -> str | None:
    """Only the runner's result, its large output files' descriptors attached (``channel.send_with_fds``)."""
    if who == "runner" and caller.f_code.co_name == "send_with_fds":
        return None
    return "a message sent on a socket"


def _code_rules(site: Any, library: tuple[str, ...], state: list[Any], runner_dir: str) -> dict[str, _Rule]:  # noqa: C901
    """The rules for events that load or run code, or touch files: exec, compile, import, open, marshal.

    Files: read-only, from library or import-machinery frames, under the library roots, the system-information
    paths, or the runner's own directory (``linecache`` reads its source when ``logging``'s ``stack_info`` or a
    library's warning formats a stack that passes through the runner: source that is no secret)."""
    readable = (*library, runner_dir)
    relative, env_root, generator_compile = _relative, library[1], _generator_check(site)
    audited, optional, system_info, write_flags = AUDITED_IMPORTS, _OPTIONAL_IMPORTS, _SYSTEM_INFO, _WRITE_FLAGS
    reimported, reimporting, stdlib, tz_roots = REIMPORTED_BY_LIBRARIES, _REIMPORTING_PACKAGES, library[0], TZ_ROOTS
    code_type = type(_classifier.__code__)
    area = _files_rule(state)
    generators = (("dataclasses.py", "_create_fn"), ("collections/__init__.py", "namedtuple"))

    def exec_(event: str, caller: Any, who: str, args: tuple[Any, ...]) -> str | None:
        code = args[0] if args else None
        if code is not None and code is state[3]:
            return None  # the program's own code object, executed once by the runner
        filename = getattr(code, "co_filename", None) if type(code) is code_type else None
        if (
            who == "import"
            and type(filename) is str
            and (filename.startswith("<frozen ") or relative(filename, library))
        ):
            return None  # a library (or frozen standard) module's code, run by the import machinery
        if who == "library" and site(caller.f_code) in generators:
            return None  # its text passed the compile check just before
        return "exec() or eval() of code that no audited generator produced"

    def compile_(event: str, caller: Any, who: str, args: tuple[Any, ...]) -> str | None:
        if who == "import" and len(args) > 1 and type(args[1]) is str and relative(args[1], library):
            return None
        if who == "library":
            why: str | None = generator_compile(caller, args[0] if args else None)
            return why
        return "compile() of text that no audited generator produced"

    def import_(event: str, caller: Any, who: str, args: tuple[Any, ...]) -> str | None:
        name = args[0] if args else None
        if who in ("program", "generated") or type(name) is not str:
            return "an import the program made itself"
        if name in audited or name in optional:
            return None
        frame: Any = caller
        while name in reimported and frame is not None:  # asyncio's or email's module body
            where = relative(frame.f_code.co_filename, (stdlib,))
            if where is not None and where.startswith(reimporting) and frame.f_code.co_name == "<module>":
                return None
            frame = frame.f_back
        frame = caller
        while frame is not None:  # an environment package importing what it needs
            if relative(frame.f_code.co_filename, (env_root,)) is not None:
                return None
            frame = frame.f_back
        return "import of a module outside the audited set"

    def file(event: str, caller: Any, who: str, args: tuple[Any, ...]) -> str | None:
        path = args[0] if args else None
        if event == "open" and who in ("library", "runner") and type(path) is str and relative(path, tz_roots):
            return None  # the time-zone database, read by zoneinfo (the runner's ZoneInfo calls the C constructor)
        if (
            who not in ("import", "library")
            or type(path) is not str
            or (relative(path, readable) is None and relative(path, system_info) is None)
        ):
            return "a file or directory outside the read-only library directories"
        if event == "open":
            mode = args[1] if len(args) > 1 else "r"
            flags = args[2] if len(args) > 2 else 0
            if (type(mode) is str and any(c in mode for c in "wax+")) or (type(flags) is int and flags & write_flags):
                return "a file opened for writing"
        return None

    def marshal_loads(event: str, caller: Any, who: str, args: tuple[Any, ...]) -> str | None:
        return None if who == "import" else "marshal.loads() outside the import machinery"

    return {"exec": exec_, "compile": compile_, "import": import_, "open": area(file), "os.listdir": file,
            "os.scandir": area(file), "marshal.loads": marshal_loads, "socket.sendmsg": _sendmsg}  # fmt: skip


#: The outcome of this process's installation (a confined environment zygote installs the hook before it
#: imports, as a fresh runner has it then; its runners inherit the hook and install no second one).
_INSTALLED: list[bool] = []


def install(*, roots: tuple[str, ...] | None = None) -> bool:
    """Install the hook (unarmed) once per process and self-test it; True when it answered."""
    if not _INSTALLED:
        _INSTALLED.append(_install(roots))
    return _INSTALLED[0]


def _install(roots: tuple[str, ...] | None) -> bool:  # noqa: C901, PLR0915 - one closure: see the module doc
    """Install the hook (unarmed) and self-test it; True when it answered.

    Everything the hook decides with is bound here, in closures (the tables too): rebinding this module's
    names afterwards changes nothing."""
    write_result = _result_writer()
    library = library_roots() if roots is None else roots
    runner_dir = os.path.dirname(os.path.abspath(__file__))
    kind, site = _classifier(runner_dir, library)
    env_root, exit_now, getframe, tool = library[1], os._exit, sys._getframe, _TOOL
    harmless, self_test, arm_event, violation = _HARMLESS, SELF_TEST, ARM, VIOLATION
    # The hook's whole state: [armed, busy, out_fd, code, stdout, max_bytes, (inputs dir, outputs dir) or None]
    state: list[Any] = [False, False, -1, None, None, 0, None]
    rules = {**_frame_rules(kind, site, env_root), **_code_rules(site, library, state, runner_dir)}
    relative = _relative

    def trip(event: str, detail: str, source: str = "tripwire") -> None:
        security_event = {"source": source, "event": event[:100], "detail": detail[:200]}
        message = (
            f"the sandbox stopped the program at audit event {event!r}: {detail}" if source == "tripwire" else detail
        )
        try:
            write_result(state[2], message, security_event, state[4], state[5])
        finally:
            exit_now(VIOLATION_EXIT_STATUS)

    def importing_environment(frame: Any) -> bool:
        """Whether an environment package's module body runs between ``frame`` and the program's code: the
        package importing itself (numpy loads its extensions, reads its data files, sets its threading
        variables), code that the package chose and the program cannot reach into."""
        while frame is not None:
            code = frame.f_code
            if code.co_filename == tool:
                return False
            if code.co_name == "<module>" and relative(code.co_filename, (env_root,)) is not None:
                return True
            frame = frame.f_back
        return False

    def decide(event: str, args: tuple[Any, ...]) -> str | None:
        """Why ``event`` ends the execution, or None when it may proceed."""
        caller = getframe(2)  # 0: decide, 1: hook, 2: the code that caused the event
        who = kind(caller.f_code)
        if who in ("library", "import") and importing_environment(caller):
            return None
        rule = rules.get(event)
        return rule(event, caller, who, args) if rule is not None else "an event the program's proxies never cause"

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if not state[0]:
            if event == self_test:
                raise SelfTestPassed
            if event == arm_event and len(args) == 5:
                state[2], state[3], state[4], state[5], files = args
                if type(files) is tuple and len(files) == 2 and all(type(d) is str and d for d in files):
                    state[6] = files
                state[0] = True
            return
        if event in harmless or state[1]:
            return
        state[1] = True  # events the hook itself causes (its own sys._getframe) pass above
        if event == violation:
            message, name = (*args, "", "")[:2]
            text = message if type(message) is str else "the program violated the sandbox"
            trip(name if type(name) is str and name else "withheld_name", text, "inner_wall")
        try:
            why = decide(event, args)
        except BaseException:
            why = "the tripwire could not decide on this event"
        if why is not None:
            trip(event, why)
        state[1] = False

    sys.addaudithook(hook)
    try:
        sys.audit(SELF_TEST)
    except SelfTestPassed:
        return True
    return False


def arm(out_fd: int, code: Any, stdout: Any, max_bytes: int, files: tuple[str, str] | None = None) -> None:
    """Arm the installed hook: from now on it decides every event (once only: a second arming trips).
    ``files``: the absolute ``inputs/`` and ``outputs/`` directories the runner's ``open`` may reach."""
    sys.audit(ARM, out_fd, code, stdout, max_bytes, files)
