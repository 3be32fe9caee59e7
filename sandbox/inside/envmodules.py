"""An environment's modules as the program sees them, and its mount as the runner checks it.

A ready environment is mounted read-only at ``ENV_MOUNT_PATH`` (a container's runtime mounts it; a subprocess
runner binds it into its private root itself, with the interpreter's standard library beside it, which the
packages import). The runner puts the mount on ``sys.path`` after the standard library (a package can never
shadow a standard module) and exposes exactly the top-level modules the boot frame names, each through a
proxy like the standard modules': a module object of its own that is never in ``sys.modules``, hides private
names (``_parser``), and hands out sub-modules of the same exposed packages as proxies too; any other module
(``os`` as ``somepackage.os``) is not reachable through it. A package's own code runs unrestricted, inside
the sandbox's walls, like any code the policy allowed; the program only ever holds proxies.
"""
# ruff: noqa: PTH109, PTH112, PTH116, PTH118, PTH120
# (the runner avoids pathlib (import cost))

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
import types
from typing import Any

from . import packages
from .wire import ENV_MOUNT_PATH

#: Read by native libraries (OpenBLAS, OpenMP, MKL, numexpr) when they load: a sandbox may start no thread,
#: and OpenBLAS failing to start its pool ends the process.
SINGLE_THREADED = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
#: matplotlib (issue 41): no display in a sandbox, so the Agg backend (files only; no GUI toolkit is tried),
#: and its config and font cache in the sandbox's own scratch space (the work directory, removed with the
#: sandbox), written while its module body runs, never in a home directory the sandbox does not have.
MATPLOTLIB_BACKEND = "Agg"
MATPLOTLIB_DIR = ".matplotlib"
#: The exposed top-level names of this runner's environment.
_TOPS: set[str] = set()
#: Proxy by real module name, and real module name by ``id`` of the proxy (kept off the proxy).
_PROXIES: dict[str, Any] = {}
_NAMES: dict[int, str] = {}
_MISSING: Any = object()
#: The environment this process's zygote imported ahead (its id; ``preload``), else empty: a runner forked from
#: it reports any other environment (or none) as ``missing``, which the host refuses (``require_mounted``).
PRELOADED: list[str] = []


class EnvModuleProxy(types.ModuleType):
    """A proxy of one environment module: public names are fetched from the real module on first read."""

    def __getattr__(self, attr: str) -> Any:
        return _attribute(self, attr)


def _proxy_of(name: str) -> Any:
    proxy = _PROXIES.get(name)
    if proxy is None:
        proxy = EnvModuleProxy(name)
        _PROXIES[name] = proxy
        _NAMES[id(proxy)] = name
    return proxy


def expose(boot: dict[str, Any], proxies: dict[str, Any]) -> None:
    """Put the environment on ``sys.path`` (after the standard library) and its modules among ``proxies``.
    Called after the lock-down: a subprocess runner's mount exists only inside its private root."""
    environment = boot.get("environment")
    if not isinstance(environment, dict):
        return
    if ENV_MOUNT_PATH not in sys.path:
        sys.path.append(ENV_MOUNT_PATH)
    # Fill the import system's directory caches now, before the tripwire is armed: in a private root the
    # runner's own directory looks changed since it was cached, and the program's first ``import numpy`` would
    # list it again, which the tripwire refuses (a listing outside the library directories). A name that no
    # module can have: nothing is imported.
    importlib.machinery.PathFinder.find_spec("sandforge-prime")
    packages.disarm_unpickling()  # before any package imports ``pickle.loads`` by name
    for name in SINGLE_THREADED:  # the sandbox may start no thread (RLIMIT_NPROC 0): tell native libraries
        os.environ[name] = "1"
    os.environ["MPLBACKEND"] = MATPLOTLIB_BACKEND
    os.environ["MPLCONFIGDIR"] = os.path.join(os.getcwd(), MATPLOTLIB_DIR)
    for name in environment.get("modules") or []:
        if isinstance(name, str) and name.isidentifier() and not name.startswith("_") and name not in proxies:
            _TOPS.add(name)
            proxies[name] = _proxy_of(name)


def exposed(name: str) -> bool:
    """Whether ``name`` (dotted or not) lies in an exposed package of the environment."""
    return name.split(".", 1)[0] in _TOPS


def import_for_program(name: str) -> Any:
    """The proxy of ``name`` after importing the real module (its errors are the program's to see)."""
    if any(part.startswith("_") or not part.isidentifier() for part in name.split(".")):
        raise ImportError(f"import of {name!r} is not allowed in the sandbox")
    packages.check_import(name)
    importlib.import_module(name)
    packages.disarm()  # the package's classes, before the program holds one of its objects
    return _proxy_of(name)


def _attribute(proxy: Any, attr: str) -> Any:
    name = _NAMES.get(id(proxy), "module")
    if attr.startswith("_") or name not in sys.modules:
        raise AttributeError(f"module {name!r} has no attribute {attr!r}")
    real = sys.modules[name]
    value = getattr(real, attr, _MISSING)
    if value is _MISSING and hasattr(real, "__path__"):  # a sub-module not imported yet
        full = f"{name}.{attr}"
        try:
            importlib.import_module(full)
        except ModuleNotFoundError as exc:
            if exc.name != full:
                raise
        value = sys.modules.get(full, _MISSING)
    if value is not _MISSING:
        packages.refuse_value(name, attr, value)  # loaders, evaluators, raw memory: never the program's
        packages.disarm()  # a sub-module just imported may define a class to disarm
        value = packages.wrapped(value)
    if isinstance(value, types.ModuleType):
        value = _proxy_of(value.__name__) if exposed(value.__name__) else _MISSING
    if value is _MISSING:
        raise AttributeError(f"module {name!r} has no attribute {attr!r}")
    setattr(proxy, attr, value)  # read once: the next read is a plain module attribute read
    return value


def mount_status(boot: dict[str, Any]) -> str | None:
    """How the runner sees its environment's mount, for the ready frame: ``read_only``, ``writable``, or
    ``missing`` (nothing mounted there); None without an environment. The mount table says so where the
    runner can read it (gVisor does not flag a read-only bind in ``statvfs``); a private root without
    ``/proc`` (subprocess) asks ``statvfs``, and compares devices to tell a mount from the root's directory."""
    environment = boot.get("environment")
    if PRELOADED and (not isinstance(environment, dict) or environment.get("env_id") != PRELOADED[0]):
        return "missing"  # another environment's modules are loaded here: never that one's runner
    if not isinstance(environment, dict):
        return None
    try:
        with open("/proc/self/mountinfo") as fh:
            table = [line.split() for line in fh]
    except OSError:
        table = None
    if table is not None:
        entries = [fields for fields in table if len(fields) > 5 and fields[4] == ENV_MOUNT_PATH]
        if not entries:
            return "missing"
        return "read_only" if "ro" in entries[-1][5].split(",") else "writable"
    try:
        mounted, root = os.stat(ENV_MOUNT_PATH), os.stat("/")
        flags = os.statvfs(ENV_MOUNT_PATH).f_flag
    except OSError:
        return "missing"
    if mounted.st_dev == root.st_dev:
        return "missing"
    return "read_only" if flags & os.ST_RDONLY else "writable"


def private_root_binds(boot: dict[str, Any]) -> list[tuple[str, str]]:
    """What a runner that builds its own private root binds into it, read-only, for its environment: the
    interpreter's standard library at its own path (the packages import standard modules, which a private
    root otherwise lacks), the system directories its own shared libraries come from (a package's extension
    may need another of them: numpy needs libstdc++), and the environment at ``ENV_MOUNT_PATH``. Empty
    without an environment."""
    environment = boot.get("environment")
    source = environment.get("bind_source") if isinstance(environment, dict) else None
    if not isinstance(source, str) or not source:
        return []
    stdlib = os.path.dirname(os.__file__)
    paths = {stdlib, *library_dirs()}
    for entry in sys.path:
        if entry.endswith("lib-dynload") and not entry.startswith(stdlib + os.sep) and os.path.isdir(entry):
            paths.add(entry)
    ordered = sorted(paths, key=lambda p: (p.count(os.sep), p))  # a parent before what lies inside it
    kept = [p for p in ordered if not any(p.startswith(q + os.sep) for q in ordered if q != p)]
    return [(path, path) for path in kept] + [(source, ENV_MOUNT_PATH)]


#: Where shared libraries of the system live; only such directories are bound (never a home directory).
_SYSTEM_LIBRARY_ROOTS = ("/usr/lib", "/lib", "/usr/lib64", "/lib64", "/usr/local/lib")
#: ``library_dirs`` once known (a zygote finds them before it forks: its runners map the same libraries).
_LIBRARY_DIRS: list[frozenset[str]] = []


def library_dirs() -> frozenset[str]:
    """The directories of the shared libraries this process has mapped, under the system's library roots,
    resolved (``/lib`` is often a link to ``/usr/lib``). Read once per process tree: a zygote's runners
    inherit its answer, instead of each reading ``/proc/self/maps`` of a large process (a pandas zygote's has
    600+ lines) on the way to its first program."""
    if not _LIBRARY_DIRS:
        _LIBRARY_DIRS.append(_read_library_dirs())
    return _LIBRARY_DIRS[0]


def _read_library_dirs() -> frozenset[str]:
    """Each mapped library's directory once, then resolved (one ``realpath`` per directory, not per line)."""
    try:
        with open("/proc/self/maps") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return frozenset()
    directories = set()
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) == 6 and ".so" in fields[5] and fields[5].startswith("/"):
            directories.add(os.path.dirname(fields[5]))
    found = {os.path.realpath(directory) for directory in directories}
    return frozenset(d for d in found if any(d == r or d.startswith(r + os.sep) for r in _SYSTEM_LIBRARY_ROOTS))
