"""Per-tenant admission: concurrent executions and executions per minute (sliding window), plus the daily
provider-call quota's state. Over a limit the caller answers 429 with ``Retry-After`` (whole seconds).

Admission runs on the event loop thread only (the HTTP app awaits nothing between check and take), so the
counters need no lock; :class:`Admission` is released by the request that took it.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sandforge.runtime.service.tenants import Quotas


class QuotaExceeded(Exception):
    """A tenant is over one of its quotas. ``retry_after_s`` is what the 429's Retry-After header says."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = max(1, retry_after_s)


def seconds_to_utc_midnight(now: datetime | None = None) -> int:
    now = now or datetime.now(UTC)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return math.ceil((midnight - now).total_seconds())


class TenantAdmission:
    """One tenant's counters."""

    def __init__(self, quotas: Quotas, clock: Callable[[], float] = time.monotonic) -> None:
        self.quotas = quotas
        self.running = 0
        self._starts: deque[float] = deque()
        self._clock = clock

    def admit(self) -> None:
        """Take one execution slot of this tenant, or raise :class:`QuotaExceeded`."""
        now = self._clock()
        while self._starts and self._starts[0] <= now - 60.0:
            self._starts.popleft()
        if self.running >= self.quotas.concurrent_executions:
            raise QuotaExceeded(
                f"too many executions at once (quota: {self.quotas.concurrent_executions})", retry_after_s=1
            )
        if len(self._starts) >= self.quotas.executions_per_minute:
            wait = math.ceil(self._starts[0] + 60.0 - now)
            raise QuotaExceeded(
                f"too many executions this minute (quota: {self.quotas.executions_per_minute})", retry_after_s=wait
            )
        self._starts.append(now)
        self.running += 1

    def release(self) -> None:
        self.running = max(0, self.running - 1)
