"""``ray start``/``ray stop`` for a cluster that lives on the loopback interface only.

Ray replaces a loopback ``--node-ip-address``/``--address`` with the machine's routable address, and its
servers bind the node's address: a "local" test cluster would listen on the network. This entry point runs
Ray's own ``ray`` command line unchanged except that loopback addresses are kept, so every server of the
cluster binds 127.0.0.1. Only ``sandforge cluster up`` uses it; a real cluster is started with ``ray start``.
"""

from __future__ import annotations

import sys
from typing import Any


def main() -> None:
    import importlib

    ray_constants: Any = importlib.import_module("ray._private.ray_constants")
    services: Any = importlib.import_module("ray._private.services")
    scripts: Any = importlib.import_module("ray.scripts.scripts")

    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (local.ray_env) makes every Ray process use 127.0.0.1; this process
    # still adds worker nodes, and keeps the loopback address it is given instead of resolving it away.
    ray_constants.ENABLE_RAY_CLUSTER = True

    original = services.resolve_ip_for_localhost

    def keep_loopback(host: str) -> str:
        return host if services.is_localhost(host) else str(original(host))

    services.resolve_ip_for_localhost = keep_loopback
    scripts.services.resolve_ip_for_localhost = keep_loopback
    sys.argv[0] = "ray"
    scripts.main()


if __name__ == "__main__":
    main()
