"""The persisted-artifact workload: a tool method stored in the ToolStore, served from it and run per call.

One timed call is ``agent.call(method, ...)`` through the real lifecycle (``runtime.agent``): the program
source looks the artifact up in a ``ToolStore`` (``select``: read, checksum, policy), the lifecycle validates
it with the default policy, executes it in a fresh sandbox of the backend under test, commits the context,
and the store records the success (method file and registry rewritten under the store's lock).

The ToolStore is not wired into the lifecycle as a program source yet, so :class:`StoreSource` is the
bench's own few-line adapter over the public APIs of both (``ProgramStore`` protocol on one side,
``ToolStore.select/lookup/record_success`` on the other). Only our backends can run this workload: no peer
has a tool store.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.loops import Failed, Result
from bench.workloads import Program, Workload, program

ROLE, METHOD = "bench_counter", "bump"
RUNTIME_VERSION = "sandforge-bench-1"
ARTIFACT_CODE = """step = args[0] if args else 1
context['total'] = context.get('total', 0) + step
context['calls'] = context.get('calls', 0) + 1
return context['calls']
"""


class StoreSource:
    """A ``ProgramStore`` for the lifecycle backed by a ``ToolStore``: reuse when the store's policy says so."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.served = 0
        self.recorded = 0

    def lookup(self, request: Any) -> Any:
        from runtime.agent import ProgramCandidate
        from runtime.store import Decision

        selection = self.store.select(
            request.role, request.method, contract_fingerprint=None, runtime_version=RUNTIME_VERSION
        )
        if selection.decision != Decision.EXECUTE_PERSISTED:
            return None
        artifact = self.store.lookup(request.role, request.method).artifact
        if artifact is None:
            return None
        self.served += 1
        ref = f"{request.role}.{request.method}@{artifact.generation}"
        return ProgramCandidate(code=artifact.code, source="persisted", artifact_ref=ref)

    def record(self, candidate: Any, record: Any) -> None:
        if candidate is not None and candidate.source == "persisted" and record.status == "ok":
            self.store.record_success(record.role, record.method)
            self.recorded += 1


@dataclass
class ArtifactBench:
    """A temporary store holding one artifact, and the agents (one per sandbox) that call it."""

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sandforge-bench-store-")))
    agents: dict[int, Any] = field(default_factory=dict)
    sources: dict[int, StoreSource] = field(default_factory=dict)
    calls: int = 0

    def __post_init__(self) -> None:
        from runtime.store import ArtifactCandidate, ProgramSource, ToolStore, assess_cacheability

        self.store = ToolStore(self.root)
        candidate = ArtifactCandidate(
            role=ROLE,
            method_name=METHOD,
            code=ARTIFACT_CODE,
            runtime_version=RUNTIME_VERSION,
            cacheability=assess_cacheability(METHOD, ARTIFACT_CODE, [1]),
        )
        self.store.save_artifact(candidate, source=ProgramSource.GENERATED)

    def runner(self, sandbox: Any) -> Callable[[Program], Result]:
        """The timed call for one of our sandboxes; the provider must never be asked (it has no programs)."""
        from runtime.agent import Agent
        from runtime.providers import ScriptedProvider

        key = id(sandbox)
        if key not in self.agents:
            self.sources[key] = StoreSource(self.store)
            self.agents[key] = Agent.for_role(
                ROLE,
                provider=ScriptedProvider([]),
                sandbox=sandbox,
                store=self.sources[key],
                log=self.root / "calls.jsonl",
            )
        agent, source = self.agents[key], self.sources[key]

        def run_one(_: Program) -> Result:
            served = source.served
            outcome = agent.call(METHOD, 1)
            if source.served != served + 1:
                raise Failed("the call was not served from the store")
            if outcome.status != "ok":
                raise Failed(f"{outcome.error_type}: {outcome.error_message}")
            return Result(True)

        return run_one

    def close(self) -> None:
        for agent in self.agents.values():
            agent.workspace.close()
        shutil.rmtree(self.root, ignore_errors=True)


def artifact_workload() -> tuple[Workload | None, ArtifactBench | None, str | None]:
    """The workload and its store, or why it cannot run in this checkout."""
    try:
        bench = ArtifactBench()
    except Exception as exc:  # the store or the lifecycle is missing or changed shape
        return None, None, f"ToolStore/lifecycle not usable here ({type(exc).__name__}: {exc})"
    work = Workload(
        "persisted_artifact",
        "persisted-artifact call: ToolStore select -> validate -> execute -> commit -> record_success",
        (program("return True"),),
        notes="ours only (no peer has a tool store); value checked: served from the store and status ok",
    )
    return work, bench, None
