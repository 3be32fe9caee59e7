"""The rendered RayCluster runs as lean as the tested local cluster (issue 22, round 8): its rayStartParams, put
through KubeRay's conversion to a ``ray start`` command and through bash (KubeRay runs ``bash -lc``), parse in
Ray's own ``ray start`` into the same lean options as the flags ``sandforge cluster up`` passes, and the head
carries the same system config (``local.SYSTEM_CONFIG``)."""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes")
if importlib.util.find_spec("ray") is None:  # never imported here: Ray fixes its settings on first import
    pytest.skip("Ray is not installed (pip install 'sandforge[cluster]')", allow_module_level=True)

from sandforge.runtime.deploy.render import LEAN_ENV, Values, render, shell_word
from sandforge.sandbox.cluster.executor import RESOURCE_PREFIX
from sandforge.sandbox.cluster.local import SYSTEM_CONFIG, ClusterState, LocalCluster, NodeSpec, ray_env

pytestmark = [
    pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash (KubeRay's shell)"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*"),  # importing ray start imports Serve
]

#: KubeRay's options that take "false" as a value (others with "false" are dropped): the older list, and the
#: one of recent versions, which added include-log-monitor.
KUBERAY_VALUE_BOOLS = {
    "old": ("log-color", "include-dashboard"),
    "new": ("log-color", "include-dashboard", "include-log-monitor"),
}
#: ``ray start`` options the local cluster sets for reasons of one machine (ports, addresses, its temp
#: directory) or that the render sets its own way (CPUs, the backend resource): everything else it sets is a
#: lean setting the render must carry.
LOCAL_ONLY = {
    "node_ip_address", "num_cpus", "resources", "dashboard_agent_listen_port", "min_worker_port",
    "max_worker_port", "port", "ray_client_server_port", "temp_dir", "address", "head",
}  # fmt: skip


def kuberay_flags(params: dict[str, str], version: str) -> str:
    """What KubeRay's convertParamMap makes of rayStartParams (sorted keys, as recent versions do)."""
    out = []
    for option in sorted(params):
        argument = params[option]
        if argument.lower() in ("true", "false") and option not in KUBERAY_VALUE_BOOLS[version]:
            if argument.lower() == "true":
                out.append(f" --{option} ")
        else:
            out.append(f" --{option}={argument} ")
    return "".join(out)


def bash_words(command_tail: str) -> list[str]:
    """The arguments bash passes to a program for ``PROGRAM <command_tail>`` (word splitting, quote removal)."""
    done = subprocess.run(
        ["bash", "-c", "printf '%s\\0' " + command_tail], capture_output=True, check=True, timeout=30
    )  # fmt: skip
    return [w.decode() for w in done.stdout.split(b"\0")[:-1]]


PARSE = """
import json, sys
from ray.scripts.scripts import start
for line in sys.stdin:
    params = start.make_context("start", json.loads(line)).params
    print(json.dumps(params, default=list), flush=True)
"""


@functools.cache
def _parser() -> subprocess.Popen[str]:
    """One child per test process imports ``ray start`` (~1 CPU-s) and parses every argv asked of it, a line each."""
    return subprocess.Popen([sys.executable, "-c", PARSE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


@pytest.fixture(scope="module", autouse=True)
def _parser_closed() -> Iterator[None]:
    yield
    if _parser.cache_info().currsize:
        proc = _parser()
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)
        _parser.cache_clear()


@functools.cache
def _parsed(argv: tuple[str, ...]) -> str:
    proc = _parser()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(list(argv)) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    assert line, f"ray start's parser ended (exit {proc.poll()}) on {list(argv)}"
    return line


def ray_start_options(argv: list[str]) -> dict[str, Any]:
    """``ray start``'s own parse of ``argv`` (Ray's click command; nothing is started), in a child process:
    Ray reads its settings once, on first import, and a test process that imported it before a test cluster's
    settings were in place would connect that cluster's callers to the wrong address (round 8)."""
    options: dict[str, Any] = json.loads(_parsed(tuple(argv)))
    return options


def ray_start_defaults() -> dict[str, Any]:
    return ray_start_options([])


def rendered_groups(values: Values | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    cluster = render("kuberay", values or Values())[0]
    return cluster["spec"]["headGroupSpec"], cluster["spec"]["workerGroupSpecs"][0]


def rendered_options(group: dict[str, Any], head: bool, version: str = "old") -> dict[str, Any]:
    words = bash_words(kuberay_flags(group["rayStartParams"], version))
    return ray_start_options(["--head", *words] if head else words)


def local_head_args(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ``ray start`` arguments ``sandforge cluster up`` gives its head (captured, nothing started)."""
    seen: list[list[str]] = []
    monkeypatch.setattr(LocalCluster, "_ray", lambda self, state, args: seen.append(args))
    state = ClusterState(gcs_port=6379, client_port=10001, temp_dir=str(tmp_path), token_file=str(tmp_path / "t"))
    LocalCluster(tmp_path)._start_head(state, NodeSpec())
    assert len(seen) == 1
    return seen[0]


def lean_settings(argv: list[str]) -> dict[str, Any]:
    """The options ``argv`` sets away from Ray's defaults, minus the ones that belong to one machine."""
    defaults = ray_start_defaults()
    parsed = ray_start_options(argv)
    return {k: v for k, v in parsed.items() if v != defaults[k] and k not in LOCAL_ONLY}


@pytest.mark.parametrize("version", sorted(KUBERAY_VALUE_BOOLS))
def test_the_head_starts_lean_through_kuberay_and_bash(version: str) -> None:
    head, _ = rendered_groups()
    options = rendered_options(head, head=True, version=version)
    assert options["system_config"] == SYSTEM_CONFIG
    assert options["no_monitor"] is True
    assert options["include_log_monitor"] is False
    assert options["include_dashboard"] is False
    assert options["disable_usage_stats"] is True
    assert options["num_cpus"] == 0


@pytest.mark.parametrize("version", sorted(KUBERAY_VALUE_BOOLS))
def test_every_sandbox_host_starts_lean_and_declares_its_backend(version: str) -> None:
    _, worker = rendered_groups(Values(backend="runsc"))
    options = rendered_options(worker, head=False, version=version)
    assert options["include_log_monitor"] is False
    assert options["disable_usage_stats"] is True
    assert json.loads(options["resources"]) == {f"{RESOURCE_PREFIX}runsc": 1000}
    # head-only options stay off the workers (ray start refuses --include-dashboard without --head)
    assert options["include_dashboard"] is None and options["system_config"] is None


def test_the_render_carries_every_lean_setting_of_the_local_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drift guard: a lean flag added to (or kept in) ``sandforge cluster up`` must be rendered too."""
    head, worker = rendered_groups()
    local_head = lean_settings(local_head_args(tmp_path, monkeypatch))
    local_node = lean_settings(LocalCluster._node_args(NodeSpec()))
    assert {"system_config", "no_monitor", "include_log_monitor", "disable_usage_stats"} <= set(local_head)
    rendered_head = rendered_options(head, head=True)
    rendered_worker = rendered_options(worker, head=False)
    for name, value in local_head.items():
        assert rendered_head[name] == value, f"the rendered head lacks the local cluster's {name}={value!r}"
    for name, value in local_node.items():
        assert rendered_worker[name] == value, f"the rendered workers lack the local cluster's {name}={value!r}"


def test_every_ray_container_runs_without_usage_stats() -> None:
    head, worker = rendered_groups()
    assert LEAN_ENV.items() <= ray_env("unused").items()  # the local cluster's environment, not a new one
    for group in (head, worker):
        env = {e["name"]: e.get("value") for e in group["template"]["spec"]["containers"][0]["env"]}
        assert env["RAY_USAGE_STATS_ENABLED"] == "0"


@pytest.mark.parametrize(
    "value",
    ['{"a": 1, "b": [2, 3]}', 'say "hi" $HOME `id` \\ back\\slash', "{a,b}", "it's; rm -rf x && echo * |"],
)
def test_a_shell_word_reaches_the_program_unchanged(value: str) -> None:
    """JSON and bash's specials (expansions, quotes, braces, globs, separators) arrive as one argument."""
    assert bash_words(f"--x={shell_word(value)} --y") == [f"--x={value}", "--y"]


def test_the_lean_settings_survive_every_values_file() -> None:
    for values in (Values(), Values(name="fleet", workers=7, backend="runc"), Values(max_workers=1)):
        head, worker = rendered_groups(values)
        assert rendered_options(head, head=True)["system_config"] == SYSTEM_CONFIG
        assert rendered_options(worker, head=False)["include_log_monitor"] is False


def test_a_ray_version_kuberay_would_probe_at_the_missing_dashboard_is_refused() -> None:
    with pytest.raises(ValueError, match=r"2\.53\.0 or later"):
        Values(ray_version="2.52.9")
    assert Values(ray_version="2.53.0").ray_version == "2.53.0"
    assert Values(ray_version="3.0.0").ray_version == "3.0.0"
