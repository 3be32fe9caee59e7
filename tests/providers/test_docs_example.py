"""docs/providers.md's Python example runs as written, against an OpenAI-compatible server on loopback (its
``base_url`` pointed at the test's server, its key from the environment)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.providers.wire import Reply, program_completion, wire_server

DOC = Path(__file__).resolve().parents[2] / "docs" / "providers.md"
DOC_URL = "http://127.0.0.1:11434/v1"


def test_the_python_example_of_docs_providers_runs(tmp_path: Path) -> None:
    (example,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert DOC_URL in example
    with wire_server() as server:
        server.queue(Reply(body=program_completion("return args[0] + args[1]")))
        env = {**os.environ, "OPENAI_API_KEY": "sk-docs", "SANDFORGE_STATE_DIR": str(tmp_path),
               "SANDFORGE_BACKEND": "subprocess"}  # fmt: skip
        done = subprocess.run([sys.executable, "-c", example.replace(DOC_URL, f"{server.url}/v1")],
                              capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "5"
        assert server.requests[0].body["model"] == "qwen3"
