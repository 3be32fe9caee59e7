"""Pattern memory (ADR 0013 section 5, implementation plan phases 1 to 4).

``tools/patterns.json`` keeps, per role, the capability labels of its last N generated or repaired calls
(default N = 50). Events are stored OLDEST FIRST, NEWEST LAST: a new event is appended, the front is
trimmed. Writes are atomic under ``.patterns.lock``; a corrupt file is quarantined and memory starts empty.

The memory only observes. It feeds two prompt blocks and one log signal, all bounded and deterministic:

- ``<recent_patterns>`` for depth-0 calls of dynamic dispatch methods (labels, counts, whether a tool
  provides the capability; never code), plus a nudge to Forge when a promotion candidate exists;
- ``promotion_candidate_detected`` / ``promotion_candidate_capabilities``: a label seen at least
  ``threshold`` times (default 2) in the last ``window`` calls (default 5) with no tool registered.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Literal

from filelock import FileLock
from pydantic import BaseModel, ConfigDict

from sandforge.runtime.store import record_files
from sandforge.runtime.store.cacheability import DEFAULT_DYNAMIC_METHODS
from sandforge.runtime.store.migrations import PATTERNS
from sandforge.runtime.store.models import PATTERNS_SCHEMA_VERSION, PatternEvent, PatternsFile, RolePatterns
from sandforge.runtime.store.paths import StorePaths, check_name

DEFAULT_WINDOW_CAP = 50
DEFAULT_SUMMARY_WINDOW = 5
DEFAULT_PROMOTION_THRESHOLD = 2
DEFAULT_TOP_N = 5
AGGREGATE_WINDOWS = (5, 10)
MAX_LABELS_PER_EVENT = 16
NUDGE = "If a general capability repeats and no Tool exists, consider Forging now."

_LABEL = re.compile(r"^[a-z0-9][a-z0-9_.:-]{0,39}$")
_UNSAFE_TEXT = re.compile(r"[<>&\x00-\x1f\x7f]")


def normalize_label(label: str) -> str | None:
    """Capability labels are short tags (``rss_parse``); anything else is dropped, not stored."""
    label = label.strip().lower()
    return label if _LABEL.match(label) else None


def safe_text(text: str, limit: int = 40) -> str:
    """Text fit for a prompt block: no markup characters, no control characters, one line, bounded."""
    text = text.encode("utf-8", "replace").decode("utf-8")  # lone surrogates cannot be stored or sent
    text = " ".join(_UNSAFE_TEXT.sub(" ", text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class PatternCount(BaseModel):
    model_config = ConfigDict(frozen=True)

    label: str
    count: int


class PatternSummary(BaseModel):
    """Label counts over the last ``window`` calls of ``method_name`` (all methods if None) of ``role``."""

    model_config = ConfigDict(frozen=True)

    role: str
    method_name: str | None
    window: int
    #: Calls actually in the window (fewer than ``window`` early on).
    calls: int
    #: Most frequent first, ties by label.
    counts: list[PatternCount]


class PromotionSignal(BaseModel):
    model_config = ConfigDict(frozen=True)

    detected: bool
    capabilities: list[str]
    threshold: int
    window: int


def summarize(
    role: str, events: Sequence[PatternEvent], *, method_name: str | None = None, window: int = DEFAULT_SUMMARY_WINDOW
) -> PatternSummary:
    """Pure: summarize ``events`` (oldest first) for the prompt and the promotion signal."""
    window = max(1, window)
    chosen = [e for e in events if method_name is None or e.method_name == method_name][-window:]
    counter: Counter[str] = Counter()
    for event in chosen:
        counter.update(set(event.capability_patterns))  # a label counts once per call
    counts = [PatternCount(label=k, count=v) for k, v in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))]
    return PatternSummary(role=role, method_name=method_name, window=window, calls=len(chosen), counts=counts)


def promotion_signal(
    summary: PatternSummary,
    tool_index: Mapping[str, Sequence[str]],
    *,
    threshold: int = DEFAULT_PROMOTION_THRESHOLD,
) -> PromotionSignal:
    """Labels seen ``>= threshold`` times in the summary's window that no registered tool provides."""
    caps = [c.label for c in summary.counts if c.count >= threshold and not tool_index.get(c.label)]
    return PromotionSignal(detected=bool(caps), capabilities=caps, threshold=threshold, window=summary.window)


def render_recent_patterns(
    summary: PatternSummary,
    *,
    depth: int,
    tool_index: Mapping[str, Sequence[str]],
    dynamic_methods: Iterable[str] = DEFAULT_DYNAMIC_METHODS,
    top_n: int = DEFAULT_TOP_N,
    threshold: int = DEFAULT_PROMOTION_THRESHOLD,
) -> str | None:
    """The ``<recent_patterns>`` block, or None: depth > 0, a stable method, or nothing observed yet.

    One line per label (top ``top_n``): ``- rss_parse: seen 3 of last 5 ask calls, tool_present=false``.
    The nudge line is added only when a promotion candidate exists (repeated, and no tool present).
    """
    method = summary.method_name
    if depth != 0 or method is None or method not in frozenset(dynamic_methods):
        return None
    if summary.calls == 0 or not summary.counts:
        return None
    label_calls = f"{safe_text(method, 24)} calls"
    lines = ["<recent_patterns>"]
    for item in summary.counts[: max(1, top_n)]:
        tools = sorted(tool_index.get(item.label, ()))
        present = f"true({', '.join(safe_text(t) for t in tools[:3])})" if tools else "false"
        lines.append(f"- {item.label}: seen {item.count} of last {summary.calls} {label_calls}, tool_present={present}")
    lines.append("</recent_patterns>")
    if promotion_signal(summary, tool_index, threshold=threshold).detected:
        lines.append(NUDGE)
    return "\n".join(lines)


def _window_counts(events: Sequence[PatternEvent]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for w in AGGREGATE_WINDOWS:
        counter: Counter[str] = Counter()
        for event in events[-w:]:
            counter.update(set(event.capability_patterns))
        out[str(w)] = dict(sorted(counter.items()))
    return out


class PatternMemory:
    """The ``tools/patterns.json`` file: record events, read summaries. Safe across processes."""

    def __init__(
        self,
        paths: StorePaths,
        *,
        window_cap: int = DEFAULT_WINDOW_CAP,
        lock_timeout: float = 30.0,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        if window_cap < 1:
            raise ValueError("window_cap must be at least 1")
        self.paths = paths
        self.window_cap = window_cap
        self._clock = clock or (lambda: datetime.now(UTC))
        self._lock = FileLock(paths.patterns_lock, timeout=lock_timeout, mode=0o600)
        self._cache: record_files.DecodeCache[PatternsFile] = record_files.DecodeCache()

    def _load(self) -> PatternsFile:
        loaded = record_files.load(self.paths.patterns, PATTERNS, lock=self._lock, now=self._clock, cache=self._cache)
        return loaded.value or PatternsFile(schema_version=PATTERNS_SCHEMA_VERSION)

    def record(
        self,
        role: str,
        method_name: str,
        capability_patterns: Iterable[str],
        *,
        outcome_status: Literal["ok", "error"] = "ok",
        error_type: str | None = None,
    ) -> PatternEvent:
        """Append one call's labels to the role's window (trimmed to ``window_cap``, newest last)."""
        check_name(role, "role")
        check_name(method_name, "method name")
        labels = sorted({lab for raw in capability_patterns if (lab := normalize_label(raw)) is not None})
        event = PatternEvent(
            timestamp=self._clock(),
            method_name=method_name,
            capability_patterns=labels[:MAX_LABELS_PER_EVENT],
            outcome_status=outcome_status,
            error_type=safe_text(error_type, 80) if error_type is not None else None,
        )
        with record_files.locked(self._lock):
            current = self._load()
            events = [*(current.roles[role].events if role in current.roles else []), event][-self.window_cap :]
            roles = dict(current.roles)
            roles[role] = RolePatterns(events=events, window_counts=_window_counts(events))
            record_files.write(
                self.paths.patterns,
                PatternsFile(schema_version=PATTERNS_SCHEMA_VERSION, roles=roles),
                self._cache,
            )
        return event

    def roles(self) -> list[str]:
        return sorted(self._load().roles)

    def roles_events(self) -> dict[str, list[PatternEvent]]:
        """Every role's events from one read of the file (the dashboard's patterns page)."""
        return {role: list(patterns.events) for role, patterns in self._load().roles.items()}

    def events(self, role: str) -> list[PatternEvent]:
        """The role's events, oldest first (newest last)."""
        data = self._load()
        return list(data.roles[role].events) if role in data.roles else []

    def recent_patterns_for(
        self, role: str, method_name: str | None = None, window: int = DEFAULT_SUMMARY_WINDOW
    ) -> PatternSummary:
        return summarize(role, self.events(role), method_name=method_name, window=window)
