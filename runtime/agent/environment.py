"""A call's environment (issue 19): the program's manifest, checked against the policy, built or found on the
host by ``runtime/environments`` and handed to the sandbox as an ``EnvironmentMount``.

:class:`Environments` is the workspace's part (where environments live, which interpreter each backend runs,
both cached); the lifecycle asks it per attempt. Failures keep ``runtime/environments``' kinds and lanes
(``errors.LIFECYCLE``): the two recoverable kinds become validation violations (the model gets the feedback,
the guardrail lane's budget), a failed resolution is the manifest's own fault (intrinsic), a failed install
or a build past the wait is the world's (extrinsic, retriable).
"""

from __future__ import annotations

import re
import sys
import threading
import weakref
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from sandforge.runtime.environments.errors import DependencyInstallFailed, EnvironmentFailure
from sandforge.runtime.environments.manifest import Manifest, manifest_of
from sandforge.runtime.environments.policy import DependencyPolicy
from sandforge.runtime.guardrails import Policy, ValidationResult, Violation
from sandforge.runtime.state_dir import resolve_state_dir
from sandforge.sandbox import EnvironmentMount
from sandforge.sandbox.protocol import EXPOSABLE_MODULE

if TYPE_CHECKING:  # the builder (uv, file locks, records) loads when a program declares packages, not before
    from sandforge.runtime.environments.builder import EnvironmentStore, Progress
    from sandforge.runtime.environments.identity import EnvironmentSpec
    from sandforge.runtime.environments.records import PreparedEnvironment
    from sandforge.runtime.environments.target import SandboxTarget

__all__ = ["Environments", "default_environments", "failure_result", "manifest_for", "mount_of"]

#: Hears each long step of the environment build one request causes (``POST /v1/exec`` streams it as
#: server-sent events, the MCP exec tool sends it as progress notifications), beside a workspace's own
#: ``Environments.progress``: per request, so it is set in the context (or on the thread) that prepares it.
BUILD_PROGRESS: ContextVar[Progress | None] = ContextVar("sandforge_build_progress", default=None)

_DEFAULTS: dict[Path, Environments] = {}
_DEFAULT_LOCK = threading.Lock()


def default_environments() -> Environments:
    """The environments below the state directory as it is now (``SANDFORGE_STATE_DIR`` may change within a
    process: one `Environments` per root, shared by the calls whose workspace names none)."""
    root = resolve_state_dir() / "environments"
    with _DEFAULT_LOCK:
        found = _DEFAULTS.get(root)
        if found is None:
            found = _DEFAULTS[root] = Environments(root)
        return found


class Environments:
    """The environments a workspace's calls run with: below ``root`` (default ``<state dir>/environments``),
    one store shared by every call, one probe per interpreter (cached on disk, so preparing starts no process)."""

    def __init__(
        self, root: Path | None = None, *, store: EnvironmentStore | None = None, progress: Progress | None = None
    ) -> None:
        self._root = root
        self._store = store
        #: hears each long step of a build (resolving, installing): the CLI shows it on standard error
        self.progress = progress
        self._lock = threading.Lock()
        self._targets: dict[str, SandboxTarget] = {}
        self._interpreters: weakref.WeakKeyDictionary[Any, dict[str | None, Any]] = weakref.WeakKeyDictionary()

    @property
    def store(self) -> EnvironmentStore:
        from sandforge.runtime.environments.builder import EnvironmentStore

        with self._lock:
            if self._store is None:
                self._store = EnvironmentStore(self._root or resolve_state_dir() / "environments")
            return self._store

    def target(self, sandbox: Any, backend: str | None) -> SandboxTarget:
        """The interpreter programs run on with ``backend`` (what their environment must be built for)."""
        from sandforge.runtime.environments.bytecode import compile_on_host
        from sandforge.runtime.environments.target import interpreter_key, probe

        found = self._interpreter(sandbox, backend)
        if found is None or found.python is not None:
            python = found.python if found is not None else None
            key = interpreter_key(python)
            target = self._cached(key, lambda: probe(python))
            runs = python or sys.executable  # compiles the bytecode when the builder's interpreter has another tag
            self.store.compilers.setdefault(target, (f"interpreter {runs}", lambda site: compile_on_host(runs, site)))
            return target
        image, runtime = found.image, found.runtime
        target = self._cached(f"image:{image}:{runtime}", lambda: _probe_image(image, runtime))
        # the image's own interpreter compiles the bytecode when this host's is of another minor version
        label = f"image {image} ({target.cache_tag})"
        self.store.compilers.setdefault(target, (label, lambda site: _compile_in_image(image, runtime, site)))
        return target

    def _interpreter(self, sandbox: Any, backend: str | None) -> Any:
        """``sandbox.interpreter(backend)``, asked once per sandbox and backend: naming a container backend's
        image hashes the inside package (milliseconds a prepared execution would pay each time)."""
        describe = getattr(sandbox, "interpreter", None)
        if describe is None:
            return None
        try:
            known = self._interpreters.setdefault(sandbox, {})
        except TypeError:  # a sandbox that cannot be weakly referenced: asked every time
            return describe(backend)
        if backend not in known:
            known[backend] = describe(backend)
        return known[backend]

    def _cached(self, key: str, describe: Any) -> SandboxTarget:
        from sandforge.runtime.environments.target import TargetCache

        known = self._targets.get(key)
        if known is None:
            known = TargetCache(self.store.root / "targets").get(key, describe)
            self._targets[key] = known
        return known

    def _heard(self) -> Progress | None:
        """Who hears this build's steps: the workspace's ``progress`` and the request's ``BUILD_PROGRESS``."""
        own, request = self.progress, BUILD_PROGRESS.get()
        if own is None or request is None:
            return own or request

        def both(message: str) -> None:
            own(message)
            request(message)

        return both

    def prepare(self, manifest: Manifest, policy: DependencyPolicy, target: SandboxTarget) -> PreparedEnvironment:
        return self.store.prepare(manifest, policy, target, progress=self._heard())

    def prepare_for(
        self, manifest: Manifest, stored: EnvironmentSpec | None, policy: DependencyPolicy, target: SandboxTarget
    ) -> PreparedEnvironment:
        """A stored artifact's environment exactly (its pins; rebuilt when this machine has not got it) when
        it is still the one this manifest, policy source and interpreter would get; else a fresh one."""
        if (
            stored is not None
            and stored.manifest == manifest
            and stored.target == target
            and (stored.source == policy.sources)
        ):
            policy.check(manifest.names)  # the policy of today, not the one it was stored under
            policy.check((pin.name for pin in stored.pins), transitive=True)
            return self.store.ensure(stored, max_env_mb=policy.max_env_mb, progress=self._heard())
        return self.store.prepare(manifest, policy, target, progress=self._heard())


def _probe_image(image: str | None, runtime: str | None) -> SandboxTarget:
    from sandforge.runtime.environments.target import probe_container
    from sandforge.sandbox.docker_engine import connect

    assert image is not None
    return probe_container(connect(), image, runtime=runtime)


def _compile_in_image(image: str | None, runtime: str | None, site: Path) -> None:
    from sandforge.runtime.environments.bytecode import compile_in_container
    from sandforge.sandbox.docker_engine import connect

    assert image is not None
    compile_in_container(connect(), image, site, runtime=runtime)


def manifest_for(code: str, structured: list[str], policy: DependencyPolicy) -> Manifest:
    """The program's normalised manifest, its declared names checked against ``policy`` (before anything is
    resolved). Raises the recoverable `EnvironmentFailure` kinds."""
    manifest = manifest_of(code, structured)
    if manifest:
        policy.check(manifest.names)
    return manifest


def failure_result(exc: EnvironmentFailure, policy: Policy) -> ValidationResult:
    """A recoverable environment failure as a validation result: the model reads it as guardrail feedback."""
    hint = exc.hint or f"allowed distributions: {', '.join(policy.dependencies.allowed) or 'none'}"
    violation = Violation(
        violation_type=exc.kind, message=str(exc.args[0]) if exc.args else exc.kind, classification="recoverable",
        required_correction=f"Fix the program's `# /// script` dependencies block: {hint}.",
    )  # fmt: skip
    return ValidationResult(verdict="recoverable", violations=[violation], policy_name=policy.name,
                            policy_fingerprint=policy.fingerprint)  # fmt: skip


_EXPOSABLE = re.compile(EXPOSABLE_MODULE)


def declared_modules(prepared: PreparedEnvironment, manifest: Manifest) -> tuple[str, ...]:
    """Public top-level modules the *declared* distributions provide (not what they pull in transitively).
    A private one (pyyaml's ``_yaml`` extension) stays importable by its package, never by the program."""
    provides = prepared.record.provides
    found = {module for name in manifest.names for module in provides.get(name, ())}
    return tuple(sorted(module for module in found if _EXPOSABLE.match(module)))


def mount_of(prepared: PreparedEnvironment, manifest: Manifest) -> EnvironmentMount:
    """The sandbox request's field: the ready site, exposing the declared distributions' public modules. An
    environment the request cannot name (a damaged record) is ``dependency_install_failed``, in one line."""
    modules = declared_modules(prepared, manifest)
    try:
        return EnvironmentMount(env_id=prepared.env_id, site=str(prepared.site), modules=modules)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise DependencyInstallFailed(
            f"environment {prepared.env_id[:12]} cannot be mounted: {where}: {first['msg']}"[:500]
        ) from None
