"""Loading policies: YAML files with line numbers kept, layered in order, compiled once.

A *layer* is a directory (or a single file). Its ``*.yaml``/``*.yml`` files, searched recursively and
sorted by relative path, apply one after another, and layers apply in the order given. Every problem of every
file is collected (file, line, key path, message, hint; a broken rule or section is left out and the rest still
checked) and raised together as one `PolicyError` (a `ConfigError`); no traceback ever reaches the user.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.resources
from collections.abc import Iterable, Sequence
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
from sandforge.runtime.guardrails.problems import PolicyError, Problem, from_config_error

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
    grant or deny capabilities. Raises `PolicyError` (a `ConfigError`) listing every problem of every file."""
    if not layers:
        raise ConfigError("no policy layers given", hint="pass at least one policy directory")
    builder = _Builder()
    for layer in layers:
        builder.begin_layer(layer)
        try:
            files = _policy_files(layer)
        except ConfigError as exc:
            builder.order += 1
            builder.problems.append(Problem("", 1, "", exc.message, exc.hint, builder.order))
            files = []
        for display, source in files:
            builder.order += 1
            try:
                file = _read(display, source, builder.problems, builder.order)
            except ConfigError as exc:  # unreadable or not YAML: nothing in it can be checked
                builder.problems.append(from_config_error(exc, display, builder.order))
                continue
            file.layer = builder.layer
            builder.apply(file)
        builder.end_layer()
    return builder.build()


# --------------------------------------------------------------------------------------------- files


@dataclass
class _File:
    name: str
    data: pm.PolicyFile
    lines: dict[YamlPath, int]
    directory: Path | None = None  # where relative paths in the file (egress.ca_file) start
    order: int = 0
    layer: int = 0
    broken_rules: frozenset[str] = frozenset()  # ids of rules left out for their problems
    broken_tags: frozenset[str] = frozenset()
    kept: dict[str, list[int]] = field(default_factory=dict)  # list sections: original index of each kept item

    def index(self, section: str, position: int) -> int:
        """The index in the file of the ``position``-th item kept of a list section (items with problems are
        left out of the model, so positions and the file's indexes differ after one)."""
        kept = self.kept.get(section)
        return kept[position] if kept is not None and position < len(kept) else position

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


def _read(name: str, source: Traversable, problems: list[Problem], order: int) -> _File:
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
    parsed, broken, kept = _validate_file(name, lines, data, problems, order)
    file = _File(name, parsed, lines, source.parent if isinstance(source, Path) else None, order)
    file.broken_rules, file.broken_tags = broken
    file.kept = kept
    return file


def _validate_file(
    name: str, lines: dict[YamlPath, int], data: dict[str, Any], problems: list[Problem], order: int
) -> tuple[pm.PolicyFile, tuple[frozenset[str], frozenset[str]], dict[str, list[int]]]:
    """The file's model, every schema problem recorded; what fails is left out (a rule, a capability, an entry
    of a section, else the section) so the rest of the file is still checked and applied."""
    try:
        return pm.PolicyFile.model_validate(data), (frozenset(), frozenset()), {}
    except ValidationError as exc:
        errors = exc.errors()
    problems.extend(_problems(name, lines, data, errors, order))
    pruned = {key: (list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else value)
              for key, value in data.items()}  # fmt: skip
    rules: set[str] = set()
    tags: set[str] = set()
    for error in errors:
        loc = error["loc"]
        section = str(loc[0]) if loc else ""
        value = pruned.get(section)
        if len(loc) >= 2 and isinstance(value, list) and isinstance(loc[1], int) and loc[1] < len(data[section]):
            item = data[section][loc[1]]
            if section == "rules" and isinstance(item, dict) and isinstance(item.get("id"), str):
                rules.add(item["id"])
            value[loc[1]] = _DROPPED
        elif len(loc) >= 2 and isinstance(value, dict) and loc[1] in value:
            (tags if section == "capabilities" else rules).add(str(loc[1]))
            del value[loc[1]]
        else:
            pruned.pop(section, None)
    kept = {
        k: [i for i, item in enumerate(v) if item is not _DROPPED] for k, v in pruned.items() if isinstance(v, list)
    }
    pruned = {k: [i for i in v if i is not _DROPPED] if isinstance(v, list) else v for k, v in pruned.items()}
    try:
        parsed = pm.PolicyFile.model_validate(pruned)
    except ValidationError:  # pragma: no cover - what failed was left out; fail closed anyway
        parsed = pm.PolicyFile()
    return parsed, (frozenset(rules), frozenset(tags)), kept


_DROPPED = object()


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


def _problems(name: str, lines: dict[YamlPath, int], data: Any, errors: list[Any], order: int) -> list[Problem]:
    """One problem per error, except that the fields missing from one mapping are one problem."""
    out: list[Problem] = []
    missing: dict[YamlPath, list[Any]] = {}
    for error in errors:
        path = _data_path(data, list(error["loc"]))
        if error["type"] == "missing" and path:
            missing.setdefault(path[:-1], []).append(error)
        else:
            out.append(_problem(name, lines, data, error, order))
    for where, alike in missing.items():
        if len(alike) == 1:
            out.append(_problem(name, lines, data, alike[0], order))
            continue
        fields = [str(_data_path(data, list(error["loc"]))[-1]) for error in alike]
        hint = pm.hint_for({"type": "missing"}, (*where, fields[0]), data)
        message = f"missing required fields: {', '.join(fields)}"
        out.append(Problem(name, _line_of(lines, where), _display(where), message, hint, order))
    return out


def _problem(name: str, lines: dict[YamlPath, int], data: Any, error: Any, order: int) -> Problem:
    """One pydantic error as a `Problem` at the line of the key it is about, with a hint where one helps."""
    loc = list(error["loc"])
    if error["type"] == "union_tag_invalid":
        loc.append("kind")  # point at the bad `kind:` line rather than the matcher's first line
    path = _data_path(data, loc)
    message = error["msg"]
    if error["type"] == "union_tag_invalid" and isinstance(error["input"], dict):
        message = f"unknown kind {error['input'].get('kind')!r}"
    return Problem(name, _line_of(lines, path), _display(path), message, pm.hint_for(error, path, data), order)


# ------------------------------------------------------------------------------------------ layering


Site = tuple[_File, YamlPath]


@dataclass
class _RuleState:
    spec: pm.RuleSpec
    origin: Origin
    sites: dict[str, Site]
    layer: int
    changed_at: list[Origin] = field(default_factory=list)
    changed_layers: list[int] = field(default_factory=list)
    examples_layer: int = 0


@dataclass
class _CapabilityState:
    description: str
    matchers: list[tuple[pm.CapabilityMatcher, Site]]
    tagged: list[tuple[str, int]]
    untagged: list[tuple[str, int]]
    origin: Origin
    layer: int


class _Builder:
    """Applies files in order, then compiles the result; every problem is collected, none stops the load."""

    def __init__(self) -> None:
        self.sources: list[PolicySource] = []
        self.rules: dict[str, _RuleState] = {}
        self.capabilities: dict[str, _CapabilityState] = {}
        self.granted: set[str] = set()
        self.grant_sites: list[tuple[str, Origin, str, int]] = []  # (tag, where, key path, file order)
        self.grant_origins: dict[str, Origin] = {}
        self.limits: dict[str, int] = {}
        self.egress = EgressPolicy()
        self.dependencies = DependencyPolicy()
        self.name = "policy"
        self.description = ""
        self.problems: list[Problem] = []
        self.broken_rules: set[str] = set()
        self.broken_tags: set[str] = set()
        self.order = 0
        self.layer = -1
        self.layer_labels: list[str] = []
        self.layer_grants: list[frozenset[str]] = []
        self.section_examples: list[Any] = []
        self.layer_sections: list[dict[str, Any]] = []
        self._layer_name: str | None = None

    def begin_layer(self, source: PolicySource) -> None:
        self.sources.append(source)
        self.layer += 1
        self._layer_name = None

    def end_layer(self) -> None:
        self.layer_labels.append(self._layer_name or str(self.sources[-1]))
        self.layer_grants.append(frozenset(self.granted))
        self.layer_sections.append({"egress": self.egress, "dependencies": self.dependencies})

    def problem(self, file: _File, path: YamlPath, message: str, hint: str | None = None) -> None:
        self.problems.append(Problem(file.name, _line_of(file.lines, path), _display(path), message, hint, file.order))

    def apply(self, file: _File) -> None:
        data = file.data
        self.broken_rules |= file.broken_rules
        self.broken_tags |= file.broken_tags
        if data.policy is not None:
            self.name = data.policy.name or self.name
            self._layer_name = data.policy.name or self._layer_name
            self.description = data.policy.description or self.description
        for tag, spec in data.capabilities.items():
            self._capability(file, tag, spec)
        for index, rule in enumerate(data.rules):
            self._rule(file, file.index("rules", index), rule)
        for rule_id, change in data.override.items():
            self._override(file, rule_id, change)
        for index, rule_id in enumerate(data.disable):
            self._disable(file, file.index("disable", index), rule_id)
        self._grants(file)
        if data.limits is not None:
            self.limits.update(data.limits.model_dump(exclude_none=True))
        if data.egress is not None:
            self._egress(file, data.egress)
        self._dependencies(file, data.dependencies)

    def _disable(self, file: _File, index: int, rule_id: str) -> None:
        state = self._existing(file, rule_id, ("disable", index), "disable")
        if state is not None:
            state.spec = state.spec.model_copy(update={"enabled": False})
            state.changed_at.append(file.origin(("disable", index)))
            state.changed_layers.append(self.layer)

    def _grants(self, file: _File) -> None:
        for section, tags in (("grant", file.data.grant), ("deny", file.data.deny)):
            for index, tag in enumerate(tags):
                origin = file.origin((section, file.index(section, index)))
                self.grant_sites.append((tag, origin, f"{section}[{file.index(section, index)}]", file.order))
                self.grant_origins[tag] = origin
                (self.granted.add if section == "grant" else self.granted.discard)(tag)

    def _section_examples(self, file: _File, name: str, section: Any) -> None:
        from sandforge.runtime.guardrails.sections import collect_examples

        self.section_examples.extend(collect_examples(name, section, file.origin((name, "examples")), self.layer))

    def _egress(self, file: _File, section: EgressSection) -> None:
        self._section_examples(file, "egress", section)
        ca_file = section.ca_file
        if ca_file is not None and not Path(ca_file).is_absolute():
            if file.directory is None:
                self.problem(file, ("egress", "ca_file"), "egress.ca_file must be an absolute path here")
                ca_file = None
            else:
                ca_file = str(file.directory / ca_file)
        self.egress = self.egress.merge(section, ca_file=ca_file)

    def _dependencies(self, file: _File, section: DependenciesSection | None) -> None:
        if section is None:
            return
        self._section_examples(file, "dependencies", section)
        wheelhouse = section.wheelhouse
        if wheelhouse is not None and not Path(wheelhouse).expanduser().is_absolute():
            if file.directory is None:
                self.problem(
                    file, ("dependencies", "wheelhouse"), "dependencies.wheelhouse must be an absolute path here"
                )
                wheelhouse = None
            else:
                wheelhouse = str(file.directory / wheelhouse)
        elif wheelhouse is not None:
            wheelhouse = str(Path(wheelhouse).expanduser())
        self.dependencies = self.dependencies.merge(section, wheelhouse=wheelhouse)

    def _capability(self, file: _File, tag: str, spec: pm.CapabilitySpec) -> None:
        base: YamlPath = ("capabilities", tag)
        state = self.capabilities.get(tag)
        if state is None:
            state = _CapabilityState(spec.description or tag, [], [], [], file.origin(base), self.layer)
            self.capabilities[tag] = state
        elif spec.description:
            state.description = spec.description
        state.matchers += [(m, (file, (*base, "match", i))) for i, m in enumerate(spec.match)]
        if spec.examples is not None:
            state.tagged += [(source, self.layer) for source in spec.examples.tagged]
            state.untagged += [(source, self.layer) for source in spec.examples.untagged]

    def _rule(self, file: _File, index: int, spec: pm.RuleSpec) -> None:
        base: YamlPath = ("rules", index)
        if spec.id in self.rules:
            where = self.rules[spec.id].origin
            hint = "change an existing rule with an `override:` entry"
            self.problem(file, (*base, "id"), f"rule {spec.id!r} is already defined at {where}", hint)
            return
        sites: dict[str, Site] = {name: (file, (*base, name)) for name in pm.RuleSpec.model_fields}
        self.rules[spec.id] = _RuleState(spec, file.origin(base), sites, self.layer, examples_layer=self.layer)

    def _override(self, file: _File, rule_id: str, change: pm.RuleOverride) -> None:
        base: YamlPath = ("override", rule_id)
        state = self._existing(file, rule_id, base, "override")
        if state is None:
            return
        update = {name: getattr(change, name) for name in change.model_fields_set}
        state.spec = state.spec.model_copy(update=update)
        state.sites.update({name: (file, (*base, name)) for name in update})
        state.changed_at.append(file.origin(base))
        state.changed_layers.append(self.layer)
        if "examples" in update:
            state.examples_layer = self.layer

    def _existing(self, file: _File, rule_id: str, path: YamlPath, action: str) -> _RuleState | None:
        state = self.rules.get(rule_id)
        if state is None and rule_id not in self.broken_rules:  # a rule left out for its problems is not unknown
            close = difflib.get_close_matches(rule_id, list(self.rules), n=1)
            hint = f"did you mean {close[0]!r}?" if close else None
            self.problem(file, path, f"cannot {action} unknown rule {rule_id!r}", hint)
        return state

    def build(self) -> Policy:
        for tag, origin, path, order in self.grant_sites:
            if tag not in self.capabilities and tag not in self.broken_tags:
                what = f"unknown capability {tag!r} (no layer defines it)"
                hint = _close(tag, self.capabilities)
                self.problems.append(Problem(origin.file, origin.line, path, what, hint, order))
        capabilities = {tag: self._compile_capability(tag, state) for tag, state in self.capabilities.items()}
        compiled = [self._compile_rule(state) for state in self.rules.values()]
        if self.problems:
            raise PolicyError(self.problems)
        try:
            limits = pm.Limits.model_validate(self.limits)
        except ValidationError as exc:  # pragma: no cover - each field is validated per file already
            raise ConfigError(f"limits: {exc.errors()[0]['msg']}") from None
        policy = Policy(
            name=self.name,
            description=self.description,
            sources=tuple(self.sources),
            rules=tuple(rule for rule in compiled if rule is not None),
            capabilities=capabilities,
            granted=frozenset(self.granted),
            limits=limits,
            egress=self.egress,
            dependencies=self.dependencies,
            layer_labels=tuple(self.layer_labels),
            layer_grants=tuple(self.layer_grants),
            grant_origins=dict(self.grant_origins),
            section_examples=tuple(self.section_examples),
            layer_sections=tuple(self.layer_sections),
        )
        return dataclasses.replace(policy, fingerprint=fingerprint(policy))

    def _compile_capability(self, tag: str, state: _CapabilityState) -> CapabilityDefinition:
        matchers = [self._compile(spec, site) for spec, site in state.matchers]
        return CapabilityDefinition(
            tag=tag,
            description=state.description,
            matchers=tuple(m for m in matchers if m is not None),
            specs=tuple(spec for spec, _ in state.matchers),
            tagged=tuple(source for source, _ in state.tagged),
            untagged=tuple(source for source, _ in state.untagged),
            origin=state.origin,
            tagged_layers=tuple(layer for _, layer in state.tagged),
            untagged_layers=tuple(layer for _, layer in state.untagged),
            layer=state.layer,
            matcher_layers=tuple(file.layer for _, (file, _path) in state.matchers),
        )

    def _compile_rule(self, state: _RuleState) -> Rule | None:
        spec = state.spec
        matcher = self._compile(spec.match, state.sites["match"])
        fields = matcher.template_fields() if matcher is not None else None
        templates: list[Template] = []
        for name in ("message", "required_correction"):
            try:
                templates.append(Template.parse(getattr(spec, name), fields or frozenset({"construct"})))
            except ValueError as exc:
                if fields is not None:  # without a matcher the fields are unknown: its problem is reported
                    file, path = state.sites[name]
                    self.problem(file, path, f"rule {spec.id!r}: {exc}")
        if matcher is None or len(templates) < 2:
            return None
        return Rule(
            spec,
            matcher,
            templates[0],
            templates[1],
            state.origin,
            tuple(state.changed_at),
            layer=state.layer,
            examples_layer=state.examples_layer,
            changed_layers=tuple(state.changed_layers),
        )

    def _compile(self, spec: BaseModel, site: Site) -> Matcher | None:
        try:
            return compile_matcher(spec)
        except MatcherError as exc:
            file, path = site
            self.problem(file, (*path, *exc.path), str(exc))
            return None


def _close(name: str, known: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {close[0]!r}?" if close else None
