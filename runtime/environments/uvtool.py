"""Running `uv` (a dependency of the project, found through its package): resolve with hashes, install pins
into a target directory. Wheels only (``--no-build``: no source distribution is ever built, so no
``setup.py`` runs on the host), the project's own cache (``--cache-dir``), no user configuration
(``--no-config``, ``UV_*`` variables dropped) and no interpreter downloads. uv's failures become the typed
errors: sdist-only distributions a policy violation, an unsatisfiable manifest a resolution failure,
anything else (a download, the disk) an install failure."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sandforge.runtime.environments.errors import (
    DependencyInstallFailed,
    DependencyPolicyViolation,
    DependencyResolutionFailed,
)
from sandforge.runtime.environments.policy import SourcePolicy, normal_name
from sandforge.runtime.environments.target import SandboxTarget

UV_TIMEOUT_S = 600.0
#: Before installing the resolved pins once more when the index no longer lists one of them (see ``Uv.install``).
STALE_INDEX_RETRY_S = 1.0
_SDIST_ONLY = (
    re.compile(r"Wheels are required for `(?P<name>[^`]+)`"),
    re.compile(r"(?P<name>[A-Za-z0-9._-]+)(==\S+)? has no usable wheels"),
)
_NO_SOLUTION = "No solution found when resolving dependencies"


def uv_binary() -> str:
    """The `uv` executable installed with sandforge (the ``uv`` package), else one on PATH."""
    try:
        import uv

        return str(uv.find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found is None:
            raise DependencyInstallFailed(
                "uv is not installed", hint="reinstall sandforge (uv is one of its dependencies)"
            ) from None
        return found


@dataclass(frozen=True)
class Uv:
    """One uv executable and the cache it shares between environments (hard links need one file system)."""

    binary: str
    cache_dir: Path

    def source_args(self, source: SourcePolicy) -> list[str]:
        args: list[str] = []
        if source.wheelhouse is not None:
            args += ["--find-links", source.wheelhouse]
        if source.offline:
            if source.wheelhouse is None:
                raise DependencyInstallFailed(
                    "the dependency policy says `source: offline` but names no wheelhouse",
                    hint="set dependencies.wheelhouse to a directory of wheels",
                )
            args += ["--no-index", "--offline"]
        elif source.source != "index":
            args += ["--default-index", source.source]
        return args

    def common(self, target: SandboxTarget, source: SourcePolicy) -> list[str]:
        return [
            "--no-config",
            "--no-python-downloads",
            "--no-progress",
            "--quiet",
            "--cache-dir",
            str(self.cache_dir),
            "--no-build",
            *target.uv_args(),
            *self.source_args(source),
        ]

    def compile(self, requirements: Path, target: SandboxTarget, source: SourcePolicy) -> str:
        """Resolve ``requirements`` to pins with hashes (``uv pip compile`` output)."""
        argv = [self.binary, "pip", "compile", str(requirements), "--generate-hashes", "--no-header"]
        argv += ["--no-annotate", "--no-strip-extras", *self.common(target, source)]
        return self._run(argv, stage="resolve")

    def install(self, pins: Path, site: Path, python: str, target: SandboxTarget, source: SourcePolicy) -> None:
        """Install exactly ``pins`` (hashes required, no dependency resolution) into ``site``, hard-linked
        from the cache."""
        argv = [self.binary, "pip", "install", "--target", str(site), "--no-deps", "--require-hashes"]
        argv += ["-r", str(pins), "--link-mode", "hardlink", "--python", python, *self.common(target, source)]
        try:
            self._run(argv, stage="install")
        except DependencyResolutionFailed:
            # The pins were resolved a moment ago: a pinned version the index does not list now is a stale page
            # (a CDN's, seen right after a release), not the manifest's fault. Once more, every page revalidated.
            time.sleep(STALE_INDEX_RETRY_S)
            self._run([*argv, "--refresh"], stage="install")

    def _run(self, argv: list[str], *, stage: str) -> str:
        env = {key: value for key, value in os.environ.items() if not key.startswith("UV_")}
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=UV_TIMEOUT_S, env=env, check=False)
        except subprocess.TimeoutExpired:
            raise DependencyInstallFailed(f"uv did not finish the {stage} within {UV_TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise DependencyInstallFailed(f"cannot run uv ({argv[0]}): {exc.strerror or exc}") from None
        if done.returncode != 0:
            raise failure(done.stderr, stage=stage)
        return done.stdout


def failure(stderr: str, *, stage: str) -> Exception:
    """The typed error for uv's complaint."""
    sdists = sorted({normal_name(m["name"]) for pattern in _SDIST_ONLY for m in pattern.finditer(stderr)})
    if sdists:
        return DependencyPolicyViolation(
            f"{', '.join(sdists)}: published only as a source distribution for this sandbox; sandforge installs "
            "wheels only (building a source distribution runs its code on the host)",
            names=tuple(sdists),
            reason="sdist_only",
        )
    summary = _summary(stderr)
    if _NO_SOLUTION in stderr or "not found in the" in stderr:
        return DependencyResolutionFailed(f"no versions satisfy the manifest: {summary}")
    return DependencyInstallFailed(f"uv failed to {stage}: {summary}")


def _summary(stderr: str) -> str:
    causes = [line.strip().removeprefix("cause:").strip() for line in stderr.splitlines() if line.strip()]
    causes = [c for c in causes if c and not c.startswith(("error: No solution", "hint:"))]
    text = " ".join(" ".join(causes[:3]).split())
    return (text[:400] + "...") if len(text) > 400 else (text or "no message")
