"""Every file sandforge reads from a user or writes for one goes through here (docs/security.md,
"Files and input at the edges"): bounded reads of regular files only, strict JSON, atomic private writes,
per-file locks for read-modify-write. Each name loads its module on first use: reading the settings file (which
every command does) needs neither pydantic_core (strict JSON) nor filelock (locks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandforge.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from sandforge.runtime.files.dirs import SymlinkRefused, make_dirs, open_dir_below
    from sandforge.runtime.files.jsontext import decode_json, encode_compact
    from sandforge.runtime.files.locks import exclusive
    from sandforge.runtime.files.read import read_arg_file, read_state_file, read_user_file
    from sandforge.runtime.files.write import append_line, io_error, make_private_dir, write_state_file, write_user_file

__all__ = [
    "SymlinkRefused",
    "append_line",
    "decode_json",
    "encode_compact",
    "exclusive",
    "io_error",
    "make_dirs",
    "make_private_dir",
    "open_dir_below",
    "read_arg_file",
    "read_state_file",
    "read_user_file",
    "write_state_file",
    "write_user_file",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "SymlinkRefused": ".dirs",
        "make_dirs": ".dirs",
        "open_dir_below": ".dirs",
        "decode_json": ".jsontext",
        "encode_compact": ".jsontext",
        "exclusive": ".locks",
        "read_arg_file": ".read",
        "read_state_file": ".read",
        "read_user_file": ".read",
        "append_line": ".write",
        "io_error": ".write",
        "make_private_dir": ".write",
        "write_state_file": ".write",
        "write_user_file": ".write",
    },
)
