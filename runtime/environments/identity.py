"""What an environment is: the sandbox's interpreter, the normalised manifest, the resolved pins (with their
hashes) and the source policy. Its id is a hash of all four, so two policies with different sources never
share an environment, and a persisted artifact that stores its `EnvironmentSpec` rebuilds exactly it."""

from __future__ import annotations

import hashlib
import json
import re

from pydantic import BaseModel, ConfigDict, Field

from sandforge.runtime.environments.manifest import Manifest
from sandforge.runtime.environments.policy import SourcePolicy, normal_name
from sandforge.runtime.environments.target import SandboxTarget

SPEC_VERSION = 1
ID_CHARS = 32
ID_PATTERN = re.compile(r"^[0-9a-f]{32}$")

_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9.+!_-]+)$")
_HASH = re.compile(r"^--hash=(?P<hash>sha256:[0-9a-f]{64})$")


class Pin(BaseModel):
    """One resolved distribution: exact version and the hashes of its acceptable files."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    version: str
    hashes: tuple[str, ...] = Field(min_length=1)

    def line(self) -> str:
        """The pin as ``uv pip install --require-hashes`` reads it."""
        return " ".join([f"{self.name}=={self.version}", *(f"--hash={h}" for h in self.hashes)])


class EnvironmentSpec(BaseModel):
    """Everything an environment's identity covers; enough to rebuild it on another machine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = SPEC_VERSION
    target: SandboxTarget
    manifest: Manifest
    pins: tuple[Pin, ...]
    source: SourcePolicy

    @property
    def env_id(self) -> str:
        return digest(self.model_dump(mode="json"))

    def pins_text(self) -> str:
        return "".join(pin.line() + "\n" for pin in self.pins)


def digest(value: object) -> str:
    """The id of a JSON value: sha256 of its canonical form, shortened."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:ID_CHARS]


def request_key(target: SandboxTarget, manifest: Manifest, source: SourcePolicy) -> str:
    """The key of a resolution: the identity without the pins (what is known before resolving)."""
    return digest(
        {
            "version": SPEC_VERSION,
            "target": target.model_dump(mode="json"),
            "manifest": manifest.model_dump(mode="json"),
            "source": source.model_dump(mode="json"),
        }
    )


def parse_pins(text: str) -> tuple[Pin, ...]:
    """The pins of ``uv pip compile --generate-hashes --no-annotate --no-header`` output."""
    pins: list[Pin] = []
    joined = re.sub(r"\\\s*\n", " ", text)
    for raw in joined.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        head, *rest = line.split()
        match = _PIN.fullmatch(head)
        hashes = [m["hash"] for token in rest if (m := _HASH.fullmatch(token)) is not None]
        if match is None or len(hashes) != len(rest) or not hashes:
            raise ValueError(f"unexpected line in the resolver's output: {line[:120]!r}")
        pins.append(Pin(name=normal_name(match["name"]), version=match["version"], hashes=tuple(sorted(hashes))))
    return tuple(sorted(pins, key=lambda pin: pin.name))
