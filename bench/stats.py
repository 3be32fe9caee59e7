"""Samples and their summaries (percentiles by linear interpolation, like numpy's default)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass
class Series:
    """Latencies (seconds) of successful executions, plus what went wrong and the peak memory seen."""

    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    peak_mb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def ok(self, seconds: float, peak_mb: float | None = None) -> None:
        self.latencies_s.append(seconds)
        if peak_mb is not None:
            self.peak_mb = max(self.peak_mb or 0.0, peak_mb)

    def fail(self, message: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 3:
            self.error_samples.append(message[:300])

    def summary(self) -> dict[str, Any]:
        ms = [v * 1000 for v in self.latencies_s]
        return {
            "n": len(ms),
            "errors": self.errors,
            "p50_ms": _round(percentile(ms, 50)),
            "p95_ms": _round(percentile(ms, 95)),
            "p99_ms": _round(percentile(ms, 99)),
            "mean_ms": _round(sum(ms) / len(ms)) if ms else None,
            "peak_mb": _round(self.peak_mb),
            "error_samples": self.error_samples,
            **self.extra,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Series:
        s = cls(
            latencies_s=[float(v) for v in data.get("latencies_s", [])],
            errors=int(data.get("errors", 0)),
            error_samples=[str(e) for e in data.get("error_samples", [])],
            peak_mb=data.get("peak_mb"),
        )
        s.extra = dict(data.get("extra", {}))
        return s


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass
class Throughput:
    completed: int = 0
    errors: int = 0
    wall_s: float = 0.0
    concurrency: int = 1
    error_samples: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def per_s(self) -> float:
        return self.completed / self.wall_s if self.wall_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "exec_per_s": round(self.per_s, 2),
            "completed": self.completed,
            "errors": self.errors,
            "wall_s": round(self.wall_s, 3),
            "concurrency": self.concurrency,
            "error_samples": self.error_samples,
            **self.extra,
        }
