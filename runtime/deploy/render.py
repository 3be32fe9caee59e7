"""`sandforge deploy render`: Kubernetes manifests for sandbox fleets (issue 22, docs/deploy.md).

Two targets: ``kuberay`` (a RayCluster whose worker pods run the sandbox-host image, for the Ray executor) and
``agent-sandbox`` (kubernetes-sigs/agent-sandbox: a SandboxTemplate with ``runtimeClassName: gvisor`` and a
SandboxWarmPool, for fleets without Ray). Every pod: no service-account token, read-only root file system,
all capabilities dropped, no privilege escalation (``no-new-privileges``), seccomp RuntimeDefault, non-root,
resource requests and limits; and a default-deny egress NetworkPolicy (the egress broker runs on the
orchestrator's side: sandboxes reach nothing). Objects are built as data, checked against the Kubernetes
client's models (``validate.py``) and written as YAML, one file per object, in a stable order. A rendered Ray
cluster runs as lean as the tested local one (``sandbox/cluster/local.py``): the same system config, no log
monitors, no autoscaler monitor, no dashboard, no usage stats (``LEAN_*`` below, docs/deploy.md).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandforge.runtime.deploy.validate import check_object
from sandforge.sandbox.cluster.executor import RESOURCE_PREFIX
from sandforge.sandbox.cluster.local import SYSTEM_CONFIG

Target = Literal["kuberay", "agent-sandbox"]
TARGETS: tuple[Target, ...] = ("kuberay", "agent-sandbox")
UID = 65534  # nobody: the image's sandbox user


def shell_word(value: str) -> str:
    """``value`` as one word of the command KubeRay runs (``bash -lc "ulimit ...; ray start --key=VALUE ..."``,
    each rayStartParam pasted in as is): double-quoted, bash's specials inside escaped. This is the form KubeRay
    documents for JSON values; bare JSON would be split at its spaces and stripped of its quotes by bash."""
    return '"' + re.sub(r'([\\"$`])', r"\\\1", value) + '"'


#: ``ray start`` options of every node of the local cluster that keep it lean (``LocalCluster._node_args``), in
#: their rayStartParams form. KubeRay passes a param as ``--key=value``, "true" as a bare ``--key``, and drops a
#: "false" unless it knows the option takes a value (recent KubeRay knows ``include-log-monitor``, older ones
#: drop it silently): "0" is Ray's boolean false too, and reaches ``ray start`` on every KubeRay version.
LEAN_NODE_PARAMS: dict[str, str] = {"include-log-monitor": "0", "disable-usage-stats": "true"}
#: The head's (``LocalCluster._start_head``): no dashboard, no autoscaler monitor (no autoscaler runs; KubeRay
#: sets it too when its own autoscaler is on), and Ray's system config, which the GCS hands to every node.
LEAN_HEAD_PARAMS: dict[str, str] = {
    "include-dashboard": "false",
    "no-monitor": "true",
    "system-config": shell_word(json.dumps(SYSTEM_CONFIG, separators=(",", ":"))),
}
#: Every Ray container's environment: no usage stats from any Ray process of the pod (drivers, ``ray`` CLIs
#: such as the ``ray health-check`` of KubeRay's init container), as ``sandforge.sandbox.cluster.local.ray_env``.
LEAN_ENV: dict[str, str] = {"RAY_USAGE_STATS_ENABLED": "0"}
#: The oldest Ray KubeRay probes through the dashboard agent's single health endpoint; older ones it probes at
#: the dashboard's ``/api/gcs_healthz``, which a head without the dashboard does not serve (never ready).
MIN_RAY_VERSION = (2, 53, 0)


class Resources(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cpu: str = "1"
    memory: str = "2Gi"
    cpu_limit: str = "2"
    memory_limit: str = "4Gi"


class Values(BaseModel):
    """What a deployment tunes (``--values FILE``, YAML); every field has a safe default."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("sandforge", pattern=r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
    namespace: str = Field("sandforge", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    image: str = Field("registry.example/sandforge/sandbox-host:latest", min_length=1, max_length=512)
    ray_version: str = Field("2.60.0", pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")
    workers: int = Field(3, ge=1, le=1000)
    max_workers: int = Field(10, ge=1, le=10000)
    backend: Literal["subprocess", "runsc", "runc"] = "subprocess"
    runtime_class: str = Field("gvisor", min_length=1, max_length=63)
    warm_pool: int = Field(4, ge=0, le=10000)
    head: Resources = Field(default_factory=Resources)
    worker: Resources = Field(
        default_factory=lambda: Resources(cpu="2", memory="4Gi", cpu_limit="4", memory_limit="8Gi")
    )
    sandbox: Resources = Field(
        default_factory=lambda: Resources(cpu="250m", memory="256Mi", cpu_limit="1", memory_limit="512Mi")
    )

    @field_validator("ray_version")
    @classmethod
    def _probed_without_dashboard(cls, value: str) -> str:
        if tuple(int(part) for part in value.split(".")) < MIN_RAY_VERSION:
            oldest = ".".join(map(str, MIN_RAY_VERSION))
            raise ValueError(f"must be {oldest} or later (KubeRay probes older Ray at the dashboard, which is off)")
        return value


def _resources(r: Resources) -> dict[str, Any]:
    return {"requests": {"cpu": r.cpu, "memory": r.memory}, "limits": {"cpu": r.cpu_limit, "memory": r.memory_limit}}


def _container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,  # the kernel's no_new_privs for every process of the container
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pod_spec(
    containers: list[dict[str, Any]], volumes: list[dict[str, Any]], runtime_class: str | None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": UID,
            "runAsGroup": UID,
            "fsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": containers,
        "volumes": volumes,
    }
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return spec


def _scratch(shm: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Writable scratch on a read-only root: /tmp (and /dev/shm for Ray's object store)."""
    volumes = [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]
    mounts = [{"name": "tmp", "mountPath": "/tmp"}]  # noqa: S108 - a pod's own emptyDir
    if shm:
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})  # noqa: S108 - a pod's own emptyDir
    return volumes, mounts


def _labels(v: Values, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "sandforge", "app.kubernetes.io/instance": v.name,
            "app.kubernetes.io/component": component}  # fmt: skip


def _meta(v: Values, name: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": v.namespace, "labels": _labels(v, component)}


def _deny_egress(v: Values, component: str, allow_same: dict[str, str] | None) -> dict[str, Any]:
    """Default-deny egress for the component's pods; ``allow_same``: pods they may still reach (a Ray
    cluster's own nodes talk to each other), nothing else, no DNS."""
    spec: dict[str, Any] = {"podSelector": {"matchLabels": _labels(v, component)}, "policyTypes": ["Egress"]}
    spec["egress"] = [{"to": [{"podSelector": {"matchLabels": allow_same}}]}] if allow_same else []
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(v, f"{v.name}-{component}-deny-egress", component), "spec": spec}  # fmt: skip


def _ray_group(v: Values, role: str, resources: Resources, params: dict[str, str]) -> dict[str, Any]:
    volumes, mounts = _scratch(shm=True)
    container = {
        "name": f"ray-{role}",
        "image": v.image,
        "imagePullPolicy": "IfNotPresent",
        "env": [
            {"name": "RAY_AUTH_MODE", "value": "token"},
            {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": f"{v.name}-ray-token", "key": "token"}}},
            {"name": "SANDFORGE_BACKEND", "value": v.backend},
            *({"name": name, "value": value} for name, value in LEAN_ENV.items()),
        ],
        "resources": _resources(resources),
        "securityContext": _container_security(),
        "volumeMounts": mounts,
    }
    labels = {**_labels(v, "ray"), "ray.io/cluster": v.name}
    template = {"metadata": {"labels": labels}, "spec": _pod_spec([container], volumes, v.runtime_class)}
    return {"rayStartParams": {**params, **LEAN_NODE_PARAMS}, "template": template}


def kuberay(v: Values) -> list[dict[str, Any]]:
    """A RayCluster (head + sandbox-host workers declaring their backend) and its default-deny egress."""
    backend = shell_word(json.dumps({f"{RESOURCE_PREFIX}{v.backend}": 1000}))
    head = _ray_group(v, "head", v.head, {"num-cpus": "0", "dashboard-host": "127.0.0.1", **LEAN_HEAD_PARAMS})
    worker = {
        "groupName": "sandbox-hosts", "replicas": v.workers, "minReplicas": v.workers,
        "maxReplicas": max(v.max_workers, v.workers),
        **_ray_group(v, "worker", v.worker, {"resources": backend}),
    }  # fmt: skip
    cluster = {
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": _meta(v, v.name, "ray"),
        "spec": {"rayVersion": v.ray_version, "headGroupSpec": head, "workerGroupSpecs": [worker]},
    }  # fmt: skip
    return [cluster, _deny_egress(v, "ray", {"ray.io/cluster": v.name})]


def agent_sandbox(v: Values) -> list[dict[str, Any]]:
    """A SandboxTemplate (gVisor runtime class) running the sandbox image, its warm pool, default-deny egress."""
    volumes, mounts = _scratch(shm=False)
    container = {
        "name": "sandbox", "image": v.image, "imagePullPolicy": "IfNotPresent",
        "resources": _resources(v.sandbox), "securityContext": _container_security(), "volumeMounts": mounts,
    }  # fmt: skip
    template = {"metadata": {"labels": _labels(v, "sandbox")}, "spec": _pod_spec([container], volumes, v.runtime_class)}
    api = "extensions.agents.x-k8s.io/v1alpha1"
    objects = [
        {"apiVersion": api, "kind": "SandboxTemplate", "metadata": _meta(v, f"{v.name}-sandbox", "sandbox"),
         "spec": {"podTemplate": template}},
        {"apiVersion": api, "kind": "SandboxWarmPool", "metadata": _meta(v, f"{v.name}-warm", "sandbox"),
         "spec": {"replicas": v.warm_pool, "sandboxTemplateRef": {"name": f"{v.name}-sandbox"}}},
        _deny_egress(v, "sandbox", None),
    ]  # fmt: skip
    return objects


def render(target: Target, values: Values) -> list[dict[str, Any]]:
    """The objects of ``target``, each checked against the Kubernetes models (ManifestError if one is not)."""
    objects = kuberay(values) if target == "kuberay" else agent_sandbox(values)
    for obj in objects:
        check_object(obj)
    return objects


def file_name(obj: dict[str, Any]) -> str:
    return f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def to_yaml(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=120)


def write(objects: list[dict[str, Any]], out: Path) -> list[Path]:
    """Write each object to ``out`` as its own YAML file; returns the paths in order."""
    from sandforge.runtime.files import write_user_file

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for obj in objects:
        path = out / file_name(obj)
        write_user_file(path, to_yaml(obj).encode())
        paths.append(path)
    return paths
