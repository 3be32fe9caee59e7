"""The packaging tests' real install (a wheel in a fresh venv, outside the repository), for the README's
examples: they are type-checked and run against what a user installs."""

from __future__ import annotations

from tests.architecture.test_packaging import installed  # noqa: F401 - a fixture, used by name
