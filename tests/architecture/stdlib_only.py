"""An import-linter contract type: modules that may import only the standard library (and a few named packages).

The code that runs inside the sandbox is loaded into an image that holds Python, RestrictedPython and nothing
else, so an import of anything else (pydantic, a host module of sandforge) would fail only at run time, inside
the sandbox. import-linter's built-in contracts forbid named modules; this one allows named modules instead.
"""

from __future__ import annotations

import sys

import grimp
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck

STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


class StdlibOnlyContract(Contract):
    """``source_modules`` (with their descendants) import only the standard library and ``allowed_modules``.

    Source modules missing from the graph are skipped, but at least one must exist: a contract that checks
    nothing (a source renamed away) is broken, not kept.
    """

    type_name = "stdlib_only"

    source_modules = fields.ListField(subfield=fields.StringField())
    allowed_modules = fields.ListField(subfield=fields.StringField(), required=False, default=[])

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        present = [m for m in self.source_modules if m in graph.modules]
        if not present:
            return ContractCheck(kept=False, metadata={"missing": list(self.source_modules), "invalid": []})
        sources: set[str] = set()
        for module in present:
            sources |= {module} | graph.find_descendants(module)
        allowed = STDLIB | set(self.allowed_modules)
        invalid = []
        for importer in sorted(sources):
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                if imported in sources or imported.split(".")[0] in allowed:
                    continue
                lines = [d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)]
                invalid.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not invalid, metadata={"missing": [], "invalid": invalid})

    def render_broken_contract(self, check: ContractCheck) -> None:
        if check.metadata["missing"]:
            output.print_error(f"none of {', '.join(check.metadata['missing'])} is in the graph: nothing was checked")
            output.new_line()
        for item in check.metadata["invalid"]:
            lines = ", ".join(f"l.{n}" for n in item["lines"])
            output.print_error(f"{item['importer']} is not allowed to import {item['imported']} ({lines})", bold=False)
            output.new_line()
