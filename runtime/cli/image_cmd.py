"""`sandforge image build|status`: the container backends' sandbox image, built offline (no registry)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from sandforge.runtime.cli.output import emit_json
from sandforge.runtime.cli.progress import Steps
from sandforge.runtime.errors import SandforgeError
from sandforge.sandbox import SandboxConfig
from sandforge.sandbox.errors import SandboxUnavailable


def _client(config: SandboxConfig) -> Any:
    from sandforge.sandbox.docker_engine import connect

    try:
        return connect(config.docker_base_url)
    except SandboxUnavailable as exc:
        raise SandforgeError(str(exc), hint="start dockerd (see .ci/run) or set DOCKER_HOST") from exc


@click.group("image")
def command() -> None:
    """The sandbox image used by the docker and gvisor backends."""


@command.command("build")
@click.option("--force", is_flag=True, help="Rebuild the image even if the expected tag is present.")
@click.option("--refresh-base", is_flag=True, help="Also re-run debootstrap for the base rootfs (slow).")
@click.option("-q", "--quiet", is_flag=True, help="Print only the tag.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (progress stays on stderr).")
@click.option("--service", is_flag=True, help="Build the service image (`sandforge serve`: deploy/compose.yaml).")
@click.option("--extra", "extras", multiple=True, help="With --service: also install this extra (e.g. cluster).")
def build_cmd(
    force: bool, refresh_base: bool, quiet: bool, as_json: bool, service: bool, extras: tuple[str, ...]
) -> None:
    """Build the image for this runner version (idempotent: does nothing when it is present).

    debootstrap (Debian bookworm, minbase + python3) from the mirror apt uses, cached under
    ~/.cache/sandforge; `docker import` as a local base; then images/Dockerfile adds the runner.
    With --service: the same base, the sandforge wheel of this source tree and its dependencies
    (images/service/Dockerfile), tagged sandforge-service:DIGEST and :latest.
    """
    from sandforge.sandbox import image

    config = SandboxConfig.from_env()
    client = _client(config)
    with Steps("service image build" if service else "image build", quiet=quiet) as shown:
        try:
            if service:
                from sandforge.runtime.deploy.service_image import build_service

                result = build_service(client, extras=extras, force=force, progress=shown.step)
            else:
                if extras:
                    raise SandforgeError("--extra applies to the service image (--service)")
                result = image.build(client, config.image, force=force, refresh_base=refresh_base, progress=shown.step)
        except image.ImageBuildError as exc:
            raise SandforgeError(f"image build failed: {exc}") from exc
    if as_json:
        emit_json({"tag": result.tag, "built": result.built, "seconds": round(result.seconds, 3),
                   "steps": {k: round(v, 3) for k, v in result.steps.items()}})  # fmt: skip
        return
    if quiet:
        click.echo(result.tag)
        return
    if result.built:
        steps = ", ".join(f"{name} {secs:.1f}s" for name, secs in result.steps.items())
        click.echo(f"built {result.tag} in {result.seconds:.1f}s ({steps})")
    else:
        click.echo(f"{result.tag} is up to date")


@command.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status_cmd(as_json: bool) -> None:
    """Show the expected tag and whether it is present (exit 1 when it is missing or stale)."""
    from sandforge.sandbox import image

    config = SandboxConfig.from_env()
    st = image.status(_client(config), config.image)
    if as_json:
        click.echo(json.dumps(st.model_dump(mode="json"), indent=2))
    else:
        click.echo(f"expected  {st.expected}")
        click.echo(f"present   {'yes (' + (st.image_id or '')[7:19] + ')' if st.present else 'no'}")
        click.echo(f"base      {st.base} {'present' if st.base_present else 'missing'}")
        click.echo(f"rootfs    {st.oci_rootfs} {'unpacked' if st.oci_rootfs_present else 'missing'} (runc/runsc)")
        if st.stale:
            click.echo(f"stale     {', '.join(sorted(st.stale))}")
        if not st.present or not st.oci_rootfs_present:
            click.echo(f"hint: {image.BUILD_HINT}", err=True)
    sys.exit(0 if st.present else 1)
