"""Credentials the host injects: ``${ENV}`` and ``${file:/path}`` references resolved on the host, only for
requests whose host and scheme the credential names. Values are returned to the broker alone, which
redacts them from everything it hands back or records."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from sandforge.runtime.egress.config import REFERENCE, Credential
from sandforge.runtime.egress.errors import MissingCredentials
from sandforge.runtime.egress.urls import Target, host_matches

MAX_SECRET_FILE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Injected:
    """A header to add, and every secret text in it (the whole value and each substituted reference),
    which the broker redacts wherever it could surface."""

    header: str
    value: str
    secrets: tuple[str, ...]


#: Substituted pieces shorter than this are not redacted on their own (they would mangle ordinary text);
#: the whole header value always is.
MIN_REDACTED_PIECE = 4


def _read_secret_file(path: str, credential: Credential) -> str:
    where = f"credential {credential.header} for {credential.host}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise MissingCredentials(
            f"{where}: cannot open the file it references ({exc.strerror})", reason="missing_credentials"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise MissingCredentials(f"{where}: the file it references is not a regular file")
        data = os.read(fd, MAX_SECRET_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise MissingCredentials(f"{where}: the file it references is larger than {MAX_SECRET_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise MissingCredentials(f"{where}: the file it references is not UTF-8") from None


def resolve_value(credential: Credential, environ: Mapping[str, str]) -> tuple[str, tuple[str, ...]]:
    """The credential's value with every reference substituted, and the substituted pieces. The message of
    a failure names the variable or the file, never a value."""
    pieces: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        if match["file"] is not None:
            piece = _read_secret_file(match["file"], credential)
            pieces.append(piece)
            return piece
        name = match["env"]
        value = environ.get(name)
        if not value:
            raise MissingCredentials(
                f"credential {credential.header} for {credential.host} needs ${{{name}}}, which the host does not set",
                reason="missing_credentials",
                hint="set it in the host's environment; retrying the program will not help",
            )
        pieces.append(value)
        return value

    value = REFERENCE.sub(substitute, credential.value)
    if any(ch in value for ch in "\r\n\0") or not value.isprintable():
        raise MissingCredentials(
            f"credential {credential.header} for {credential.host} resolves to an unusable header value "
            "(control characters)",
            reason="missing_credentials",
        )
    return value, tuple(piece for piece in pieces if len(piece) >= MIN_REDACTED_PIECE)


class CredentialSource:
    """The policy's credentials, resolved per request against `environ` (the host's environment)."""

    def __init__(self, credentials: tuple[Credential, ...], environ: Mapping[str, str] | None = None) -> None:
        self._credentials = credentials
        self._environ = environ if environ is not None else os.environ

    @property
    def header_names(self) -> frozenset[str]:
        return frozenset(c.header.lower() for c in self._credentials)

    def for_target(self, target: Target) -> list[Injected]:
        out: list[Injected] = []
        for credential in self._credentials:
            if target.scheme in credential.schemes and host_matches(credential.host, target):
                value, pieces = resolve_value(credential, self._environ)
                out.append(Injected(credential.header, value, (value, *pieces)))
        return out
