"""The bounded ``<known_tools>`` prompt block (ADR 0012 sections 7 and 8): top-N by recency and utility.

Score (0..1, higher first; ties by role):

    0.5 * recency      0.5 ** (days since last use, or since creation, / half_life_days)
  + 0.3 * reliability  (successes + 1) / (successes + intrinsic failures + 2)   (Laplace; extrinsic ignored)
  + 0.2 * usage        log(1 + usage_count) / log(1 + 100), capped at 1

The full registry stays on disk; only the working set reaches the prompt.
"""

from __future__ import annotations

import heapq
import json
import math
import re
from collections.abc import Iterable
from datetime import datetime

from sandforge.runtime.store.models import RegistryEntry
from sandforge.runtime.store.patterns import safe_text

DEFAULT_TOP_N = 10
DEFAULT_HALF_LIFE_DAYS = 14.0
MAX_PURPOSE_CHARS = 120
_PLAIN_NAME = re.compile(r"^[\w][\w .:/-]{0,63}$")


def utility_score(entry: RegistryEntry, now: datetime, *, half_life_days: float = DEFAULT_HALF_LIFE_DAYS) -> float:
    ref = entry.last_used_at or entry.created_at
    age_days = max((now - ref).total_seconds() / 86400.0, 0.0)
    recency: float = 0.5 ** (age_days / half_life_days)
    reliability = (entry.success_count + 1) / (entry.success_count + entry.intrinsic_failure_count + 2)
    usage = min(math.log1p(entry.usage_count) / math.log1p(100), 1.0)
    return 0.5 * recency + 0.3 * reliability + 0.2 * usage


def rank_known_tools(
    entries: Iterable[RegistryEntry],
    *,
    now: datetime,
    top_n: int = DEFAULT_TOP_N,
    exclude_roles: Iterable[str] = (),
    contracted_only: bool = False,
    half_life_days: float = DEFAULT_HALF_LIFE_DAYS,
) -> list[RegistryEntry]:
    excluded = frozenset(exclude_roles)
    pool = (e for e in entries if e.role not in excluded and (e.has_contract or not contracted_only))
    return heapq.nsmallest(
        max(0, top_n), pool, key=lambda e: (-utility_score(e, now, half_life_days=half_life_days), e.role)
    )


def display_name(role: str) -> str:
    """The role as the model should write it in ``tool("...")``: plain, or JSON-quoted if unusual."""
    if _PLAIN_NAME.match(role):
        return role
    return json.dumps(role[:64]).replace("<", "\\u003c").replace(">", "\\u003e")


def render_known_tools(entries: Iterable[RegistryEntry], *, max_purpose_chars: int = MAX_PURPOSE_CHARS) -> str | None:
    """``<known_tools>`` for already ranked and bounded ``entries``; None when there are none."""
    lines = ["<known_tools>"]
    for e in entries:
        parts = [f"- {display_name(e.role)}"]
        if e.purpose:
            parts.append(f": {safe_text(e.purpose, max_purpose_chars)}")
        details = []
        if e.methods:
            shown = ", ".join(safe_text(m, 32) for m in e.methods[:6])
            details.append(f"methods: {shown}" + (", ..." if len(e.methods) > 6 else ""))
        if e.usage_count:
            ok = e.success_count / max(e.success_count + e.intrinsic_failure_count, 1)
            details.append(f"used {e.usage_count}x, {ok:.0%} ok")
        if details:
            parts.append(f" ({'; '.join(details)})")
        lines.append("".join(parts))
    if len(lines) == 1:
        return None
    lines.append("</known_tools>")
    return "\n".join(lines)
