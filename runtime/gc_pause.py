"""One way to pause Python's cyclic garbage collector around work that allocates many small objects.

Decoding large JSON, loading thousands of store records or session rows, and analysing a program's AST
create containers that form no reference cycles (reference counting frees them), yet their allocations
trigger cyclic collections whose cost grows with the whole heap. Pausing the collector meanwhile is safe
and much faster. It lives here, beside ``runtime.names`` and ``runtime.errors``, so that every layer
(files, guardrails, store, sessions) can use it without importing another layer.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector for the ``with`` block; re-enable it after only if it was enabled
    before (so nested pauses, and a host that turned it off itself, are left as they were)."""
    enabled = gc.isenabled()
    if enabled:
        gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
