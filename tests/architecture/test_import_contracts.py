"""The import contracts in pyproject.toml ([tool.importlinter], run by `make lint`) hold, and each one can fail.

Each contract is checked by import-linter itself, once on the project's real import graph (it must be kept)
and once on that graph plus one synthetic module that breaks it (it must be broken, naming that module).
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest
from importlinter import configuration
from importlinter.adapters.building import GraphBuilder
from importlinter.application import use_cases
from importlinter.application.app_config import settings
from importlinter.application.use_cases import create_report, read_user_options

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "pyproject.toml"
CONTRACTS = {c["id"]: c for c in tomllib.loads(CONFIG.read_text())["tool"]["importlinter"]["contracts"]}
SYNTHETIC = "synthetic_violation"

configuration.configure()  # what `lint-imports` does before it reads a configuration
use_cases._register_built_in_contract_types()


class _Builder(GraphBuilder):
    """The real graph (built once), plus ``extra`` imports: (importer, imported) pairs, new modules added."""

    def __init__(self, graph: grimp.ImportGraph) -> None:
        self.graph = graph
        self.extra: list[tuple[str, str]] = []

    def build(self, *args: object, **kwargs: object) -> grimp.ImportGraph:
        graph = copy.deepcopy(self.graph)
        for importer, imported in self.extra:
            for module in (importer, imported):
                if module not in graph.modules:
                    graph.add_module(module, is_squashed="." not in module and module != "sandforge")
            graph.add_import(importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}")
        return graph


@pytest.fixture(scope="module")
def real_graph() -> grimp.ImportGraph:
    options = read_user_options(str(CONFIG)).session_options
    return grimp.build_graph(
        *options["root_packages"], include_external_packages=options["include_external_packages"], cache_dir=None
    )


@pytest.fixture
def builder(real_graph: grimp.ImportGraph) -> Iterator[_Builder]:
    saved = settings.GRAPH_BUILDER
    fake = _Builder(real_graph)
    settings.configure(GRAPH_BUILDER=fake)
    try:
        yield fake
    finally:
        settings.configure(GRAPH_BUILDER=saved)


def _broken(contract_id: str) -> list[str]:
    """Rendered names of what broke ``contract_id`` (empty when it is kept)."""
    report = create_report(read_user_options(str(CONFIG)), limit_to_contracts=(contract_id,), cache_dir=None)
    assert not report.could_not_run, report.invalid_contract_options
    return [repr(check.metadata) for _, check in report.get_contracts_and_checks() if not check.kept]


def _inside(graph: grimp.ImportGraph) -> str:
    """The first module the inside contract names that today's graph holds (``sandforge.sandbox.inside``)."""
    present = [m for m in CONTRACTS["inside-stdlib-only"]["source_modules"] if m in graph.modules]
    assert present, "the inside contract names no module of today's graph"
    return present[0]


def test_every_contract_is_kept(builder: _Builder) -> None:
    for contract_id in CONTRACTS:
        assert _broken(contract_id) == [], contract_id


# One synthetic import per contract that the contract must refuse.
VIOLATIONS = {
    "sandbox-below-runtime": [(f"sandforge.sandbox.{SYNTHETIC}", "sandforge.runtime.agent")],
    "inside-stdlib-only": [("{inside}", "pydantic")],
    "backends-independent": [
        ("sandforge.sandbox.backends.subprocess_backend", "sandforge.sandbox.backends.oci_backend"),
    ],
    "rooms-below-backends": [(f"sandforge.sandbox.{SYNTHETIC}", "sandforge.sandbox.backends.subprocess_backend")],
    "lifecycle-behind-port": [("sandforge.runtime.agent.lifecycle", "sandforge.runtime.agent.agent")],
    "store-not-agent": [(f"sandforge.runtime.store.{SYNTHETIC}", "sandforge.runtime.agent")],
    "product-not-bench": [(f"sandforge.runtime.cli.{SYNTHETIC}", "bench")],
    "no-old-top-level-names": [(f"tests.{SYNTHETIC}", "sandbox")],
    "layers": [(f"sandforge.runtime.store.{SYNTHETIC}", "sandforge.runtime.providers")],
    "core-not-integrations": [(f"sandforge.runtime.agent.{SYNTHETIC}", "sandforge.integrations.core")],
    "frameworks-in-adapters": [(f"sandforge.integrations.core.{SYNTHETIC}", "smolagents")],
    "no-cycles": [
        (f"sandforge.runtime.names.{SYNTHETIC}", "sandforge.runtime.store"),
        ("sandforge.runtime.store", f"sandforge.runtime.names.{SYNTHETIC}"),
    ],
}


def test_every_contract_has_a_violation() -> None:
    assert set(VIOLATIONS) == set(CONTRACTS)


@pytest.mark.parametrize("contract_id", sorted(VIOLATIONS))
def test_contract_refuses_a_synthetic_violation(builder: _Builder, contract_id: str) -> None:
    builder.extra = [(a.format(inside=_inside(builder.graph)), b) for a, b in VIOLATIONS[contract_id]]
    broken = _broken(contract_id)
    assert broken, f"{contract_id} kept despite {builder.extra}"
    importer, imported = builder.extra[0]
    assert importer.rsplit(".", 1)[-1] in broken[0] or imported in broken[0], broken


@pytest.mark.parametrize(
    "imported",
    [
        "sandforge.sandbox.protocol",  # a host module of sandforge
        "sandforge.runtime.errors",
        "docker",  # a third-party package
    ],
)
def test_inside_refuses_anything_but_stdlib_and_restrictedpython(builder: _Builder, imported: str) -> None:
    builder.extra = [(_inside(builder.graph), imported)]
    assert _broken("inside-stdlib-only")


def test_inside_contract_refuses_to_check_nothing(builder: _Builder) -> None:
    """A contract whose modules all vanished (a rename) would check nothing: it is broken instead."""
    graph = builder.graph
    builder.graph = copy.deepcopy(graph)
    for source in CONTRACTS["inside-stdlib-only"]["source_modules"]:
        if source in builder.graph.modules:
            for module in builder.graph.find_descendants(source) | {source}:
                builder.graph.remove_module(module)
    try:
        assert _broken("inside-stdlib-only")
    finally:
        builder.graph = graph


def test_every_backend_is_in_the_independence_contract(real_graph: grimp.ImportGraph) -> None:
    """A new backend module (``*_backend``) cannot escape the contract by not being listed."""
    backends = {m for m in real_graph.find_children("sandforge.sandbox.backends") if m.endswith("_backend")}
    assert backends, "no backend module found"
    assert backends <= set(CONTRACTS["backends-independent"]["modules"])
