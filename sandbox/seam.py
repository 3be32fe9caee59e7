"""The tests' and the benchmark's seam into the runner: never configuration, never a request field.

``ACTIVE`` is None in production. A test or ``bench/bench_compat.py`` sets it (``monkeypatch.setattr``) to
start runners without the tripwire (``tripwire_off``: the benchmark's side-by-side run, and the tests that
show which layer stopped an attack) or with the real standard-library callables in place of the runner's
wrappers or one of the runner's own layers reverted (``unwrapped``: a fix reverted, to show that the tripwire
still ends the run: the name check before the class generators, the packages' withheld names, wrappers and
unpickling floor). The boot frame
carries it (``BootFrame.seam``): built by the host only, from this module, never from a program, a context
value, a tool contract or a ``SandboxConfig``.
"""

from __future__ import annotations

from sandforge.sandbox.protocol import BootSeam

ACTIVE: BootSeam | None = None


def tripwire_off() -> bool:
    return ACTIVE is not None and ACTIVE.tripwire_off


__all__ = ["ACTIVE", "BootSeam", "tripwire_off"]
