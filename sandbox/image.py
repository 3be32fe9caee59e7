"""Build the sandbox image offline and tell whether the one this code expects is present.

No registry is involved: a Debian rootfs is debootstrapped from the mirror apt already uses (cached as a
tarball), ``docker import``-ed as a local base image, and ``images/Dockerfile`` adds the inside package
(``sandbox/inside/``) and RestrictedPython on top. The tag is derived from what runs inside (every file of
the inside package, RestrictedPython version, recipe), so a stale image is never used: the backends only
ever start the exact :func:`expected_tag`.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import RestrictedPython
from pydantic import BaseModel, ConfigDict

log = logging.getLogger(__name__)

SANDBOX_DIR = Path(__file__).resolve().parent
#: The package that runs inside the sandbox: all of it goes into the image, and into its tag.
INSIDE_DIR = SANDBOX_DIR / "inside"
RECIPE_DIR = SANDBOX_DIR.parent / "images"
DOCKERFILE = RECIPE_DIR / "Dockerfile"

SUITE = "bookworm"
BASE_IMAGE = f"sandforge-base:{SUITE}-python3"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: Inside the image: where the inside package and RestrictedPython live (the latter is BootFrame.sys_path).
IMAGE_INSIDE = "/opt/sandforge/inside"
#: A file of the image whose presence says the inside package is there (an unpacked rootfs is complete).
IMAGE_ENTRY = f"{IMAGE_INSIDE}/start.py"
IMAGE_LIB = "/opt/sandforge/lib"
LABEL = "sandforge.image"
#: Trimmed from the rootfs before it is imported: nothing the runner needs.
TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info")

BUILD_HINT = "run `sandforge image build`"

Progress = Callable[[str], None]


class ImageBuildError(Exception):
    """The image could not be built; the message says which step failed and why."""


class ImageStatus(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expected: str
    present: bool
    image_id: str | None = None
    stale: list[str] = []
    base: str = BASE_IMAGE
    base_present: bool = False
    oci_rootfs: str = ""
    oci_rootfs_present: bool = False


class BuildResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tag: str
    built: bool
    image_id: str
    seconds: float
    steps: dict[str, float] = {}


def restrictedpython_dir() -> Path:
    return Path(RestrictedPython.__file__).resolve().parent


def restrictedpython_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("RestrictedPython")
    except PackageNotFoundError:  # pragma: no cover - vendored copy without metadata
        return hashlib.sha256(
            b"".join(p.read_bytes() for p in sorted(restrictedpython_dir().rglob("*.py")))
        ).hexdigest()


#: The oldest RestrictedPython without a published escape: 8.3 closed guard names shadowed by positional-only
#: parameters, 8.4 string.Formatter's field traversal (CVE-2026-76825), 8.5 the async generators' frame
#: attributes missing from INSPECT_ATTRIBUTES; 9.0 is the release the sandbox is tested with. The subprocess
#: backend runs the installed copy and the image is built from it, so this one check covers both.
RESTRICTEDPYTHON_MINIMUM = "9.0"


def restrictedpython_advisory(installed: str | None = None) -> str | None:
    """Why the installed RestrictedPython (or ``installed``) must not be used, or None when it may."""
    from packaging.version import InvalidVersion, Version

    found = restrictedpython_version() if installed is None else installed
    try:
        if Version(found) >= Version(RESTRICTEDPYTHON_MINIMUM):
            return None
    except InvalidVersion:
        found = "a copy without version metadata"
    return (
        f"RestrictedPython {found} has published sandbox escapes; install RestrictedPython>="
        f"{RESTRICTEDPYTHON_MINIMUM} (pip install -U 'RestrictedPython>={RESTRICTEDPYTHON_MINIMUM}')"
    )


def inside_files() -> dict[str, bytes]:
    """Every source file of the inside package, by its path relative to the package (no caches)."""
    return {
        path.relative_to(INSIDE_DIR).as_posix(): path.read_bytes()
        for path in sorted(INSIDE_DIR.rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def image_digest(inside: dict[str, bytes] | None = None) -> str:
    """12 hex digits of sha256 over every file of the inside package (names and contents), the
    RestrictedPython version and the recipe."""
    h = hashlib.sha256()
    for name, data in sorted((inside_files() if inside is None else inside).items()):
        h.update(b"\0inside/" + name.encode() + b"\0" + hashlib.sha256(data).digest())
    h.update(b"\0RestrictedPython==" + restrictedpython_version().encode())
    h.update(b"\0" + (DOCKERFILE.read_bytes() if DOCKERFILE.exists() else b""))
    return h.hexdigest()[:12]


def expected_tag(repository: str = "sandforge-sandbox") -> str:
    return f"{repository}:{image_digest()}"


def missing_image_message(tag: str, stale: list[str]) -> str:
    if stale:
        return (
            f"sandbox image {tag} is stale (found {', '.join(sorted(stale))}, built for another runner); {BUILD_HINT}"
        )
    return f"sandbox image {tag} is missing; {BUILD_HINT}"


def _low_level(client: Any) -> Any:
    """Accept a ``docker.DockerClient`` or its low-level ``docker.APIClient``."""
    return getattr(client, "api", client)


def status(client: Any, repository: str = "sandforge-sandbox") -> ImageStatus:
    """Is the expected image present? Other tags of the same repository are reported as stale."""
    import docker.errors

    api = _low_level(client)
    tag = expected_tag(repository)
    rootfs = oci_rootfs(tag)
    result = ImageStatus(
        expected=tag,
        present=False,
        oci_rootfs=str(rootfs),
        oci_rootfs_present=(rootfs / IMAGE_ENTRY.lstrip("/")).exists(),
    )
    try:
        info = api.inspect_image(tag)
        result.present, result.image_id = True, str(info["Id"])
    except docker.errors.ImageNotFound:
        pass
    for image in api.images(name=repository):
        result.stale += [t for t in image.get("RepoTags") or [] if t.startswith(f"{repository}:") and t != tag]
    try:
        api.inspect_image(BASE_IMAGE)
        result.base_present = True
    except docker.errors.ImageNotFound:
        pass
    return result


# --- the base rootfs ------------------------------------------------------------------------------------


def apt_mirror(suite: str = SUITE) -> str:
    """The Debian mirror apt already uses: ``SANDFORGE_DEBIAN_MIRROR``, else the apt sources, else default."""
    if env := os.environ.get("SANDFORGE_DEBIAN_MIRROR"):
        return env
    sources = Path("/etc/apt/sources.list.d")
    for path in sorted(sources.glob("*.sources")) if sources.is_dir() else []:
        if uri := _deb822_mirror(path.read_text(errors="replace"), suite):
            return uri
    for path in [Path("/etc/apt/sources.list"), *sorted(sources.glob("*.list"))]:
        if path.is_file() and (uri := _one_line_mirror(path.read_text(errors="replace"), suite)):
            return uri
    return DEFAULT_MIRROR


def _deb822_mirror(text: str, suite: str) -> str | None:
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if (
            "deb" in fields.get("types", "").split()
            and suite in fields.get("suites", "").split()
            and fields.get("uris")
        ):
            return fields["uris"].split()[0]
    return None


def _one_line_mirror(text: str, suite: str) -> str | None:
    for line in text.splitlines():
        parts = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
        if len(parts) >= 3 and parts[0] == "deb" and parts[2] == suite:
            return parts[1]
    return None


def cache_dir(*, create: bool = True) -> Path:
    """Where the rootfs tarball, the build lock and the OCI rootfs live. ``create=False`` only names it: a
    backend that merely asks where its rootfs would be must work on a read-only home (a service container)."""
    import platformdirs  # here and below: every backend imports this module, few build an image

    path = Path(os.environ.get("SANDFORGE_CACHE_DIR") or platformdirs.user_cache_dir("sandforge"))
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def rootfs_tarball(progress: Progress, *, refresh: bool = False) -> Path:
    """The cached, trimmed debootstrap rootfs as a tarball; debootstraps it when missing."""
    target = cache_dir() / f"rootfs-{SUITE}-minbase-python3.tar"
    if target.exists() and not refresh:
        progress(f"using cached rootfs {target}")
        return target
    if os.geteuid() != 0:
        raise ImageBuildError("debootstrap needs root to build the base rootfs; run `sandforge image build` as root")
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed (apt-get install debootstrap)")
    mirror = apt_mirror()
    with tempfile.TemporaryDirectory(prefix="sandforge-rootfs-", dir=cache_dir()) as tmp:
        rootfs = Path(tmp) / "rootfs"
        progress(f"debootstrap --variant=minbase --include=python3 {SUITE} from {mirror} (about 40 s)")
        cmd = ["debootstrap", "--variant=minbase", "--include=python3", SUITE, str(rootfs), mirror]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-8:]
            raise ImageBuildError(f"debootstrap failed (exit {proc.returncode}): " + " | ".join(tail))
        for rel in TRIM:
            for child in (rootfs / rel).glob("*"):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        partial = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
        partial.replace(target)
    return target


def ensure_base(client: Any, progress: Progress, *, refresh: bool = False) -> str:
    """Import the cached rootfs as the local base image (no registry), unless it is already there."""
    import docker.errors

    api = _low_level(client)
    if not refresh:
        try:
            api.inspect_image(BASE_IMAGE)
            progress(f"base image {BASE_IMAGE} present")
            return BASE_IMAGE
        except docker.errors.ImageNotFound:
            pass
    tarball = rootfs_tarball(progress, refresh=refresh)
    repository, tag = BASE_IMAGE.split(":")
    progress(f"docker import {tarball.name} as {BASE_IMAGE}")
    api.import_image_from_file(str(tarball), repository=repository, tag=tag)
    api.inspect_image(BASE_IMAGE)  # the import reports errors only in its stream; check it landed
    return BASE_IMAGE


# --- the sandbox image ----------------------------------------------------------------------------------


def build_context(inside: dict[str, bytes]) -> bytes:
    """The build context: Dockerfile, the inside package and the installed RestrictedPython package (no
    caches), refused for a RestrictedPython with published escapes."""
    if not DOCKERFILE.exists():
        raise ImageBuildError(f"image recipe {DOCKERFILE} not found (sandforge must run from its source tree)")
    if advisory := restrictedpython_advisory():  # the image carries the installed copy
        raise ImageBuildError(f"the sandbox image is not built: {advisory}")
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0  # reproducible: the build cache keys on content
            tar.addfile(info, io.BytesIO(data))

        add("Dockerfile", DOCKERFILE.read_bytes())
        for name, data in sorted(inside.items()):
            add(f"inside/{name}", data)
        package = restrictedpython_dir()
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
                add(f"lib/{package.name}/{path.relative_to(package)}", path.read_bytes())
    return buf.getvalue()


def build(
    client: Any,
    repository: str = "sandforge-sandbox",
    *,
    force: bool = False,
    refresh_base: bool = False,
    progress: Progress | None = None,
) -> BuildResult:
    """Build the expected image (idempotent: a present image is left alone unless ``force``)."""
    import docker.errors
    import requests

    api = _low_level(client)
    say: Progress = progress or (lambda msg: log.info("%s", msg))
    inside = inside_files()  # read once: the tag must describe exactly what goes into the image
    tag = f"{repository}:{image_digest(inside)}"
    started = time.monotonic()
    steps: dict[str, float] = {}
    from filelock import FileLock, Timeout

    lock = FileLock(str(cache_dir() / "image-build.lock"))
    try:
        lock.acquire(timeout=1800)
    except Timeout as exc:
        raise ImageBuildError("another image build holds the lock for too long") from exc
    try:
        if not force and not refresh_base:
            try:
                info = api.inspect_image(tag)
                say(f"{tag} is present")
                if export_rootfs(api, tag, say):
                    steps["oci_rootfs"] = round(time.monotonic() - started, 2)
                return BuildResult(
                    tag=tag, built=False, image_id=str(info["Id"]), seconds=time.monotonic() - started, steps=steps
                )
            except docker.errors.ImageNotFound:
                pass
        mark = time.monotonic()
        base = ensure_base(client, say, refresh=refresh_base)
        steps["base"] = round(time.monotonic() - mark, 2)
        mark = time.monotonic()
        say(f"building {tag} from {base}")
        log_lines: list[str] = []
        for chunk in api.build(
            fileobj=io.BytesIO(build_context(inside)),
            custom_context=True,
            tag=tag,
            buildargs={"BASE": base},
            rm=True,
            forcerm=True,
            pull=False,
            nocache=force,
            network_mode="none",
            labels={LABEL: "1", "sandforge.restrictedpython": restrictedpython_version()},
            decode=True,
        ):
            if "error" in chunk:
                detail = " | ".join(line for line in log_lines[-6:] if line)
                raise ImageBuildError(f"docker build failed: {str(chunk['error']).strip()} ({detail})")
            if text := str(chunk.get("stream") or "").strip():
                log_lines.append(text)
                log.debug("build: %s", text)
        image_id = str(api.inspect_image(tag)["Id"])
        steps["image"] = round(time.monotonic() - mark, 2)
        mark = time.monotonic()
        export_rootfs(api, tag, say)
        steps["oci_rootfs"] = round(time.monotonic() - mark, 2)
        return BuildResult(tag=tag, built=True, image_id=image_id, seconds=time.monotonic() - started, steps=steps)
    except docker.errors.APIError as exc:
        raise ImageBuildError(f"the Docker engine refused: {exc.explanation or exc}") from exc
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise ImageBuildError(f"lost the Docker engine during the build: {exc}") from exc
    finally:
        lock.release()


# --- the same filesystem for OCI runtimes driven directly (the runc and runsc backends) -----------------


def oci_rootfs(tag: str) -> Path:
    """Where the image's filesystem is unpacked for runc/runsc (one directory per image tag)."""
    return cache_dir(create=False) / "oci" / tag.replace(":", "-") / "rootfs"


def export_rootfs(api: Any, tag: str, progress: Progress) -> bool:
    """Unpack the image's filesystem for the OCI backends, unless already there; True when it exported.

    ``docker export`` of a never-started container, streamed into ``tar`` in a temporary directory that is
    renamed into place only when complete, so a half-unpacked root is never used.
    """
    target = oci_rootfs(tag)
    if (target / IMAGE_ENTRY.lstrip("/")).exists():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    progress(f"unpacking {tag} for the runc/runsc backends into {target}")
    container = api.create_container(image=tag, command=["true"], network_disabled=True)
    try:
        with tempfile.TemporaryDirectory(prefix="rootfs-", dir=target.parent) as tmp:
            staging = Path(tmp) / "rootfs"
            staging.mkdir()
            tar = subprocess.Popen(
                ["tar", "--numeric-owner", "-x", "-C", str(staging)], stdin=subprocess.PIPE, stderr=subprocess.PIPE
            )
            assert tar.stdin is not None
            try:
                for chunk in api.export(container["Id"]):
                    tar.stdin.write(chunk)
            finally:
                tar.stdin.close()
                tar.wait(timeout=600)
            err = tar.stderr.read() if tar.stderr is not None else b""
            if tar.returncode != 0:
                raise ImageBuildError(f"unpacking the image failed: {err.decode(errors='replace').strip()[-300:]}")
            staging.chmod(0o755)
            if target.exists():
                shutil.rmtree(target)
            staging.replace(target)
    finally:
        api.remove_container(container["Id"], force=True)
    return True
