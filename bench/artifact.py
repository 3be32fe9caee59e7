"""The persisted-artifact workload: a tool method stored in the ToolStore, looked up and run per call."""

from __future__ import annotations

from bench.subjects import Validator
from bench.workloads import Workload


def artifact_workload(quick: bool, validator: Validator) -> tuple[Workload | None, str | None]:
    return None, "not implemented yet"
