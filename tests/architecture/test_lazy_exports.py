"""One helper (runtime/lazy.py) gives the packages with lazily loaded names their ``__getattr__`` and
``__dir__``: every exported name resolves, an unknown one is an AttributeError, importing the package alone
loads none of the names' modules."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

PACKAGES = {
    "sandforge": ("sandforge.runtime.agent", "sandforge.runtime.store", "sandforge.sandbox"),
    "sandforge.runtime.providers": ("sandforge.runtime.providers.anthropic_provider", "anthropic"),
    "sandforge.runtime.egress": ("sandforge.runtime.egress.broker", "httpx"),
    "sandforge.runtime.environments": (
        "sandforge.runtime.environments.builder",
        "sandforge.runtime.environments.uvtool",
        "sandforge.runtime.environments.records",
    ),
    "sandforge.runtime.store": ("sandforge.runtime.store.toolstore", "sandforge.runtime.store.registry_db", "sqlite3"),
}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_exported_name_resolves_and_nothing_else(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__getattr__.__module__ == "sandforge.runtime.lazy"
    for name in module.__all__:
        assert getattr(module, name) is not None, name
        assert name in dir(module)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        module.nope  # noqa: B018


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_importing_the_package_alone_stays_light(package: str) -> None:
    probe = f"import json, sys; import {package}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert [m for m in PACKAGES[package] if m in loaded] == []
