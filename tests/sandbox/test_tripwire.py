"""The tripwire (issue 36; docs/security.md, "The tripwire"): the runner's PEP 578 audit hook ends the
execution at the first event a program confined to its proxies could never cause.

Attacks come two ways: through RestrictedPython with a fix reverted (``sandforge.sandbox.seam``, the tests'
seam: the real standard-library callable back on the proxy), and as an escaped program (the real runner with
unrestricted programs, ``escaped_runner_armed.py`` and its container bootstrap), which holds the real ``os``,
``sys`` and builtins: whatever it then does with them must trip. Each test says which layer stopped it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandforge.sandbox import ErrorType, ExecutionOutcome, ExecutionRequest, Sandbox, SandboxConfig, seam
from sandforge.sandbox.backends.base import Backend
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend
from sandforge.sandbox.inside import tripwire, world
from sandforge.sandbox.inside.wire import VIOLATION_EXIT_STATUS
from sandforge.sandbox.protections import Protection, enforced
from sandforge.sandbox.protocol import BootSeam, Limits, tripwire_canary
from tests.conftest import BACKEND_PARAMS
from tests.sandbox.test_container_boundary import ESCAPED_BOOTSTRAP_ARMED, container_backend

ARMED = Path(__file__).with_name("escaped_runner_armed.py")
LIMITS = Limits(timeout_s=10, memory_mb=256, disk_mb=4, max_processes=12)
SECRET = "/etc/sandforge-tripwire-secret-path"

#: Every backend (the runner's interpreter differs: the host's for subprocess, the image's for containers, on
#: runc's or gVisor's kernel).
BACKENDS = BACKEND_PARAMS
#: Subprocess and one container backend: the tests that revert a fix through the seam.
TWO_BACKENDS = ["subprocess", pytest.param("docker", marks=pytest.mark.docker)]


def tripped(outcome: ExecutionOutcome, event: str) -> None:
    """The tripwire ended the run on ``event``: a sandbox_violation with its security event, nothing else."""
    assert outcome.error_type == ErrorType.SANDBOX_VIOLATION, (
        outcome.error_type,
        outcome.error_message,
        outcome.stderr,
    )
    assert outcome.security_event is not None, outcome.error_message
    assert (outcome.security_event.source, outcome.security_event.event) == ("tripwire", event), outcome.security_event
    assert outcome.context is None
    if outcome.metadata.get("exit_code") is not None:  # the backends that wait for the exit
        assert outcome.metadata["exit_code"] == VIOLATION_EXIT_STATUS


# --- ordinary programs never trip ------------------------------------------------------------------------

ORDINARY = """
import dataclasses, collections, enum, typing, json, re, decimal, datetime, statistics, string, textwrap
import random, io, csv, html, base64, hashlib, calendar, time, urllib.parse, copy, functools, fractions
import xml.etree.ElementTree as ET
@dataclasses.dataclass(order=True)
class Point:
    x: int
    y: int = 0
    tags: list = dataclasses.field(default_factory=list)
@dataclasses.dataclass(frozen=True, kw_only=True)
class Frozen:
    self: int = 1
    name: str = "n"
P = collections.namedtuple("P", "a b", defaults=[0])
class Color(enum.Enum):
    RED = 1
E = enum.Enum("E", "A B")
TD = typing.TypedDict("TD", {"a": int})
class TD2(typing.TypedDict):
    x: int
class Node(typing.NamedTuple):
    v: int
Alias = typing.List["Point"]
T = typing.TypeVar("T")
when = datetime.datetime.strptime("2024-01-02", "%Y-%m-%d")
buf = io.StringIO()
csv.writer(buf).writerow([1, 2])
@functools.lru_cache
def f(n):
    return n
print(Point(1), P(1), Color.RED, E.A, Frozen(), Node(1), id(buf) > 0)
context["ok"] = True
return [
    repr(Point(1, 2)), Point(1) < Point(2), hash(Frozen()) == hash(Frozen()), P(1).b, str(when.date()),
    json.loads(json.dumps({"a": [1]})), re.sub(r"\\d", "n", "a1"), str(decimal.Decimal("1.10") + 1),
    statistics.median([1, 2, 3]), string.Template("$a").substitute(a=1), textwrap.shorten("a b c d", 5),
    random.Random(1).randint(1, 9), html.escape("<"), base64.b64encode(b"x").decode(), hashlib.md5(b"").hexdigest(),
    calendar.isleap(2024), urllib.parse.urlparse("http://x/y").path, copy.deepcopy([Point(1)])[0].x,
    str(fractions.Fraction(1, 3)), ET.tostring(ET.fromstring("<a/>")).decode(), f(2), time.time() > 0, buf.getvalue(),
]
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_ordinary_programs_do_not_trip(backend: str) -> None:
    with Sandbox(SandboxConfig(backend=backend, pool_size=0)) as sb:
        outcome = sb.execute(ExecutionRequest(code=ORDINARY))
    assert outcome.ok, (outcome.error_type, outcome.error_message, outcome.stderr)
    assert outcome.value[0] == "sandforge_tool.<locals>.Point(x=1, y=2, tags=[])"
    assert outcome.protections[Protection.AUDIT_TRIPWIRE] is True
    assert outcome.context == {"ok": True}


# --- issue 36, item 1, with the fix reverted: the tripwire alone stops it ------------------------------

INJECTED = '__import__("os").system("id")'
DATACLASS_INJECTION = (
    "import dataclasses, typing\n"
    f"T = typing.TypedDict('T', {{'q\"\\n{INJECTED}\\ndef k():\\n return \"': int}})\n"
    "dataclasses.dataclass(T, init=False, eq=False)\n"
    "return 'escaped'"
)
CLASS_STATEMENT_INJECTION = (
    "import dataclasses, typing\n"
    f"T = typing.TypedDict('T', {{'q\"\\n{INJECTED}\\ndef k():\\n return \"': int}})\n"
    "@dataclasses.dataclass(init=False, eq=False)\n"
    "class U(T):\n    pass\n"
    "return 'escaped'"
)


@pytest.fixture
def fixes_reverted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' seam: the real ``dataclasses.dataclass`` and ``typing.TypedDict`` on the proxies and no name
    check before the class generators (``generators.check_generated_names``, issue 36 item 1's fix), so only
    the tripwire is left to stop it."""
    reverted = ("dataclasses.dataclass", "typing.TypedDict", "generators.check_generated_names")
    monkeypatch.setattr(seam, "ACTIVE", BootSeam(unwrapped=reverted))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("code", [DATACLASS_INJECTION, CLASS_STATEMENT_INJECTION], ids=["call", "class-statement"])
def test_dataclass_exec_injection_trips_with_the_name_check_reverted(
    backend: str, code: str, fixes_reverted: None
) -> None:
    """Stopped by the tripwire's own check of the generator (``compile`` from ``dataclasses._create_fn``: a
    field name that is not an identifier), before the generated text runs."""
    with Sandbox(SandboxConfig(backend=backend, pool_size=0)) as sb:
        outcome = sb.execute(ExecutionRequest(code=code))
    tripped(outcome, "compile")
    assert "identifier" in outcome.security_event.detail  # type: ignore[union-attr]
    assert INJECTED not in (outcome.error_message or "")


# --- issue 36, item 5, with the fix reverted: what stops an escape attempt through the special methods -------

#: A functional Enum installs ``__reduce_ex__`` (and hides Enum's own ``__copy__``); ``copy.copy`` then hands
#: the program's reduce value to ``copy._reconstruct``, which ``setattr``-s every name of its state on the
#: new object, ``__class__`` included: an attribute the guards refuse to the program, set by library code.
ENUM_SPECIAL_METHODS = """
import copy, enum
class Box:
    pass
class Other:
    pass
def reduce(self, protocol):
    return (Box, (), (None, {'__class__': Other}))
E = enum.Enum('E', {'__reduce_ex__': reduce, '__copy__': None, 'A': 1})
return isinstance(copy.copy(E.A), Other)
"""


@pytest.mark.parametrize("backend", TWO_BACKENDS)
@pytest.mark.parametrize(
    ("reverted", "stopped_by"),
    [
        ((), "inner_wall"),  # the fix: the name check refuses '__reduce_ex__' before enum sees it
        (("generators.check_generated_names",), "tripwire"),  # the fix reverted: the tripwire alone
        (("generators.check_generated_names",), None),  # and no tripwire either: the attempt is real
    ],
    ids=["fix", "fix-reverted", "no-tripwire"],
)
def test_enum_special_methods_with_the_name_check_reverted(
    backend: str, reverted: tuple[str, ...], stopped_by: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 5 with its fix reverted: the class is created with the program's ``__reduce_ex__`` (no event:
    nothing reached the real world yet); the ``__class__`` assignment ``copy`` then makes on its behalf is
    ``object.__setattr__`` from library code on an object, not a class the program defined: the tripwire
    ends the run there."""
    monkeypatch.setattr(seam, "ACTIVE", BootSeam(unwrapped=reverted, tripwire_off=stopped_by is None))
    with Sandbox(SandboxConfig(backend=backend, pool_size=0)) as sb:
        outcome = sb.execute(ExecutionRequest(code=ENUM_SPECIAL_METHODS))
    if stopped_by is None:
        assert outcome.ok and outcome.value is True, (outcome.error_type, outcome.error_message)
    elif stopped_by == "tripwire":
        tripped(outcome, "object.__setattr__")
    else:
        assert outcome.error_type == ErrorType.SANDBOX_VIOLATION, (outcome.error_type, outcome.error_message)
        assert outcome.security_event is not None
        assert (outcome.security_event.source, outcome.security_event.event) == ("inner_wall", "generated_name")
        assert "'__reduce_ex__'" in (outcome.error_message or "")


# --- an escaped program: every event class trips, with its name and none of its arguments ----------------

#: (what the escaped program does, the audit event that must end it)
ESCAPES = [
    (f"open({SECRET!r})", "open"),
    (f"import os\nos.listdir({SECRET!r})", "os.listdir"),
    ("import os\nos.system('id')", "os.system"),
    ("import os\nos.kill(1, 0)", "os.kill"),
    ("import sys\nsys.modules.pop('ctypes', None)\nimport ctypes", "import"),  # forgotten after lock-down
    ("import pickle", "import"),  # outside the audited set
    ("import socket\nsocket.socket()", "socket.__new__"),
    ("import sys\nsys._getframe()", "sys._getframe"),
    ("import sys\nsys.settrace(None)", "sys.settrace"),
    ("import sys\nsys.setprofile(None)", "sys.setprofile"),
    ("import sys\nsys.addaudithook(lambda *a: None)", "sys.addaudithook"),
    ("compile('1', 'x', 'eval')", "compile"),
    ("import marshal\nmarshal.loads(b'\\xe9\\x01\\x00\\x00\\x00')", "marshal.loads"),
    ("def f():\n    pass\nf.__code__", "object.__getattr__"),
    ("def g():\n    yield 1\ng().gi_frame", "object.__getattr__"),
    ("try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    e.__traceback__.tb_frame", "object.__getattr__"),
    ("import json\njson.JSONDecoder.__doc__ = 'x'", "object.__setattr__"),
    ("import sys\nsys._current_frames()", "sys._current_frames"),
    ("import sys\nsys.audit('sandforge.tripwire.arm', 1, None, None, 1)", "sandforge.tripwire.arm"),
]


@pytest.fixture(scope="module")
def armed_subprocess() -> Iterator[Backend]:
    backend = SubprocessBackend(SandboxConfig(pool_size=0), runner=ARMED)
    try:
        yield backend
    finally:
        backend.close()


def run_escaped(backend: Backend, code: str) -> ExecutionOutcome:
    worker = backend.spawn(LIMITS)
    return worker.execute(ExecutionRequest(code=code, limits=LIMITS), None)


@pytest.mark.parametrize(("code", "event"), ESCAPES, ids=[e for _, e in ESCAPES])
def test_an_escaped_program_trips_on_subprocess(armed_subprocess: Backend, code: str, event: str) -> None:
    """Stopped by the tripwire alone: the program runs unrestricted (RestrictedPython and the proxies gone)."""
    outcome = run_escaped(armed_subprocess, f"print('before')\n{code}\nprint('after')\nreturn 'not stopped'")
    tripped(outcome, event)
    assert outcome.stdout == "before\n"  # what it printed until then, nothing after
    assert SECRET not in (outcome.error_message or "") and SECRET not in str(outcome.security_event)


@pytest.fixture(params=[p for p in BACKEND_PARAMS if p != "subprocess"])
def armed_container(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    request.getfixturevalue("docker_env")
    backend = container_backend(request.param, ESCAPED_BOOTSTRAP_ARMED, monkeypatch)
    try:
        yield backend
    finally:
        backend.close()


@pytest.mark.parametrize(("code", "event"), [ESCAPES[0], ESCAPES[2], ESCAPES[4], ESCAPES[11], ESCAPES[16]])
def test_an_escaped_program_trips_in_a_container(armed_container: Backend, code: str, event: str) -> None:
    outcome = run_escaped(armed_container, f"print('before')\n{code}\nreturn 'not stopped'")
    tripped(outcome, event)
    assert outcome.stdout == "before\n"


def test_an_escaped_program_cannot_erase_its_inner_wall_violation(armed_subprocess: Backend) -> None:
    """Issue 36 item 2: clearing ``VIOLATIONS`` and the seal used to end ok. The first violation is final:
    the runner wrote the result and exited before the program could reach either."""
    code = (
        "import sys\nworld = sys.modules['inside.world']\n"
        "try:\n    raise world.SandboxViolation('first', 'withheld_name')\nexcept Exception:\n    pass\n"
        "world.VIOLATIONS.clear()\nworld.ACTIVE_SEAL.clear()\nreturn 'clean'"
    )
    outcome = run_escaped(armed_subprocess, code)
    assert outcome.error_type == ErrorType.SANDBOX_VIOLATION
    assert outcome.security_event is not None and outcome.security_event.source == "inner_wall"
    assert outcome.metadata["exit_code"] == VIOLATION_EXIT_STATUS


# --- the protection: required everywhere, verified by the canary, not settable by a request --------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_canary_is_stopped(backend: str) -> None:
    with Sandbox(SandboxConfig(backend=backend, pool_size=0)) as sb:
        outcome = sb.execute(tripwire_canary())
    tripped(outcome, "sys._getframe")


def test_the_canary_cannot_be_asked_for_by_a_request() -> None:
    with pytest.raises(ValueError, match="_tripwire_canary"):
        ExecutionRequest.model_validate({"code": "return 1", "_tripwire_canary": True})
    assert ExecutionRequest(code="return 1")._tripwire_canary is False


def test_audit_tripwire_cannot_be_waived() -> None:
    assert Protection.AUDIT_TRIPWIRE in enforced((), (Protection.AUDIT_TRIPWIRE,))
    config = SandboxConfig(allow_missing=(Protection.AUDIT_TRIPWIRE,))
    assert Protection.AUDIT_TRIPWIRE in config.enforced_protections


def test_the_audited_imports_cover_every_allowed_module() -> None:
    """``tripwire.AUDITED_IMPORTS`` was measured: an interpreter whose allowed modules import more fails here
    until the new modules are audited."""
    inside = Path(tripwire.__file__).resolve().parent
    script = (
        f"import sys; sys.path.insert(0, {str(inside.parent)!r})\n"
        "before = set(sys.modules)\n"
        f"for name in {sorted({*world.ALLOWED_MODULES, *world.INTERNAL_IMPORTS})!r}: __import__(name)\n"
        "print(' '.join(sorted(set(sys.modules))))"
    )
    loaded = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", script], capture_output=True, text=True, check=True
    )
    missing = set(loaded.stdout.split()) - tripwire.AUDITED_IMPORTS - tripwire.REIMPORTED_BY_LIBRARIES
    missing -= {"__main__", "site"}
    assert not missing


def test_only_the_runners_send_with_fds_may_send_a_message_on_a_socket() -> None:
    """``socket.sendmsg`` (descriptors attached: issue 41's large outputs) passes the tripwire from the runner's
    own ``channel.send_with_fds`` alone; the hook says ``runner`` only for the runner's code (its file), so a
    program's function of the same name, or any other runner function, is refused."""

    def send_with_fds() -> object:  # the name the rule looks for, in a frame that is not the runner's
        return sys._getframe()

    named = send_with_fds()
    assert tripwire._sendmsg("socket.sendmsg", named, "runner", ()) is None
    assert tripwire._sendmsg("socket.sendmsg", named, "program", ()) == "a message sent on a socket"
    assert tripwire._sendmsg("socket.sendmsg", named, "library", ()) == "a message sent on a socket"
    assert tripwire._sendmsg("socket.sendmsg", sys._getframe(), "runner", ()) == "a message sent on a socket"
