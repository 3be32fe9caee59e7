"""How `sandforge exec` ends: as a process it skips the interpreter's teardown (issue 39) yet flushes its output,
runs the exit handlers and keeps its exit status; called in-process it leaves the process as it found it."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandforge.runtime.cli import main

#: ``main()`` with no arguments, as the installed ``sandforge`` script calls it, after an exit handler of its own
#: and an object that says so when the interpreter's teardown frees it.
ENTRY = (
    "import atexit, builtins, sys\n"
    "atexit.register(lambda: sys.stderr.write('exit handler ran\\n'))\n"
    "class Freed:\n"
    "    def __del__(self): sys.__stderr__.write('teardown ran\\n')\n"
    "builtins.freed = Freed()\n"
    "from sandforge.runtime.cli import main\n"
    "sys.exit(main())\n"
)


def test_exec_as_a_process_skips_the_teardown_yet_flushes_runs_exit_handlers_keeps_its_status(tmp_path: Path) -> None:
    program = tmp_path / "fails.py"
    program.write_text("print('x' * 50000)\nraise ValueError('no')\n")
    env = {**os.environ, "SANDFORGE_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-c", ENTRY, "exec", "--backend", "subprocess", str(program), "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    outcome = json.loads(done.stdout)  # all of it reached the pipe
    assert outcome["error_type"] == "execution" and outcome["stdout"] == "x" * 50000 + "\n"
    assert done.stderr.endswith("exit handler ran\n")  # the handlers ran, the teardown did not


@pytest.mark.parametrize("call", ["runner", "with_arguments"])
def test_exec_in_process_leaves_the_collector_running_and_raises_system_exit(tmp_path: Path, call: str) -> None:
    program = tmp_path / "two.py"
    program.write_text("return 1 + 1\n")
    args = ["exec", "--backend", "subprocess", str(program)]
    assert gc.isenabled()
    if call == "runner":
        assert CliRunner().invoke(main, args).exit_code == 0
    else:
        with pytest.raises(SystemExit) as ended:
            main(args)
        assert ended.value.code == 0
    assert gc.isenabled()
