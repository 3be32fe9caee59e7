"""The Overview's summary updated with a few changed rows (a fresh process after another's write) is exactly the
summary of every row, or refused when the methods it would have to list next are not known."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sandforge.runtime.dashboard.boardsnap import FLAGGED_SHOWN, Mark, ToolSnap, summarize_board
from sandforge.runtime.dashboard.toolhealth import BADGE_ORDER, worst

badges = st.sampled_from(["degraded", "stale", "degraded", "stale", *BADGE_ORDER])  # many flagged: lists overflow
marks = st.lists(st.tuples(st.sampled_from(["run", "ask", "go"]), badges, st.sampled_from([0.0, 0.1, 0.3, 0.5])),
                 max_size=3, unique_by=lambda m: m[0])  # fmt: skip


def _snap(role: str, ms: list[tuple[str, str, float]]) -> ToolSnap:
    made = tuple(Mark(m, b, r) for m, b, r in ms)  # type: ignore[arg-type]
    return ToolSnap(role, None, 0, 0, 0.0, (), made, b"d" * 16, worst([m.badge for m in made]),
                    max((m.rate for m in made), default=0.0))  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    before=st.dictionaries(st.sampled_from([f"t{i:02d}" for i in range(40)]), marks, max_size=40),
    changes=st.dictionaries(st.sampled_from([f"t{i:02d}" for i in range(45)]), marks, max_size=12),
)
def test_an_updated_summary_is_the_summary_of_every_row(
    before: dict[str, list[tuple[str, str, float]]], changes: dict[str, list[tuple[str, str, float]]]
) -> None:
    old_rows = {r: _snap(r, m) for r, m in before.items()}
    new = [_snap(r, m) for r, m in changes.items()]
    after_rows = sorted({**old_rows, **{t.role: t for t in new}}.values(), key=lambda t: t.role)
    stored = summarize_board(sorted(old_rows.values(), key=lambda t: t.role))
    updated = stored.updated({r: old_rows[r] for r in changes if r in old_rows}, new)
    expected = summarize_board(after_rows)
    if updated is None:  # refused only when a listed method left and more were flagged than listed
        kept = [f for f in stored.flagged if f[0] not in changes]
        assert len(kept) < FLAGGED_SHOWN < stored.flagged_total
    else:
        assert updated == expected


def test_a_listed_method_leaving_a_full_list_is_refused_not_guessed() -> None:
    rows = [_snap(f"t{i:02d}", [("run", "degraded", 0.01 * (i + 1))]) for i in range(FLAGGED_SHOWN + 5)]
    stored = summarize_board(rows)
    top = stored.flagged[0][0]
    healed = _snap(top, [("run", "healthy", 0.0)])
    assert stored.updated({top: next(t for t in rows if t.role == top)}, [healed]) is None  # the 21st is not known
    last = rows[0]  # flagged, but ranked past the list: its change is known exactly
    assert last.role not in {r for r, _ in stored.flagged}
    updated = stored.updated({last.role: last}, [_snap(last.role, [("run", "healthy", 0.0)])])
    assert updated == summarize_board([_snap(last.role, [("run", "healthy", 0.0)]), *rows[1:]])
