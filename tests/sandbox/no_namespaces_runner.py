"""Test-only runner: the real runner on a machine where namespaces cannot be created.

Every ``unshare`` fails with EPERM, as it does without root when unprivileged user namespaces are disabled
(``kernel.unprivileged_userns_clone=0``, ``user.max_user_namespaces=0``, or a seccomp profile that denies
them). The rest of the lock-down (rlimits, no_new_privs, seccomp) still works, so the host must refuse
the worker for what is missing, never run it with the walls it has.
"""

import ctypes
import errno
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sandbox"))
from inside import lockdown, start


class _NoNamespaces:
    def __init__(self, libc):
        self._libc = libc

    def __getattr__(self, name):
        return getattr(self._libc, name)

    def unshare(self, flags):
        ctypes.set_errno(errno.EPERM)
        return -1


_real_libc = lockdown._libc
lockdown._libc = lambda: _NoNamespaces(_real_libc())

if __name__ == "__main__":
    os._exit(start.main(sys.argv[1:]))
