"""What every container backend shares (docker and gvisor through dockerd, runc and runsc without it): the
runner's command line in the sandbox image, the user, the scratch directory, the gVisor headroom, names.

The walls themselves are stated per engine (``docker_backend`` asks dockerd, ``sandbox/oci_spec.py`` writes
the OCI spec); ``sandbox/protections.py`` holds what each backend provides and ``sandbox/verify.py`` how
the host checks it.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from sandforge.sandbox import image

#: The runner: the inside package, imported from its precompiled ``.pyc`` files (running a file as a script
#: would compile it anew in every container; docs/benchmarks.md has the cost), its start-up imports served
#: from the image's bundle of them (``inside/bundle.py``: one read instead of ~20 system calls per module,
#: each a trap into gVisor's sentry).
BOOTSTRAP = (
    f"import sys; sys.path.insert(0, {str(PurePosixPath(image.IMAGE_INSIDE).parent)!r}); "
    "import inside.bundle; inside.bundle.install(); import inside.start; inside.start.run(sys.argv[1:])"
)
COMMAND = ["python3", "-I", "-S", "-B", "-c", BOOTSTRAP, "--result-stdout"]
#: The interpreter in the sandbox image (an OCI runtime wants an absolute path).
PYTHON = "/usr/bin/python3"
SANDBOX_USER = "65534:65534"
#: The container's only writable place: a size-limited noexec tmpfs (inside the container, not the host's).
SCRATCH = "/tmp"  # noqa: S108
#: runsc's own threads and memory live in the container's cgroups: headroom on top of the program's limits
#: (the runner's rlimits still bound the program itself to ``limits``).
GVISOR_PIDS_HEADROOM = 112
GVISOR_MEMORY_HEADROOM_MB = 64

#: Docker containers carry ``LABEL=1`` and their owner (``sandbox/ownership.py``, ``host_owner``).
LABEL = "sandforge"
OWNER_LABEL = "sandforge.owner"
#: OCI containers and their bundles are named ``<ID_PREFIX>-<process tag>-<n>``.
ID_PREFIX = "sf"


__all__ = [
    "BOOTSTRAP", "COMMAND", "GVISOR_MEMORY_HEADROOM_MB", "GVISOR_PIDS_HEADROOM", "ID_PREFIX", "LABEL",
    "OWNER_LABEL", "PYTHON", "SANDBOX_USER", "SCRATCH",
]  # fmt: skip
