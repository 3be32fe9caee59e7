"""Data files a user hands to a command (chat scripts, tool groups, scripted programs): JSON by suffix,
YAML otherwise, read bounded and decoded with the same bounds as policy files (node budget, depth, no
aliases blowing up, no custom tags). Every problem is one ``error:`` line, exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandforge.runtime.errors import ConfigError, InputFileError, SandforgeError
from sandforge.runtime.files.jsontext import UTF8_BOM, decode_json
from sandforge.runtime.files.read import read_user_file

#: Chat scripts, tool group files and program scripts are small; 16 MiB is generous.
DATA_FILE_MAX_BYTES = 16 * 1024 * 1024


def decode_data(raw: bytes, *, name: str, json_only: bool) -> Any:
    """``raw`` as JSON (``json_only``) or YAML (a superset of JSON here) plain data."""
    if json_only:
        return decode_json(raw, what=name)
    try:
        text = raw.removeprefix(UTF8_BOM).decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputFileError(f"{name}:{line}: not valid UTF-8") from None
    from sandforge.runtime.files.yamltext import compose_yaml  # PyYAML only when a YAML file is read

    try:
        return compose_yaml(name, text)
    except ConfigError as exc:
        raise InputFileError(f"not valid YAML: {exc.message}") from None


def read_data_file(
    path: Path, *, what: str, limit: int = DATA_FILE_MAX_BYTES, error: type[SandforgeError] = InputFileError
) -> Any:
    """Plain data from ``path`` (``.json``: strict JSON; else YAML); ``error`` (exit 2 kinds) otherwise."""
    try:
        raw = read_user_file(path, limit=limit, what=what)
        return decode_data(raw, name=f"{what} {path}", json_only=path.suffix == ".json")
    except InputFileError as exc:
        raise error(exc.message) from None
