"""The effective policy: every layer merged, every matcher compiled, and a fingerprint over the result."""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from sandforge.runtime.egress.config import EgressPolicy
from sandforge.runtime.environments.policy import DependencyPolicy
from sandforge.runtime.guardrails import policy_model as pm
from sandforge.runtime.guardrails.matchers import Matcher

#: Where a policy layer comes from: a directory or file path, or package data (``importlib.resources``).
PolicySource = Path | Traversable

#: Bumped whenever the engine's semantics change, so verdicts cached under an old fingerprint expire.
ENGINE_VERSION = "2"  # 2: literal URLs judged by the egress rules (egress_denied)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where something in a policy was written."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class Template:
    """A message template: literal text and plain ``{field}`` placeholders, nothing else."""

    text: str
    parts: tuple[tuple[str, str | None], ...]

    @classmethod
    def parse(cls, text: str, allowed: frozenset[str]) -> Template:
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise ValueError(f"malformed template {text!r}: {exc}") from None
        parts: list[tuple[str, str | None]] = []
        for literal, name, spec, conversion in parsed:
            if name is not None and (spec or conversion or name not in allowed):
                if name in allowed:
                    raise ValueError(f"placeholder {{{name}}} may not have a conversion or format spec")
                raise ValueError(f"unknown placeholder {{{name}}}; this matcher provides {', '.join(sorted(allowed))}")
            parts.append((literal, name))
        return cls(text, tuple(parts))

    def render(self, values: Mapping[str, str]) -> str:
        return "".join(literal + (values.get(name, "") if name else "") for literal, name in self.parts)


@dataclass(frozen=True)
class Rule:
    """A compiled rule. `origin` is where it was defined; `changed_at` where layers overrode it."""

    spec: pm.RuleSpec
    matcher: Matcher
    message: Template
    correction: Template
    origin: Origin
    changed_at: tuple[Origin, ...] = ()
    layer: int = 0
    """The index of the layer that defined it (``Policy.layer_labels``)."""
    examples_layer: int = 0
    """The layer its examples were written in: where it was defined, or the last override of ``examples``."""
    changed_layers: tuple[int, ...] = ()

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def classification(self) -> pm.Classification:
        return self.spec.classification

    @property
    def enabled(self) -> bool:
        return self.spec.enabled


@dataclass(frozen=True)
class CapabilityDefinition:
    """A capability tag and the matchers that detect it (merged across layers)."""

    tag: str
    description: str
    matchers: tuple[Matcher, ...]
    specs: tuple[pm.CapabilityMatcher, ...]
    tagged: tuple[str, ...]
    untagged: tuple[str, ...]
    origin: Origin
    tagged_layers: tuple[int, ...] = ()
    """The layer each ``tagged`` example was written in (same order); ``untagged_layers`` likewise."""
    untagged_layers: tuple[int, ...] = ()
    layer: int = 0
    matcher_layers: tuple[int, ...] = ()
    """The layer each matcher was added in (same order as ``matchers`` and ``specs``)."""


@dataclass(frozen=True)
class Policy:
    """An effective, compiled policy. Immutable and safe to share between threads.

    `sources` are the layers it was loaded from (paths or package resources), in order, so a caller can
    layer more on top: ``load_policy([*default_policy().sources, extra_dir])``."""

    name: str
    description: str
    sources: tuple[PolicySource, ...]
    rules: tuple[Rule, ...]
    capabilities: Mapping[str, CapabilityDefinition]
    granted: frozenset[str]
    limits: pm.Limits
    fingerprint: str = field(default="")
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    """What brokered requests may reach, every layer merged. Its allow entries and ranges judge literal URLs at
    validation (``egress_literals.py``), so they join the fingerprint when present."""
    dependencies: DependencyPolicy = field(default_factory=DependencyPolicy)
    """Which distributions programs may declare and where wheels come from, every layer merged
    (``runtime/environments``). Not in the fingerprint: it does not change how a program is validated."""
    layer_labels: tuple[str, ...] = ()
    """One name per layer, for reports: the ``policy.name`` the layer sets, else its path."""
    layer_grants: tuple[frozenset[str], ...] = ()
    """What was granted after each layer: an example written in layer ``i`` assumes ``layer_grants[i]``."""
    grant_origins: Mapping[str, Origin] = field(default_factory=dict)
    """Where each capability was last granted or denied."""
    section_examples: tuple[Any, ...] = ()
    """Examples of the non-rule sections (egress, dependencies), as ``sections.SectionExample``s."""
    layer_sections: tuple[Mapping[str, Any], ...] = ()
    """The sections (``egress``, ``dependencies``) as they stood after each layer: an example written in layer
    ``i`` assumes ``layer_sections[i]``."""

    @property
    def layers(self) -> tuple[str, ...]:
        """The layers' paths, for display."""
        return tuple(str(source) for source in self.sources)

    @property
    def active_rules(self) -> tuple[Rule, ...]:
        return tuple(rule for rule in self.rules if rule.enabled)

    def rule(self, rule_id: str) -> Rule | None:
        return next((rule for rule in self.rules if rule.id == rule_id), None)


def fingerprint(policy: Policy) -> str:
    """sha256 over what can change a verdict or a violation: rules (minus their documentation and
    examples), capability matchers, grants, limits, egress allow entries and ranges, and the engine version.
    File names, layer order and comments do not count, so the same effective policy has the same fingerprint
    everywhere."""
    documentation = {"description", "rationale", "examples"}
    canonical: dict[str, Any] = {
        "engine": ENGINE_VERSION,
        "rules": [rule.spec.model_dump(mode="json", by_alias=True, exclude=documentation) for rule in policy.rules],
        "capabilities": {
            tag: [spec.model_dump(mode="json", by_alias=True) for spec in definition.specs]
            for tag, definition in sorted(policy.capabilities.items())
        },
        "granted": sorted(policy.granted),
        "limits": policy.limits.model_dump(mode="json"),
    }
    if policy.egress.allow or policy.egress.allow_ranges:  # absent, the fingerprint is the one without a section
        canonical["egress"] = {
            "allow": [entry.model_dump(mode="json") for entry in policy.egress.allow],
            "allow_ranges": sorted(policy.egress.allow_ranges),
        }
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()
