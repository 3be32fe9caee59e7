"""`sandforge deploy render` (issue 22): manifests for KubeRay and agent-sandbox, checked against the
Kubernetes client's models and against golden files, with the pod hardening every pod must carry."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

pytest.importorskip("kubernetes")

from sandforge.runtime.cli import main
from sandforge.runtime.deploy.render import TARGETS, Values, file_name, render, to_yaml
from sandforge.runtime.deploy.validate import ManifestError, check, check_object

GOLDEN = Path(__file__).parent / "golden"


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]
    if obj["kind"] == "RayCluster":
        return [spec["headGroupSpec"]["template"], *[g["template"] for g in spec["workerGroupSpecs"]]]
    if obj["kind"] == "SandboxTemplate":
        return [spec["podTemplate"]]
    return []


@pytest.mark.parametrize("target", TARGETS)
def test_rendered_manifests_match_the_golden_files(target: str) -> None:
    objects = render(target, Values())  # type: ignore[arg-type]
    expected = sorted(p.name for p in (GOLDEN / target).glob("*.yaml"))
    assert sorted(file_name(o) for o in objects) == expected
    if os.environ.get("SANDFORGE_UPDATE_GOLDEN"):
        for obj in objects:
            (GOLDEN / target / file_name(obj)).write_text(to_yaml(obj))
    for obj in objects:
        assert to_yaml(obj) == (GOLDEN / target / file_name(obj)).read_text(), file_name(obj)


@pytest.mark.parametrize("target", TARGETS)
def test_every_pod_is_hardened(target: str) -> None:
    objects = render(target, Values())  # type: ignore[arg-type]
    templates = [t for o in objects for t in pod_templates(o)]
    assert templates
    for template in templates:
        spec = template["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert spec["runtimeClassName"] == "gvisor"
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in spec["containers"]:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
            assert set(container["resources"]) == {"requests", "limits"}
            assert {"cpu", "memory"} <= set(container["resources"]["limits"])


@pytest.mark.parametrize("target", TARGETS)
def test_egress_is_denied_by_default(target: str) -> None:
    objects = render(target, Values())  # type: ignore[arg-type]
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert len(policies) == 1
    spec = policies[0]["spec"]
    assert spec["policyTypes"] == ["Egress"]
    labels = {
        k: v for t in (pod_templates(o) for o in objects) for tpl in t for k, v in tpl["metadata"]["labels"].items()
    }
    assert spec["podSelector"]["matchLabels"].items() <= labels.items()  # it selects the pods rendered
    for rule in spec["egress"]:  # at most: the cluster's own pods (Ray nodes talk to each other); no ipBlock, no DNS
        assert set(rule) == {"to"}
        assert all(set(peer) == {"podSelector"} for peer in rule["to"])
    if target == "agent-sandbox":
        assert spec["egress"] == []


def test_the_kuberay_workers_run_the_sandbox_host_image_and_declare_their_backend() -> None:
    values = Values(image="registry.example/sf:1", backend="runsc", workers=5)
    cluster = render("kuberay", values)[0]
    worker = cluster["spec"]["workerGroupSpecs"][0]
    assert worker["replicas"] == 5
    assert worker["template"]["spec"]["containers"][0]["image"] == "registry.example/sf:1"
    # one bash word: KubeRay pastes rayStartParams into `bash -lc "ray start ..."` (tests/deploy/test_lean_render.py)
    assert worker["rayStartParams"]["resources"] == '"{\\"sandforge_backend_runsc\\": 1000}"'
    env = {e["name"]: e for e in worker["template"]["spec"]["containers"][0]["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"]  # the token is never in the manifest


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o["spec"].__setitem__("podSelectr", {}), "podSelectr: not a field of V1NetworkPolicySpec"),
        (lambda o: o["spec"].__setitem__("policyTypes", "Egress"), "expected a list"),
        (lambda o: o["metadata"].__setitem__("labels", {"a": 1}), "expected str"),
    ],
)
def test_the_validator_refuses_what_the_api_would(mutate: Any, message: str) -> None:
    policy = next(o for o in render("agent-sandbox", Values()) if o["kind"] == "NetworkPolicy")
    mutate(policy)
    with pytest.raises(ManifestError, match=message):
        check_object(policy)


def test_a_container_without_a_name_is_refused() -> None:
    template = pod_templates(render("agent-sandbox", Values())[0])[0]
    del template["spec"]["containers"][0]["name"]
    with pytest.raises(ManifestError, match="name"):
        check("V1PodTemplateSpec", template, "t")


def test_a_custom_resource_with_an_unknown_field_is_refused() -> None:
    cluster = render("kuberay", Values())[0]
    cluster["spec"]["headGroupSpec"]["rayStartParam"] = {}
    with pytest.raises(ManifestError, match="rayStartParam"):
        check_object(cluster)


def test_the_cli_writes_one_file_per_object(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("name: fleet\nnamespace: agents\nworkers: 2\n")
    result = CliRunner().invoke(main, ["deploy", "render", "--target", "kuberay", "--values", str(values), "-o",
                                       str(tmp_path / "out")])  # fmt: skip
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["networkpolicy-fleet-ray-deny-egress.yaml", "raycluster-fleet.yaml"]
    cluster = yaml.safe_load((tmp_path / "out" / "raycluster-fleet.yaml").read_text())
    assert cluster["metadata"]["namespace"] == "agents"


def test_bad_values_are_one_line_usage_errors(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("workers: -1\n")
    result = CliRunner().invoke(main, ["deploy", "render", "--target", "kuberay", "--values", str(values), "-o",
                                       str(tmp_path / "out")])  # fmt: skip
    assert result.exit_code == 2
    assert "workers" in result.output and "Traceback" not in result.output
    values.write_text("imagee: x\n")
    result = CliRunner().invoke(main, ["deploy", "render", "--target", "kuberay", "--values", str(values), "-o",
                                       str(tmp_path / "out")])  # fmt: skip
    assert result.exit_code == 2 and "imagee" in result.output


WITHOUT_CLUSTER_EXTRA = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("msgpack", "ray"):
            raise ModuleNotFoundError(f"No module named {name!r} (not installed here)")
        return None
sys.meta_path.insert(0, Block())
from sandforge.runtime.deploy.render import render, Values
print(len(render("kuberay", Values())))
"""


def test_rendering_needs_neither_ray_nor_msgpack() -> None:
    """``sandforge[deploy]`` alone renders: the render reads names of the cluster code, never its transports."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", WITHOUT_CLUSTER_EXTRA], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "2"
