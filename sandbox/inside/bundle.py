"""The runner's start-up modules in one file, read at once: a container's runner imports without the
import system's file-system calls.

A runner imports ~140 pure-Python modules before it reports ready (itself, RestrictedPython, and the
standard library they and ``asyncio`` need), and the import system spends ~20 system calls on each (a
``stat`` of every ``sys.path`` entry, then open, fstat, read, close of the ``.pyc``). Under gVisor each
call is a trap into the sentry, and file calls may reach the gofer: those imports were most of a gVisor
sandbox's start-up CPU (docs/benchmarks.md, "gVisor cold start"). The image build (``images/Dockerfile``)
runs ``bundler.build``, which imports what a container's runner imports before lock-down and writes those
modules' compiled files into one bundle beside this package; the container's bootstrap
(``sandbox/containers.py``) calls :func:`install` before it imports the runner, and the runner calls
:func:`uninstall` before it locks itself down, so every import after that (a program's modules, on first
use) goes through the ordinary import system exactly as before.

Nothing else changes: the bundled bytes are the ``.pyc`` files themselves, loaded by the standard
``SourceFileLoader`` (its header checked against the source's recorded size and time), so each module has
the same code (``co_filename``), ``__file__`` and ``__spec__`` as when read from its file. Without a bundle
(the subprocess backend, a runner started from a file) nothing is installed and imports are the ordinary
ones.
"""

# Imported before the bundle is installed, through the ordinary import system: nothing but built-in modules
# here (no ``typing``, no ``__future__``: annotations are strings).
import _imp
import _thread
import marshal
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: The bundle's file name, in the directory holding the inside package (``/opt/sandforge`` in the image).
BUNDLE_NAME = "runner.bundle"
#: The bundle format's first bytes: a bundle of another format (or Python) is ignored, never misread.
MAGIC = b"sandforge-bundle-1 " + sys.implementation.cache_tag.encode() + b"\n"

_external: "Any" = sys.modules["_frozen_importlib_external"]
_bootstrap: "Any" = sys.modules["_frozen_importlib"]


class _ImpWithoutLock:
    """``_imp`` without its global import lock, for the import system while the bundle is installed in a
    process with one thread (``_thread`` None is the import system's own mode for a build without threads:
    dummy module locks).

    Why: CPython 3.11 reads the monotonic clock on every lock acquisition (``sem_clockwait``'s deadline, even
    for a lock that is free), ~10 per import; gVisor's vDSO answers clock reads only after its first second,
    so before that each is a trap into the sentry: with the bundle, three quarters of a runner's start-up
    system calls were these. The runner starts no thread before lock-down; one started while this is installed
    would import without the locks that keep two threads from loading one module twice."""

    def acquire_lock(self) -> None:
        return None

    def release_lock(self) -> None:
        return None

    def __getattr__(self, name: str) -> "Any":
        return getattr(_imp, name)


def bundle_path() -> str:
    """Where the bundle lives: beside this package (``os`` may not be imported yet)."""
    return __file__.rpartition("/")[0].rpartition("/")[0] + "/" + BUNDLE_NAME


class BundledLoader(_external.SourceFileLoader):  # type: ignore[misc]
    """The standard loader of a module's source file, but for the compiled file, which comes from the bundle,
    and the source's size and time, which the build checked against the compiled file's header."""

    def __init__(self, fullname: str, path: str, pyc: memoryview) -> None:
        super().__init__(fullname, path)
        self._pyc: memoryview | None = pyc
        self._pyc_path = _external.cache_from_source(path)

    def get_code(self, fullname: str) -> "Any":
        try:
            return super().get_code(fullname)
        finally:
            self._pyc = None  # used once: the bundle's memory is freed when its last module is loaded

    def path_stats(self, path: str) -> "dict[str, int]":
        header = self._pyc
        if path == self.path and header is not None:
            return {"mtime": int.from_bytes(header[8:12], "little"), "size": int.from_bytes(header[12:16], "little")}
        return super().path_stats(path)  # type: ignore[no-any-return]

    def get_data(self, path: str) -> "Any":
        if path == self._pyc_path and self._pyc is not None:
            return self._pyc  # the .pyc file's bytes (a view into the bundle: not copied)
        return super().get_data(path)  # the source itself (linecache, inspect), a reload: from the files


class BundleFinder:
    """Finds a bundled module by name: the bundle holds exactly the modules a runner imports before
    lock-down, resolved at build time with the runner's ``sys.path``."""

    def __init__(self, index: "dict[str, tuple[str, bool, int, int]]", data: memoryview) -> None:
        self._index = index
        self._data = data

    def find_spec(self, fullname: str, path: "Any" = None, target: "Any" = None) -> "Any":
        entry = self._index.get(fullname)
        if entry is None:
            return None
        source, package, offset, length = entry
        if offset < 0:  # an extension module: its file, without searching every sys.path entry for it
            return _external.spec_from_file_location(
                fullname, source, loader=_external.ExtensionFileLoader(fullname, source)
            )
        loader = BundledLoader(fullname, source, self._data[offset : offset + length])
        locations = [source.rpartition("/")[0]] if package else None
        return _external.spec_from_file_location(fullname, source, loader=loader, submodule_search_locations=locations)


def install(path: "str | None" = None) -> bool:
    """Serve the bundled modules from memory, first among the import system's finders; False (and nothing
    installed) when there is no readable bundle of this format."""
    try:
        with open(path or bundle_path(), "rb") as file:
            data = file.read()
    except OSError:
        return False
    if not data.startswith(MAGIC):
        return False
    view = memoryview(data)
    index_length = int.from_bytes(view[len(MAGIC) : len(MAGIC) + 8], "big")
    start = len(MAGIC) + 8
    index = marshal.loads(view[start : start + index_length])  # noqa: S302 - the image's own read-only file
    sys.meta_path.insert(0, BundleFinder(index, view[start + index_length :]))
    if _thread._count() == 0:  # one thread: the import system's locks guard nothing (see _ImpWithoutLock)
        _bootstrap._thread, _bootstrap._imp = None, _ImpWithoutLock()
    return True


def uninstall() -> None:
    """Back to the ordinary import system, locks included (before lock-down: what a program imports later is
    read from its file, under the tripwire's file rules, as without a bundle)."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, BundleFinder)]
    if isinstance(_bootstrap._imp, _ImpWithoutLock):
        _bootstrap._thread, _bootstrap._imp = _thread, _imp


__all__ = ["BUNDLE_NAME", "MAGIC", "BundleFinder", "BundledLoader", "bundle_path", "install", "uninstall"]
