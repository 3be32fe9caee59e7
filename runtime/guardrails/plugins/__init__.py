"""Python checks for what a declaration cannot express, referenced from policy files by name:

```yaml
match: {kind: plugin, plugin: delegated_tool_mutation, options: {factories: [tool, delegate]}}
```

A plugin is one function decorated with `register`: it receives the analysed `Program` and its validated
options and yields `Finding`s. Its docstring is its documentation (``sandforge policy explain`` shows it).
Third-party plugins register the same way in a module exposed under the ``sandforge.guardrails``
entry-point group; they are only imported when a policy names one that is not built in.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from sandforge.runtime.guardrails.program import Finding, Program

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "sandforge.guardrails"
_BUILTIN_MODULES = ("context_callables", "headlines", "inner_wall", "metaclass", "tool_mutation")


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


OptionsT = TypeVar("OptionsT", bound=BaseModel)
CheckFunction = Callable[[Program, Any], Iterable[Finding]]


@dataclass(frozen=True)
class Plugin:
    name: str
    check: CheckFunction
    options: type[BaseModel]
    fields: frozenset[str]

    @property
    def documentation(self) -> str:
        return inspect.getdoc(self.check) or ""

    @property
    def summary(self) -> str:
        return self.documentation.split("\n\n", 1)[0].replace("\n", " ")


_REGISTRY: dict[str, Plugin] = {}
_loaded_builtins = False


def register(
    name: str, *, options: type[OptionsT] | None = None, fields: Iterable[str] = ()
) -> Callable[[Callable[[Program, OptionsT], Iterable[Finding]]], Callable[[Program, OptionsT], Iterable[Finding]]]:
    """Register a check under `name`; `options` is the pydantic model of its ``options`` mapping and
    `fields` the message-template fields its findings provide."""

    def decorate(
        check: Callable[[Program, OptionsT], Iterable[Finding]],
    ) -> Callable[[Program, OptionsT], Iterable[Finding]]:
        if not inspect.getdoc(check):
            raise TypeError(f"guardrail plugin {name!r} needs a docstring: it is the rule's documentation")
        _REGISTRY[name] = Plugin(name, check, options or NoOptions, frozenset(fields))
        return check

    return decorate


def _load_builtins() -> None:
    global _loaded_builtins
    if not _loaded_builtins:
        for module in _BUILTIN_MODULES:
            importlib.import_module(f"{__name__}.{module}")
        _loaded_builtins = True


def get_plugin(name: str) -> Plugin | None:
    """The plugin registered as `name`, importing its entry point if it is not built in."""
    _load_builtins()
    if name not in _REGISTRY:
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            if entry.name == name:
                entry.load()
                break
    return _REGISTRY.get(name)


def builtin_plugins() -> dict[str, Plugin]:
    _load_builtins()
    return dict(_REGISTRY)
