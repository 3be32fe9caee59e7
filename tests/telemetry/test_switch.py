"""When telemetry is on (issue 21): the standard OTEL_* variables or SANDFORGE_OTEL, and without it (or without
the extra) nothing of OpenTelemetry is imported and calls work as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandforge.runtime import telemetry
from sandforge.runtime.telemetry.api import wanted

#: A real call on the subprocess sandbox, then which OpenTelemetry modules were imported and what is active.
CALL = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from sandforge.runtime.agent import CallLog, Workspace
    from sandforge.runtime.providers import ScriptedProvider
    from sandforge.runtime.telemetry import current
    from sandforge.sandbox import SandboxConfig
    ws = Workspace(provider=ScriptedProvider(["return args[0] + 1\\n"]),
                   sandbox=SandboxConfig(backend="subprocess", pool_size=0), log=CallLog(Path(sys.argv[1])))
    out = ws.call("calc", "inc", 1)
    ws.close()
    print(json.dumps({"ok": out.ok, "value": out.value, "enabled": current().enabled,
                      "otel": sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")}))
    """
)

#: Makes ``import opentelemetry`` fail, as when the extra is not installed.
BLOCK = textwrap.dedent(
    """
    import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "opentelemetry":
                raise ImportError("No module named " + repr(name))
            return None
    sys.meta_path.insert(0, _Block())
    """
)


def run(tmp_path: Path, env: dict[str, str], *, blocked: bool = False) -> tuple[dict[str, object], str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SANDFORGE_OTEL"))}
    code = (BLOCK if blocked else "") + CALL
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "calls.jsonl")], env={**clean, **env},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [line] = [ln for ln in done.stdout.splitlines() if ln.startswith('{"ok"')]
    return json.loads(line), done.stderr


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, False),
        ({"SANDFORGE_OTEL": "1"}, True),
        ({"SANDFORGE_OTEL": "0", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),  # names the service, asks for nothing
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_which_variables_turn_it_on(env: dict[str, str], expected: bool) -> None:
    assert wanted(env) is expected


def test_a_malformed_switch_is_named() -> None:
    with pytest.raises(ValueError, match="SANDFORGE_OTEL must be 1 or 0"):
        wanted({"SANDFORGE_OTEL": "maybe"})


def test_off_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    result, _ = run(tmp_path, {})
    assert result == {"ok": True, "value": 2, "enabled": False, "otel": []}


def test_on_without_the_extra_the_call_works_and_says_what_to_install(tmp_path: Path) -> None:
    result, stderr = run(tmp_path, {"SANDFORGE_OTEL": "1"}, blocked=True)
    assert result == {"ok": True, "value": 2, "enabled": False, "otel": []}
    assert "sandforge[otel]" in stderr


def test_on_with_the_console_exporter_the_spans_are_exported(tmp_path: Path) -> None:
    result, _ = run(
        tmp_path, {"SANDFORGE_OTEL": "1", "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none"}
    )
    assert result["ok"] is True and result["enabled"] is True
    assert "opentelemetry.sdk.trace" in result["otel"]  # type: ignore[operator]


def test_console_export_prints_the_call_span(tmp_path: Path) -> None:
    env = {"SANDFORGE_OTEL": "1", "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none",
           "OTEL_SERVICE_NAME": "forge-test"}  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SANDFORGE_OTEL"))}
    done = subprocess.run([sys.executable, "-c", CALL, str(tmp_path / "c.jsonl")], env={**clean, **env},
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"name": "execute_tool calc.inc"' in done.stdout and '"service.name": "forge-test"' in done.stdout


def test_an_unknown_exporter_leaves_telemetry_off_with_a_warning(tmp_path: Path) -> None:
    result, stderr = run(tmp_path, {"SANDFORGE_OTEL": "1", "OTEL_TRACES_EXPORTER": "zipkin"})
    assert result["ok"] is True and result["enabled"] is False
    assert "unsupported exporter" in stderr


def test_the_null_telemetry_records_nothing() -> None:
    null = telemetry.NULL
    with null.span("x", {"a": 1}) as span:
        span.set({"b": 2})
        span.event("e", {})
        span.fail("t", "m")
    assert span is telemetry.NULL_SPAN and not null.enabled


def test_only_the_seam_imports_opentelemetry() -> None:
    import ast

    root = Path(__file__).resolve().parents[2]
    importers = set()
    for folder in ("runtime", "sandbox"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_bytes())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [])  # fmt: skip
                if any(n.split(".")[0] == "opentelemetry" for n in names):
                    importers.add(str(path.relative_to(root)))
    assert importers == {"runtime/telemetry/otel.py"}


#: A ``sitecustomize`` that hides OpenTelemetry's SDK and exporters but not its API: the state of a machine
#: where another package pulled in ``opentelemetry-api`` and the ``otel`` extra is not installed.
API_ONLY = textwrap.dedent(
    """
    import sys
    class _NoSdk:
        def find_spec(self, name, path=None, target=None):
            if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, _NoSdk())
    """
)


@pytest.mark.parametrize("switch", [{"SANDFORGE_OTEL": "1"}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}])
def test_with_only_the_api_installed_a_command_says_so_in_one_line(tmp_path: Path, switch: dict[str, str]) -> None:
    (tmp_path / "shadow").mkdir()
    (tmp_path / "shadow" / "sitecustomize.py").write_text(API_ONLY)
    (tmp_path / "two.py").write_text("return 1 + 1\n")
    root = Path(__file__).resolve().parents[2]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SANDFORGE_OTEL"))}
    env = {**clean, **switch, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), str(root)]),
           "SANDFORGE_STATE_DIR": str(tmp_path / "state")}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from sandforge.runtime.cli import main; sys.exit(main())",
         "exec", "--backend", "subprocess", str(tmp_path / "two.py")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: 2")
    assert "Traceback" not in done.stderr
    [line] = [ln for ln in done.stderr.splitlines() if "telemetry" in ln]
    assert "opentelemetry.sdk is not installed" in line and "sandforge[otel]" in line
