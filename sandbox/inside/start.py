"""The entry point of the inside: one runner (``--result-fd N`` or ``--result-stdout``) or a zygote
(``--zygote --control-fd N``), optionally re-executed in a user namespace first (``--userns``, rootless)."""

from __future__ import annotations

import os
import sys

from .channel import read_frame
from .lockdown import _reexec_in_user_namespace
from .serving import prepare, serve
from .wire import MAX_BOOT_BYTES
from .zygote import zygote


def main(argv: list[str]) -> int:
    if "--userns" in argv:
        _reexec_in_user_namespace(argv)
    if "--zygote" in argv:
        return zygote(int(argv[argv.index("--control-fd") + 1]))
    in_fd = int(argv[argv.index("--input-fd") + 1]) if "--input-fd" in argv else 0
    if "--result-stdout" in argv:
        out_fd = os.dup(1)
        os.dup2(2, 1)
    else:
        out_fd = int(argv[argv.index("--result-fd") + 1])
    boot = read_frame(in_fd, MAX_BOOT_BYTES)
    if boot.get("type") != "boot":
        raise SystemExit("expected a boot frame")
    return serve(in_fd, out_fd, boot, prepare(boot))


def run(argv: list[str]) -> None:
    """The process entry point: `main`, then exit at once.

    Skip interpreter finalization: the result is written, nothing else may run, and tearing down dozens of
    modules would add milliseconds before the host sees the channel close. Containers import this module
    from its precompiled ``.pyc`` (see ``images/Dockerfile``) instead of running the file as a script,
    which would compile it again in every container.
    """
    status = main(argv)
    sys.stdout.flush()
    os._exit(status)


if __name__ == "__main__":
    run(sys.argv[1:])
