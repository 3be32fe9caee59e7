"""Checked contracts: a delegated tool's ``deliverable`` as a JSON Schema the lifecycle enforces.

A contract's ``deliverable`` that is a JSON object is a schema; any other value (a prose string, a list)
is a description for the model and is not checked. Two spellings are accepted:

- JSON Schema (draft 2020-12), e.g. ``{"type": "array", "items": {"type": "string"}, "minItems": 1}``;
- the original project's shorthand, mapped onto JSON Schema: ``type`` with Python names too (``list``,
  ``dict``, ``str``, ``int``, ``float``, ``bool``, ``none``), ``required`` (object keys), ``min_items`` /
  ``max_items`` / ``min_length`` / ``max_length``, nested in ``items`` and ``properties``.

Validation uses the ``jsonschema`` library. The host runs it on a schema and a value that a program chose,
so keywords that would run program-chosen regular expressions in the host (``pattern``,
``patternProperties``), references (``$ref``, ``$dynamicRef``) and ``uniqueItems`` (quadratic) are
refused as an invalid contract, and ``format`` is not asserted.
"""

from __future__ import annotations

import fnmatch
import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from pydantic import BaseModel, ConfigDict, JsonValue

from sandforge.runtime.files.media import mismatch
from sandforge.runtime.store.models import FileSpec, ToolContract, ToolFiles

SHORTHAND_TYPES: dict[str, str] = {
    "list": "array",
    "tuple": "array",
    "dict": "object",
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "none": "null",
    "None": "null",
}
SHORTHAND_KEYWORDS: dict[str, str] = {
    "min_items": "minItems",
    "max_items": "maxItems",
    "min_length": "minLength",
    "max_length": "maxLength",
}
#: Refused in a deliverable: program-chosen regular expressions run in the host (``pattern``,
#: ``patternProperties``), references (``$ref``, ``$dynamicRef``), and ``uniqueItems`` (quadratic in the
#: result's length for unhashable items).
REFUSED_KEYWORDS: frozenset[str] = frozenset({"pattern", "patternProperties", "$ref", "$dynamicRef", "uniqueItems"})
#: Keywords whose value is one schema / a map of schemas / a list of schemas (walked for the mapping).
_SUB_SCHEMA = frozenset({"items", "additionalProperties", "contains", "not", "propertyNames", "if", "then", "else"})
_SCHEMA_MAP = frozenset({"properties", "$defs", "definitions", "dependentSchemas"})
_SCHEMA_LIST = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
MAX_SCHEMA_DEPTH = 32
MAX_PREVIEW_CHARS = 200


class InvalidContract(ValueError):
    """A contract field the runtime cannot accept (the program's mistake, reported as ``invalid_contract``)."""


class ContractViolation(BaseModel):
    """Why a result does not match the declared deliverable: where, what was expected, what was there."""

    model_config = ConfigDict(frozen=True)

    path: str
    expected: str
    actual: str
    message: str
    #: what was missed: the value's ``deliverable``, or a declared output file (``outputs``, issue 41)
    kind: Literal["deliverable", "outputs"] = "deliverable"

    @property
    def text(self) -> str:
        if self.kind == "outputs" and self.message != "a declared output is missing":
            return f"the run's output {self.path} does not match the contract: expected {self.expected}, " \
                   f"actual: {self.actual}"  # fmt: skip
        if self.kind == "outputs":
            return f"the run does not write the contract's output {self.path}: expected {self.expected}, " \
                   f"actual {self.actual}"  # fmt: skip
        return f"the result does not match the contract's deliverable at {self.path}: expected {self.expected}, " \
               f"actual {self.actual} ({self.message})"  # fmt: skip


def check_outputs(files: ToolFiles | None, written: Mapping[str, bytes]) -> ContractViolation | None:
    """The first required output of ``files`` that no written name matches (a glob needs one match), or a written
    file whose bytes are not the media type its declaration says (``runtime.files.media``); None when all hold.

    A missing or mistyped output is the program's defect, whatever the input (a program that cannot make it
    answers an error instead), so the lifecycle treats it as an intrinsic contract violation (docs/files.md)."""
    if files is None:
        return None
    names = sorted(written)
    for spec in files.produces:
        if spec.required and not any(fnmatch.fnmatchcase(name, spec.name) for name in names):
            actual = _bounded(", ".join(names)) if names else "no output file"
            return ContractViolation(path=f"outputs/{spec.name}", expected="a file matching it", actual=actual,
                                     message="a declared output is missing", kind="outputs")  # fmt: skip
    found = typed_mismatch(files.produces, written)
    if found is not None:
        name, expected, why = found
        return ContractViolation(path=f"outputs/{name}", expected=expected, actual=_bounded(why),
                                 message="a declared output is not its media type", kind="outputs")  # fmt: skip
    return None


def check_inputs(files: ToolFiles | None, given: Mapping[str, bytes]) -> str | None:
    """Why an input file is not the media type the contract declares for it (one line), or None."""
    found = typed_mismatch(files.takes, given) if files is not None else None
    if found is None:
        return None
    name, expected, why = found
    return f"inputs/{name}: the contract declares {expected}, but {_bounded(why)}"


def typed_mismatch(specs: Iterable[FileSpec], files: Mapping[str, bytes]) -> tuple[str, str, str] | None:
    """The first file a spec with a media type matches whose bytes are not that type: (name, type, why)."""
    for name in sorted(files):
        for spec in specs:
            if spec.media_type is not None and fnmatch.fnmatchcase(name, spec.name):
                why = mismatch(spec.media_type, files[name])
                if why is not None:
                    return name, spec.media_type, why
    return None


def _bounded(text: str, limit: int = MAX_PREVIEW_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _preview(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    return _bounded(text)


def _type_name(value: object) -> object:
    if isinstance(value, str):
        return SHORTHAND_TYPES.get(value, value)
    if isinstance(value, list):
        return [SHORTHAND_TYPES.get(v, v) if isinstance(v, str) else v for v in value]
    return value


def to_json_schema(deliverable: dict[str, Any], _depth: int = 0) -> dict[str, Any]:
    """The deliverable as JSON Schema: shorthand names mapped, everything else kept (see module doc)."""
    if _depth > MAX_SCHEMA_DEPTH:
        raise InvalidContract(f"the deliverable schema is nested more than {MAX_SCHEMA_DEPTH} levels deep")
    schema: dict[str, Any] = {}
    for key, value in deliverable.items():
        if key in REFUSED_KEYWORDS:
            raise InvalidContract(f"the deliverable schema keyword {key!r} is not supported")
        name = SHORTHAND_KEYWORDS.get(key, key)
        if name == "type":
            value = _type_name(value)
        elif name in _SUB_SCHEMA and isinstance(value, dict):
            value = to_json_schema(value, _depth + 1)
        elif name in _SCHEMA_MAP and isinstance(value, dict):
            value = {k: to_json_schema(v, _depth + 1) if isinstance(v, dict) else v for k, v in value.items()}
        elif name in _SCHEMA_LIST and isinstance(value, list):
            value = [to_json_schema(v, _depth + 1) if isinstance(v, dict) else v for v in value]
        schema[name] = value
    return schema


@functools.lru_cache(maxsize=256)
def _validator(schema_text: str) -> Draft202012Validator:
    schema = to_json_schema(json.loads(schema_text))
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        message = f"the deliverable is not a valid JSON Schema at {where}: {_bounded(exc.message)}"
        raise InvalidContract(message) from None
    return Draft202012Validator(schema)


def deliverable_validator(deliverable: JsonValue) -> Draft202012Validator | None:
    """The validator of a schema deliverable, None when the deliverable is not a schema (not an object).

    Raises :class:`InvalidContract` when it is an object but not a usable schema."""
    if not isinstance(deliverable, dict):
        return None
    try:
        text = json.dumps(deliverable, sort_keys=True, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidContract(f"the deliverable is not JSON: {exc}") from None
    return _validator(text)


def check_contract(contract: ToolContract) -> None:
    """Raise :class:`InvalidContract` if ``contract`` cannot be accepted (its deliverable or inputs are bad
    schemas)."""
    deliverable_validator(contract.deliverable)
    if contract.inputs is not None:
        if not isinstance(contract.inputs, dict):
            raise InvalidContract("inputs must map each method name to its list of parameters")
        for method in contract.inputs:
            method_parameters(contract.inputs, method)


class Parameter(BaseModel):
    """One positional parameter of a typed method: its name, JSON Schema and whether a caller must give it."""

    model_config = ConfigDict(frozen=True)

    name: str
    schema_: dict[str, Any]
    required: bool


def method_parameters(inputs: JsonValue, method: str) -> list[Parameter] | None:
    """The typed positional parameters of ``method`` in order, None when the contract does not type it.

    Each entry is a JSON Schema (shorthand type names such as ``"str"`` mapped, as for deliverables) with a
    ``name``; one with a ``default`` is optional. Raises :class:`InvalidContract` for anything else."""
    if not isinstance(inputs, dict) or method not in inputs:
        return None
    entries = inputs[method]
    if not isinstance(entries, list):
        raise InvalidContract(f"inputs of {method!r} must be a list of parameters")
    found: list[Parameter] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InvalidContract(f"parameter {i} of {method!r} must be an object with a string 'name'")
        name = str(entry["name"])
        if not name.isidentifier() or name in {p.name for p in found}:
            raise InvalidContract(f"parameter {i} of {method!r}: {name!r} is not a unique identifier")
        schema = to_json_schema({k: v for k, v in entry.items() if k != "name"})
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            raise InvalidContract(f"parameter {name!r} of {method!r} is not a valid JSON Schema: "
                                  f"{_bounded(exc.message)}") from None  # fmt: skip
        found.append(Parameter(name=name, schema_=schema, required="default" not in schema))
    return found


#: The arguments of a method whose contract does not type them: positional and keyword JSON values.
UNTYPED_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "args": {"type": "array", "description": "positional arguments (JSON values)", "default": []},
        "kwargs": {"type": "object", "description": "keyword arguments (JSON values)", "default": {}},
    },
    "additionalProperties": False,
}


def input_schema(parameters: list[Parameter] | None) -> dict[str, Any]:
    """One JSON Schema object for a method's arguments: its typed parameters as named properties, or
    :data:`UNTYPED_INPUT_SCHEMA` (what MCP clients and agent frameworks are shown)."""
    if parameters is None:
        return UNTYPED_INPUT_SCHEMA
    return {
        "type": "object",
        "properties": {p.name: p.schema_ for p in parameters},
        "required": [p.name for p in parameters if p.required],
        "additionalProperties": False,
    }


def positional_arguments(parameters: list[Parameter], arguments: dict[str, Any]) -> list[Any]:
    """Named arguments of a typed method as its positional ones; a missing optional one ends them, so the
    program's own default applies."""
    args: list[Any] = []
    for p in parameters:
        if p.name not in arguments:
            break
        args.append(arguments[p.name])
    return args


def method_description(headline: str, contract: ToolContract, *, typed: bool) -> str:
    """What a model or an MCP client reads about one tool method: ``headline``, then the contract's purpose,
    deliverable and acceptance, and how to pass arguments when the contract does not type them."""
    purpose = f"Purpose: {contract.purpose}" if contract.purpose else "No contract was recorded for this tool."
    lines = [headline, purpose]
    for label, value in (("Deliverable", contract.deliverable), ("Acceptance", contract.acceptance)):
        if value is not None:
            lines.append(f"{label}: {json.dumps(value, ensure_ascii=False)[:2000]}")
    if not typed:
        lines.append('Call with {"args": [...], "kwargs": {...}}.')
    return "\n".join(lines)


def arguments_problem(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """Why ``arguments`` do not fit a method's input schema (one line), None when they do."""
    error = best_match(Draft202012Validator(schema).iter_errors(arguments))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "arguments"
    return f"{where}: {error.message}"[:500]


def _path(parts: Iterable[object]) -> str:
    text = "$"
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def check_deliverable(value: JsonValue, deliverable: JsonValue) -> ContractViolation | None:
    """The first (most relevant) mismatch of ``value`` with the deliverable, None when it matches or the
    deliverable is not a schema. A deliverable that is not a usable schema is not enforced here: it is
    refused when it is declared (:func:`check_contract`)."""
    try:
        validator = deliverable_validator(deliverable)
    except InvalidContract:
        return None
    if validator is None:
        return None
    error: ValidationError | None = best_match(validator.iter_errors(value))
    if error is None:
        return None
    keyword = str(error.validator)
    return ContractViolation(
        path=_path(error.absolute_path),
        expected=f"{keyword} {_preview(error.validator_value)}",
        actual=_preview(error.instance),
        message=_bounded(error.message),
    )
