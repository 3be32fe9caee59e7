"""Workspace: the runtime shared by every agent of a process (sandbox, provider, policy, registry, log)."""

from __future__ import annotations

import json
import logging
import os
import random
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import JsonValue

from sandforge.runtime.agent.awaited import awaited_port
from sandforge.runtime.agent.bounds import check_arguments
from sandforge.runtime.agent.budgets import Budgets
from sandforge.runtime.agent.callgate import CallGate
from sandforge.runtime.agent.calllog import STORE_FIELDS, CallLog, CallRecord, default_log_path
from sandforge.runtime.agent.contracts import check_contract, check_inputs
from sandforge.runtime.agent.env import CallEnv, CallSpec
from sandforge.runtime.agent.environment import Environments
from sandforge.runtime.agent.lifecycle import CallRun
from sandforge.runtime.agent.outcome import Outcome
from sandforge.runtime.agent.persistence import ToolStoreSource
from sandforge.runtime.agent.source import ProgramStore
from sandforge.runtime.agent.state import CommitConflict, StagedRecord, State, ToolContract
from sandforge.runtime.agent.statedb import DB_FILE_NAME, Committed, StateDB, StateDBError
from sandforge.runtime.agent.trace_budget import TraceBudget
from sandforge.runtime.errors import InputFileError
from sandforge.runtime.gate import SandboxPort
from sandforge.runtime.guardrails import Policy, default_policy
from sandforge.runtime.providers.base import Provider
from sandforge.runtime.store import ToolStore
from sandforge.runtime.store.errors import StoreError
from sandforge.runtime.store.models import ToolFiles
from sandforge.sandbox import ExecutionRequest, Limits, Sandbox, SandboxConfig
from sandforge.sandbox.config import BackendName
from sandforge.sandbox.context import ContextError, ContextSnapshot

#: Input files as a caller gives them: name -> bytes, or a path read when the call starts (``sandbox/files.py``).
FileInputs = Mapping[str, bytes | os.PathLike[str]]

if TYPE_CHECKING:
    from sandforge.runtime.egress.broker import EgressBroker

log = logging.getLogger(__name__)

LogSpec = CallLog | Path | str | None | Literal[False]
#: how much of the call log's end is searched for the lines of records a stopped process may have written
UNLOGGED_TAIL_BYTES = 8 << 20
#: re-runs of a call whose commit another process keeps changing underneath (then a retriable state_conflict)
RERUNS = 10


def as_json(value: Any, what: str) -> Any:
    """A JSON round-tripped copy of ``value``; TypeError if it is not JSON (context must cross the wall)."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serializable: {exc}") from None


def as_snapshot(context: dict[str, Any], what: str) -> ContextSnapshot:
    """``context`` encoded key by key; TypeError if it is not JSON (as :func:`as_json`).

    Top-level keys that are not strings are converted the way ``json.dumps`` converts them, as before."""
    try:
        return ContextSnapshot.from_dict(context)
    except ContextError:
        return ContextSnapshot.from_dict(as_json(context, what))


def _log_tail(path: Path | None, size: int = UNLOGGED_TAIL_BYTES) -> bytes:
    """The last ``size`` bytes of the call log (empty when there is none or it cannot be read)."""
    if path is None:
        return b""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO in its place cannot hang this
    except OSError:
        return b""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return b""
        return os.pread(fd, size, max(0, st.st_size - size))
    except OSError:
        return b""
    finally:
        os.close(fd)


class Workspace:
    """Holds what agents share and runs their calls. Thread-safe: calls of different roles run at once, calls
    of one role in turn, and a commit never loses another call's update (``runtime/agent/callgate.py``).

    Agents are made by ``Agent.for_role(role, workspace=ws)``; a call sees only the :class:`CallEnv`
    the workspace gives it (:meth:`call_env`), never the workspace itself.

    ``sandbox`` may be a Sandbox (shared, not closed here), a SandboxConfig or a backend name (a Sandbox is
    created and closed by :meth:`close`). ``log`` is a CallLog, a path, None (the default log file, see
    ``sandforge logs``) or False (keep records in memory only). ``store`` is a ``runtime.store.ToolStore``
    (wrapped in :class:`~runtime.agent.persistence.ToolStoreSource`: artifacts, repair, pattern memory,
    known tools; see docs/toolstore.md) or any :class:`ProgramStore`. ``trace_budget`` bounds what one
    top-level call may spend with all its nested calls (see docs/security.md, "Trace budget"). Programs
    fetch through ``egress`` when given, else through the policy's own broker (docs/lifecycle.md, "Brokered
    requests"); a policy that does not grant ``http_fetch`` reaches nothing either way.

    Committed contexts live in memory unless ``state_dir`` is given: then in ``<state_dir>/state.db``
    (:mod:`~runtime.agent.statedb`), written in the same transaction as the records of the calls that
    changed them, shared with every other process opening that directory, and kept across restarts.
    """

    def __init__(
        self,
        *,
        provider: Provider,
        sandbox: Sandbox | SandboxConfig | BackendName | None = None,
        backend: BackendName | None = None,
        policy: Policy | None = None,
        log: LogSpec = None,
        store: ProgramStore | ToolStore | None = None,
        limits: Limits | None = None,
        budgets: Budgets | None = None,
        trace_budget: TraceBudget | None = None,
        egress: EgressBroker | None = None,
        environments: Environments | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.provider = provider
        #: the broker programs fetch through (None: the policy's own; runtime/agent/egress.py)
        self.egress = egress
        #: where programs' declared environments are built and found (None: ``<state dir>/environments``)
        self.environments = environments
        self.budgets = budgets or Budgets()
        #: what one top-level call and all its nested calls may spend (default: TraceBudget.from_env())
        self.trace_budget = trace_budget if trace_budget is not None else TraceBudget.from_env()
        self._owns_store = isinstance(store, ToolStore)
        self.store: ProgramStore | None = ToolStoreSource(store) if isinstance(store, ToolStore) else store
        self.policy = policy if policy is not None else default_policy()
        self._owns_sandbox = sandbox is None or isinstance(sandbox, (str, SandboxConfig))
        if sandbox is None or isinstance(sandbox, str):
            name = backend or sandbox
            self.sandbox = Sandbox(SandboxConfig.from_env(**({"backend": name} if name else {})))
        elif isinstance(sandbox, SandboxConfig):
            self.sandbox = Sandbox(sandbox)
        else:
            self.sandbox = sandbox
        self.backend: BackendName | None = backend
        self.limits = limits or self.sandbox.config.limits
        if isinstance(log, CallLog):
            self.log = log
        elif log is False:
            self.log = CallLog(None)
        else:
            self.log = CallLog(default_log_path() if log is None else Path(log))
        self._db = StateDB(Path(state_dir) / DB_FILE_NAME) if state_dir is not None else None
        self._state = State(self._commit_records, self._commit_tools, self._db)
        if self._db is not None:
            self._log_unlogged(self._db)
        self._gate = CallGate()  # calls of different roles at once, one role's in turn (runtime/agent/callgate.py)

    @property
    def tool_store(self) -> ToolStore | None:
        """The ToolStore behind ``store``, when it is one."""
        return self.store.store if isinstance(self.store, ToolStoreSource) else None

    @property
    def provider_name(self) -> str:
        return str(getattr(self.provider, "name", type(self.provider).__name__))

    @property
    def backend_name(self) -> str:
        return self.backend or self.sandbox.config.backend

    # --- calls ---

    def call_env(self) -> CallEnv:
        """What one call may use: this workspace's runtime as it is now (read per call, so a provider or
        policy assigned to the workspace applies from the next call on). A call made for an awaiting task
        (``runtime/agent/awaited.py``) gets the sandbox through that task's loop."""
        sandbox: SandboxPort = awaited_port(self.sandbox) or self.sandbox
        return CallEnv(
            provider=self.provider, provider_name=self.provider_name, policy=self.policy, sandbox=sandbox,
            backend=self.backend, limits=self.limits, budgets=self.budgets, trace_budget=self.trace_budget,
            store=self.store, state=self._state, records=self._commit_records, egress=self.egress,
            environments=self.environments,
        )  # fmt: skip

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Outcome:
        """One top-level dynamic call: ``role.method(*args, **kwargs)``. Never raises for tool failures."""
        return self._call(self._spec(role, method, args, kwargs))

    def call_with_files(self, role: str, method: str, files: FileInputs, /, *args: Any, **kwargs: Any) -> Outcome:
        """:meth:`call` with input files (name -> bytes or a ``pathlib.Path``, read now): each attempt's program
        reads them as ``inputs/NAME``; the ``outputs/`` files of the attempt that succeeds come back as
        ``Outcome.files``, committed with its context (a failed attempt's never). A separate method, so no
        tool keyword argument is ever taken for the files. Files past ``limits`` (``max_files``,
        ``max_file_bytes``, ``max_files_bytes``, ``disk_mb``), a bad name or an unreadable path raise
        ``pydantic.ValidationError`` before anything runs; a file whose bytes are not the media type the role's
        contract declares for it raises ``InputFileError``."""
        checked = ExecutionRequest(code="", files=files, limits=self.limits).files  # the sandbox's own checks
        with self._state.lock:
            contract = self._state.tools.get(role)
        problem = check_inputs(contract.files if contract is not None else None, checked)
        if problem is not None:  # bytes that are not the media type the contract declares: nothing runs
            raise InputFileError(problem)
        return self._call(self._spec(role, method, args, kwargs, checked))

    @staticmethod
    def _spec(role: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
              files: dict[str, bytes] | None = None) -> CallSpec:  # fmt: skip
        check_arguments(list(args), dict(kwargs))  # before json: a lone surrogate passes json.dumps
        call_args = as_json(list(args), "call arguments")
        call_kwargs = as_json(dict(kwargs), "call keyword arguments")
        return CallSpec(role=role, method=method, args=call_args, kwargs=call_kwargs, files=files or {})

    def _call(self, spec: CallSpec) -> Outcome:
        role, method = spec.role, spec.method
        with self._gate.shared(role):
            try:
                return CallRun.top(self.call_env(), spec).run()
            except CommitConflict as exc:
                log.info("call %s.%s runs again: %s", role, method, exc)
                if self._gate.nested:  # a call made inside a call cannot wait for the gate it holds itself
                    return self._run_unchecked(spec)
        with self._gate.exclusive():
            return self._run_unchecked(spec)

    def _run_unchecked(self, spec: CallSpec) -> Outcome:
        """Run ``spec`` again, unchecked against this process's calls: the gate is exclusive (or this thread
        already holds it).

        With a state database another process may still commit underneath: that commit is refused too and the
        call runs again after a short random wait, up to ``RERUNS`` times. A call that never gets a clean commit
        answers a retriable ``state_conflict`` error: the other process's update is never overwritten."""
        self._state.unchecked.on = True
        try:
            for attempt in range(RERUNS):
                try:
                    return CallRun.top(self.call_env(), spec).run()
                except CommitConflict as exc:
                    log.info("call %s.%s runs again: %s", spec.role, spec.method, exc)
                    time.sleep(random.uniform(0, min(0.5, 0.02 * 2**attempt)))  # noqa: S311 (jitter, not a secret)
                    conflict = exc
            return Outcome(status="error", error_type="state_conflict", retriable=True, tool_role=spec.role,
                           method_name=spec.method, error_message=f"{conflict}, {RERUNS} times: nothing was "
                           "committed; call again")  # fmt: skip
        finally:
            self._state.unchecked.on = False

    # --- committed state ---

    def context(self, role: str) -> dict[str, JsonValue]:
        """A copy of the committed context of ``role``."""
        return self.context_snapshot(role).to_dict()

    def context_snapshot(self, role: str) -> ContextSnapshot:
        """The committed context of ``role`` as it is kept: each key's JSON text, nothing decoded."""
        return self.committed(role).snapshot

    def committed(self, role: str) -> Committed:
        """The committed context of ``role`` with its version and entity tag (``GET /v1/roles/ROLE/context``)."""
        with self._state.lock:
            return self._state.read(role)

    def set_context(self, role: str, context: dict[str, JsonValue]) -> None:
        """Replace the committed context of ``role`` (no model call)."""
        self.replace_context(role, context)

    def replace_context(
        self, role: str, context: dict[str, JsonValue], if_match: str | None = None
    ) -> tuple[Committed, bool]:
        """Replace the committed context of ``role`` unless ``if_match`` (an ``If-Match`` value) names another
        version than the committed one: ``(the context now, replaced)``. TypeError if it is not a JSON object."""
        if not isinstance(context, dict):
            raise TypeError("a context is a dict")
        return self._state.replace(role, as_snapshot(context, "the context"), if_match)

    def update_context(self, role: str, key: str, value: Any) -> None:
        change = as_snapshot({key: value}, f"context value {key!r}")
        with self._state.lock:
            self._state.replace(role, self._state.read(role).snapshot.with_changes(change))

    def delete_context(self, role: str, key: str) -> None:
        with self._state.lock:
            current = self._state.read(role).snapshot
            if key not in current:
                raise KeyError(key)
            self._state.replace(role, current.with_changes({}, [key]))

    @property
    def tools(self) -> dict[str, ToolContract]:
        """The committed tool registry: role -> contract (registered by ``delegate(...)`` or here)."""
        with self._state.lock:
            return dict(self._state.tools)

    def register_tool(self, role: str, *, purpose: str | None = None, deliverable: JsonValue = None,
                      acceptance: JsonValue = None, failure_policy: JsonValue = None,
                      inputs: JsonValue = None, files: ToolFiles | Mapping[str, Any] | None = None,
                      ) -> ToolContract:  # fmt: skip
        """``inputs``: typed parameters per method (``{"fetch": [{"name": "url", "type": "string"}]}``), which
        MCP clients see as the stored tool's input schema. InvalidContract when they are not usable.
        ``files``: what its calls take and produce (``{"takes": [{"name": "data.csv"}], "produces": [{"name":
        "chart.png", "media_type": "image/png"}]}``, :class:`ToolFiles`); an ok run missing a required output
        is a contract violation. pydantic's ValidationError when they are not valid."""
        declared = ToolFiles.model_validate(files) if files is not None else None
        contract = ToolContract(role=role, purpose=purpose, deliverable=deliverable, acceptance=acceptance,
                                failure_policy=failure_policy, inputs=inputs, files=declared)  # fmt: skip
        check_contract(contract)
        with self._state.lock:
            self._state.tools[role] = contract
        self._commit_tools({role: contract})
        return contract

    # --- records ---

    def _commit_records(self, staged: list[StagedRecord]) -> None:
        """The store sees each committed record first (it may add its fields), then the log gets it."""
        logged: list[tuple[str, str]] = []
        for item in staged:
            record = item.record
            if self.store is not None:
                plan = item.plan
                hook = plan.on_record if plan is not None and plan.on_record is not None else self.store.record
                try:
                    updated = hook(item.candidate, record)
                except StoreError as exc:  # a refusal the store raised on purpose: one line, no traceback
                    log.warning("program store did not record call %s: %s", record.call_id, exc)
                except Exception:
                    log.exception("program store failed to record call %s", record.call_id)
                else:
                    if isinstance(updated, CallRecord) and updated is not record:
                        record = record.model_copy(update={k: getattr(updated, k) for k in STORE_FIELDS})
            if (problem := self.log.write(record)) is not None:  # stays unlogged: recovery and pruning skip it
                log.warning("cannot write the call log %s: %s", self.log.path, problem)
                continue
            logged.append((record.call_id, record.model_dump_json()))
        if self._db is not None and logged:
            try:
                self._db.logged([cid for cid, _ in logged], [text for _, text in logged])
            except StateDBError as exc:  # the record stays unlogged: the next process appends it again
                log.warning("%s", exc)

    def _log_unlogged(self, db: StateDB) -> None:
        """Records committed by a process that died before it appended them to the call log. One that died after
        appending but before marking it logged left its line at the log's end: the tail is looked at first, so
        no record is written twice."""
        pending = db.unlogged()
        if not pending:
            return
        tail = _log_tail(self.log.path)
        for call_id, text in pending:
            if f'"call_id":{json.dumps(call_id)}'.encode() not in tail:
                self.log.append(CallRecord.model_validate_json(text))
        log.info("call log: %d committed record(s) of a stopped process checked and written", len(pending))
        db.logged([cid for cid, _ in pending])

    def _commit_tools(self, tools: dict[str, ToolContract]) -> None:
        """Committed contracts go to the store's registry when it keeps one (``register_tool``)."""
        register = getattr(self.store, "register_tool", None)
        if register is None:
            return
        for contract in tools.values():
            try:
                register(contract)
            except StoreError as exc:
                log.warning("program store did not register tool %r: %s", contract.role, exc)
            except Exception:
                log.exception("program store failed to register tool %r", contract.role)

    # --- lifetime ---

    def close(self) -> None:
        if self._owns_store and isinstance(self.store, ToolStoreSource):
            try:
                self.store.close()  # writes the successes still queued
            except Exception:
                log.exception("could not write pending ToolStore successes")
        if self._owns_sandbox:
            self.sandbox.close()
        if self._db is not None:
            self._db.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
