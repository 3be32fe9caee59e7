"""The modules issue 38 adds (``sandbox/inside/idiom_modules.py``): each works as agent tools use it, on
the subprocess backend and on docker, and each is attacked for what its audit withheld or replaced. Every
attack says what stops it: ``proxy`` (a withheld name or a wrapper: a sticky ``sandbox_violation``),
``guard`` (the run-time attribute guard, or a refused format field: the program's own error) or
``library`` (the module's own check: ``zoneinfo`` refuses keys that leave its database) or ``loop`` (the
sandbox's event loop, which has no sockets, threads, pipes or subprocesses)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import pytest

from sandforge.sandbox import ErrorType, ExecutionRequest, Sandbox, SandboxConfig


@pytest.fixture(scope="module", params=["subprocess", pytest.param("docker", marks=pytest.mark.docker)])
def sb(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    with Sandbox(SandboxConfig(backend=request.param, pool_size=1)) as sandbox:
        yield sandbox


def run(sb: Sandbox, code: str) -> object:
    return sb.execute(ExecutionRequest(code=textwrap.dedent(code)))


WORKS = [
    (
        "uuid",
        """
        import uuid
        named = uuid.uuid5(uuid.NAMESPACE_DNS, "example.com")
        fresh = uuid.uuid4()
        return [str(named), fresh.version, uuid.UUID(str(named)) == named, len(fresh.hex)]
        """,
        ["cfbff0d1-9375-5685-968c-48ce8b15ae17", 4, True, 32],
    ),
    (
        "zoneinfo, two zones, from the image's or host's database",
        """
        import datetime, zoneinfo
        ny, tokyo = zoneinfo.ZoneInfo("America/New_York"), zoneinfo.ZoneInfo("Asia/Tokyo")
        meeting = datetime.datetime(2024, 3, 10, 12, 0, tzinfo=ny)
        try:
            zoneinfo.ZoneInfo("Mars/Olympus_Mons")
            missing = False
        except zoneinfo.ZoneInfoNotFoundError:
            missing = True
        return [meeting.astimezone(tokyo).isoformat(), meeting.utcoffset().total_seconds(), missing]
        """,
        ["2024-03-11T01:00:00+09:00", -14400.0, True],
    ),
    (
        "logging to the execution's stderr and to a StringIO",
        """
        import io, logging
        logging.basicConfig(level=logging.INFO, format="%(levelname)s:%(name)s:%(message)s")
        log = logging.getLogger("tool")
        log.info("started %d", 3)
        buffer = io.StringIO()
        handler = logging.StreamHandler(buffer)
        handler.setFormatter(logging.Formatter("{levelname} {message}", style="{"))
        log.addHandler(handler)
        log.warning("low stock")
        try:
            1 / 0
        except ZeroDivisionError:
            log.exception("failed")
        return buffer.getvalue().splitlines()[:2]
        """,
        ["WARNING low stock", "ERROR failed"],
    ),
    (
        "traceback formats the program's frames only",
        """
        import traceback
        def inner():
            return {}["missing"]
        try:
            inner()
        except KeyError as exc:
            text = traceback.format_exc()
            lines = traceback.format_exception(exc)
            only = traceback.format_exception_only(type(exc), exc)
        return [text.splitlines()[0], text.splitlines()[-1], "<tool>" in text, "inside" in text, lines[-1], only]
        """,
        [
            "Traceback (most recent call last):",
            "KeyError: 'missing'",
            True,
            False,
            "KeyError: 'missing'\n",
            ["KeyError: 'missing'\n"],
        ],
    ),
    (
        "configparser from a string",
        """
        import configparser, io
        config = configparser.ConfigParser()
        config.optionxform = str
        config.read_string("[db]\\nHost = db.local\\nport = 5432\\n[cache]\\nttl = 60\\n")
        out = io.StringIO()
        config.write(out)
        return [config.sections(), config["db"]["Host"], config.getint("db", "port"), "Host" in out.getvalue()]
        """,
        [["db", "cache"], "db.local", 5432, True],
    ),
    (
        "email.utils RFC 2822 dates and addresses",
        """
        import datetime, email.utils
        when = email.utils.parsedate_to_datetime("Tue, 01 Oct 2024 10:00:00 +0200")
        stamp = email.utils.format_datetime(datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc))
        return [when.isoformat(), stamp, email.utils.parseaddr("Bo <bo@example.org>")]
        """,
        ["2024-10-01T10:00:00+02:00", "Mon, 01 Jan 2024 00:00:00 +0000", ["Bo", "bo@example.org"]],
    ),
    (
        "asyncio.gather of three coroutines, async with, async for, queues and timeouts",
        """
        import asyncio

        class Session:
            async def __aenter__(self):
                self.open = True
                return self

            async def __aexit__(self, *exc):
                self.open = False

        async def pages(n):
            for i in range(n):
                await asyncio.sleep(0)
                yield i

        async def fetch(name, delay):
            await asyncio.sleep(delay)
            return f"{name}:{delay}"

        async def main():
            results = await asyncio.gather(fetch("a", 0.02), fetch("b", 0.01), fetch("c", 0))
            async with Session() as session:
                was_open = session.open
            seen = [i async for i in pages(3)]
            queue = asyncio.Queue()
            await queue.put("job")
            try:
                await asyncio.wait_for(asyncio.sleep(5), 0.01)
                timed_out = False
            except asyncio.TimeoutError:
                timed_out = True
            return [results, was_open, session.open, seen, await queue.get(), timed_out]

        return asyncio.run(main())
        """,
        [["a:0.02", "b:0.01", "c:0"], True, False, [0, 1, 2], "job", True],
    ),
    (
        "sys: facts and the program's own streams",
        """
        import sys
        print("to stdout", file=sys.stdout)
        sys.stderr.write("to stderr\\n")
        info = sys.version_info
        return [info >= (3, 8), sys.maxsize > 2**31, info.major, sys.byteorder in ("little", "big")]
        """,
        [True, True, 3, True],
    ),
    (
        "queue and stat",
        """
        import queue, stat
        jobs = queue.PriorityQueue()
        for job in [(3, "c"), (1, "a"), (2, "b")]:
            jobs.put(job)
        order = [jobs.get()[1] for _ in range(3)]
        return [order, jobs.empty(), stat.filemode(0o100644), stat.S_ISDIR(0o040755)]
        """,
        [["a", "b", "c"], True, "-rw-r--r--", True],
    ),
]


@pytest.mark.parametrize(("code", "value"), [pytest.param(c, v, id=n) for n, c, v in WORKS])
def test_the_module_works(sb: Sandbox, code: str, value: object) -> None:
    out = run(sb, code)
    assert out.ok, (out.error_type, out.error_message)  # type: ignore[attr-defined]
    assert out.value == value  # type: ignore[attr-defined]


def test_logging_writes_to_the_executions_stderr(sb: Sandbox) -> None:
    out = run(sb, "import logging\nlogging.getLogger('tool').warning('disk at %d%%', 91)\nreturn 1")
    assert out.ok, out.error_message  # type: ignore[attr-defined]
    assert "disk at 91%" in out.stderr and "disk at 91%" not in out.stdout  # type: ignore[attr-defined]


def test_logging_a_stack_or_an_exception_does_not_trip(sb: Sandbox) -> None:
    """``logging.exception`` and ``stack_info=True`` format a stack through the runner's own frames, whose
    source ``linecache`` reads: the tripwire lets library code read the runner's directory, read-only."""
    code = (
        "import logging\nlog = logging.getLogger('tool')\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n"
        "    log.exception('failed')\nlog.warning('here', stack_info=True)\nreturn 1"
    )
    out = run(sb, code)
    assert out.ok, (out.error_type, out.error_message)  # type: ignore[attr-defined]
    assert "ZeroDivisionError" in out.stderr and "Stack (most recent call last)" in out.stderr  # type: ignore[attr-defined]


#: (name, stopped by, program, a text the refusal's message contains)
ATTACKS = [
    ("uuid1 reads the network interfaces", "proxy", "import uuid\nreturn str(uuid.uuid1())", "uuid.uuid1 is withheld"),
    ("getnode", "proxy", "from uuid import getnode\nreturn getnode()", "getnode"),
    ("uuid's os", "guard", "import uuid\nreturn uuid._uuid", "starts with"),
    (
        "zoneinfo path outside the database",
        "library",
        "import zoneinfo\nreturn str(zoneinfo.ZoneInfo('/etc/passwd'))",
        "ValueError",
    ),
    (
        "zoneinfo relative escape",
        "library",
        "import zoneinfo\nreturn str(zoneinfo.ZoneInfo('../../etc/passwd'))",
        "ValueError",
    ),
    (
        "zoneinfo walks the database",
        "proxy",
        "import zoneinfo\nreturn len(zoneinfo.available_timezones())",
        "available_timezones is withheld",
    ),
    ("zoneinfo search path", "proxy", "import zoneinfo\nzoneinfo.reset_tzpath(['/'])\nreturn 1", "reset_tzpath"),
    (
        "logging to a file",
        "proxy",
        "import logging\nlogging.basicConfig(filename='/tmp/x.log')\nreturn 1",
        "opens a file",
    ),
    ("logging FileHandler", "proxy", "import logging\nreturn logging.FileHandler('/tmp/x')", "FileHandler is withheld"),
    ("logging's frame", "proxy", "import logging\nreturn logging.currentframe()", "currentframe is withheld"),
    (
        "logging format reading attributes",
        "guard",
        "import logging\nf = logging.Formatter('{exc_info[2].tb_frame.f_globals}', style='{')\nreturn 1",
        "reads an attribute",
    ),
    (
        "logging basicConfig format reading attributes",
        "guard",
        "import logging\nlogging.basicConfig(format='{msg.__class__}', style='{')\nreturn 1",
        "reads an attribute",
    ),
    ("logging's private source file", "guard", "import logging\nreturn logging._srcfile", "starts with"),
    ("traceback frames", "proxy", "import traceback\nreturn traceback.extract_stack()", "extract_stack is withheld"),
    ("traceback walk", "proxy", "import traceback\nreturn list(traceback.walk_stack(None))", "walk_stack is withheld"),
    (
        "traceback locals",
        "proxy",
        "import traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError as e:\n"
        "    return traceback.TracebackException.from_exception(e, capture_locals=True)",
        "TracebackException",
    ),
    (
        "configparser reads files",
        "proxy",
        "import configparser\nconfigparser.ConfigParser().read('/etc/passwd')",
        "opens files",
    ),
    (
        "configparser raw reads files",
        "proxy",
        "import configparser\nconfigparser.RawConfigParser().read(['/etc/hostname'])",
        "opens files",
    ),
    (
        "email msgid looks up the host",
        "proxy",
        "import email.utils\nreturn email.utils.make_msgid()",
        "make_msgid is withheld",
    ),
    (
        "asyncio threads",
        "loop",
        "import asyncio\nasync def main():\n"
        "    return await asyncio.get_running_loop().run_in_executor(None, len, 'x')\nreturn asyncio.run(main())",
        "no sockets, threads",
    ),
    (
        "asyncio name lookup",
        "loop",
        "import asyncio\nasync def main():\n"
        "    return await asyncio.get_running_loop().getaddrinfo('localhost', 80)\nreturn asyncio.run(main())",
        "no sockets, threads",
    ),
    ("asyncio streams", "proxy", "import asyncio\nreturn asyncio.open_connection", "open_connection is withheld"),
    (
        "asyncio subprocess",
        "proxy",
        "import asyncio\nreturn asyncio.create_subprocess_exec",
        "create_subprocess_exec is withheld",
    ),
    ("asyncio to_thread", "proxy", "import asyncio\nreturn asyncio.to_thread", "to_thread is withheld"),
    ("asyncio real loop", "proxy", "import asyncio\nreturn asyncio.new_event_loop()", "new_event_loop is withheld"),
    ("asyncio policy", "proxy", "import asyncio\nreturn asyncio.get_event_loop_policy()", "withheld"),
    (
        "a deadlocked loop ends instead of hanging",
        "loop",
        "import asyncio\nasync def main():\n    await asyncio.Event().wait()\nreturn asyncio.run(main())",
        "nothing left to run",
    ),
    (
        "the loop's private selector",
        "guard",
        "import asyncio\nasync def main():\n"
        "    return asyncio.get_running_loop()._selector\nreturn asyncio.run(main())",
        "starts with",
    ),
    (
        "a coroutine's frame, computed",
        "guard",
        "async def f():\n    return 1\nc = f()\ntry:\n    return getattr(c, 'cr_' + 'frame')\nfinally:\n    c.close()",
        "restricted name",
    ),
    (
        "a task's stack frames lead nowhere",
        "guard",
        "import asyncio\nasync def main():\n    frames = asyncio.current_task().get_stack()\n"
        "    return getattr(frames[0], 'f_' + 'globals')\nreturn asyncio.run(main())",
        "restricted name",
    ),
    ("sys.modules", "proxy", "import sys\nreturn sys.modules['os']", "sys.modules is withheld"),
    ("sys.path", "proxy", "from sys import path\nreturn path", "path"),
    ("sys frames", "guard", "import sys\nreturn sys._getframe(0)", "starts with"),
    ("sys exception state", "proxy", "import sys\nreturn sys.exc_info()", "exc_info is withheld"),
    ("sys audit hooks", "proxy", "import sys\nsys.addaudithook(print)\nreturn 1", "addaudithook is withheld"),
    ("sys stream's real file", "guard", "import sys\nreturn sys.stderr.buffer", "has no attribute"),
    ("email.utils' socket", "guard", "import email.utils\nreturn getattr(email.utils, 'socket')", "has no attribute"),
]


@pytest.mark.parametrize(
    ("stopper", "code", "needle"), [pytest.param(s, c, n, id=f"{s}: {name}") for name, s, c, n in ATTACKS]
)
def test_attack_is_stopped(sb: Sandbox, stopper: str, code: str, needle: str) -> None:
    out = run(sb, code)
    assert not out.ok, f"the attack returned {out.value!r}"  # type: ignore[attr-defined]
    message = out.error_message or ""  # type: ignore[attr-defined]
    assert needle in message, message
    expected = ErrorType.SANDBOX_VIOLATION if stopper == "proxy" else ErrorType.EXECUTION
    assert out.error_type == expected, (out.error_type, message)  # type: ignore[attr-defined]
