"""Tenants: the server configuration (``server.yaml``), API tokens, and one tenant's runtime.

A tenant is the unit of isolation: its own state directory (ToolStore, sessions database, call log,
environments), policy layer, provider and quotas. Nothing here ever reaches a second tenant's directory:
:class:`TenantRuntime` is built from one :class:`TenantConfig` and holds only objects rooted in its state
directory, so a program of tenant A that calls ``tool("x")`` resolves ``x`` in A's ToolStore.

Tokens are stored as ``sha256:<hex>`` hashes (a token is 256 random bits, so a plain hash is enough);
:meth:`ServerConfig.authenticate` compares the presented token's hash with *every* hash of every tenant with
:func:`hmac.compare_digest`, so the time it takes does not depend on which tenant (if any) matched.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sandforge.runtime.errors import ConfigError, SandforgeError
from sandforge.runtime.files import write_user_file
from sandforge.runtime.files.structured import read_data_file
from sandforge.runtime.guardrails import Policy, layered_policy
from sandforge.runtime.providers.base import GeneratedProgram, GenerationRequest, Provider, ProviderError
from sandforge.runtime.providers.factory import ModelSettings
from sandforge.runtime.providers.factory import ProviderUnavailable as ProviderUnavailable  # sessions_api reads it here
from sandforge.sandbox import AsyncSandbox, Limits, Sandbox, SandboxConfig
from sandforge.sandbox.aio import DEFAULT_THREADS, Threads
from sandforge.sandbox.config import BackendName
from sandforge.sandbox.prestart import prestart

if TYPE_CHECKING:
    from sandforge.runtime.agent.calllog import CallLog
    from sandforge.runtime.agent.environment import Environments
    from sandforge.runtime.agent.statedb import StateDB
    from sandforge.runtime.agent.workspace import Workspace
    from sandforge.runtime.service.uploads import UploadStore
    from sandforge.runtime.sessions import SessionStore
    from sandforge.runtime.store import ToolStore

log = logging.getLogger(__name__)

TENANT_NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,62}$"
TOKEN_HASH_PATTERN = r"^sha256:[0-9a-f]{64}$"  # noqa: S105 (a pattern, not a secret)
TOKEN_PREFIX = "sf_"  # noqa: S105 (a prefix, not a secret)
CONFIG_MAX_BYTES = 1 << 20
CALL_LOG_KEEP = 32
#: The capability tag whose grant lets programs reach the network through the egress broker.
EGRESS_CAPABILITY = "http_fetch"


class Quotas(BaseModel):
    """What one tenant may use. Requests over a rate are 429 (with Retry-After); asking for more timeout or
    memory than allowed is 422; a body over ``max_body_bytes`` is 413."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    concurrent_executions: int = Field(4, ge=1, le=256, description="executions and agent calls at once")
    executions_per_minute: int = Field(120, ge=1, le=100_000, description="exec and agent calls per minute")
    provider_calls_per_day: int = Field(1000, ge=0, le=10_000_000, description="model calls per UTC day")
    max_timeout_s: float = Field(30.0, gt=0, le=3600, description="largest timeout_s a request may ask for")
    max_memory_mb: int = Field(512, ge=16, le=65536, description="largest memory_mb a request may ask for")
    max_body_bytes: int = Field(1 << 20, ge=1024, le=64 << 20, description="largest request body")
    max_upload_bytes: int = Field(
        64 << 20, ge=1024, le=1 << 40,
        description="largest streamed body (POST /v1/files, a multipart POST /v1/exec): never held in memory",
    )  # fmt: skip
    max_stored_files: int = Field(100, ge=0, le=100_000, description="uploads and kept outputs at once (/v1/files)")
    max_stored_bytes: int = Field(256 << 20, ge=0, le=1 << 40, description="their bytes in all")
    stored_file_max_age_s: float = Field(86_400.0, gt=0, le=365 * 86_400, description="removed once older")


class ProviderConfig(ModelSettings):
    """Which model provider writes the tenant's tool programs. ``none``: agent calls are refused (422).

    ``scripted`` replays ``programs`` (a ScriptedProvider file: tests, demos, soaks); ``anthropic`` and ``openai``
    (any OpenAI-compatible endpoint: ``base_url``) read their key from the environment variable ``api_key_env``
    (a name, never the key itself, is in server.yaml); ``replay`` serves ``recording`` (a file ``record`` wrote).
    The model fields are :class:`~sandforge.runtime.providers.factory.ModelSettings`'."""

    kind: Literal["none", "scripted", "anthropic", "openai", "replay"] = "none"
    programs: Path | None = None
    chat_script: Path | None = Field(None, description="scripted: the chat turns sessions replay (a chat script)")
    recording: Path | None = Field(None, description="replay: the recording to serve")

    @model_validator(mode="after")
    def _programs_for_scripted(self) -> ProviderConfig:
        if self.kind == "scripted" and self.programs is None:
            raise ValueError("a scripted provider needs 'programs' (a ScriptedProvider file)")
        if self.kind == "replay" and self.recording is None:
            raise ValueError("a replay provider needs 'recording' (a file a live provider's 'record' wrote)")
        return self


class TenantConfig(BaseModel):
    """One tenant of ``server.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=TENANT_NAME_PATTERN)
    token_hashes: tuple[str, ...] = ()
    state_dir: Path | None = Field(None, description="default: <server state_dir>/tenants/<name>")
    policy: tuple[Path, ...] = Field((), description="policy directories layered over the default, in order")
    provider: ProviderConfig = Field(default_factory=ProviderConfig)
    quotas: Quotas = Field(default_factory=Quotas)
    backend: BackendName | None = Field(None, description="default backend (else the server's)")

    @field_validator("token_hashes")
    @classmethod
    def _hashes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        import re

        for h in value:
            if not re.fullmatch(TOKEN_HASH_PATTERN, h):
                raise ValueError("a token hash is 'sha256:' and 64 lowercase hex digits (see sandforge tokens)")
        return value


class ServerConfig(BaseModel):
    """``server.yaml``: where state lives, the shared execution slots, and the tenants."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state_dir: Path = Field(Path("state"), description="tenants' default state directories live below it")
    audit_log: Path | None = Field(None, description="JSONL audit log (default: <state_dir>/audit.jsonl)")
    backend: BackendName = "subprocess"
    execution_slots: int = Field(8, ge=1, le=1024, description="executions at once across all tenants")
    pool_size: int = Field(1, ge=0, le=64, description="warm workers per tenant and backend")
    shutdown_grace_s: float = Field(10.0, ge=0, le=600, description="how long in-flight calls may finish")
    tenants: tuple[TenantConfig, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> ServerConfig:
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenant names must be unique")
        hashes = [h for t in self.tenants for h in t.token_hashes]
        if len(set(hashes)) != len(hashes):
            raise ValueError("a token hash appears twice (each token belongs to one tenant)")
        dirs = [str(self.tenant_state_dir(t)) for t in self.tenants]
        if len(set(dirs)) != len(dirs):
            raise ValueError("two tenants share a state directory")
        return self

    @property
    def audit_path(self) -> Path:
        return self.audit_log if self.audit_log is not None else self.state_dir / "audit.jsonl"

    def tenant(self, name: str) -> TenantConfig:
        for t in self.tenants:
            if t.name == name:
                return t
        raise ConfigError(f"no tenant named {name!r} in the server configuration")

    def tenant_state_dir(self, tenant: TenantConfig) -> Path:
        return tenant.state_dir if tenant.state_dir is not None else self.state_dir / "tenants" / tenant.name

    def authenticate(self, token: str | None) -> TenantConfig | None:
        """The tenant ``token`` belongs to, or None. Constant-time in which hash matched: every hash of every
        tenant is compared, none is skipped after a match."""
        presented = hash_token(token or "").encode("ascii")
        found: TenantConfig | None = None
        for tenant in self.tenants:
            for stored in tenant.token_hashes:
                if hmac.compare_digest(presented, stored.encode("ascii")) and token:
                    found = tenant
        return found

    def with_tenant(self, tenant: TenantConfig) -> ServerConfig:
        """This configuration with ``tenant`` replacing the one of the same name (or added)."""
        rest = tuple(t for t in self.tenants if t.name != tenant.name)
        return self.model_copy(update={"tenants": (*rest, tenant)})


def hash_token(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> str:
    """A fresh API token: ``sf_`` and 43 URL-safe characters (256 random bits)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def _resolve(base: Path, path: Path | None) -> Path | None:
    if path is None:
        return None
    path = path.expanduser()
    return path if path.is_absolute() else base / path


def _absolute(config: ServerConfig, base: Path) -> ServerConfig:
    """Relative paths of ``server.yaml`` are relative to the file's directory."""
    tenants = tuple(
        t.model_copy(
            update={
                "state_dir": _resolve(base, t.state_dir),
                "policy": tuple(_resolve(base, p) or p for p in t.policy),
                "provider": t.provider.model_copy(
                    update={
                        "programs": _resolve(base, t.provider.programs),
                        "chat_script": _resolve(base, t.provider.chat_script),
                    }
                ),
            }
        )
        for t in config.tenants
    )
    return config.model_copy(
        update={
            "state_dir": _resolve(base, config.state_dir),
            "audit_log": _resolve(base, config.audit_log),
            "tenants": tenants,
        }
    )


def parse_server_config(data: Any, *, base: Path, name: str = "server configuration") -> ServerConfig:
    if data is None:
        data = {}
    try:
        config = ServerConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top)"
        raise ConfigError(f"{name}: {where}: {err['msg']}") from None
    return _absolute(config, base)


def load_server_config(path: Path) -> ServerConfig:
    """``server.yaml`` (or .json) as a :class:`ServerConfig`, relative paths resolved; ConfigError otherwise."""
    data = read_data_file(path, what="server configuration", limit=CONFIG_MAX_BYTES, error=ConfigError)
    return parse_server_config(data, base=path.resolve().parent, name=str(path))


def save_server_config(path: Path, config: ServerConfig) -> None:
    """Write ``config`` (atomically, keeping the file's mode and owner). Paths are written as they are in
    ``config``; :func:`edit_token_hashes` keeps a file's own relative paths instead."""
    data = config.model_dump(mode="json", exclude_defaults=True)
    write_user_file(path, yaml.safe_dump(data, sort_keys=False).encode("utf-8"))


def edit_token_hashes(
    path: Path, *, tenant: str | None = None, add: str | None = None, remove: str | None = None, create: bool = False
) -> str | None:
    """Add hash ``add`` to ``tenant`` (creating the tenant, and the file, with ``create``) or remove hash
    ``remove`` from whichever tenant holds it, editing the file's own data (its relative paths stay relative)
    and validating the result before writing it. Returns the tenant changed (None: ``remove`` was nowhere).
    Comments in the file are not kept. The caller holds the file's lock."""
    data: Any = (
        read_data_file(path, what="server configuration", limit=CONFIG_MAX_BYTES, error=ConfigError)
        if (path.exists() or not create)
        else {}
    )
    if data is None:
        data = {}
    if not isinstance(data, dict) or not isinstance(data.setdefault("tenants", []), list):
        raise ConfigError(f"{path}: not a server configuration (a mapping with a 'tenants' list)")
    tenants: list[Any] = data["tenants"]
    changed: str | None = None
    for item in tenants:
        if not isinstance(item, dict):
            continue
        hashes = item.setdefault("token_hashes", [])
        if add is not None and item.get("name") == tenant:
            hashes.append(add)
            changed = tenant
        if remove is not None and remove in hashes:
            item["token_hashes"] = [h for h in hashes if h != remove]
            changed = str(item.get("name"))
    if add is not None and changed is None:
        if not create:
            raise ConfigError(f"no tenant named {tenant!r} in {path}", hint="add it, or pass --new-tenant")
        tenants.append({"name": tenant, "token_hashes": [add]})
        changed = tenant
    if changed is None:
        return None
    parse_server_config(data, base=path.resolve().parent, name=str(path))  # never write an invalid file
    write_user_file(path, yaml.safe_dump(data, sort_keys=False).encode("utf-8"))
    return changed


class ProviderQuotaExceeded(ProviderError):
    """The tenant used its provider calls for today."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"provider call quota reached ({limit} per day)", retriable=False, kind="quota_exceeded")


class DailyCounter:
    """Counts events per UTC day (thread-safe)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._day = ""
        self._count = 0
        self._lock = threading.Lock()

    def _roll(self) -> None:
        today = datetime.now(UTC).date().isoformat()
        if today != self._day:
            self._day, self._count = today, 0

    def take(self) -> bool:
        with self._lock:
            self._roll()
            if self._count >= self.limit:
                return False
            self._count += 1
            return True

    @property
    def exhausted(self) -> bool:
        with self._lock:
            self._roll()
            return self._count >= self.limit

    @property
    def used(self) -> int:
        with self._lock:
            self._roll()
            return self._count


class MeteredProvider:
    """A tenant's provider behind its daily provider-call quota: over it, a non-retriable ProviderError."""

    def __init__(self, inner: Provider, counter: DailyCounter) -> None:
        self.inner = inner
        self.counter = counter
        self.name = str(getattr(inner, "name", type(inner).__name__))

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        if not self.counter.take():
            raise ProviderQuotaExceeded(self.counter.limit)
        return self.inner.generate(request)


class NoProvider:
    """The tenant has no provider configured: every generation fails, typed and non-retriable."""

    name = "none"

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        raise ProviderError(
            f"no model provider is configured for this tenant, so {request.role}.{request.method} cannot be "
            "generated (only healthy stored tools run)",
            retriable=False,
            kind="not_configured",
        )


def build_provider(config: ProviderConfig) -> Provider:
    if config.kind == "scripted":
        from sandforge.runtime.providers import ScriptedProvider

        assert config.programs is not None
        return ScriptedProvider(config.programs)
    if config.kind == "none":
        return NoProvider()
    from sandforge.runtime.providers.factory import program_provider

    return program_provider(config.kind, config, replay=config.recording)


class TenantRuntime:
    """One tenant's runtime, every part rooted in its state directory. Parts are built on first use.

    ``tool_store``, ``call_log``, ``sessions`` (the sessions database), ``policy`` (the default policy with the
    tenant's layers), ``provider`` (metered by the daily quota), ``sandbox`` (this tenant's own warm pools) and
    ``workspace`` (the Agent runtime over all of them: ``Agent.for_role(role, workspace=rt.workspace)``).
    Thread-safe; :meth:`close` releases the sandbox (no worker or container survives) and the database.
    """

    def __init__(self, server: ServerConfig, tenant: TenantConfig, *, threads: Threads | None = None) -> None:
        self.server = server
        #: the async executions' thread pools, shared by the server's tenants (None: this runtime's own)
        self.threads = threads
        self.config = tenant
        self.name = tenant.name
        self.state_dir = server.tenant_state_dir(tenant)
        self.provider_calls = DailyCounter(tenant.quotas.provider_calls_per_day)
        self._lock = threading.RLock()
        self._parts: dict[str, Any] = {}
        self._closed = False

    def _part(self, key: str, build: Any) -> Any:
        with self._lock:
            if self._closed:
                raise SandforgeError(f"tenant {self.name} is shut down")
            if key not in self._parts:
                self._parts[key] = build()
            return self._parts[key]

    @property
    def backend(self) -> BackendName:
        return self.config.backend or self.server.backend

    @property
    def policy(self) -> Policy:
        def build() -> Policy:
            return layered_policy(self.config.policy)

        policy: Policy = self._part("policy", build)
        return policy

    @property
    def tool_store(self) -> ToolStore:
        from sandforge.runtime.store import ToolStore

        store: ToolStore = self._part("tool_store", lambda: ToolStore(self.state_dir))
        return store

    @property
    def call_log_path(self) -> Path:
        return self.state_dir / "logs" / "calls.jsonl"

    @property
    def call_log(self) -> CallLog:
        from sandforge.runtime.agent.calllog import CallLog

        # the file is the log (GET /v1/calls reads it); a long-running server keeps few records in memory
        log: CallLog = self._part("call_log", lambda: CallLog(self.call_log_path, keep=CALL_LOG_KEEP))
        return log

    @property
    def sessions(self) -> SessionStore:
        from sandforge.runtime.files import make_private_dir
        from sandforge.runtime.sessions import SessionStore

        def build() -> SessionStore:
            make_private_dir(self.state_dir)
            return SessionStore(state=self.state_dir)

        store: SessionStore = self._part("sessions", build)
        return store

    @property
    def provider(self) -> Provider:
        provider: Provider = self._part(
            "provider", lambda: MeteredProvider(build_provider(self.config.provider), self.provider_calls)
        )
        return provider

    @property
    def chat_provider(self) -> Any:
        """The model behind the tenant's chat sessions (one per tenant: a scripted one replays its turns in
        order across requests); ProviderUnavailable when the tenant has none."""
        return self._part("chat_provider", self._build_chat_provider)

    def _build_chat_provider(self) -> Any:
        cfg = self.config.provider
        if cfg.kind == "scripted" and cfg.chat_script is not None:
            from sandforge.runtime.providers.chat import ScriptedChatProvider

            return ScriptedChatProvider.from_file(cfg.chat_script)
        if cfg.kind in ("anthropic", "openai", "replay"):
            from sandforge.runtime.providers.factory import chat_provider

            return chat_provider(cfg.kind, cfg, replay=cfg.recording)
        raise ProviderUnavailable("this tenant has no chat provider configured")

    def sandbox_config(self) -> SandboxConfig:
        # a service's thread count stays flat: its warm pools start their spawn threads when made
        return SandboxConfig.from_env(backend=self.backend, pool_size=self.server.pool_size, prestart_threads=True)

    @property
    def sandbox(self) -> Sandbox:
        sandbox: Sandbox = self._part("sandbox", lambda: Sandbox(self.sandbox_config()))
        return sandbox

    @property
    def async_sandbox(self) -> AsyncSandbox:
        """:attr:`sandbox` for the event loop (the same warm pools): ``POST /v1/exec`` awaits its executions
        there, with no thread waiting for each one's output."""
        sandbox: AsyncSandbox = self._part("async_sandbox", lambda: AsyncSandbox(self.sandbox, threads=self.threads))
        return sandbox

    def limits(self, *, timeout_s: float | None = None, memory_mb: int | None = None) -> Limits:
        """The sandbox's limits with a request's overrides (checked against the quotas by the caller)."""
        base = self.sandbox.config.limits
        update: dict[str, Any] = {}
        if timeout_s is not None:
            update["timeout_s"] = timeout_s
        if memory_mb is not None:
            update["memory_mb"] = memory_mb
        return Limits(**{**base.model_dump(), **update}) if update else base

    @property
    def environments_dir(self) -> Path:
        """Where this tenant's third-party environments are built and found: inside its own state directory,
        so one tenant never runs (or probes, or prunes) an environment another tenant's program built."""
        return self.state_dir / "environments"

    @property
    def environments(self) -> Environments:
        from sandforge.runtime.agent.environment import Environments

        environments: Environments = self._part("environments", lambda: Environments(self.environments_dir))
        return environments

    @property
    def workspace(self) -> Workspace:
        from sandforge.runtime.agent.workspace import Workspace

        def build() -> Workspace:
            return Workspace(
                provider=self.provider, sandbox=self.sandbox, policy=self.policy, log=self.call_log,
                store=self.tool_store, environments=self.environments, state_dir=self.state_dir,
            )  # fmt: skip

        workspace: Workspace = self._part("workspace", build)
        return workspace

    @property
    def uploads(self) -> UploadStore:
        """The tenant's stored files (``/v1/files``: uploads and kept outputs), cleaned by age when opened."""
        from sandforge.runtime.service.uploads import UploadStore

        q = self.config.quotas
        store: UploadStore = self._part("uploads", lambda: UploadStore(
            self.state_dir, max_files=q.max_stored_files, max_bytes=q.max_stored_bytes,
            max_age_s=q.stored_file_max_age_s))  # fmt: skip
        return store

    @property
    def state(self) -> StateDB:
        """The tenant's state database (committed contexts), opened without a provider or a sandbox: what
        ``/v1/roles/{role}/context`` and the MCP context resource read and write. The workspace has its own
        connection to it; each sees the other's commits (``runtime/agent/statedb.py``)."""
        from sandforge.runtime.agent.statedb import DB_FILE_NAME, StateDB

        db: StateDB = self._part("state", lambda: StateDB(self.state_dir / DB_FILE_NAME))
        return db

    # --- what the MCP tools use of a tenant (``mcp.tenant.TenantPort``) ---

    @property
    def store(self) -> ToolStore:
        return self.tool_store

    @property
    def limit_caps(self) -> tuple[float, int]:
        """The largest timeout (seconds) and memory (MB) a request may ask for."""
        quotas = self.config.quotas
        return quotas.max_timeout_s, quotas.max_memory_mb

    @property
    def default_limits(self) -> Limits:
        """The limits of a request that asks for none: the sandbox's, never above the tenant's quotas."""
        base = self.sandbox.config.limits
        max_timeout, max_memory = self.limit_caps
        return self.limits(timeout_s=min(base.timeout_s, max_timeout), memory_mb=min(base.memory_mb, max_memory))

    @property
    def egress_granted(self) -> bool:
        """Programs of this tenant may reach the network through the broker (MCP tools are then open-world)."""
        return EGRESS_CAPABILITY in self.policy.granted

    def close(self) -> None:
        with self._lock:
            self._closed = True
            parts, self._parts = self._parts, {}
        if "workspace" in parts:
            parts["workspace"].close()
        if "sessions" in parts:
            parts["sessions"].close()
        if "state" in parts:
            parts["state"].close()
        if "async_sandbox" in parts and self.threads is None:  # shared threads are their owner's to stop
            parts["async_sandbox"].threads.shutdown()
        if "sandbox" in parts:
            parts["sandbox"].close()


def standalone_tenant(
    name: str,
    state_dir: Path,
    *,
    policy: tuple[Path, ...] | Policy = (),
    provider: ProviderConfig | None = None,
    backend: BackendName | None = None,
    max_timeout_s: float | None = None,
    max_memory_mb: int | None = None,
) -> TenantRuntime:
    """One tenant outside any ``server.yaml`` (``sandforge mcp`` with flags): the same runtime the service
    builds, its state in ``state_dir``, with no daily provider-call quota. ``policy``: layer paths over the
    default, or the Policy itself (``--policy``/``--no-default`` as the CLI loaded them). ConfigError for bad
    values."""
    quotas: dict[str, Any] = {"provider_calls_per_day": 10_000_000}
    if max_timeout_s is not None:
        quotas["max_timeout_s"] = max_timeout_s
    if max_memory_mb is not None:
        quotas["max_memory_mb"] = max_memory_mb
    layers = policy if isinstance(policy, tuple) else ()
    tenant = {"name": name, "state_dir": state_dir, "policy": layers, "quotas": quotas,
              "provider": (provider or ProviderConfig()).model_dump(), "backend": backend}  # fmt: skip
    config = parse_server_config({"state_dir": state_dir, "tenants": [tenant]}, base=Path.cwd(), name="tenant")
    runtime = TenantRuntime(config, config.tenants[0])
    if not isinstance(policy, tuple):
        runtime._parts["policy"] = policy
    return runtime


def service_threads(execution_slots: int) -> Threads:
    """The async executions' thread pools of a server, every thread started: ``short`` (reaping an exit,
    starting a worker, handed-off clean-ups) as the async API has it, ``long`` (a nested call's answer, a
    fetch: at most one per execution at a time) one per execution slot, so no awaited execution waits for one."""
    threads = Threads(short=min(DEFAULT_THREADS, execution_slots), long=execution_slots)
    prestart(threads.short)
    prestart(threads.long)
    return threads


class TenantRuntimes:
    """The factory: one :class:`TenantRuntime` per tenant of a :class:`ServerConfig`, made on first use.

    With ``config_path``, token hashes are re-read when the file changes (``sandforge tokens create|revoke``
    take effect without a restart); other changes (tenants, quotas, paths) need a restart."""

    def __init__(self, config: ServerConfig, *, config_path: Path | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self._stamp = self._file_stamp()
        self._runtimes: dict[str, TenantRuntime] = {}
        self._lock = threading.Lock()
        #: the awaited executions' threads (reaping, starting workers, nested calls), shared by every tenant and
        #: all started now: bounded by the execution slots, so the server's thread count never grows
        self.threads = service_threads(config.execution_slots)

    def _file_stamp(self) -> tuple[int, int, int] | None:
        if self.config_path is None:
            return None
        try:
            st = self.config_path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _reload_tokens(self) -> None:
        stamp = self._file_stamp()
        if stamp == self._stamp or self.config_path is None:
            return
        self._stamp = stamp
        try:
            fresh = load_server_config(self.config_path)
        except SandforgeError as exc:  # keep serving with the hashes we have; fail closed for new ones
            log.error("server configuration not reloaded: %s", exc)
            return
        hashes = {t.name: t.token_hashes for t in fresh.tenants}
        tenants = tuple(t.model_copy(update={"token_hashes": hashes.get(t.name, ())}) for t in self.config.tenants)
        self.config = self.config.model_copy(update={"tenants": tenants})

    def get(self, name: str) -> TenantRuntime:
        with self._lock:
            rt = self._runtimes.get(name)
            if rt is None:
                rt = TenantRuntime(self.config, self.config.tenant(name), threads=self.threads)
                self._runtimes[name] = rt
            return rt

    def for_token(self, token: str | None) -> TenantRuntime | None:
        """The runtime of the tenant ``token`` authenticates, or None (see :meth:`ServerConfig.authenticate`)."""
        self._reload_tokens()
        tenant = self.config.authenticate(token)
        return None if tenant is None else self.get(tenant.name)

    def close(self) -> None:
        with self._lock:
            runtimes, self._runtimes = list(self._runtimes.values()), {}
        self.threads.shutdown()  # waits for the workers' handed-off clean-ups, before their sandboxes close
        for rt in runtimes:
            rt.close()
