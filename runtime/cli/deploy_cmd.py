"""`sandforge deploy render`: Kubernetes manifests for KubeRay or agent-sandbox, validated (docs/deploy.md)."""

from __future__ import annotations

from pathlib import Path

import click
from pydantic import ValidationError

from sandforge.runtime.cli.common import SandforgeGroup
from sandforge.runtime.cli.output import emit_json
from sandforge.runtime.deploy.render import TARGETS, Target, Values, render, write
from sandforge.runtime.deploy.validate import ManifestError
from sandforge.runtime.errors import UsageError
from sandforge.runtime.files import read_user_file
from sandforge.runtime.files.yamltext import compose_yaml

MAX_VALUES_BYTES = 1024 * 1024


@click.group(cls=SandforgeGroup)
def command() -> None:
    """Deployment manifests (rendered and validated here; applying them is kubectl's job)."""


command.name = "deploy"


def load_values(path: Path | None) -> Values:
    if path is None:
        return Values()
    data = compose_yaml(str(path), read_user_file(path, limit=MAX_VALUES_BYTES, what="values file").decode())
    try:
        return Values.model_validate(data or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top)"
        raise UsageError(f"--values {path}: {where}: {err['msg']}") from None


@command.command("render")
@click.option("--target", type=click.Choice(TARGETS), required=True, help="kuberay (RayCluster) or agent-sandbox.")
@click.option("--values", "values_path", type=click.Path(dir_okay=False, path_type=Path), help="YAML values file.")
@click.option("-o", "--output", "out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory to write the manifests to (one YAML file per object).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def render_cmd(target: Target, values_path: Path | None, out: Path, as_json: bool) -> None:
    """Write the manifests of TARGET to OUTPUT, each checked against the Kubernetes API models first."""
    values = load_values(values_path)
    try:
        objects = render(target, values)
    except ManifestError as exc:
        raise UsageError(f"rendered manifest is invalid: {exc}") from None
    paths = write(objects, out)
    if as_json:
        emit_json({"target": target, "files": [str(p) for p in paths]})
        return
    for path in paths:
        click.echo(str(path))
