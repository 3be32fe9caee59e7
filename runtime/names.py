"""Bounds on names and contract text that programs choose and the registry keeps (issue 13 item 7).

The lowest layer: the agent (checks nested calls), the store (keeps contracts) and the prompt renderer (shows
them to a model) all import these, so one number holds everywhere.
"""

from __future__ import annotations

import re

#: A role as a program may name it in ``tool(...)``/``delegate(...)``: an identifier, not text.
ROLE_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$"
#: A method as a program may call it on a tool handle.
METHOD_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,63}$"
#: A delegate's ``purpose``: at most this many characters.
MAX_PURPOSE_CHARS = 1000
#: Each other contract field (deliverable, acceptance, failure_policy): at most this many characters of JSON.
MAX_CONTRACT_FIELD_CHARS = 2000

_ROLE = re.compile(ROLE_PATTERN)
_METHOD = re.compile(METHOD_PATTERN)


def valid_role(name: object) -> bool:
    """``fullmatch``, not ``match``: ``$`` alone would accept a trailing newline."""
    return isinstance(name, str) and _ROLE.fullmatch(name) is not None


def valid_method(name: object) -> bool:
    return isinstance(name, str) and _METHOD.fullmatch(name) is not None
