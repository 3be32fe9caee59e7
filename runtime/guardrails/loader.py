"""Loading policies: YAML files with line numbers kept, layered in order, compiled once.

A *layer* is a directory (or a single file). Its ``*.yaml``/``*.yml`` files, searched recursively and
sorted by relative path, apply one after another, and layers apply in the order given. Every problem is a
`ConfigError` naming the file, the line and what is wrong; no traceback ever reaches the user.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.resources
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from sandforge.runtime.egress.config import EgressPolicy, EgressSection
from sandforge.runtime.environments.policy import DependenciesSection, DependencyPolicy
from sandforge.runtime.errors import ConfigError, InputFileError
from sandforge.runtime.files.read import read_user_file
from sandforge.runtime.files.yamltext import YamlPath
from sandforge.runtime.files.yamltext import compose_with_lines as _compose
from sandforge.runtime.guardrails import policy_model as pm
from sandforge.runtime.guardrails.matchers import Matcher, MatcherError, compile_matcher
from sandforge.runtime.guardrails.policy import (
    CapabilityDefinition,
    Origin,
    Policy,
    PolicySource,
    Rule,
    Template,
    fingerprint,
)

MAX_POLICY_FILE_BYTES = 4 * 1024 * 1024
MAX_LAYER_DEPTH = 8


def default_policy_dir() -> Traversable:
    """The shipped default policy, as package data (``policies/default``)."""
    return importlib.resources.files("sandforge.policies") / "default"


@functools.cache
def default_policy() -> Policy:
    """The shipped default policy, loaded once per process."""
    return load_policy([default_policy_dir()])


def layered_policy(layers: Sequence[PolicySource], *, include_default: bool = True) -> Policy:
    """`layers` over the default policy (or alone, with ``include_default=False``)."""
    if include_default and not layers:
        return default_policy()
    return load_policy([default_policy_dir(), *layers] if include_default else list(layers))


def load_policy(layers: Sequence[PolicySource]) -> Policy:
    """Load and merge policy layers; later layers add, override and disable rules of earlier ones, and
    grant or deny capabilities. Raises `ConfigError` for any malformed file."""
    if not layers:
        raise ConfigError("no policy layers given", hint="pass at least one policy directory")
    builder = _Builder()
    for layer in layers:
        builder.sources.append(layer)
        for display, source in _policy_files(layer):
            builder.apply(_read(display, source))
    return builder.build()


# --------------------------------------------------------------------------------------------- files


@dataclass
class _File:
    name: str
    data: pm.PolicyFile
    lines: dict[YamlPath, int]
    directory: Path | None = None  # where relative paths in the file (egress.ca_file) start

    def origin(self, path: YamlPath) -> Origin:
        return Origin(self.name, _line_of(self.lines, path))


def _policy_files(layer: PolicySource) -> list[tuple[str, Traversable]]:
    if layer.is_file():
        return [(str(layer), layer)]
    if not layer.is_dir():
        if isinstance(layer, Path) and (layer.exists() or layer.is_symlink()):
            raise ConfigError(f"policy {layer} is neither a regular file nor a directory")
        raise ConfigError(f"policy directory {layer} does not exist")
    found = _yaml_files_below(layer)
    if not found:
        raise ConfigError(f"policy directory {layer} has no .yaml files")
    return [(display, entry) for _, display, entry in sorted(found, key=lambda item: item[0])]


def _yaml_files_below(layer: Traversable) -> list[tuple[str, str, Traversable]]:
    """Every ``.yaml``/``.yml`` file below ``layer`` (hidden entries skipped, MAX_LAYER_DEPTH folders deep):
    (path relative to the layer, display name, the file)."""
    found: list[tuple[str, str, Traversable]] = []
    stack: list[tuple[Traversable, str, int]] = [(layer, "", 0)]
    while stack:
        directory, relative, depth = stack.pop()
        for entry in directory.iterdir():
            name = entry.name
            if name.startswith(".") or name == "__pycache__":
                continue
            if entry.is_dir():
                if depth < MAX_LAYER_DEPTH:
                    stack.append((entry, f"{relative}{name}/", depth + 1))
            elif name.endswith((".yaml", ".yml")):
                found.append((relative + name, str(entry), entry))
    return found


def _read(name: str, source: Traversable) -> _File:
    try:  # a file on disk is read bounded, and only if regular (a FIFO or /dev/zero named *.yaml is refused)
        raw = (
            read_user_file(source, limit=MAX_POLICY_FILE_BYTES, what="policy file")
            if isinstance(source, Path)
            else source.read_bytes()
        )
    except InputFileError as exc:
        raise ConfigError(exc.message) from None
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read policy file: {exc.strerror or exc}") from None
    if len(raw) > MAX_POLICY_FILE_BYTES:
        raise ConfigError(f"{name}: policy file is larger than {MAX_POLICY_FILE_BYTES} bytes")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{name}:{line}: policy file is not valid UTF-8") from None
    data, lines = _compose(name, text)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{name}:1: a policy file must be a mapping of sections, not a {type(data).__name__}")
    try:
        parsed = pm.PolicyFile.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(name, lines, data, exc, ()) from None
    return _File(name, parsed, lines, source.parent if isinstance(source, Path) else None)


def _line_of(lines: dict[YamlPath, int], path: YamlPath) -> int:
    for end in range(len(path), -1, -1):
        line = lines.get(path[:end])
        if line is not None:
            return line
    return 1


def _display(path: YamlPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _data_path(data: Any, loc: Sequence[str | int]) -> YamlPath:
    """Map a pydantic error location onto the data, dropping union tags that are not keys."""
    path: list[str | int] = []
    current = data
    for index, part in enumerate(loc):
        present = (isinstance(current, dict) and part in current) or (
            isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current)
        )
        if present:
            current = current[part]
            path.append(part)
        elif index == len(loc) - 1:
            path.append(part)
    return tuple(path)


def _validation_error(
    name: str, lines: dict[YamlPath, int], data: Any, exc: ValidationError, base: YamlPath
) -> ConfigError:
    errors = exc.errors()
    first = errors[0]
    loc = list(first["loc"])
    if first["type"] == "union_tag_invalid":
        loc.append("kind")  # point at the bad `kind:` line rather than the matcher's first line
    path = (*base, *_data_path(data, loc))
    where = _display(path)
    message = first["msg"]
    if first["type"] == "union_tag_invalid":
        message = f"unknown kind {first['input'].get('kind')!r}" if isinstance(first["input"], dict) else message
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return ConfigError(f"{name}:{_line_of(lines, path)}: {where + ': ' if where else ''}{message}{more}")


# ------------------------------------------------------------------------------------------ layering


Site = tuple[_File, YamlPath]


@dataclass
class _RuleState:
    spec: pm.RuleSpec
    origin: Origin
    sites: dict[str, Site]
    changed_at: list[Origin] = field(default_factory=list)


@dataclass
class _CapabilityState:
    description: str
    matchers: list[tuple[pm.CapabilityMatcher, Site]]
    tagged: list[str]
    untagged: list[str]
    origin: Origin


class _Builder:
    """Applies files in order, then compiles the result."""

    def __init__(self) -> None:
        self.sources: list[PolicySource] = []
        self.rules: dict[str, _RuleState] = {}
        self.capabilities: dict[str, _CapabilityState] = {}
        self.granted: set[str] = set()
        self.grant_sites: list[tuple[str, Origin]] = []
        self.limits: dict[str, int] = {}
        self.egress = EgressPolicy()
        self.dependencies = DependencyPolicy()
        self.name = "policy"
        self.description = ""

    def apply(self, file: _File) -> None:
        data = file.data
        if data.policy is not None:
            self.name = data.policy.name or self.name
            self.description = data.policy.description or self.description
        for tag, spec in data.capabilities.items():
            self._capability(file, tag, spec)
        for index, rule in enumerate(data.rules):
            self._rule(file, index, rule)
        for rule_id, change in data.override.items():
            self._override(file, rule_id, change)
        for index, rule_id in enumerate(data.disable):
            state = self._existing(file, rule_id, ("disable", index), "disable")
            state.spec = state.spec.model_copy(update={"enabled": False})
            state.changed_at.append(file.origin(("disable", index)))
        for section, tags in (("grant", data.grant), ("deny", data.deny)):
            for index, tag in enumerate(tags):
                self.grant_sites.append((tag, file.origin((section, index))))
                (self.granted.add if section == "grant" else self.granted.discard)(tag)
        if data.limits is not None:
            self.limits.update(data.limits.model_dump(exclude_none=True))
        if data.egress is not None:
            self._egress(file, data.egress)
        self._dependencies(file, data.dependencies)

    def _egress(self, file: _File, section: EgressSection) -> None:
        ca_file = section.ca_file
        if ca_file is not None and not Path(ca_file).is_absolute():
            if file.directory is None:
                raise ConfigError(f"{file.origin(('egress', 'ca_file'))}: egress.ca_file must be an absolute path here")
            ca_file = str(file.directory / ca_file)
        self.egress = self.egress.merge(section, ca_file=ca_file)

    def _dependencies(self, file: _File, section: DependenciesSection | None) -> None:
        if section is None:
            return
        wheelhouse = section.wheelhouse
        if wheelhouse is not None and not Path(wheelhouse).expanduser().is_absolute():
            if file.directory is None:
                where = file.origin(("dependencies", "wheelhouse"))
                raise ConfigError(f"{where}: dependencies.wheelhouse must be an absolute path here")
            wheelhouse = str(file.directory / wheelhouse)
        elif wheelhouse is not None:
            wheelhouse = str(Path(wheelhouse).expanduser())
        self.dependencies = self.dependencies.merge(section, wheelhouse=wheelhouse)

    def _capability(self, file: _File, tag: str, spec: pm.CapabilitySpec) -> None:
        base: YamlPath = ("capabilities", tag)
        state = self.capabilities.get(tag)
        if state is None:
            state = self.capabilities[tag] = _CapabilityState(spec.description or tag, [], [], [], file.origin(base))
        elif spec.description:
            state.description = spec.description
        state.matchers += [(m, (file, (*base, "match", i))) for i, m in enumerate(spec.match)]
        if spec.examples is not None:
            state.tagged += spec.examples.tagged
            state.untagged += spec.examples.untagged

    def _rule(self, file: _File, index: int, spec: pm.RuleSpec) -> None:
        base: YamlPath = ("rules", index)
        if spec.id in self.rules:
            raise ConfigError(
                f"{file.name}:{_line_of(file.lines, (*base, 'id'))}: rule {spec.id!r} is already defined at "
                f"{self.rules[spec.id].origin}",
                hint="change an existing rule with an `override:` entry",
            )
        sites: dict[str, Site] = {name: (file, (*base, name)) for name in pm.RuleSpec.model_fields}
        self.rules[spec.id] = _RuleState(spec, file.origin(base), sites)

    def _override(self, file: _File, rule_id: str, change: pm.RuleOverride) -> None:
        base: YamlPath = ("override", rule_id)
        state = self._existing(file, rule_id, base, "override")
        update = {name: getattr(change, name) for name in change.model_fields_set}
        state.spec = state.spec.model_copy(update=update)
        state.sites.update({name: (file, (*base, name)) for name in update})
        state.changed_at.append(file.origin(base))

    def _existing(self, file: _File, rule_id: str, path: YamlPath, action: str) -> _RuleState:
        state = self.rules.get(rule_id)
        if state is None:
            close = difflib.get_close_matches(rule_id, list(self.rules), n=1)
            raise ConfigError(
                f"{file.name}:{_line_of(file.lines, path)}: cannot {action} unknown rule {rule_id!r}",
                hint=f"did you mean {close[0]!r}?" if close else None,
            )
        return state

    def build(self) -> Policy:
        for tag, origin in self.grant_sites:
            if tag not in self.capabilities:
                raise ConfigError(f"{origin}: unknown capability {tag!r} (no layer defines it)")
        capabilities = {tag: self._compile_capability(tag, state) for tag, state in self.capabilities.items()}
        rules = tuple(self._compile_rule(state) for state in self.rules.values())
        try:
            limits = pm.Limits.model_validate(self.limits)
        except ValidationError as exc:  # pragma: no cover - each field is validated per file already
            raise ConfigError(f"limits: {exc.errors()[0]['msg']}") from None
        policy = Policy(
            name=self.name,
            description=self.description,
            sources=tuple(self.sources),
            rules=rules,
            capabilities=capabilities,
            granted=frozenset(self.granted),
            limits=limits,
            egress=self.egress,
            dependencies=self.dependencies,
        )
        return dataclasses.replace(policy, fingerprint=fingerprint(policy))

    def _compile_capability(self, tag: str, state: _CapabilityState) -> CapabilityDefinition:
        matchers = tuple(_compile(spec, site) for spec, site in state.matchers)
        return CapabilityDefinition(
            tag=tag,
            description=state.description,
            matchers=matchers,
            specs=tuple(spec for spec, _ in state.matchers),
            tagged=tuple(state.tagged),
            untagged=tuple(state.untagged),
            origin=state.origin,
        )

    def _compile_rule(self, state: _RuleState) -> Rule:
        spec = state.spec
        matcher = _compile(spec.match, state.sites["match"])
        templates: list[Template] = []
        for name in ("message", "required_correction"):
            try:
                templates.append(Template.parse(getattr(spec, name), matcher.template_fields()))
            except ValueError as exc:
                file, path = state.sites[name]
                raise ConfigError(f"{file.origin(path)}: rule {spec.id!r}: {name}: {exc}") from None
        return Rule(spec, matcher, templates[0], templates[1], state.origin, tuple(state.changed_at))


def _compile(spec: BaseModel, site: Site) -> Matcher:
    try:
        return compile_matcher(spec)
    except MatcherError as exc:
        file, path = site
        raise ConfigError(f"{file.origin((*path, *exc.path))}: {_display((*path, *exc.path))}: {exc}") from None
