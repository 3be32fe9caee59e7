"""An environment zygote's pre-import: the environment's top-level modules imported once, in the zygote, so each
runner it forks starts with them loaded (issue 39 item 3); its host side is ``sandbox/envzygotes.py``.

The zygote imports them before any child exists, so before any tripwire is installed, and exactly as a
program's ``import`` in a runner would (``envmodules.import_for_program``): the unpickling floor first (a
package that binds ``pickle.loads`` at import binds the refusing one), the package classes disarmed after. The
program still reaches them only through its proxies, which each child makes for itself: the same module
objects, the same withheld names and loaders.

The zygote reads the site at its host path, but its children see it at ``ENV_MOUNT_PATH``: every path the
import recorded is pointed there afterwards (``__file__``, ``__path__``, the spec, the loader, and the file name
of every function's code, which the tripwire reads to tell library code from the program's, and a module's own
global strings and paths under the site: ``HERE = os.path.dirname(__file__)``). A path kept anywhere else (inside
a container, an object) still names the host's site, which a runner does not have: the package fails to open
it, and a frame left with the host path is not library code to the tripwire: both fail closed. A package that
needs a thread at import, or fails to import, fails the zygote (the host falls back to the plain one).
"""
# ruff: noqa: PTH112, PTH117, PTH120, PTH208
# (the runner avoids pathlib (import cost))

from __future__ import annotations

import gc
import importlib
import os
import sys
import types
from typing import Any, TypeGuard

from . import envmodules, packages
from .wire import ENV_MOUNT_PATH

#: A first use of a package, run once in the zygote after its import (and after its classes are disarmed), so no
#: runner pays it again: lazy imports inside the package, its first-call caches. Only what any program may do
#: itself through its proxies, on data of its own: the state it leaves is the state that first use leaves.
WARMUPS: dict[str, str] = {
    "pandas": "frame = module.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})\n"
              "frame['a'].sum(); frame[frame['a'] > 1]; frame.groupby('b')['a'].sum(); frame.to_dict()\n",
    "numpy": "module.arange(6).reshape(2, 3).sum(axis=0)\n",
}  # fmt: skip


#: The modules this zygote warmed up (``WARMUPS``), which each of its runners warms again before it is ready.
WARMED: list[str] = []
#: How long a fresh runner waits for an execution before it warms up (``rewarm``): the run that took the
#: worker before it is likely over by then.
REWARM_AFTER_S = 0.1


class PreloadFailed(Exception):
    """The environment cannot be pre-imported in a zygote; the message is one line."""


def preload(environment: Any) -> list[str]:
    """Import ``environment``'s modules (the boot frame's part, with ``bind_source``); the names imported."""
    if not isinstance(environment, dict) or not isinstance(environment.get("bind_source"), str):
        raise PreloadFailed("the environment to pre-import names no site")
    site, env_id = os.path.normpath(environment["bind_source"]), str(environment.get("env_id"))
    names = [n for n in environment.get("modules") or [] if isinstance(n, str) and n.isidentifier() and n[0] != "_"]
    os.chdir("/")  # nothing the import records may name the host's working directory
    for variable in envmodules.SINGLE_THREADED:
        os.environ[variable] = "1"
    packages.disarm_unpickling()
    before, saved = set(sys.modules), sys.path[:]
    stdlib = os.path.dirname(os.__file__)
    # What a runner's import finds: the standard library, then the site (not the host's own site-packages).
    sys.path[:] = [p for p in saved if _under(p, stdlib) or p.endswith((".zip", "lib-dynload"))] + [site]
    try:
        for name in names:
            packages.check_import(name)
            try:
                importlib.import_module(name)
            except Exception as exc:
                raise PreloadFailed(f"import {name}: {type(exc).__name__}: {exc}"[:300]) from None
        packages.disarm()
        _warm(names)
        WARMED[:] = [name for name in names if name in WARMUPS]
    finally:
        sys.path[:] = saved
        for entry in [p for p in sys.path_importer_cache if _under(p, site)]:
            del sys.path_importer_cache[entry]
    strays = sorted(n for n in set(sys.modules) - before if not _from(sys.modules[n], (site, stdlib)))
    if strays:
        raise PreloadFailed(f"importing {', '.join(names)} loaded {', '.join(strays[:3])} from outside the environment")
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:
        raise PreloadFailed(f"importing {', '.join(names)} started {threads - 1} thread(s); a zygote forks only alone")
    _repoint(site)
    envmodules.PRELOADED[:] = [env_id]
    gc.freeze()  # a child's collections never walk (and so never copy) the pages of what the import made
    huge_pages()
    return names


#: ``madvise`` advice (Linux): transparent huge pages allowed for a range, and its pages collapsed into them now.
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
_HUGE = 1 << 21


def huge_pages() -> int:
    """Back the zygote's larger heap ranges (anonymous, read-write, 2 MiB-aligned stretches) with transparent
    huge pages, once, after the import; how many ranges the kernel collapsed. Each runner forked from it copies
    one page-table entry per 2 MiB of them instead of 512, and its exit tears down as few: ~0.8 ms of a pandas
    runner's CPU. A page a runner writes is still copied alone (the kernel splits the huge page in the child
    first). Best effort: a kernel without them (or ``MADV_COLLAPSE``, before Linux 6.1) refuses, nothing else
    changes."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    try:
        with open("/proc/self/maps") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return 0
    collapsed = 0
    for line in lines:
        fields = line.split()
        if fields[1:2] != ["rw-p"] or not (len(fields) == 5 or fields[5:] == ["[heap]"]):
            continue
        low, high = (int(bound, 16) for bound in fields[0].split("-"))
        start, end = (low + _HUGE - 1) & ~(_HUGE - 1), high & ~(_HUGE - 1)
        if end > start and libc.madvise(start, end - start, MADV_HUGEPAGE) == 0:
            collapsed += libc.madvise(start, end - start, MADV_COLLAPSE) == 0
    return collapsed


def rewarm(in_fd: int) -> None:
    """In a runner of an environment zygote, ready but holding no program yet (nor armed): the zygote's
    warm-ups once more, if no execution comes within ``REWARM_AFTER_S``. Their objects are the zygote's, shared,
    and CPython writes a reference count on each object it reads, so a first use in a fresh child copies each
    page it touches (pandas: ~600 pages, ~2.3 ms of a run's CPU). Done here, while the worker waits in its pool,
    not inside the program's run; not at once, where it would compete with the run that took the worker before
    it. The same fixed text as in the zygote, on the same modules: it leaves the state the zygote's left."""
    import select

    if not WARMED or select.select([in_fd], [], [], REWARM_AFTER_S)[0]:
        return  # an execution came first: it pays for its first use itself
    _warm(WARMED)


def _warm(names: list[str]) -> None:
    """Run the ``WARMUPS`` of the modules imported (a failed one is only not warm: the import stands)."""
    for name in names:
        source = WARMUPS.get(name)
        if source is not None:
            try:
                exec(compile(source, f"<warm-up of {name}>", "exec"), {"module": sys.modules[name]})  # noqa: S102
            except Exception:  # noqa: S112 - a first use that fails here fails in the program's run too
                continue


def _under(path: Any, root: str) -> TypeGuard[str]:
    return isinstance(path, str) and (path == root or path.startswith(root + os.sep))


def _from(module: Any, roots: tuple[str, ...]) -> bool:
    """Whether ``module`` was loaded from under one of ``roots`` (or from no file: built in, frozen, namespace)."""
    origin = getattr(getattr(module, "__spec__", None), "origin", None)
    return not isinstance(origin, str) or not os.path.isabs(origin) or any(_under(origin, r) for r in roots)


def _moved(path: str, site: str) -> str:
    return ENV_MOUNT_PATH + path[len(site) :]


def _repoint(site: str) -> None:
    """Every path the import recorded under ``site``, pointed at the same file under ``ENV_MOUNT_PATH``."""
    for module in list(sys.modules.values()):
        if isinstance(module, types.ModuleType):
            _repoint_module(module, site)
    imp: Any = sys.modules["_imp"]
    for obj in gc.get_objects():  # functions: their code's file name, nested code objects included
        code = obj.__code__ if isinstance(obj, types.FunctionType) else None
        if code is not None and _under(code.co_filename, site):
            imp._fix_co_filename(code, _moved(code.co_filename, site))
    import linecache

    linecache.clearcache()


def _repoint_module(module: types.ModuleType, site: str) -> None:
    """``module``'s file, cached file, search path, spec and loader paths under ``site``, moved."""
    names = vars(module)
    for attr in ("__file__", "__cached__"):
        if _under(names.get(attr), site):
            setattr(module, attr, _moved(names[attr], site))
    spec, loader = names.get("__spec__"), names.get("__loader__")
    for search in (names.get("__path__"), getattr(spec, "submodule_search_locations", None)):
        if isinstance(search, list):
            search[:] = [_moved(p, site) if _under(p, site) else p for p in search]
    for holder, attr in ((spec, "origin"), (spec, "cached"), (loader, "path")):
        value = getattr(holder, attr, None)
        if _under(value, site):
            setattr(holder, attr, _moved(value, site))
    for name, value in list(names.items()):  # ``HERE = os.path.dirname(__file__)``, ``DATA = Path(...)``
        if _under(value, site):
            names[name] = _moved(value, site)
        elif type(value).__module__ == "pathlib" and _under(str(value), site):
            names[name] = type(value)(_moved(str(value), site))


def check_spawn(request_environment: Any) -> None:
    """Refuse to fork a runner for another environment (or none) than the one this zygote pre-imported."""
    preloaded = envmodules.PRELOADED
    wanted = request_environment.get("env_id") if isinstance(request_environment, dict) else None
    if preloaded and wanted != preloaded[0]:
        raise ValueError(f"this zygote pre-imported environment {preloaded[0]}, not {wanted}")
