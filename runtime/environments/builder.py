"""Preparing environments: check the manifest against the policy, resolve (cached per request), check the
transitive closure, then find the environment ready or build it once.

Layout below ``root`` (``<state dir>/environments``)::

    cache/                  the uv cache: wheels and unpacked archives; hard-link source, never mounted
    resolutions/KEY.json    pins of one (target, manifest, source) request, so a cache hit does not run uv
    envs/ID/site/           the packages: the directory a sandbox mounts read-only
    envs/ID/environment.json   the record, written last: a directory under envs/ without it is not ready
    envs/.tmp-ID-*/         a build in progress (renamed to envs/ID when complete)
    locks/ID.lock           held while ID is built: concurrent requests build it once, the others wait

A build installs into a temporary directory (hard links from the cache), compiles bytecode there (a
read-only mount cannot cache ``.pyc``; the bytecode names the mount path), writes the record, and renames the
directory into place. A build that fails removes its directory; one that is killed leaves a ``.tmp-``
directory that is never ready, removed by the next build of the same environment or by ``envs prune``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from filelock import FileLock, Timeout
from packaging.specifiers import SpecifierSet
from pydantic import ValidationError

from sandforge.runtime.environments import layout
from sandforge.runtime.environments.bytecode import Compiler, cache_tag, compile_on_host
from sandforge.runtime.environments.errors import (
    DependencyInstallFailed,
    DependencyPolicyViolation,
    EnvironmentFailure,
    EnvironmentPreparing,
    InvalidDependencyManifest,
)
from sandforge.runtime.environments.identity import (
    ID_PATTERN,
    EnvironmentSpec,
    Pin,
    parse_pins,
    request_key,
)
from sandforge.runtime.environments.manifest import Manifest
from sandforge.runtime.environments.policy import DependencyPolicy, SourcePolicy
from sandforge.runtime.environments.records import (
    MAX_RECORD_BYTES,
    RECORD_NAME,
    SITE_NAME,
    EnvironmentRecord,
    PreparedEnvironment,
)
from sandforge.runtime.environments.target import SandboxTarget
from sandforge.runtime.environments.uvtool import Uv, uv_binary

log = logging.getLogger(__name__)

#: hears each long step of preparing an environment (a message; the CLI shows it as progress)
Progress = Callable[[str], None]

DEFAULT_WAIT_S = 300.0
TMP_PREFIX = ".tmp-"


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


class EnvironmentStore:
    """Environments on this machine, below ``root``. Safe to use from many processes at once."""

    def __init__(
        self,
        root: Path,
        *,
        uv: str | None = None,
        python: str | None = None,
        wait_s: float = DEFAULT_WAIT_S,
        cache_dir: Path | None = None,
        compile_in: Literal["auto", "target"] = "auto",
    ) -> None:
        self.root = root
        self.envs = root / "envs"
        self.locks = root / "locks"
        self.resolutions = root / "resolutions"
        # the uv cache: on the environments' file system (hard links), never mounted; shared on purpose only
        self.uv = Uv(binary=uv or uv_binary(), cache_dir=cache_dir or root / "cache")
        self.python = python or sys.executable  # compiles bytecode when it shares the target's bytecode tag
        self.wait_s = wait_s
        #: where bytecode is compiled: "auto" (this host's interpreter when its tag is the target's, else the
        #: target's own) or "target" (always the target's own, from `compilers`)
        self.compile_in: Literal["auto", "target"] = compile_in
        #: target -> (label, compiler) of the interpreter that runs programs there (an image's, in a container)
        self.compilers: dict[SandboxTarget, tuple[str, Compiler]] = {}
        self._tags: dict[str, str] = {}

    # ------------------------------------------------------------------------------------------ public

    def prepare(
        self, manifest: Manifest, policy: DependencyPolicy, target: SandboxTarget, *, progress: Progress | None = None
    ) -> PreparedEnvironment:
        """The ready environment for ``manifest`` under ``policy`` on ``target``: checked, resolved (once per
        request), built (once per identity). Raises the typed `EnvironmentFailure` kinds. ``progress`` hears
        each long step (the CLI shows it)."""
        start = time.perf_counter()
        if not manifest:
            raise InvalidDependencyManifest("the manifest declares no dependency; run without an environment")
        policy.check(manifest.names)
        _check_python(manifest, target)
        source = policy.sources
        resolve_start = time.perf_counter()
        pins, resolved = self._resolution(manifest, target, source, allowed=policy.allowed, progress=progress)
        resolve_ms = _ms(resolve_start) if resolved else 0.0
        policy.check((pin.name for pin in pins), transitive=True)
        spec = EnvironmentSpec(target=target, manifest=manifest, pins=pins, source=source)
        return self.ensure(spec, max_env_mb=policy.max_env_mb, start=start, resolve_ms=resolve_ms, progress=progress)

    def ensure(
        self, spec: EnvironmentSpec, *, max_env_mb: int = 500, start: float | None = None, resolve_ms: float = 0.0,
        progress: Progress | None = None,
    ) -> PreparedEnvironment:  # fmt: skip
        """The environment of ``spec`` (pins included, e.g. a persisted artifact's), built if not ready."""
        start = time.perf_counter() if start is None else start
        env_id = spec.env_id
        record = self.record(env_id)
        if record is None:
            with self.build_lock(env_id):
                record = self.record(env_id)  # built by the process we waited for
                if record is None:
                    if progress is not None:
                        progress(f"installing {len(spec.pins)} package(s) into environment {env_id[:12]}")
                    record = self._build(spec, max_env_mb=max_env_mb, resolve_ms=resolve_ms)
                    return self._prepared(record, hit=False, start=start, resolve_ms=resolve_ms)
        return self._prepared(record, hit=True, start=start)

    def record(self, env_id: str) -> EnvironmentRecord | None:
        """The record of a ready environment, or None (not built, being built, or damaged)."""
        if not ID_PATTERN.fullmatch(env_id):
            return None
        path = self.envs / env_id / RECORD_NAME
        try:
            with path.open("rb") as handle:
                raw = handle.read(MAX_RECORD_BYTES + 1)
        except OSError:
            return None
        try:
            record = EnvironmentRecord.model_validate_json(raw)
        except ValidationError:
            log.warning("environment %s has an unreadable record; treated as not ready", env_id)
            return None
        return record if record.env_id == env_id and (self.envs / env_id / SITE_NAME).is_dir() else None

    def ready(self) -> list[EnvironmentRecord]:
        """Every ready environment, newest first."""
        if not self.envs.is_dir():
            return []
        records = [r for entry in self.envs.iterdir() if (r := self.record(entry.name)) is not None]
        return sorted(records, key=lambda r: r.created_at, reverse=True)

    def leftovers(self) -> list[Path]:
        """Directories below envs/ that are not ready environments (killed builds, damaged ones)."""
        if not self.envs.is_dir():
            return []
        return sorted(e for e in self.envs.iterdir() if self.record(e.name) is None)

    def site(self, env_id: str) -> Path:
        return self.envs / env_id / SITE_NAME

    # ------------------------------------------------------------------------------------------ resolve

    def _resolution(
        self, manifest: Manifest, target: SandboxTarget, source: SourcePolicy, *, allowed: tuple[str, ...],
        progress: Progress | None = None,
    ) -> tuple[tuple[Pin, ...], bool]:  # fmt: skip
        """(pins, whether uv ran). A request resolved before is read from ``resolutions/`` (and ``progress``
        hears nothing: there is no step to wait for)."""
        key = request_key(target, manifest, source)
        path = self.resolutions / f"{key}.json"
        with contextlib.suppress(OSError, ValueError, ValidationError):
            return tuple(Pin.model_validate(p) for p in json.loads(path.read_bytes())["pins"]), False
        if progress is not None:
            progress(f"resolving {', '.join(manifest.names)}")
        self.resolutions.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.TemporaryDirectory(dir=self.resolutions, prefix=TMP_PREFIX) as work:
            requirements = Path(work) / "requirements.in"
            requirements.write_text("".join(line + "\n" for line in manifest.lines()), encoding="utf-8")
            try:
                text = self.uv.compile(requirements, target, source)
            except DependencyPolicyViolation as exc:  # sdist only: the feedback lists what is allowed
                raise DependencyPolicyViolation(
                    exc.message, names=exc.names, allowed=allowed, reason=exc.reason
                ) from None
            try:
                pins = parse_pins(text)
            except ValueError as exc:
                raise DependencyInstallFailed(f"cannot read uv's resolution: {exc}") from None
            staged = Path(work) / "resolution.json"
            staged.write_text(json.dumps({"key": key, "pins": [p.model_dump(mode="json") for p in pins]}))
            staged.replace(path)
        return pins, True

    # ------------------------------------------------------------------------------------------ build

    @contextlib.contextmanager
    def build_lock(self, env_id: str) -> Iterator[None]:
        self.locks.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = FileLock(self.locks / f"{env_id}.lock", timeout=self.wait_s, mode=0o600)
        try:
            lock.acquire()
        except Timeout:
            raise EnvironmentPreparing(
                f"environment {env_id} is being built by another process (waited {self.wait_s:g} s)",
                hint="retry shortly",
            ) from None
        try:
            yield
        finally:
            lock.release()

    def _build(self, spec: EnvironmentSpec, *, max_env_mb: int, resolve_ms: float) -> EnvironmentRecord:
        env_id = spec.env_id
        self.envs.mkdir(parents=True, exist_ok=True, mode=0o755)
        self._remove_leftovers_of(env_id)  # killed builds of this id (we hold its lock: none is alive)
        work = Path(tempfile.mkdtemp(dir=self.envs, prefix=f"{TMP_PREFIX}{env_id}-"))
        try:
            record = self._build_in(work, spec, max_env_mb=max_env_mb, resolve_ms=resolve_ms)
            work.rename(self.envs / env_id)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        log.info("environment %s built in %.0f ms", env_id, record.install_ms + record.compile_ms)
        return record

    def _build_in(self, work: Path, spec: EnvironmentSpec, *, max_env_mb: int, resolve_ms: float) -> EnvironmentRecord:
        site = work / SITE_NAME
        pins = work / "pins.txt"
        pins.write_text(spec.pins_text(), encoding="utf-8")
        start = time.perf_counter()
        self.uv.install(pins, site, self.python, spec.target, spec.source)
        install_ms = _ms(start)
        pins.unlink()
        (site / ".lock").unlink(missing_ok=True)  # uv's lock of the target directory, not part of it
        start = time.perf_counter()
        compiled_by = self._compile(site, spec.target)
        compile_ms = _ms(start)
        layout.open_up(work)
        use = layout.disk_use(site)
        if use.size_bytes > max_env_mb * 1024 * 1024:
            raise DependencyPolicyViolation(
                f"the environment would take {use.size_bytes / 1024 / 1024:.0f} MB, over the policy's "
                f"max_env_mb ({max_env_mb})",
                names=tuple(pin.name for pin in spec.pins),
                reason="max_env_mb",
            )
        record = EnvironmentRecord(
            env_id=spec.env_id,
            spec=spec,
            created_at=time.time(),
            uv_version=self._uv_version(),
            resolve_ms=resolve_ms,
            install_ms=install_ms,
            compile_ms=compile_ms,
            compiled_by=compiled_by,
            files=use.files,
            size_bytes=use.size_bytes,
            unshared_bytes=use.unshared_bytes,
            provides=layout.provides(site),
        )
        marker = work / RECORD_NAME
        with marker.open("w", encoding="utf-8") as handle:
            handle.write(record.model_dump_json(indent=1))
            handle.flush()
            os.fsync(handle.fileno())
        marker.chmod(0o644)
        return record

    def _compile(self, site: Path, target: SandboxTarget) -> str:
        """Bytecode for every module by an interpreter of the sandbox's bytecode tag (``bytecode.py``): this
        host's when its tag is the target's (unless ``compile_in`` is "target"), else the target's own
        (`compilers`, registered by whoever knows the target's image). What compiled it."""
        if self.compile_in == "auto":
            tag = self._tags.get(self.python) or self._tags.setdefault(self.python, cache_tag(self.python))
            if tag == target.cache_tag:
                compile_on_host(self.python, site)
                return f"host {self.python} ({tag})"
        else:
            tag = "not asked"
        found = self.compilers.get(target)
        if found is None:
            raise DependencyInstallFailed(
                f"cannot compile bytecode for {target.cache_tag}: {self.python} is {tag or 'not runnable'} and no "
                "interpreter of the sandbox's is known to the builder"
            )
        label, compiler = found
        compiler(site)
        return label

    def _uv_version(self) -> str:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = subprocess.run([self.uv.binary, "--version"], capture_output=True, text=True, timeout=30)
            return done.stdout.strip()
        return ""

    def _remove_leftovers_of(self, env_id: str) -> None:
        for entry in self.envs.glob(f"{TMP_PREFIX}{env_id}-*"):
            shutil.rmtree(entry, ignore_errors=True)
        broken = self.envs / env_id
        if broken.exists():  # a damaged environment (no valid record): rebuilt from scratch
            shutil.rmtree(broken, ignore_errors=True)

    def _prepared(
        self, record: EnvironmentRecord, *, hit: bool, start: float, resolve_ms: float = 0.0
    ) -> PreparedEnvironment:
        return PreparedEnvironment(
            env_id=record.env_id,
            site=self.site(record.env_id),
            record=record,
            cache_hit=hit,
            prepare_ms=_ms(start),
            resolve_ms=resolve_ms,
            install_ms=0.0 if hit else record.install_ms + record.compile_ms,
        )


def _check_python(manifest: Manifest, target: SandboxTarget) -> None:
    if manifest.requires_python is None:
        return
    if not SpecifierSet(manifest.requires_python).contains(target.version, prereleases=True):
        raise InvalidDependencyManifest(
            f"the program requires Python {manifest.requires_python}; the sandbox runs {target.version}"
        )


__all__ = ["EnvironmentFailure", "EnvironmentStore"]
