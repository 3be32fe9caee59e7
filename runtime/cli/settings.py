"""Every ``SANDFORGE_*`` setting, and the configuration file that can hold them (issue 21).

A setting comes from, in order: the command's flag, the environment variable, the configuration file, the
default. The file is ``--config FILE`` (or ``$SANDFORGE_CONFIG``); else the first ``sandforge.toml``, or
``pyproject.toml`` with a ``[tool.sandforge]`` table, found from the current directory upwards. Its keys are
the variables' names without ``SANDFORGE_``, in lower case (``backend = "docker"``, ``pool_size = 4``);
relative paths are relative to the file. The CLI applies the file by setting the variables it names that the
environment does not, so the library reads one source.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sandforge.runtime.errors import ConfigError
from sandforge.runtime.files import read_user_file

CONFIG_ENV = "SANDFORGE_CONFIG"
MAX_CONFIG_BYTES = 1024 * 1024
Kind = Literal["str", "int", "float", "bool", "path", "list", "paths"]


@dataclass(frozen=True)
class Setting:
    key: str
    kind: Kind
    default: str
    help: str
    #: a credential: `sandforge config` says whether it is set, never its value
    secret: bool = False

    @property
    def env(self) -> str:
        return "SANDFORGE_" + self.key.upper()


#: The settings a user may set (tests' own variables are not among them). The README's table is this one.
SETTINGS: tuple[Setting, ...] = (
    Setting("backend", "str", "subprocess", "sandbox backend: subprocess, docker, gvisor, runc, runsc"),
    Setting("pool_size", "int", "2", "warm sandboxes kept ready per backend (0: every execution starts cold)"),
    Setting("env_zygotes_max", "int", "2", "zygotes with an environment's packages pre-imported (LRU; confined)"),
    Setting("cluster", "str", "none", "run executions on a Ray cluster (HOST:PORT or ray://HOST:PORT; docs/deploy.md)"),
    Setting("cluster_connect_timeout_s", "float", "120", "seconds to keep trying to (re)connect to the cluster"),
    Setting("require_protections", "list", "the backend's table", "protections a sandbox must show (comma list)"),
    Setting("allow_missing_protections", "list", "none", "protections waived (comma list; weakens the sandbox)"),
    Setting("state_dir", "path", "the user state directory", "tool store, sessions, environments, call log"),
    Setting("call_log", "path", "<state_dir>/calls.jsonl", "the call log (JSON lines)"),
    Setting("call_records_max", "int", "100000", "committed call records kept in state.db (oldest logged pruned)"),
    Setting("lock_timeout", "float", "300", "seconds to wait for a file lock before failing (exit 7)"),
    Setting("cache_dir", "path", "the user cache directory", "downloaded and built artefacts (image build)"),
    Setting("debian_mirror", "str", "deb.debian.org", "Debian mirror for `sandforge image build`"),
    Setting("anthropic_model", "str", "a current Sonnet", "model that writes tool programs"),
    Setting("chat_model", "str", "a current Sonnet", "model of `sandforge chat`"),
    Setting("openai_base_url", "str", "OPENAI_BASE_URL, else OpenAI's",
            "OpenAI-compatible endpoint (docs/providers.md)"),
    Setting("openai_model", "str", "gpt-4.1-mini", "model of the openai provider (programs and chat)"),
    Setting("openai_api_key", "str", "OPENAI_API_KEY", "key of the openai provider (never shown)", secret=True),
    Setting("trace_max_nested_calls", "int", "20", "nested tool()/delegate() calls per trace"),
    Setting("trace_max_provider_calls", "int", "24", "provider generations per trace"),
    Setting("trace_max_sandboxes", "int", "40", "program executions per trace"),
    Setting("trace_max_wall_s", "float", "300", "wall-clock seconds per trace"),
    Setting("otel", "bool", "off (on when OTEL_* exporter variables are set)", "OpenTelemetry traces and metrics"),
    Setting("otel_record_io", "bool", "off", "put programs' arguments and results into spans"),
    Setting("mcp_policy", "paths", "none", "policy layers of `sandforge mcp` (':'-separated)"),
    Setting("mcp_provider", "str", "scripted or anthropic", "program provider of `sandforge mcp` (or openai, replay)"),
    Setting("mcp_programs", "path", "none", "programs the scripted provider of `sandforge mcp` replays"),
    Setting("server_config", "path", "none", "server.yaml of `sandforge serve` / `sandforge mcp --tenant`"),
    Setting("tenant", "str", "none", "tenant of `sandforge mcp --config`"),
)
BY_KEY = {s.key: s for s in SETTINGS}
#: Read before the configuration file can be applied (at import): environment only.
ENV_ONLY = ("SANDFORGE_OCI_STATE_DIR", CONFIG_ENV)


def find_config(start: Path) -> tuple[Path, dict[str, Any]] | None:
    """The configuration file that applies in ``start`` (and its table), searching upwards."""
    for directory in (start, *start.parents):
        own = directory / "sandforge.toml"
        if own.is_file():
            return own, _table(own, pyproject=False, found=True)
        project = directory / "pyproject.toml"
        if project.is_file():
            table = _table(project, pyproject=True, found=True)
            if table:
                return project, table
    return None


def load_config(explicit: str | None, cwd: Path | None = None) -> tuple[Path, dict[str, Any]] | None:
    """``explicit`` (``--config``/``$SANDFORGE_CONFIG``; must exist) or the file found from ``cwd``."""
    if explicit:
        path = Path(explicit)
        return path, _table(path, pyproject=path.name == "pyproject.toml")
    return find_config((cwd or Path.cwd()).resolve())


def _check_owner(path: Path) -> None:
    """A file sandforge found by itself (not named by the user) configures the sandbox: it must be the user's
    (or root's) and writable by nobody else, or a shared directory could weaken another user's sandbox."""
    info = path.stat()
    if info.st_uid not in (os.geteuid(), 0) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"{path}: refused: owned by another user or writable by others",
                          hint=f"fix its owner and mode, or name a file with --config / ${CONFIG_ENV}")  # fmt: skip


def _table(path: Path, *, pyproject: bool, found: bool = False) -> dict[str, Any]:
    """The settings table of ``path``. A found file is refused unless it is safe (`_check_owner`) only when it
    configures something: a ``pyproject.toml`` without ``[tool.sandforge]`` is passed over, whoever owns it."""
    import tomllib  # only when a settings file was found: most runs have none

    raw = read_user_file(path, limit=MAX_CONFIG_BYTES, what="configuration file")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    if pyproject:
        tool = data.get("tool")
        data = tool.get("sandforge", {}) if isinstance(tool, dict) else {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: [tool.sandforge] must be a table")
    if found and (data or not pyproject):
        _check_owner(path)
    return data


def _text(path: Path, setting: Setting, value: Any) -> str:
    """A file value as its environment variable holds it; the file and key name any wrong type."""
    where = f"{path}: {setting.key}"
    kind = setting.kind
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false")
        return "1" if value else "0"
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where} must be an integer")
    if kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ConfigError(f"{where} must be a number")
    if kind in ("list", "paths"):
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(i, str) for i in items):
            raise ConfigError(f"{where} must be a string or a list of strings")
        if kind == "paths":
            return ":".join(str(path.parent / i) for i in items)
        return ",".join(items)
    if kind in ("str", "path") and not isinstance(value, str):
        raise ConfigError(f"{where} must be a string")
    if kind == "path":
        return str(path.parent / Path(value).expanduser())
    return str(value)


def apply_config(path: Path, table: Mapping[str, Any], environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Set the variables ``table`` names that ``environ`` does not; returns the keys it set. An unknown key
    is a ConfigError naming the file and the key (a typo must not be silently ignored)."""
    env = os.environ if environ is None else environ
    unknown = sorted(set(table) - set(BY_KEY))
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s) {', '.join(unknown)}",
                          hint="`sandforge config` lists the settings")  # fmt: skip
    applied = []
    for key, value in table.items():
        setting = BY_KEY[key]
        text = _text(path, setting, value)
        if setting.env not in env:
            env[setting.env] = text
            applied.append(key)
    return applied


def effective(environ: Mapping[str, str], from_file: set[str]) -> list[dict[str, str | None]]:
    """Every setting, its value and where it came from (environment, file or default)."""
    rows: list[dict[str, str | None]] = []
    for s in SETTINGS:
        value = environ.get(s.env)
        if s.secret and value is not None:
            value = "(set)"
        source = "default" if value is None else "file" if s.key in from_file else "environment"
        rows.append({"key": s.key, "env": s.env, "value": value, "source": source, "default": s.default,
                     "help": s.help})  # fmt: skip
    return rows
