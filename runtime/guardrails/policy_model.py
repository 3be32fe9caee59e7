"""The policy file format. These models are the single source of truth: the loader validates files with
them and `policy_json_schema()` publishes them as ``policies/policy.schema.json`` for editors.

A policy is a directory of YAML files; every file has the same shape (`PolicyFile`), every section is
optional, and files and directories layer in order (see ``docs/policies.md``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from sandforge.runtime.egress.config import EgressSection as _EgressSectionBase
from sandforge.runtime.environments.policy import DependenciesSection as _DependenciesSectionBase

Classification = Literal["recoverable", "terminal"]

ID_PATTERN = r"^[a-z][a-z0-9_]{1,63}$"
RuleId = Annotated[str, Field(pattern=ID_PATTERN, description="snake_case identifier")]
Tag = Annotated[str, Field(pattern=ID_PATTERN, description="capability tag, snake_case")]

_MAX_FLATTEN_DEPTH = 8


def _flatten(value: Any) -> Any:
    """Flatten nested lists, so YAML anchors can be combined: ``except: [*allowed, *forbidden]``."""
    if not isinstance(value, list):
        return value
    out: list[Any] = []
    stack: list[tuple[Any, int]] = [(item, 0) for item in reversed(value)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list) and depth < _MAX_FLATTEN_DEPTH:
            stack.extend((inner, depth + 1) for inner in reversed(item))
        else:
            out.append(item)
    return out


_GLOB_ITEM = {"type": "string", "minLength": 1}
Globs = Annotated[
    list[Annotated[str, Field(min_length=1)]],
    BeforeValidator(_flatten),
    WithJsonSchema(
        {
            "type": "array",
            "description": "glob patterns (`*` matches any run of characters, dots included; `?` one "
            "character; `[abc]` a set); nested lists are flattened so YAML anchors can be combined",
            "items": {"anyOf": [_GLOB_ITEM, {"type": "array", "items": _GLOB_ITEM}]},
        }
    ),
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


# ------------------------------------------------------------------------------------------ matchers


class ImportMatch(_Model):
    """Imports of modules: ``import a.b``, ``import a.b as c``, ``from a import b``, and
    ``__import__("a")``/``importlib.import_module("a")`` with literal names. A pattern matches a module or
    any package it is inside (``os`` matches ``import os.path``); ``except`` must match the whole module
    (for ``from a import b``: ``a``, or ``a.b`` for every imported name). Message field: ``{module}``."""

    kind: Literal["import"]
    modules: Globs = Field(min_length=1)
    except_: Globs = Field(default_factory=list, alias="except")
    except_granted: dict[Annotated[str, Field(min_length=1)], Globs] = Field(
        default_factory=dict,
        description="capability tag -> modules exempt (as `except`) when the policy grants that capability "
        "(`http_fetch: [requests]`: the sandbox's broker-backed stand-in is importable then)",
    )


class NameMatch(_Model):
    """References to names, matched by qualified name after alias resolution: ``eval``, ``os.system``
    (also written ``o.system`` after ``import os as o``). Message field: ``{name}``."""

    kind: Literal["name"]
    names: Globs = Field(min_length=1)
    except_: Globs = Field(default_factory=list, alias="except")


class AttributeMatch(_Model):
    """Attribute accesses by attribute name, with or without an attribute node: ``x.__class__``,
    ``getattr(x, "__class__")``, ``"{0.__class__}".format(x)``, ``case object(__class__=c)``.
    Message field: ``{attribute}``."""

    kind: Literal["attribute"]
    names: Globs = Field(min_length=1)
    except_: Globs = Field(default_factory=list, alias="except")
    except_super: Globs = Field(
        default_factory=list,
        description="names exempt when read from a super() call (super().__init__(...) in a subclass)",
    )
    except_then: Globs = Field(
        default_factory=list,
        description="names exempt when what they read is only read for one of these attributes "
        "(__class__ in x.__class__.__name__, which hands out the class's name, not the class)",
    )


class ArgumentCondition(_Model):
    """A condition on one argument of a call, found by position or keyword."""

    position: int | None = Field(None, ge=0, description="0-based positional index")
    keyword: str | None = Field(None, min_length=1)
    values: Globs = Field(min_length=1, description="the argument is a string literal matching one of these")
    missing: str | None = Field(None, description="value to test when the argument is absent (else: no match)")
    match_computed: bool = Field(False, description="whether an argument that is not a literal matches")

    @model_validator(mode="after")
    def _locatable(self) -> ArgumentCondition:
        if self.position is None and self.keyword is None:
            raise ValueError("an argument condition needs `position`, `keyword` or both")
        return self


class CallMatch(_Model):
    """Calls of functions, matched by the callee's qualified name after alias resolution
    (``import os as o; o.system(...)`` calls ``os.system``). Message field: ``{function}``."""

    kind: Literal["call"]
    functions: Globs = Field(min_length=1)
    argument: ArgumentCondition | None = None
    min_args: int | None = Field(None, ge=1, description="at least this many positional arguments")
    unless: ArgumentCondition | None = Field(
        None, description="no match when this argument is a string literal matching its values (the sandbox's "
        "own file area: open('outputs/chart.png', 'wb'))",
    )  # fmt: skip


class DynamicMatch(_Model):
    """Dynamic evaluation: any reference to an evaluator (``eval``, ``exec``, ...; not just calls), and
    calls of attribute-by-name functions whose name argument is not a string literal (``getattr(x, n)``),
    or that are passed around uncalled. Message field: ``{name}``."""

    kind: Literal["dynamic"]
    evaluators: Globs = Field(default_factory=list)
    computed_names: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict, description="function qualified name -> index of its name argument"
    )

    @model_validator(mode="after")
    def _not_empty(self) -> DynamicMatch:
        if not self.evaluators and not self.computed_names:
            raise ValueError("a dynamic matcher needs `evaluators`, `computed_names` or both")
        return self


class DecoratorMatch(_Model):
    """Decorators, which call a function with the decorated object and no visible call node. Matched by
    qualified name (for ``@f(...)``, the name of ``f``); other expressions are ``<expr>``/``<lambda>``.
    Message field: ``{decorator}``."""

    kind: Literal["decorator"]
    names: Globs = Field(default_factory=lambda: ["*"])
    except_: Globs = Field(default_factory=list, alias="except")
    except_defined: bool = Field(
        False,
        description="exempt decorators the program defines itself: a name bound only by the program's own "
        "def or class statements (@memoize, @retry(3)), or a method of such a class (@Registry.register)",
    )


DefinitionKind = Literal["function", "class", "assignment"]
_DEFINITION_KINDS: list[DefinitionKind] = ["function", "class", "assignment"]


class DefinitionMatch(_Model):
    """Names the program defines: functions, classes, and assignment targets. Message field: ``{name}``."""

    kind: Literal["definition"]
    names: Globs = Field(min_length=1)
    except_: Globs = Field(default_factory=list, alias="except")
    of: list[DefinitionKind] = Field(default_factory=lambda: list(_DEFINITION_KINDS), min_length=1)


class UngrantedCapabilityMatch(_Model):
    """Capabilities the program uses (see the capability table) that the policy does not grant; reported
    once per tag, at its first evidence. Message fields: ``{capability}``, ``{evidence}``."""

    kind: Literal["ungranted_capability"]
    tags: Globs = Field(default_factory=lambda: ["*"])


class PluginMatch(_Model):
    """A Python check, for what a declaration cannot express. ``plugin`` names a built-in check or one
    registered under the ``sandforge.guardrails`` entry-point group; ``options`` are validated by it."""

    kind: Literal["plugin"]
    plugin: str = Field(min_length=1)
    options: dict[str, Any] = Field(default_factory=dict)


RuleMatcher = Annotated[
    ImportMatch
    | NameMatch
    | AttributeMatch
    | CallMatch
    | DynamicMatch
    | DecoratorMatch
    | DefinitionMatch
    | UngrantedCapabilityMatch
    | PluginMatch,
    Field(discriminator="kind"),
]
CapabilityMatcher = Annotated[
    ImportMatch | NameMatch | AttributeMatch | CallMatch | DecoratorMatch | DefinitionMatch | PluginMatch,
    Field(discriminator="kind"),
]


# --------------------------------------------------------------------------------------------- rules

Code = Annotated[str, Field(min_length=1)]


class RuleExamples(_Model):
    """Programs that must trigger the rule and programs that must not; ``sandforge policy test`` runs
    them against the effective policy. ``corrected`` programs are trigger programs rewritten the way
    ``required_correction`` says (``policy explain`` shows the first one under "Use instead"): they must
    not trigger the rule nor what no policy lifts (the sandbox's compiler), and the default policy's
    tests hold them to full approval and a successful run in the sandbox."""

    trigger: list[Code] = Field(min_length=1)
    clean: list[Code] = Field(min_length=1)
    corrected: list[Code] = Field(
        default_factory=list,
        description="trigger programs rewritten as required_correction says; they must run unrefused",
    )


class RuleSpec(_Model):
    """One guardrail rule."""

    id: RuleId
    description: str = Field(min_length=1, description="what the rule catches, one sentence")
    rationale: str = Field(min_length=1, description="why it is bad (shown by `policy explain`)")
    classification: Classification = Field(
        "recoverable", description="recoverable (default): a rewrite can fix it; terminal: no rewrite can"
    )
    message: str = Field(min_length=1, description="template; fields depend on the matcher, plus {construct}")
    required_correction: str = Field(
        min_length=1, description="a concise, policy-preserving rewrite instruction; never domain logic"
    )
    match: RuleMatcher
    examples: RuleExamples
    enabled: bool = True


class RuleOverride(_Model):
    """Changes to a rule defined by an earlier file or layer; unset fields keep their value."""

    description: str | None = Field(None, min_length=1)
    rationale: str | None = Field(None, min_length=1)
    classification: Classification | None = None
    message: str | None = Field(None, min_length=1)
    required_correction: str | None = Field(None, min_length=1)
    match: RuleMatcher | None = None
    examples: RuleExamples | None = None
    enabled: bool | None = None


# ------------------------------------------------------------------------------------- capabilities


class CapabilityExamples(_Model):
    """Programs that must be tagged with the capability and programs that must not."""

    tagged: list[Code] = Field(min_length=1)
    untagged: list[Code] = Field(min_length=1)


class CapabilitySpec(_Model):
    """A capability tag: the constructs that show a program uses it. A later file that names an existing
    tag adds matchers (and examples) to it."""

    description: str | None = Field(None, min_length=1)
    match: list[CapabilityMatcher] = Field(min_length=1)
    examples: CapabilityExamples | None = None


# ------------------------------------------------------------------------------------------- files


class Limits(_Model):
    """Bounds that keep validation linear and small; a later layer overrides them field by field."""

    max_source_bytes: int = Field(256 * 1024, ge=1024, le=16 * 1024 * 1024, description="UTF-8 bytes")
    max_ast_depth: int = Field(200, ge=16, le=2000, description="deepest AST nesting accepted")
    max_violations: int = Field(100, ge=1, le=10_000, description="violations reported per program")


class LimitsOverride(_Model):
    max_source_bytes: int | None = Field(None, ge=1024, le=16 * 1024 * 1024)
    max_ast_depth: int | None = Field(None, ge=16, le=2000)
    max_violations: int | None = Field(None, ge=1, le=10_000)


class PolicyMeta(_Model):
    name: str | None = Field(None, min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None


# ---------------------------------------------------------------------------------- section examples

_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _request_example(value: str) -> str:
    """``URL`` or ``METHOD URL``: checked when the file loads, so a typo is a problem with its line."""
    method, _, url = value.strip().partition(" ") if " " in value.strip() else ("GET", "", value.strip())
    if method.upper() not in _METHODS:
        raise ValueError(f"{value!r}: expected `URL` or `METHOD URL` (methods: {', '.join(_METHODS)})")
    if not url.strip().lower().startswith(("http://", "https://")):
        raise ValueError(f"{value!r}: the URL must start with http:// or https://")
    return f"{method.upper()} {url.strip()}"


RequestExample = Annotated[str, Field(min_length=8, max_length=2048), AfterValidator(_request_example)]


class EgressExamples(_Model):
    """Requests the egress rules must allow and must deny (``URL`` or ``METHOD URL``; GET when no method is
    given); ``sandforge policy test`` runs them against the effective egress policy, the platform deny list
    and ``resolve`` included (no DNS lookups: host names not in ``resolve`` are judged by the rules alone)."""

    allow: list[RequestExample] = Field(default_factory=list, description="requests that must be allowed")
    deny: list[RequestExample] = Field(default_factory=list, description="requests that must be denied")


class EgressSection(_EgressSectionBase):
    """The ``egress:`` section (its model is runtime/egress/config.py's, of the same name), plus its examples."""

    examples: EgressExamples | None = Field(None, description="requests it must allow and deny (`policy test`)")


ManifestExample = Annotated[
    str | list[Annotated[str, Field(min_length=1, max_length=500)]],
    Field(description="one requirement (`pandas>=2`), a list of them, or a program with a `# /// script` block"),
]


class DependencyExamples(_Model):
    """Manifests the dependency rules must accept and refuse (declared names only: what they pull in is judged
    when an environment is built); ``sandforge policy test`` runs them against the effective policy."""

    accept: list[ManifestExample] = Field(default_factory=list, description="manifests that must be accepted")
    refuse: list[ManifestExample] = Field(default_factory=list, description="manifests that must be refused")


class DependenciesSection(_DependenciesSectionBase):
    """The ``dependencies:`` section (its model is runtime/environments/policy.py's, of the same name), plus its
    examples."""

    examples: DependencyExamples | None = Field(None, description="manifests it must accept and refuse (`policy test`)")


class PolicyFile(_Model):
    """One policy file. Sections apply in this order: capabilities, rules, override, disable, grant, deny,
    limits, egress, dependencies."""

    schema_: str | None = Field(None, alias="$schema", description="optional, for editors")
    policy: PolicyMeta | None = None
    capabilities: dict[Tag, CapabilitySpec] = Field(default_factory=dict)
    rules: list[RuleSpec] = Field(default_factory=list, description="new rules; ids must be unused")
    override: dict[RuleId, RuleOverride] = Field(default_factory=dict, description="changes to earlier rules")
    disable: list[RuleId] = Field(default_factory=list, description="rules to switch off")
    grant: list[Tag] = Field(default_factory=list, description="capabilities this deployment grants")
    deny: list[Tag] = Field(default_factory=list, description="capabilities revoked (after `grant`)")
    limits: LimitsOverride | None = None
    egress: EgressSection | None = Field(
        None, description="what brokered requests may reach (docs/policies.md, 'Egress'); default: nothing"
    )
    dependencies: DependenciesSection | None = Field(
        None, description="third-party distributions programs may declare (docs/environments.md); default: none"
    )


SCHEMA_ID = "https://sandforge.dev/schemas/policy.schema.json"


def policy_json_schema() -> dict[str, Any]:
    """The JSON Schema of a policy file (what ``policies/policy.schema.json`` holds)."""
    schema = PolicyFile.model_json_schema(by_alias=True, mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **schema,
        "title": "sandforge guardrail policy file",
    }


# -------------------------------------------------------------------------------------------- hints


def required_fields(model: type[BaseModel]) -> list[str]:
    """The fields a file must give for ``model`` (by their YAML names), in declaration order."""
    return [info.alias or name for name, info in model.model_fields.items() if info.is_required()]


def _all_models() -> list[type[BaseModel]]:
    seen: list[type[BaseModel]] = []
    stack: list[type[BaseModel]] = [PolicyFile]
    while stack:
        model = stack.pop()
        if model in seen:
            continue
        seen.append(model)
        for info in model.model_fields.values():
            stack.extend(_models_in(info.annotation))
    return seen


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in getattr(annotation, "__args__", ()) or ():
        found.extend(_models_in(arg))
    for meta in getattr(annotation, "__metadata__", ()) or ():
        found.extend(_models_in(meta) if isinstance(meta, type) else [])
    return found


_MATCHERS: dict[str, type[BaseModel]] = {
    cls.model_fields["kind"].annotation.__args__[0]: cls  # type: ignore[union-attr]
    for cls in (
        ImportMatch,
        NameMatch,
        AttributeMatch,
        CallMatch,
        DynamicMatch,
        DecoratorMatch,
        DefinitionMatch,
        UngrantedCapabilityMatch,
        PluginMatch,
    )
}


def model_at(path: tuple[str | int, ...], data: Any) -> type[BaseModel] | None:
    """Which model the mapping at ``path`` (a key path into the file's data) is validated with, where the shape
    says so: rules, their examples and matchers, capabilities, overrides; None elsewhere."""
    shape = tuple("#" if isinstance(part, int) else part for part in path)
    if shape[:2] == ("rules", "#") or (shape[:1] == ("override",) and len(shape) >= 2):
        rest = shape[2:]
        if not rest:
            return RuleSpec if shape[0] == "rules" else RuleOverride
        if rest == ("examples",):
            return RuleExamples
        if rest == ("match",):
            node = _get(data, path)
            kind = node.get("kind") if isinstance(node, dict) else None
            return _MATCHERS.get(kind) if isinstance(kind, str) else None
    if shape[:1] == ("capabilities",) and len(shape) >= 2:
        rest = shape[2:]
        found: dict[tuple[str, ...], type[BaseModel]] = {(): CapabilitySpec, ("examples",): CapabilityExamples}
        return found.get(rest)
    return None


def _get(data: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        present = part in data if isinstance(data, dict) else isinstance(data, list) and isinstance(part, int)
        if not present or (isinstance(data, list) and not 0 <= int(part) < len(data)):
            return None
        data = data[part]
    return data


def hint_for(error: Any, path: tuple[str | int, ...], data: Any = None) -> str | None:
    """A hint for one pydantic error: the required fields of what is missing one, the closest known field for an
    unknown one, the known kinds for an unknown ``kind``."""
    import difflib

    kind = error["type"]
    if kind == "missing":
        model = model_at(path[:-1], data)
        if model is not None:
            return f"required fields here: {', '.join(required_fields(model))}"
        return None
    if kind == "extra_forbidden" and path:
        known = sorted({info.alias or name for model in _all_models() for name, info in model.model_fields.items()})
        close = difflib.get_close_matches(str(path[-1]), known, n=1, cutoff=0.7)
        return f"did you mean {close[0]!r}?" if close else None
    if kind == "union_tag_invalid":
        return f"kinds: {', '.join(sorted(_MATCHERS))}"
    return None
