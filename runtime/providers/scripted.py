"""ScriptedProvider: replays prepared programs in order and records every request it receives.

It drives the demo and the tests: each ``generate`` call takes the next program, whatever the call, so a
script is read top to bottom in the order the lifecycle asks (nested calls included). An item may be an
exception instance, which is raised instead (to script provider failures).

A script file is either JSON (a list of strings or ``{"code": ..., "dependencies": [...]}`` objects) or
plain text with programs separated by lines that are exactly ``# ---``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from pathlib import Path

from sandforge.runtime.errors import UsageError
from sandforge.runtime.files import decode_json, read_user_file
from sandforge.runtime.files.structured import DATA_FILE_MAX_BYTES
from sandforge.runtime.providers.base import GeneratedProgram, GenerationRequest, ProviderError
from sandforge.runtime.providers.prompt import RenderedPrompt, render_prompt

SEPARATOR = re.compile(r"^# ---[ \t]*$", re.MULTILINE)

ScriptItem = str | GeneratedProgram | BaseException


class ScriptedProvider:
    """Returns ``programs[0]``, then ``programs[1]``, ...; raises a non-retriable ProviderError when empty."""

    name = "scripted"

    def __init__(self, programs: Iterable[ScriptItem] | str | Path) -> None:
        if isinstance(programs, (str, Path)):
            items: list[ScriptItem] = list(load_script(Path(programs)))
        else:
            items = list(programs)
        self._items = items
        self._next = 0
        self._lock = threading.Lock()
        #: every request received, in order (also the ones that found the script empty)
        self.requests: list[GenerationRequest] = []
        #: the prompt a real model would have been sent for each request
        self.prompts: list[RenderedPrompt] = []

    @property
    def calls(self) -> int:
        """How many times ``generate`` was called."""
        return len(self.requests)

    @property
    def remaining(self) -> int:
        return len(self._items) - self._next

    def generate(self, request: GenerationRequest) -> GeneratedProgram:
        with self._lock:
            self.requests.append(request)
            self.prompts.append(render_prompt(request))
            if self._next >= len(self._items):
                raise ProviderError(
                    f"scripted provider has no program left for {request.role}.{request.method} "
                    f"(script had {len(self._items)})",
                    retriable=False,
                    kind="script_exhausted",
                )
            item = self._items[self._next]
            self._next += 1
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, GeneratedProgram):
            return item.model_copy(update={"provider": self.name})
        return GeneratedProgram(code=item, provider=self.name)


def load_script(path: Path) -> list[GeneratedProgram]:
    """Programs from a JSON list or a ``# ---``-separated text file."""
    raw = read_user_file(path, limit=DATA_FILE_MAX_BYTES, what="program script")  # bounded, regular only
    if path.suffix == ".json":
        data = decode_json(raw, what=f"program script {path}")
        if not isinstance(data, list):
            raise UsageError(f"{path}: a JSON script must be a list of programs")
        programs = []
        for index, item in enumerate(data):
            if isinstance(item, str):
                programs.append(GeneratedProgram(code=item))
            elif isinstance(item, dict) and isinstance(item.get("code"), str):
                deps = item.get("dependencies") or []
                if not isinstance(deps, list):
                    raise UsageError(f"{path}: item {index}: 'dependencies' must be a list")
                programs.append(GeneratedProgram(code=item["code"], dependencies=[str(d) for d in deps]))
            else:
                raise UsageError(f"{path}: item {index} is neither a string nor an object with 'code'")
        return programs
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise UsageError(f"{path}:{line}: program script is not valid UTF-8") from None
    chunks = [chunk.strip("\n") for chunk in SEPARATOR.split(text)]
    return [GeneratedProgram(code=chunk + "\n") for chunk in chunks if chunk.strip()]
