"""The inner wall (issue 13 items 1 and 5) attacked on every backend: the two RestrictedPython escapes the
default policy approved, ``canonicalize(from_file=...)``, and variations of each class; plus the runner's
checks called directly (globals seal, sticky violations, the audit gate, forgetting lock-down modules).

Every attack must end as ``sandbox_violation`` (or be harmless), never as a value computed with the real
``sys``, the real builtins or a host file.
"""

from __future__ import annotations

import ast
import calendar
import functools
import os
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandforge.sandbox import ErrorType, ExecutionRequest, Limits, Sandbox, SandboxConfig
from sandforge.sandbox.backends.base import Backend
from sandforge.sandbox.backends.subprocess_backend import SubprocessBackend
from sandforge.sandbox.inside import bridge, compilation, guards, serving, world


def run(sandbox: Sandbox, code: str, **kw: object) -> object:
    return sandbox.execute(ExecutionRequest(code=textwrap.dedent(code), **kw))  # type: ignore[arg-type]


def assert_violation(out: object, fragment: str = "") -> None:
    assert out.error_type == ErrorType.SANDBOX_VIOLATION, (out.error_type, out.error_message, out.value)  # type: ignore[attr-defined]
    assert fragment in (out.error_message or ""), out.error_message  # type: ignore[attr-defined]
    assert out.value is None  # type: ignore[attr-defined]


ESCAPES = {
    "update_wrapper copies __globals__": """
        import functools, calendar
        def f():
            return sys.version
        functools.update_wrapper(f, calendar.isleap, assigned=(), updated=("__globals__",))
        return f()
    """,
    "from-import of update_wrapper": """
        from functools import update_wrapper
        return 1
    """,
    "getattr of update_wrapper": """
        import functools
        return getattr(functools, "update_wrapper")
    """,
    "wraps with updated=": """
        import functools, calendar
        @functools.wraps(calendar.isleap, updated=("__globals__",))
        def f():
            return sys.version
        return f()
    """,
    "wraps with assigned=": """
        import functools, calendar
        @functools.wraps(calendar.isleap, assigned=("__globals__",))
        def f():
            return 1
        return f()
    """,
    "singledispatch": """
        import functools
        @functools.singledispatch
        def handle(x):
            return 0
        return handle(1)
    """,
    "singledispatchmethod": """
        from functools import singledispatchmethod
        return 1
    """,
    "copy's dispatch table": """
        import copy
        copy.dispatch_table[list] = lambda x: (list, ())
        return 1
    """,
    "reduce protocol": """
        class A:
            def __reduce_ex__(self, protocol):
                return (A, ())
        return 1
    """,
    "GenericAlias": """
        import functools
        return functools.GenericAlias
    """,
    "base64.main reads the protocol channel": """
        import base64
        base64.main()
    """,
    "calendar.main": """
        import calendar
        calendar.main(["x", "--help"])
    """,
    "set the clock": """
        import time
        time.clock_settime(0, 0.0)
    """,
    "C-API capsule": """
        import datetime
        return repr(datetime.datetime_CAPI)
    """,
    "io.open outside io's allow-list": """
        import io
        return io.open
    """,
    "hasattr of a withheld name": """
        import functools
        return hasattr(functools, "singledispatch")
    """,
}


@pytest.mark.parametrize("code", list(ESCAPES.values()), ids=list(ESCAPES))
def test_escape_is_a_violation(sandbox: Sandbox, code: str) -> None:
    assert_violation(run(sandbox, code))


@pytest.mark.parametrize(
    "source",
    ["'/etc/passwd'", "'/proc/self/status'", "b'/etc/hostname'", "3", "0", "True"],
)
def test_canonicalize_opens_no_file_or_descriptor(sandbox: Sandbox, source: str) -> None:
    out = run(sandbox, f"import xml.etree.ElementTree as ET\nreturn ET.canonicalize(from_file={source})")
    assert_violation(out, "canonicalize(from_file=...)")


def test_canonicalize_still_works_on_text_and_readers(sandbox: Sandbox) -> None:
    out = run(
        sandbox,
        """
        import csv
        import xml.etree.ElementTree as ET
        return [ET.canonicalize("<a  b='1'/>"), ET.canonicalize(from_file=csv.StringIO("<x><y/></x>"))]
        """,
    )
    assert out.ok, out.error_message
    assert out.value == ['<a b="1"></a>', "<x><y></y></x>"]


def test_xml_parsing_reads_no_file(sandbox: Sandbox) -> None:
    """The class of item 5: no allowed parser follows external entities, DTDs or includes to a file."""
    out = run(
        sandbox,
        """
        import xml.etree.ElementTree as ET
        out = []
        for doc in args:
            try:
                out.append(ET.tostring(ET.fromstring(doc), encoding="unicode"))
            except ET.ParseError as exc:
                out.append("ParseError")
        return out
        """,
        args=[
            '<!DOCTYPE a [<!ENTITY x SYSTEM "file:///etc/hostname">]><a>&x;</a>',
            '<!DOCTYPE a [<!ENTITY % p SYSTEM "file:///etc/hostname"> %p;]><a>x</a>',
            '<!DOCTYPE a SYSTEM "file:///etc/hostname"><a>x</a>',
            '<a xmlns:xi="http://www.w3.org/2001/XInclude"><xi:include href="/etc/hostname" parse="text"/></a>',
        ],
    )
    assert out.ok, out.error_message
    assert out.value[0] == "ParseError"
    assert out.value[1:3] == ["<a>x</a>", "<a>x</a>"]
    assert "xi:include" in out.value[3].replace("ns0:", "xi:")  # kept as an element, never resolved


def test_a_violation_is_sticky(sandbox: Sandbox) -> None:
    """Catching the refusal does not help: the run ends as a violation whatever the program returns."""
    out = run(
        sandbox,
        """
        import functools
        try:
            functools.update_wrapper
        except Exception as exc:
            caught = str(exc)
        return "fine"
        """,
    )
    assert_violation(out, "functools.update_wrapper is withheld")


def test_no_nested_call_after_a_violation(sandbox: Sandbox) -> None:
    out = run(
        sandbox,
        """
        import json
        try:
            json.load
        except Exception:
            pass
        return tool("helper").run(1)
        """,
    )
    assert_violation(out, "json.load is withheld")
    assert out.metadata.get("nested_calls", 0) == 0


def test_wraps_keeps_working_for_decorators(sandbox: Sandbox) -> None:
    out = run(
        sandbox,
        """
        import functools
        def deco(f):
            @functools.wraps(f)
            def inner(*a):
                return f(*a) + 1
            return inner
        @deco
        def double(x):
            "Double x."
            return 2 * x
        return [double(2), str(double).split()[1]]
        """,
    )
    assert out.ok, out.error_message
    assert out.value == [5, "sandforge_tool.<locals>.double"]  # the wrapped name, not "inner"


def test_wraps_refuses_non_program_functions(sandbox: Sandbox) -> None:
    out = run(sandbox, "import functools, calendar\nfunctools.wraps(len)(calendar.isleap)\nreturn 1")
    assert out.error_type == ErrorType.EXECUTION and "functions the program defines" in (out.error_message or "")


def test_standard_library_printing_is_captured_and_bounded(sandbox: Sandbox) -> None:
    out = run(sandbox, "import calendar, re\ncalendar.prmonth(2024, 2)\nre.compile('ab', re.DEBUG)\nreturn 1")
    assert out.ok, out.error_message
    assert "February 2024" in out.stdout and "LITERAL 97" in out.stdout
    flood = run(
        sandbox,
        "import calendar\nfor i in range(10000):\n    calendar.prmonth(2024, 2)\nreturn 1",
        limits=Limits(max_output_bytes=4096),
    )
    assert flood.error_type == ErrorType.OUTPUT_LIMIT


def test_honest_annotations_still_compile(sandbox: Sandbox) -> None:
    out = run(sandbox, "def f(x: int, *, y: list[int] = None) -> dict:\n    return {'x': x}\nreturn f(1)")
    assert out.ok, out.error_message
    assert out.value == {"x": 1}


# --- the runner's checks, called directly -----------------------------------------------------------------


def test_every_allowed_module_was_audited() -> None:
    """A module added to ALLOWED_MODULES must be audited (docs/security.md) and listed in AUDITED_MODULES."""
    assert set(world.ALLOWED_MODULES) <= world.AUDITED_MODULES
    for module, names in {**world.WITHHELD_NAMES, **world.MODULE_WRAPPERS}.items():
        assert module in world.ALLOWED_MODULES, module
        real = __import__(module, fromlist=["_"])
        for name in names:
            assert hasattr(real, name), f"{module}.{name} does not exist: a stale entry"


SURFACE = Path(__file__).with_name("inner_wall_surface.json")


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the pinned surface is Python 3.11's (the image's)")
def test_the_exposed_surface_is_the_audited_one() -> None:
    """Every name a proxy exposes was there when the audit was made: a new public name (a Python upgrade, a
    module re-exporting something new) fails here until it is audited and the pin regenerated."""
    import json

    pinned = json.loads(SURFACE.read_text())["surface"]
    proxies = world.build_module_proxies()
    for module, names in pinned.items():
        if module in world.ALLOWED_MODULES:
            new = sorted({n for n in vars(proxies[module]) if not n.startswith("_")} - set(names))
            assert not new, f"{module} exposes unaudited names {new}: audit them (docs/security.md), then re-pin"


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("kind", ["namespace", "module object"])
def test_every_kind_of_proxy_is_sealed(clean_wall: object, lazy: bool, kind: str) -> None:
    """Namespace proxies and module-object proxies (faster attribute reads), filled now or on first use."""
    if kind == "namespace":
        proxies = world.build_module_proxies(lazy=lazy)
        proxy = proxies["functools"]
    else:
        proxy = types.ModuleType("functools")
        world._populate(proxy, "functools")
    assert proxy.partial is functools.partial
    assert proxy.wraps is world.MODULE_WRAPPERS["functools"]["wraps"]
    with pytest.raises(world.SandboxViolation, match=r"functools\.update_wrapper is withheld"):
        proxy.update_wrapper  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        proxy.nope  # noqa: B018
    reason = world.WITHHELD_NAMES["functools"]["update_wrapper"]
    recorded = list(world.VIOLATIONS)
    assert recorded == [
        f"module 'functools' has no attribute 'update_wrapper': functools.update_wrapper is withheld in the "
        f"sandbox: {reason}"
    ]


def test_proxies_expose_no_withheld_name_and_the_wrappers() -> None:
    proxies = world.build_module_proxies()
    for module in world.ALLOWED_MODULES:
        exposed = {k: v for k, v in vars(proxies[module]).items() if not k.startswith("_")}
        assert not set(exposed) & set(world.withheld(module)), module
        assert not any(isinstance(v, type(os)) and world._real_module(v) for v in exposed.values()), module
    assert proxies["functools"].wraps is world.MODULE_WRAPPERS["functools"]["wraps"]
    canonicalize = world.MODULE_WRAPPERS["xml.etree.ElementTree"]["canonicalize"]
    assert proxies["xml.etree.ElementTree"].canonicalize is canonicalize
    del world.VIOLATIONS[:]
    with pytest.raises(world.SandboxViolation, match="withheld"):
        proxies["functools"].singledispatch  # noqa: B018
    assert world.VIOLATIONS
    del world.VIOLATIONS[:]


@pytest.fixture
def clean_wall() -> object:
    del world.VIOLATIONS[:]  # before too: an in-process test of another file may have left its own here
    world.ACTIVE_SEAL.clear()
    yield
    del world.VIOLATIONS[:]
    world.ACTIVE_SEAL.clear()


def _namespace() -> dict[str, object]:
    stdout = world.BoundedText(1000)
    namespace = guards.build_globals(world.build_module_proxies(), stdout, bridge.Bridge(0, 1, 1000))
    namespace[world.TOOL_FUNCTION] = lambda *a: None
    return namespace


def test_the_seal_sees_a_rewritten_namespace(clean_wall: object) -> None:
    namespace = _namespace()
    seal = world.GlobalsSeal(namespace)
    seal.check()  # untouched
    namespace["total"] = 3  # a program's own global is fine
    seal.check()
    namespace.update(calendar.isleap.__globals__)  # what update_wrapper(updated=("__globals__",)) did
    with pytest.raises(world.SandboxViolation, match="rewritten"):
        seal.check()


@pytest.mark.parametrize(
    "change",
    [
        lambda ns: ns["__builtins__"].__setitem__("open", open),
        lambda ns: ns["__builtins__"].pop("getattr"),
        lambda ns: ns.__setitem__("_getattr_", getattr),
        lambda ns: ns.__setitem__("__builtins__", dict(ns["__builtins__"])),
        lambda ns: ns.__setitem__("helper", os),
        lambda ns: ns.pop("_write_"),
    ],
    ids=["builtin added", "builtin removed", "guard replaced", "builtins copied", "real module", "guard removed"],
)
def test_the_seal_sees_each_kind_of_change(clean_wall: object, change: object) -> None:
    namespace = _namespace()
    seal = world.GlobalsSeal(namespace)
    change(namespace)  # type: ignore[operator]
    with pytest.raises(world.SandboxViolation):
        seal.check()


def test_a_missed_hole_is_still_caught_by_the_seal(clean_wall: object) -> None:
    """Put the real update_wrapper back (as if the audit had missed it): the run still ends as a violation,
    because the program's globals no longer hold what the runner put there."""
    proxies = world.build_module_proxies()
    proxies["functools"].update_wrapper = functools.update_wrapper
    code = """
import functools, calendar
def f():
    pass
functools.update_wrapper(f, calendar.isleap, assigned=(), updated=("__globals__",))
return 1
"""
    boot = {"limits": {"max_output_bytes": 1000, "memory_mb": 64}}
    frame = {"code": code, "args": [], "kwargs": {}}
    saved = sys.stdout, sys.stdin
    built = serving.program_globals(proxies, boot["limits"], bridge.Bridge(0, 1, 1000))
    result = serving.execute(frame, {}, boot, built)
    assert (sys.stdout, sys.stdin) == saved  # restored after the program
    assert result.header["status"] == "error"
    assert result.header["error"]["type"] == "sandbox_violation", result.header
    assert "globals" in result.header["error"]["message"]


def test_compile_refusals_are_violations() -> None:
    for code in ["class A:\n    def __deepcopy__(self, memo):\n        pass"]:
        compiled, error = compilation.compile_program(code)
        assert compiled is None and error is not None and error["type"] == "sandbox_violation", code
    assert compilation.inner_wall_refusal(ast.parse("def f(x: 'a'): pass")) is None  # kept as a string (issue 38)


# --- lock-down-only modules are gone from the runner process ----------------------------------------------

FORGETTING_RUNNER = """
import os, sys
sys.path[:0] = [{sandbox!r}, {tests!r}]
from inside import serving, start
real_forget = serving.forget_lockdown_modules
import escaped_runner  # unrestricted programs, as after an escape...
serving.forget_lockdown_modules = real_forget  # ...but with the runner's real clean-up
{late}
if __name__ == "__main__":
    os._exit(start.main(sys.argv[1:]))
"""

PROBE = """
import sys
gone = ("ctypes", "_ctypes", "mmap", "resource", "socket", "_socket", "select", "fcntl", "signal")
loaded = sorted(n for n in sys.modules if n.split(".")[0] in gone)
modules = [m for k, m in list(sys.modules.items()) if k == "inside" or k.startswith("inside.")]
assert len(modules) > 5, sorted(sys.modules)
names = ("ctypes", "mmap", "resource", "fcntl", "signal")
cleared = {n: all(getattr(m, n, None) is None for m in modules) for n in names}
try:
    import ctypes
    reimport = "imported"
except ImportError:
    reimport = "ImportError"
return [loaded, cleared, reimport]
"""


#: A runner that imports a module after its zygote planned what its runners forget (``world.plan_forgetting``):
#: the plan is stale, and the runner must find the new module itself.
LATE_IMPORT = """
real_lock_down = serving.lock_down
def lock_down_after_an_import(*args, **kwargs):
    import ctypes.wintypes  # no zygote imports it; before the private root, which has no standard library
    return real_lock_down(*args, **kwargs)
serving.lock_down = lock_down_after_an_import
"""


@pytest.mark.skipif(os.geteuid() != 0 and not Path("/proc/self/ns/user").exists(), reason="needs namespaces")
@pytest.mark.parametrize("late_import", [False, True], ids=["planned", "imported-after-the-plan"])
def test_lockdown_modules_are_forgotten(tmp_path: Path, late_import: bool) -> None:
    here = Path(__file__).resolve()
    script = tmp_path / "forgetting_runner.py"
    late = LATE_IMPORT if late_import else ""
    script.write_text(FORGETTING_RUNNER.format(sandbox=str(here.parents[2] / "sandbox"), tests=str(here.parent),
                                               late=late))  # fmt: skip
    backend = SubprocessBackend(SandboxConfig(pool_size=0), runner=script)
    try:
        worker = backend.spawn(Limits())
        out = worker.execute(ExecutionRequest(code=PROBE), None)
    finally:
        backend.close()
    assert out.ok, (out.error_type, out.error_message, out.stderr)
    loaded, cleared, reimport = out.value
    assert loaded == []
    assert all(cleared.values()), cleared
    if out.protections.get("private_root"):
        assert reimport == "ImportError"  # nothing to import them from inside the private root


@pytest.fixture(
    params=[
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("gvisor", marks=[pytest.mark.docker, pytest.mark.gvisor]),
        pytest.param("runc", marks=pytest.mark.oci("runc")),
        pytest.param("runsc", marks=pytest.mark.oci("runsc")),
    ]
)
def forgetting_container(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    """A container backend whose runner runs programs unrestricted but keeps its real clean-up."""
    from sandforge.sandbox.backends import docker_backend, oci_backend
    from sandforge.sandbox.backends.docker_backend import DockerBackend
    from sandforge.sandbox.backends.oci_backend import OciBackend
    from tests.sandbox.test_container_boundary import ESCAPED_BOOTSTRAP

    keep = "serving.forget_lockdown_modules = lambda: []"
    assert keep in ESCAPED_BOOTSTRAP
    bootstrap = "\n".join(line for line in ESCAPED_BOOTSTRAP.splitlines() if not line.startswith(keep))
    command = ["-I", "-S", "-B", "-c", bootstrap]
    monkeypatch.setattr(docker_backend, "COMMAND", ["python3", *command])
    monkeypatch.setattr(oci_backend, "COMMAND", ["/usr/bin/python3", *command])
    config = SandboxConfig(pool_size=0)
    backend: Backend
    if request.param in ("runc", "runsc"):
        backend = OciBackend(config, runtime=request.param)
    else:
        backend = DockerBackend(config, runtime="runsc" if request.param == "gvisor" else None)
    try:
        yield backend
    finally:
        backend.close()


def test_lockdown_modules_are_forgotten_in_containers(forgetting_container: Backend) -> None:
    limits = Limits(timeout_s=10, memory_mb=128, disk_mb=4, max_processes=12)
    out = forgetting_container.spawn(limits).execute(ExecutionRequest(code=PROBE, limits=limits), None)
    assert out.ok, (out.error_type, out.error_message, out.stderr)
    loaded, cleared, _reimport = out.value  # the image's root holds them: they can be imported again
    assert loaded == []
    assert all(cleared.values()), cleared
