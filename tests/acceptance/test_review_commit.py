"""A commit that cannot keep the context file's owner or group (issue 14 item 3) says so in one line.

A non-root user may own a context file whose group is not one of theirs; the replacement file cannot get
that group back (EPERM). The commit is refused (fail closed: the secret would otherwise change group) with
exit 5, the file intact, and an error that names the owner problem rather than blaming the permissions.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import main


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file another owner")
def test_owner_that_cannot_be_kept_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    program = tmp_path / "inc.py"
    program.write_text("context['n'] = context.get('n', 0) + 1\nreturn context['n']\n")
    ctx = tmp_path / "ctx.json"
    ctx.write_text('{"n": 0}')
    os.chown(ctx, 65534, 65534)

    def refuse(fd: int, uid: int, gid: int) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "fchown", refuse)
    result = CliRunner().invoke(main, ["exec", str(program), "--context", str(ctx), "--commit"])

    assert result.exit_code == 7  # FileIOError (runtime/cli/exits.py)
    assert ctx.read_text() == '{"n": 0}'
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "owner" in errors[0] and "65534:65534" in errors[0], result.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
