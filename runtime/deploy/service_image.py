"""`sandforge image build --service`: the service image, built offline like the sandbox image (issue 42).

From the same debootstrap base (``sandforge-base:bookworm-python3``, no registry): the sandforge wheel built
from this source tree and its dependencies, resolved by uv on the host for the base's Python (3.11) and the
machine's architecture, copied into ``/opt/sandforge/site``; the docker build itself runs with no network.
The tag is ``sandforge-service:<digest>``, the digest taken over what goes in (the wheel's files, every
dependency's installed files, the recipe), so a stale image is never mistaken for the current one; the build
also tags ``sandforge-service:latest``, which ``deploy/compose.yaml`` names.

No secret enters the image: tokens are made on the first start, into the state volume (``sandforge serve
--init-from``), never at build time (``tests/deploy/compose`` inspects the layers).
"""

from __future__ import annotations

import hashlib
import io
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from sandforge.sandbox import image

SOURCE_ROOT = Path(__file__).resolve().parents[2]
RECIPE_DIR = SOURCE_ROOT / "images" / "service"
REPOSITORY = "sandforge-service"
#: The base's interpreter (Debian bookworm): the dependencies are resolved for it, not for the host's.
BASE_PYTHON = "3.11"
#: Extras the service image carries beyond the core dependencies (traces for an operator's collector).
EXTRAS = ("otel",)
#: Extras an operator may add (``--extra``): the Ray executor's, and the provider and framework ones.
KNOWN_EXTRAS = frozenset({"otel", "cluster", "deploy", "openai"})
UV_PLATFORMS = {"x86_64": "x86_64-manylinux_2_28", "aarch64": "aarch64-manylinux_2_28"}


def _run(cmd: list[str], what: str, timeout: float) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
        raise image.ImageBuildError(f"{what} failed (exit {proc.returncode}): {tail}")


def _uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if found is None:
        raise image.ImageBuildError("uv is not installed (it is a dependency of sandforge: reinstall it)")
    return found


def stage_site(ctx: Path, progress: image.Progress, extras: tuple[str, ...] = ()) -> None:
    """``ctx/site``: the wheel of this source tree and its dependencies (and ``extras``'), for the base's Python."""
    if not (SOURCE_ROOT / "pyproject.toml").exists() or not (RECIPE_DIR / "Dockerfile").exists():
        raise image.ImageBuildError(f"the service image is built from a source checkout ({SOURCE_ROOT} is not one)")
    arch = platform.machine()
    if arch not in UV_PLATFORMS:
        raise image.ImageBuildError(f"no service image for architecture {arch!r} (x86_64 and aarch64 are known)")
    uv = _uv()
    progress("building the sandforge wheel (uv build)")
    _run([uv, "build", "--wheel", "--quiet", "--out-dir", str(ctx / "dist"), str(SOURCE_ROOT)], "uv build", 600)
    wheel = next((ctx / "dist").glob("sandforge-*.whl"))
    progress(f"resolving dependencies for Python {BASE_PYTHON} on {arch} (uv pip install --target)")
    _run(
        [uv, "pip", "install", "--quiet", "--no-compile", "--target", str(ctx / "site"),
         "--python-version", BASE_PYTHON, "--python-platform", UV_PLATFORMS[arch],
         f"{wheel}[{','.join(sorted({*EXTRAS, *extras}))}]"],
        "uv pip install",
        1200,
    )  # fmt: skip
    shutil.rmtree(ctx / "dist")
    drop_install_records(ctx / "site")


#: What an installer writes about *this* install (the wheel's temporary path, a cache key): never the same
#: twice, so it would give every build a new digest; nothing at run time reads them.
INSTALL_RECORDS = ("direct_url.json", "uv_cache.json")


def drop_install_records(site: Path) -> None:
    for dist_info in site.glob("*.dist-info"):
        dropped = [name for name in INSTALL_RECORDS if (dist_info / name).exists()]
        for name in dropped:
            (dist_info / name).unlink()
        record = dist_info / "RECORD"
        if dropped and record.exists():
            keep = [
                line
                for line in record.read_text().splitlines()
                if line.split(",", 1)[0].rsplit("/", 1)[-1] not in dropped
            ]
            record.write_text("\n".join(keep) + "\n")


def context_digest(ctx: Path) -> str:
    """A digest of every file the build context holds, by path and content (not by time)."""
    h = hashlib.sha256()
    for path in sorted(p for p in ctx.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(ctx)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:12]


def context_tar(ctx: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(ctx.rglob("*")):
            if "__pycache__" in path.parts:
                continue
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(ctx)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if path.is_file():
                with path.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue()


def build_service(
    client: Any, *, extras: tuple[str, ...] = (), force: bool = False, progress: image.Progress | None = None
) -> image.BuildResult:
    """Build (or find) the service image of this source tree; tag it ``:latest`` as well. ``extras``: more of
    sandforge's extras (``cluster`` makes the image the KubeRay render's node image: docs/deploy.md)."""
    unknown = set(extras) - KNOWN_EXTRAS
    if unknown:
        raise image.ImageBuildError(
            f"unknown extra(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(KNOWN_EXTRAS))})"
        )

    from filelock import FileLock, Timeout

    say: image.Progress = progress or (lambda msg: None)
    lock = FileLock(str(image.cache_dir() / "service-build.lock"))
    try:  # a second build (CI's step and a test session's fixture) waits for the first and finds its image
        lock.acquire(timeout=1800)
    except Timeout as exc:
        raise image.ImageBuildError("another service image build holds the lock for too long") from exc
    try:
        return _build_service(client, extras=extras, force=force, say=say)
    finally:
        lock.release()


def _build_service(client: Any, *, extras: tuple[str, ...], force: bool, say: image.Progress) -> image.BuildResult:
    import docker.errors

    api = image._low_level(client)
    started = time.monotonic()
    steps: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="sandforge-service-") as tmp:
        ctx = Path(tmp)
        mark = time.monotonic()
        stage_site(ctx, say, extras)
        for name in ("Dockerfile", "server.yaml"):
            shutil.copyfile(RECIPE_DIR / name, ctx / name)
        steps["stage"] = round(time.monotonic() - mark, 2)
        tag = f"{REPOSITORY}:{context_digest(ctx)}"
        try:
            if not force:
                try:
                    info = api.inspect_image(tag)
                    api.tag(tag, REPOSITORY, "latest")
                    say(f"{tag} is present")
                    return image.BuildResult(tag=tag, built=False, image_id=str(info["Id"]),
                                             seconds=time.monotonic() - started, steps=steps)  # fmt: skip
                except docker.errors.ImageNotFound:
                    pass
            mark = time.monotonic()
            base = image.ensure_base(client, say)
            steps["base"] = round(time.monotonic() - mark, 2)
            mark = time.monotonic()
            say(f"building {tag} from {base} (no network)")
            lines: list[str] = []
            for chunk in api.build(
                fileobj=io.BytesIO(context_tar(ctx)), custom_context=True, tag=tag, buildargs={"BASE": base},
                rm=True, forcerm=True, pull=False, nocache=force, network_mode="none",
                labels={"sandforge.service": "1"}, decode=True,
            ):  # fmt: skip
                if "error" in chunk:
                    detail = " | ".join(line for line in lines[-6:] if line)
                    raise image.ImageBuildError(f"docker build failed: {str(chunk['error']).strip()} ({detail})")
                if text := str(chunk.get("stream") or "").strip():
                    lines.append(text)
            api.tag(tag, REPOSITORY, "latest")
            steps["image"] = round(time.monotonic() - mark, 2)
            image_id = str(api.inspect_image(tag)["Id"])
        except docker.errors.APIError as exc:
            raise image.ImageBuildError(f"the Docker engine refused: {exc.explanation or exc}") from exc
        except docker.errors.DockerException as exc:
            raise image.ImageBuildError(f"lost the Docker engine during the build: {exc}") from exc
    return image.BuildResult(tag=tag, built=True, image_id=image_id, seconds=time.monotonic() - started, steps=steps)
