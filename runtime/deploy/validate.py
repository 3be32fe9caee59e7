"""Check rendered manifests against the Kubernetes API's own models (the ``kubernetes`` Python client).

Every key must be a field of the model at that place (a typo is an error, not an ignored field), every value
of the type the model declares, and every required field present (the models' own checks). Custom resources
(KubeRay's RayCluster, agent-sandbox's SandboxTemplate and SandboxWarmPool) are checked by their pod
templates (``V1PodTemplateSpec``) and metadata, and by the fields of their spec this renderer writes.
"""

from __future__ import annotations

import re
from typing import Any

_LIST = re.compile(r"^(?:List|list)\[(.+)\]$")
_DICT = re.compile(r"^(?:Dict|dict)\[str, (.+)\]$|^dict\(str, (.+)\)$")
_PRIMITIVE: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "bool": (bool,), "float": (int, float), "object": (object,),
    "datetime": (str,), "date": (str,),
}  # fmt: skip


class ManifestError(ValueError):
    """A rendered object does not match the Kubernetes API (the message names the path)."""


def _client() -> Any:
    try:
        import kubernetes.client as client
    except ImportError:
        raise ManifestError(
            "validating manifests needs the kubernetes client: pip install 'sandforge[deploy]'"
        ) from None
    return client


def check(model: str, data: Any, path: str = "") -> Any:
    """``data`` (a manifest fragment, camelCase keys) built into the client's ``model``; ManifestError if it
    does not fit."""
    if (m := _LIST.match(model)) is not None:
        if not isinstance(data, list):
            raise ManifestError(f"{path or '.'}: expected a list, got {type(data).__name__}")
        return [check(m.group(1), item, f"{path}[{i}]") for i, item in enumerate(data)]
    if (m := _DICT.match(model)) is not None:
        if not isinstance(data, dict):
            raise ManifestError(f"{path or '.'}: expected a mapping, got {type(data).__name__}")
        inner = m.group(1) or m.group(2)
        return {k: check(inner, v, f"{path}.{k}") for k, v in data.items()}
    if model in _PRIMITIVE:
        if not isinstance(data, _PRIMITIVE[model]) or (model in ("int", "float") and isinstance(data, bool)):
            raise ManifestError(f"{path or '.'}: expected {model}, got {type(data).__name__}")
        return data
    return _check_model(model, data, path)


def _check_model(model: str, data: Any, path: str) -> Any:
    cls = getattr(_client(), model, None)
    if cls is None:
        raise ManifestError(f"{path or '.'}: unknown Kubernetes model {model}")
    if not isinstance(data, dict):
        raise ManifestError(f"{path or '.'}: expected a {model} object, got {type(data).__name__}")
    by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        attr = by_json.get(key)
        if attr is None:
            raise ManifestError(f"{path}.{key}: not a field of {model}")
        kwargs[attr] = check(cls.openapi_types[attr], value, f"{path}.{key}")
    try:
        return cls(**kwargs)
    except ValueError as exc:
        raise ManifestError(f"{path or '.'}: {model}: {exc}") from None


#: Core kinds rendered here and the client model of each.
CORE_MODELS = {
    "NetworkPolicy": "V1NetworkPolicy",
    "ServiceAccount": "V1ServiceAccount",
    "Namespace": "V1Namespace",
    "Service": "V1Service",
    "Deployment": "V1Deployment",
}


def check_object(obj: dict[str, Any]) -> None:
    """One rendered object, whole: a core kind by its model; a custom resource by its metadata, its pod
    templates and the spec fields this renderer writes."""
    kind = obj.get("kind")
    where = f"{kind}/{obj.get('metadata', {}).get('name', '?')}"
    if kind in CORE_MODELS:
        check(CORE_MODELS[kind], obj, where)
        return
    check("V1ObjectMeta", obj.get("metadata"), f"{where}.metadata")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise ManifestError(f"{where}.spec: missing")
    if kind == "RayCluster":
        _check_keys(spec, {"rayVersion", "headGroupSpec", "workerGroupSpecs", "enableInTreeAutoscaling"}, where)
        groups = [("headGroupSpec", spec["headGroupSpec"])]
        groups += [(f"workerGroupSpecs[{i}]", g) for i, g in enumerate(spec.get("workerGroupSpecs", []))]
        for name, group in groups:
            allowed = {
                "rayStartParams",
                "template",
                "groupName",
                "replicas",
                "minReplicas",
                "maxReplicas",
                "serviceType",
            }
            _check_keys(group, allowed, f"{where}.{name}")
            check("Dict[str, str]", group.get("rayStartParams", {}), f"{where}.{name}.rayStartParams")
            check("V1PodTemplateSpec", group["template"], f"{where}.{name}.template")
    elif kind == "SandboxTemplate":
        _check_keys(spec, {"podTemplate"}, where)
        check("V1PodTemplateSpec", spec["podTemplate"], f"{where}.spec.podTemplate")
    elif kind == "SandboxWarmPool":
        _check_keys(spec, {"replicas", "sandboxTemplateRef"}, where)
        check("int", spec["replicas"], f"{where}.spec.replicas")
        _check_keys(spec["sandboxTemplateRef"], {"name"}, f"{where}.spec.sandboxTemplateRef")
    else:
        raise ManifestError(f"{where}: unknown kind")


def _check_keys(data: Any, allowed: set[str], where: str) -> None:
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: expected a mapping")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ManifestError(f"{where}: unknown field(s) {', '.join(unknown)}")
