"""The inside as its own package (issue 17, item 2): what it may import, how a sandbox loads it, and the
wire constants the host takes from it instead of keeping copies."""

from __future__ import annotations

import ast
import fcntl
import subprocess
import sys
from pathlib import Path

from sandforge.sandbox import context, handoff, image, protocol
from sandforge.sandbox.backends.subprocess_backend import RUNNER
from sandforge.sandbox.inside import lazycontext, wire

INSIDE = Path(wire.__file__).resolve().parent


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every absolute import of a module: (line, top-level module name)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def test_the_inside_imports_only_the_standard_library_and_restrictedpython() -> None:
    modules = sorted(INSIDE.glob("*.py"))
    assert {p.name for p in modules} >= {"wire.py", "channel.py", "lockdown.py", "world.py", "serving.py"}
    allowed = set(sys.stdlib_module_names) | {"RestrictedPython", "__future__"}
    strays = [f"{p.name}:{line} imports {name}" for p in modules for line, name in _imports(p) if name not in allowed]
    assert not strays, strays


def test_a_sandbox_loads_the_package_without_sandforge_or_pydantic(tmp_path: Path) -> None:
    """Started as the subprocess backend starts it (``python -I -S -B inside/__main__.py``): every module it
    imports is listed by ``-X importtime``; neither sandforge's nor pydantic's are among them."""
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-B", "-X", "importtime", str(RUNNER), "--result-fd", "1"],
        input=protocol.encode_frame({"type": "not-boot"}, 1 << 20), capture_output=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert b"expected a boot frame" in proc.stderr, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.decode().splitlines() if "|" in line}
    assert {"inside", "inside.start", "inside.wire", "inside.serving", "inside.zygote"} <= imported
    assert not {name for name in imported if name.split(".")[0] in ("sandforge", "pydantic", "pydantic_core")}


def test_the_host_takes_the_wire_constants_from_the_inside() -> None:
    assert protocol.PROTOCOL_VERSION is wire.PROTOCOL_VERSION
    assert protocol.HEADER is wire.HEADER
    assert protocol.MAX_VALUE_DEPTH == wire.MAX_VALUE_DEPTH == lazycontext.MAX_VALUE_DEPTH
    assert {kind.value for kind in protocol.ErrorType} == {
        value for name, value in vars(wire.ErrorKind).items() if not name.startswith("_")
    }
    assert {kind.value for kind in protocol.RUNNER_ERROR_TYPES} == wire.INSIDE_ERROR_KINDS
    assert context.SEALS == wire.APPLIED_SEALS == wire.REQUIRED_SEALS | fcntl.F_SEAL_SEAL
    assert handoff.PROOF_FILE == wire.HANDOFF_PROOF_FILE


def test_host_and_inside_encode_a_value_to_the_same_bytes() -> None:
    value = {"é": [1, 2.5, None, True, "x\u2028"], "n": {"a": ""}}
    assert context.encode_value(value) == lazycontext.dump_json(value, "a value")
    assert protocol.encode_frame(value, 1 << 20)[wire.HEADER.size :] == wire.dumps(value).encode()


def test_the_image_tag_covers_every_file_of_the_package() -> None:
    files = image.inside_files()
    assert set(files) == {
        p.relative_to(INSIDE).as_posix() for p in INSIDE.rglob("*.py") if "__pycache__" not in p.parts
    }
    digest = image.image_digest(files)
    assert digest == image.image_digest()
    for name in files:
        assert image.image_digest({**files, name: files[name] + b"\n"}) != digest, name
    assert image.image_digest({**files, "extra.py": b""}) != digest
    built = image.build_context(files)
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(built)) as tar:
        names = set(tar.getnames())
    assert {f"inside/{name}" for name in files} <= names
