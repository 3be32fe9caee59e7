"""Glob patterns over qualified names: exact names hit a set, wildcards one compiled regex."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

_WILDCARDS = frozenset("*?[")
T = TypeVar("T")


class GlobSet:
    """A set of fnmatch-style patterns (case-sensitive; ``*`` also matches dots)."""

    __slots__ = ("_prefixes", "_regex", "_suffixes", "exact", "patterns", "wild")

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)
        self.exact = frozenset(p for p in patterns if not _WILDCARDS & set(p))
        self.wild = tuple(p for p in patterns if _WILDCARDS & set(p))
        self._regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in self.wild)) if self.wild else None
        # necessary conditions for any wildcard match, checked in C before the regex
        self._prefixes = tuple({p[: min(p.find(c) for c in _WILDCARDS if c in p)] for p in self.wild})
        self._suffixes = tuple({_literal_suffix(p) for p in self.wild})

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def matches(self, name: str) -> bool:
        if name in self.exact:
            return True
        return (
            self._regex is not None
            and name.startswith(self._prefixes)
            and name.endswith(self._suffixes)
            and self._regex.match(name) is not None
        )

    def select(self, index: Mapping[str, T]) -> Iterator[tuple[str, T]]:
        """The entries of `index` whose key matches: exact patterns by lookup, wildcards by scan."""
        for name in self.exact:
            found = index.get(name)
            if found is not None:
                yield name, found
        regex = self._regex
        if regex is not None:  # `matches`, inline: this scans every key of the index
            exact, prefixes, suffixes = self.exact, self._prefixes, self._suffixes
            for name, value in index.items():
                if (
                    name.startswith(prefixes)
                    and name.endswith(suffixes)
                    and name not in exact
                    and regex.match(name) is not None
                ):
                    yield name, value

    def first_match(self, names: Iterable[str]) -> str | None:
        return next((name for name in names if self.matches(name)), None)


def _literal_suffix(pattern: str) -> str:
    last = max(pattern.rfind(c) for c in _WILDCARDS)
    suffix = pattern[last + 1 :]
    return "" if "]" in suffix else suffix
