"""Bounds on names and contract text that programs choose and the registry keeps (issue 13 item 7).

The agent (checks nested calls), the store (keeps contracts) and the prompt renderer (shows them to a model)
all import these; the contract bounds come from the wire model, so one number holds from frame to prompt.
"""

from __future__ import annotations

import re

from sandforge.sandbox.protocol import MAX_CONTRACT_FIELD_CHARS, MAX_PURPOSE_CHARS

#: A role as a program may name it in ``tool(...)``/``delegate(...)``: an identifier, not text.
ROLE_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$"
#: A method as a program may call it on a tool handle.
METHOD_PATTERN = r"^[A-Za-z][A-Za-z0-9_]{0,63}$"

_ROLE = re.compile(ROLE_PATTERN)
_METHOD = re.compile(METHOD_PATTERN)


def valid_role(name: object) -> bool:
    """``fullmatch``, not ``match``: ``$`` alone would accept a trailing newline."""
    return isinstance(name, str) and _ROLE.fullmatch(name) is not None


def valid_method(name: object) -> bool:
    return isinstance(name, str) and _METHOD.fullmatch(name) is not None


#: The contract bounds are the wire model's (``sandbox.protocol``): one number from the frame to the prompt.
__all__ = [
    "MAX_CONTRACT_FIELD_CHARS",
    "MAX_PURPOSE_CHARS",
    "METHOD_PATTERN",
    "ROLE_PATTERN",
    "valid_method",
    "valid_role",
]
