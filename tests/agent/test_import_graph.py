"""The runtime's import graph, read from the source with ``ast``: no import cycle, and the call loop behind
its port (it never imports the workspace or the Agent API, and reaches a sandbox only through the gate).

Every import counts, also one inside a function or under ``if TYPE_CHECKING``: a lazy import hides a
cycle, it does not remove it. Importing ``pkg.mod`` is an edge to ``pkg.mod`` (not to ``pkg``'s
``__init__``), as in import-linter.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "sandforge"
#: The modules of the call loop: what ``CallRun`` and its parts are made of.
CALL_LOOP = ("lifecycle", "env", "attempt", "lanes", "seam", "execution", "recording", "requests")


def modules(*folders: str) -> dict[str, Path]:
    """Module name (``sandforge.runtime.agent.lifecycle``) -> file, for every .py under ``folders``."""
    found: dict[str, Path] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([PACKAGE, *parts])] = path
    return found


def imports(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The modules of ``known`` that ``name`` imports (anywhere in the file)."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def resolve(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    edges: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        edges.update(r for t in targets if (r := resolve(t)) is not None and r != name)
    return edges


def graph(*folders: str) -> dict[str, set[str]]:
    found = modules(*folders)
    return {name: imports(name, path, found) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    tarjan = _Tarjan(edges)
    for v in sorted(edges):
        if v not in tarjan.index:
            tarjan.visit(v)
    return tarjan.found


class _Tarjan:
    """Tarjan's algorithm's state; `visit` is its recursion, `found` the components of more than one module."""

    def __init__(self, edges: dict[str, set[str]]) -> None:
        self.edges = edges
        self.index: dict[str, int] = {}
        self.low: dict[str, int] = {}
        self.stack: list[str] = []
        self.on_stack: set[str] = set()
        self.found: list[list[str]] = []

    def visit(self, v: str) -> None:
        index, low = self.index, self.low
        index[v] = low[v] = len(index)
        self.stack.append(v)
        self.on_stack.add(v)
        for w in sorted(self.edges.get(v, ())):
            if w not in index:
                self.visit(w)
                low[v] = min(low[v], low[w])
            elif w in self.on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            self._pop_component(v)

    def _pop_component(self, v: str) -> None:
        component = []
        while True:
            w = self.stack.pop()
            self.on_stack.discard(w)
            component.append(w)
            if w == v:
                break
        if len(component) > 1:
            self.found.append(sorted(component))


# --- the checker itself -------------------------------------------------------------------------------


def test_the_checker_finds_a_cycle_and_a_lazy_import(tmp_path: Path) -> None:
    a = tmp_path / "a.py"
    a.write_text("from sandforge.x import b\n")
    b = tmp_path / "b.py"
    b.write_text("def f():\n    from sandforge.x.a import thing\n")
    known = ["sandforge.x.a", "sandforge.x.b", "sandforge.x"]
    edges = {"sandforge.x.a": imports("sandforge.x.a", a, known), "sandforge.x.b": imports("sandforge.x.b", b, known)}
    assert edges == {"sandforge.x.a": {"sandforge.x.b"}, "sandforge.x.b": {"sandforge.x.a"}}
    assert cycles(edges) == [["sandforge.x.a", "sandforge.x.b"]]
    assert cycles({"p": {"q"}, "q": {"r"}, "r": set()}) == []


# --- the contracts ------------------------------------------------------------------------------------


def test_the_agent_layer_has_no_import_cycle() -> None:
    edges = graph("runtime/agent")
    assert "sandforge.runtime.agent.lifecycle" in edges
    assert cycles(edges) == []


def test_the_runtime_has_no_import_cycle() -> None:
    assert cycles(graph("runtime")) == []


def test_the_call_loop_never_imports_the_workspace_or_the_agent_api() -> None:
    edges = graph("runtime")
    loop = [f"{PACKAGE}.runtime.agent.{name}" for name in CALL_LOOP]
    forbidden = {f"{PACKAGE}.runtime.agent.workspace", f"{PACKAGE}.runtime.agent.agent", f"{PACKAGE}.runtime.agent"}
    assert {name: sorted(edges[name] & forbidden) for name in loop} == {name: [] for name in loop}
    assert f"{PACKAGE}.runtime.agent.lifecycle" not in edges[f"{PACKAGE}.runtime.agent.agent"]


def test_the_workspace_does_not_make_agents() -> None:
    assert f"{PACKAGE}.runtime.agent.agent" not in graph("runtime")[f"{PACKAGE}.runtime.agent.workspace"]


def test_the_call_loop_reaches_validation_and_the_sandbox_only_through_the_gate() -> None:
    """No module of the agent layer calls the guardrails' ``validate`` or a sandbox's ``execute`` itself."""
    offenders = []
    for name, path in modules("runtime/agent").items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("guardrails"):
                offenders += [f"{name} imports validate" for a in node.names if a.name == "validate"]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if node.func.attr == "execute" and isinstance(owner, ast.Attribute) and owner.attr == "sandbox":
                    offenders.append(f"{name} calls .sandbox.execute (line {node.lineno})")
    assert offenders == []
    assert "execute_approved" in (ROOT / "runtime/agent/execution.py").read_text(encoding="utf-8")
