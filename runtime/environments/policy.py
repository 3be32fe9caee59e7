"""The ``dependencies:`` section of a policy file, the effective dependency policy after layering, and the
checks of names against it (declared ones before anything is resolved, transitive ones after).

Layering (``DependencyPolicy.merge``): ``allow`` and ``block`` accumulate, ``source``, ``wheelhouse`` and
``max_env_mb`` take the last value given, ``reset: true`` first forgets earlier layers' ``allow`` and
``block``. ``block`` wins over ``allow``. HTTP client libraries are never installed whatever a layer says:
the sandbox has no network, and ``requests`` is the egress broker's stand-in. With no section the policy
allows nothing. This module imports nothing from the rest of sandforge but the errors.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandforge.runtime.environments.errors import DependencyPolicyViolation

#: Never installed into an environment (declared or transitive), and never allowed by a policy layer.
HTTP_CLIENTS = frozenset({"requests", "httpx", "httpcore", "urllib3", "aiohttp", "pycurl", "httplib2", "h11"})

_NAME = re.compile(r"^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$")
#: What PEP 503 normalises to one "-" (its own definition, which ``packaging.utils.canonicalize_name`` implements:
#: the policy's names are checked without loading ``packaging``, issue 39).
_SEPARATORS = re.compile(r"[-_.]+")
_URL = re.compile(r"^https?://[^\s/?#]+(/[^\s]*)?$")
DistName = Annotated[str, Field(min_length=1, max_length=100)]


def normal_name(value: str) -> str:
    """A distribution name in PEP 503 form; ValueError when it is not one."""
    if not _NAME.fullmatch(value.strip()):
        raise ValueError(f"{value!r} is not a distribution name")
    return _SEPARATORS.sub("-", value.strip()).lower()


def _names(values: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for value in values:
        seen.setdefault(normal_name(value), None)
    return list(seen)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class DependenciesSection(_Model):
    """The ``dependencies:`` section of one policy file (docs/environments.md)."""

    reset: bool = Field(False, description="forget earlier layers' allow and block lists first")
    allow: list[DistName] = Field(
        default_factory=list, description="distributions programs may declare (and their dependencies must be)"
    )
    block: list[DistName] = Field(default_factory=list, description="never installed; wins over allow")
    source: str | None = Field(
        None,
        max_length=2048,
        description="`index` (the package index), `offline` (the wheelhouse only) or an index URL; "
        "part of every environment's identity",
    )
    wheelhouse: str | None = Field(
        None, min_length=1, max_length=4096, description="a directory of wheels, used first; relative to the file"
    )
    max_env_mb: int | None = Field(None, ge=1, le=100_000, description="largest environment, installed size")

    @field_validator("allow")
    @classmethod
    def _allow(cls, values: list[str]) -> list[str]:
        names = _names(values)
        clients = sorted(set(names) & HTTP_CLIENTS)
        if clients:
            raise ValueError(
                f"{', '.join(clients)}: HTTP client libraries are never installed (the sandbox has no network; "
                "programs fetch through the egress broker, whose stand-in serves `requests`)"
            )
        return names

    @field_validator("block")
    @classmethod
    def _block(cls, values: list[str]) -> list[str]:
        return _names(values)

    @field_validator("source")
    @classmethod
    def _source(cls, value: str | None) -> str | None:
        if value is None or value in ("index", "offline"):
            return value
        if not _URL.fullmatch(value):
            raise ValueError(f"source {value!r}: expected `index`, `offline` or an http(s) index URL")
        return value.rstrip("/")


class SourcePolicy(_Model):
    """Where wheels come from. Part of an environment's identity: two policies never share one."""

    source: str = "index"
    wheelhouse: str | None = None

    @property
    def offline(self) -> bool:
        return self.source == "offline"

    def describe(self) -> str:
        if self.offline:
            return f"the wheelhouse only ({self.wheelhouse})"
        where = "the package index" if self.source == "index" else self.source
        return f"{where}, wheelhouse {self.wheelhouse} first" if self.wheelhouse else where


class DependencyPolicy(_Model):
    """The effective dependency policy (every layer merged). The default allows nothing."""

    allow: tuple[str, ...] = ()
    block: tuple[str, ...] = ()
    source: str = "index"
    wheelhouse: str | None = None
    max_env_mb: int = 500

    def merge(self, section: DependenciesSection, *, wheelhouse: str | None = None) -> DependencyPolicy:
        """This policy with `section` on top. ``wheelhouse`` is the section's directory already resolved by
        the caller (relative paths are relative to the policy file)."""
        base_allow, base_block = ((), ()) if section.reset else (self.allow, self.block)
        return DependencyPolicy(
            allow=tuple(_names((*base_allow, *section.allow))),
            block=tuple(_names((*base_block, *section.block))),
            source=section.source or self.source,
            wheelhouse=wheelhouse or section.wheelhouse or self.wheelhouse,
            max_env_mb=section.max_env_mb or self.max_env_mb,
        )

    @property
    def sources(self) -> SourcePolicy:
        return SourcePolicy(source=self.source, wheelhouse=self.wheelhouse)

    @property
    def allowed(self) -> tuple[str, ...]:
        """What a program may declare: allowed, not blocked, not an HTTP client; sorted (for feedback)."""
        return tuple(sorted(set(self.allow) - set(self.block) - HTTP_CLIENTS))

    def refusal(self, name: str) -> str | None:
        """Why ``name`` (normalised) may not be installed, or None when it may."""
        if name in HTTP_CLIENTS:
            return "an HTTP client library (never installed: the sandbox has no network; use fetch() or requests)"
        if name in self.block:
            return "blocked by the policy"
        if name not in self.allow:
            return "not in the policy's allow list"
        return None

    def check(self, names: Iterable[str], *, transitive: bool = False) -> None:
        """Raise `DependencyPolicyViolation` naming every refused distribution among ``names``."""
        refused = {name: why for name in names if (why := self.refusal(name)) is not None}
        if not refused:
            return
        what = "required by the declared dependencies" if transitive else "declared"
        detail = "; ".join(f"{name}: {why}" for name, why in sorted(refused.items()))
        raise DependencyPolicyViolation(
            f"{len(refused)} distribution(s) {what} may not be installed: {detail}",
            names=tuple(sorted(refused)),
            allowed=self.allowed,
            reason="transitive" if transitive else "declared",
        )
