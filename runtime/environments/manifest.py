"""A program's dependency manifest: PEP 723 inline script metadata and the provider's structured field,
normalised into one `Manifest`.

Normal form: PEP 503 names, PEP 440 specifier sets (as `packaging` prints them), extras sorted, duplicates
merged (their specifiers intersected), sorted by name. A duplicate whose specifiers cannot both hold is an
error, and so is anything that is not a plain named requirement (URLs, paths, environment markers: an
environment is built for one sandbox interpreter). Every failure is `InvalidDependencyManifest`, whose message
goes back to the model.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from sandforge.runtime.environments.errors import InvalidDependencyManifest

if TYPE_CHECKING:  # `packaging` loads with the first requirement parsed: most programs declare none (issue 39)
    from packaging.specifiers import SpecifierSet

MAX_REQUIREMENTS = 64
MAX_REQUIREMENT_CHARS = 200
MAX_BLOCK_CHARS = 16 * 1024

# The reference regular expression of PEP 723 (one `# /// TYPE` ... `# ///` block per type).
_BLOCK = re.compile(r"(?m)^# /// (?P<type>[a-zA-Z0-9-]+)$\s(?P<content>(^#(| .*)$\s)+)^# ///$")
_SCRIPT_KEYS = frozenset({"dependencies", "requires-python", "tool"})


class NormalRequirement(BaseModel):
    """One distribution in normal form."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="PEP 503 normalised name")
    extras: tuple[str, ...] = ()
    specifier: str = Field("", description="PEP 440 specifier set, e.g. '<3,>=2.8'; empty = any version")

    def __str__(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        return f"{self.name}{extras}{self.specifier}"


class Manifest(BaseModel):
    """The normalised manifest of one program (what an artifact stores, what an environment is built for)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requirements: tuple[NormalRequirement, ...] = ()
    requires_python: str | None = Field(None, description="PEP 723 `requires-python`, normalised")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(req.name for req in self.requirements)

    def lines(self) -> list[str]:
        """The requirements as strings (what ``uv pip compile`` reads, one a line)."""
        return [str(req) for req in self.requirements]

    def __bool__(self) -> bool:
        return bool(self.requirements)


def script_metadata(source: str) -> dict[str, object] | None:
    """The TOML table of the program's ``# /// script`` block, or None when it has none."""
    blocks = [m for m in _BLOCK.finditer(source) if m["type"] == "script"]
    if not blocks:
        if re.search(r"(?m)^# /// script\s*$", source):
            raise InvalidDependencyManifest(
                "the `# /// script` block is not closed by a `# ///` line (every line in it starts with `#`)"
            )
        return None
    if len(blocks) > 1:
        raise InvalidDependencyManifest("the program has more than one `# /// script` block; keep one")
    content = blocks[0]["content"]
    if len(content) > MAX_BLOCK_CHARS:
        raise InvalidDependencyManifest(f"the `# /// script` block is longer than {MAX_BLOCK_CHARS} characters")
    text = "".join(line[2:] if line.startswith("# ") else line[1:] for line in content.splitlines(keepends=True))
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidDependencyManifest(f"the `# /// script` block is not valid TOML: {exc}") from None
    unknown = sorted(set(table) - _SCRIPT_KEYS)
    if unknown:
        raise InvalidDependencyManifest(
            f"the `# /// script` block has unknown key(s) {', '.join(unknown)}; "
            "PEP 723 defines `dependencies`, `requires-python` and `[tool]`"
        )
    return table


def manifest_of(source: str, structured: Iterable[str] = ()) -> Manifest:
    """The normalised manifest of a program: its PEP 723 block and the provider's structured list together."""
    table = script_metadata(source) or {}
    declared = table.get("dependencies", [])
    if not isinstance(declared, list) or not all(isinstance(item, str) for item in declared):
        raise InvalidDependencyManifest("`dependencies` in the `# /// script` block must be a list of strings")
    requires_python = table.get("requires-python")
    if requires_python is not None and not isinstance(requires_python, str):
        raise InvalidDependencyManifest("`requires-python` must be a string such as '>=3.11'")
    return normalise([*declared, *structured], requires_python=requires_python)


def normalise(requirements: Iterable[str], *, requires_python: str | None = None) -> Manifest:
    """Parse, check and merge requirement strings into a `Manifest`."""
    merged: dict[str, NormalRequirement] = {}
    for count, raw in enumerate(requirements, start=1):
        if count > MAX_REQUIREMENTS:
            raise InvalidDependencyManifest(f"more than {MAX_REQUIREMENTS} dependencies declared")
        req = _parse(raw)
        previous = merged.get(req.name)
        merged[req.name] = req if previous is None else _merge(previous, req)
    python = None
    if requires_python is not None:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            python = str(SpecifierSet(requires_python))
        except InvalidSpecifier:
            raise InvalidDependencyManifest(f"requires-python {requires_python!r} is not a PEP 440 specifier") from None
    return Manifest(requirements=tuple(merged[name] for name in sorted(merged)), requires_python=python)


def _parse(raw: str) -> NormalRequirement:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    if not isinstance(raw, str):
        raise InvalidDependencyManifest("every dependency must be a string such as 'python-dateutil>=2.8'")
    text = raw.strip()
    if not text or len(text) > MAX_REQUIREMENT_CHARS:
        raise InvalidDependencyManifest(
            f"dependency {raw[:60]!r} is empty or longer than {MAX_REQUIREMENT_CHARS} characters"
        )
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        first = str(exc).splitlines()[0]
        raise InvalidDependencyManifest(f"dependency {text!r} is not a valid requirement: {first}") from None
    if req.url is not None:
        raise InvalidDependencyManifest(
            f"dependency {text!r} names a URL or path; declare a distribution name and version from the index"
        )
    if req.marker is not None:
        raise InvalidDependencyManifest(
            f"dependency {text!r} has an environment marker; environments are built for the sandbox's one "
            "interpreter, so declare it without `; ...`"
        )
    extras = tuple(sorted({str(canonicalize_name(extra)) for extra in req.extras}))
    return NormalRequirement(name=str(canonicalize_name(req.name)), extras=extras, specifier=str(req.specifier))


def _merge(first: NormalRequirement, second: NormalRequirement) -> NormalRequirement:
    from packaging.specifiers import SpecifierSet

    combined = SpecifierSet(first.specifier) & SpecifierSet(second.specifier)
    if not satisfiable(combined):
        raise InvalidDependencyManifest(
            f"dependency {first.name!r} is declared twice with conflicting versions: "
            f"{first.specifier or 'any'} and {second.specifier or 'any'}"
        )
    extras = tuple(sorted({*first.extras, *second.extras}))
    return NormalRequirement(name=first.name, extras=extras, specifier=str(combined))


def satisfiable(specifier: SpecifierSet) -> bool:
    """Whether some version can satisfy ``specifier``: tried on the versions it names, just past each, and
    the extremes. Conservative only for bounds closer than ``0.0.1`` apart (then the resolver decides)."""
    from packaging.version import InvalidVersion, Version

    candidates: list[Version] = [Version("0"), Version("999999")]
    for spec in specifier:
        try:
            version = Version(spec.version.rstrip(".*"))
        except InvalidVersion:
            return True  # an arbitrary-equality (===) string: let the resolver judge it
        candidates.append(version)
        release = ".".join(str(part) for part in version.release)
        candidates.append(Version(f"{release}.0.0.1"))
    return any(specifier.contains(candidate, prereleases=True) for candidate in candidates)
