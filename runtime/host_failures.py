"""One family of typed failures the host observes on a program's behalf: a brokered request
(``runtime.egress.errors``) and preparing an environment (``runtime.environments.errors``).

Each class names its outcome type (``kind``, an ``ErrorType`` value: one name per concept, the same in the
sandbox's outcomes, the lifecycle's lanes and the call log) and how the lifecycle treats it when nothing
catches it (`Lane`). A family's ``ERRORS`` and ``LIFECYCLE`` tables are derived from its classes
(:func:`tables`), so a kind cannot have a class without a lane or a lane without a class."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, NamedTuple, TypeVar

from sandforge.runtime.errors import SandforgeError


class Lane(NamedTuple):
    """How the lifecycle treats a kind (ADR 0016's classes): it ends the call whatever a retry would do
    (``terminal``), the same program may succeed later (``retriable``), it is the artifact's fault
    (``counts_against_health``)."""

    terminal: bool
    retriable: bool
    counts_against_health: bool


class HostFailure(SandforgeError):
    """Base of the family: a one-line message, the outcome type ``kind``, a finer ``reason``, a hint."""

    kind: ClassVar[str]
    lane: ClassVar[Lane]

    def __init__(self, message: str, *, reason: str = "", hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.reason = reason or self.kind


F = TypeVar("F", bound=HostFailure)


def tables(classes: Iterable[type[F]]) -> tuple[dict[str, type[F]], dict[str, Lane]]:
    """A family's (kind -> class, kind -> lane); two classes of one kind are a programming error."""
    errors: dict[str, type[F]] = {}
    for cls in classes:
        if cls.kind in errors:
            raise ValueError(f"two failure classes of kind {cls.kind!r}")
        errors[cls.kind] = cls
    return errors, {kind: cls.lane for kind, cls in errors.items()}
