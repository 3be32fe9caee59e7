"""The runner's start-up bundle (``sandbox/inside/bundle.py``, ``bundler.py``): what the image build
writes, that a runner's start-up imports come from it with the same files and code, and that lock-down's
``uninstall`` gives the ordinary import system, locks included, back."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from sandforge.sandbox import image
from sandforge.sandbox.inside import wire

INSIDE = Path(wire.__file__).resolve().parent

#: Run in a fresh interpreter: install the bundle, import what a container's runner imports, report where
#: each module came from, then uninstall and import something new.
_CHECK = """
import sys
sys.path.insert(0, sys.argv[1])
before = set(sys.modules)
import inside.bundle as b
installed = b.install()
import inside.bundler
inside.bundler.runner_imports()
import _frozen_importlib, _thread
lock_free = _frozen_importlib._thread is None
early = ("inside", "inside.bundle", "inside.bundler")  # imported before install, or not by a runner
new = [n for n in sorted(set(sys.modules) - before) if n not in early]
def loader(n):
    return type(getattr(sys.modules[n], "__loader__", None)).__name__
bundled = [n for n in new if loader(n) == "BundledLoader"]
from_files = [n for n in new if loader(n) == "SourceFileLoader"]
same = all(
    sys.modules[n].__file__ == sys.modules[n].__spec__.origin
    and sys.modules[n].__spec__.cached.endswith(".pyc")
    for n in bundled
)
released = all(sys.modules[n].__loader__._pyc is None for n in bundled)
import json.decoder as d
code_file = d.JSONDecoder.decode.__code__.co_filename
b.uninstall()
import colorsys  # not bundled: read from its file, with the import system's locks back
import json
print(json.dumps({
    "installed": installed, "lock_free": lock_free, "bundled": bundled, "from_files": from_files, "same": same,
    "released": released,
    "code_file": code_file, "json_file": d.__file__,
    "restored": _frozen_importlib._thread is _thread
    and not any(type(f).__name__ == "BundleFinder" for f in sys.meta_path),
    "colorsys": type(colorsys.__loader__).__name__,
}))
"""


def _package_copy(tmp_path: Path) -> Path:
    """The inside package compiled in a directory of its own beside ``lib/`` (RestrictedPython), as the image
    holds them."""
    root = tmp_path / "opt"
    shutil.copytree(INSIDE, root / "inside", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(image.restrictedpython_dir(), root / "lib" / "RestrictedPython")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root)], check=True, timeout=120)
    return root


def test_a_runner_imports_its_start_up_modules_from_the_bundle(tmp_path: Path) -> None:
    root = _package_copy(tmp_path)
    build = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", f"import sys; sys.path.insert(0, {str(root)!r}); "
         "import inside.bundler as b; print(b.build())"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-2000:]
    assert int(build.stdout) > 100
    assert (root / "runner.bundle").is_file()

    run = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", _CHECK, str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout)
    assert seen["installed"] and seen["lock_free"]
    assert {"inside.start", "inside.serving", "inside.lockdown", "json.decoder", "asyncio"} <= set(seen["bundled"])
    assert seen["from_files"] == []  # every pure-Python start-up module came from the bundle
    assert seen["same"]
    assert seen["released"]  # each module's bytes are dropped once loaded: the bundle does not stay in memory
    assert seen["code_file"] == seen["json_file"]  # the code is the .pyc's own: co_filename is the source's path
    assert seen["restored"]
    assert seen["colorsys"] == "SourceFileLoader"


def test_without_a_bundle_nothing_is_installed(tmp_path: Path) -> None:
    root = _package_copy(tmp_path)
    (root / "runner.bundle").write_bytes(b"not a bundle")
    run = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-c", f"import sys; sys.path.insert(0, {str(root)!r}); "
         "import inside.bundle as b, _frozen_importlib, _thread; print(b.install(), b.install('/nonexistent'), "
         "_frozen_importlib._thread is _thread, len([f for f in sys.meta_path if type(f) is b.BundleFinder]))"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False", "False", "True", "0"]
