"""Red team on the compose stack's files, read as data (no stack: tests/deploy/compose runs it): what an edit
that loosens the container would change, each pinned here so it fails fast in the unit run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
#: What a process with capabilities in a user namespace of its own could still reach in the kernel: the
#: container allows unshare, so these must stay refused by the profile itself (deploy/seccomp.json's comment).
KERNEL_FACING = {
    "bpf", "keyctl", "add_key", "request_key", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "perf_event_open", "ptrace", "process_vm_readv", "process_vm_writev", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "open_by_handle_at", "name_to_handle_at",
    "pidfd_getfd", "kcmp", "reboot", "swapon", "swapoff", "syslog", "acct", "settimeofday", "clock_settime",
}  # fmt: skip


def _service() -> dict[str, Any]:
    compose = yaml.safe_load((REPO / "deploy" / "compose.yaml").read_text())
    service: dict[str, Any] = compose["services"]["sandforge"]
    return service


def test_the_service_is_published_on_loopback_only() -> None:
    for port in _service()["ports"]:
        assert str(port).startswith("127.0.0.1:"), port


def test_the_container_has_no_capability_no_escalation_a_read_only_root_and_no_docker_socket() -> None:
    service = _service()
    assert service["cap_drop"] == ["ALL"] and not service.get("cap_add") and not service.get("privileged")
    assert service["read_only"] is True and "no-new-privileges:true" in service["security_opt"]
    assert not any("unconfined" in str(o) for o in service["security_opt"])
    mounts = [str(v) for v in service["volumes"]]
    assert not any("docker.sock" in m for m in mounts)
    assert all(m.endswith(":ro") for m in mounts if m.startswith("./")), mounts  # configuration: read-only
    assert not service.get("network_mode") and not service.get("pid") and not service.get("ipc")


def test_the_seccomp_profile_refuses_every_kernel_facing_call_on_every_architecture() -> None:
    profile = json.loads((REPO / "deploy" / "seccomp.json").read_text())
    refused = {name for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ERRNO" and not rule.get("args")
               for name in rule["names"]}  # fmt: skip
    allowed = {name for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" for name in rule["names"]}
    assert sorted(KERNEL_FACING - refused) == [] and not KERNEL_FACING & allowed
    assert {"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"} <= set(profile["architectures"])  # no i386 bypass


def test_the_images_first_start_writes_into_the_volume_from_a_read_only_template() -> None:
    dockerfile = (REPO / "images" / "service" / "Dockerfile").read_text()
    assert "USER 10001:10001" in dockerfile and 'VOLUME ["/var/lib/sandforge"]' in dockerfile
    assert '"--config", "/var/lib/sandforge/server.yaml"' in dockerfile
    assert '"--init-from", "/etc/sandforge/server.yaml"' in dockerfile
    assert "chmod 0700 /var/lib/sandforge" in dockerfile
    template = yaml.safe_load((REPO / "images" / "service" / "server.yaml").read_text()) or {}
    assert not any(t.get("token_hashes") for t in template.get("tenants", [])), "no token in an image layer"
