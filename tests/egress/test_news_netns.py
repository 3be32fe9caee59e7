"""The news scenario (`sandforge demo --news`) inside a network namespace with only lo up: the demo's local
internet is all there is, so even a broken broker or layer could not reach a real news site. The same checks
run on every backend, outside a namespace, in tests/acceptance/test_news_demo.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandforge.sandbox import Sandbox, SandboxConfig
from tests.acceptance.test_news_demo import (
    assert_answers_each_source_with_the_brokers_provenance,
    check_only_the_three_feeds,
    run,
)

pytestmark = pytest.mark.netns


def test_two_runs_of_the_scenario_with_only_lo(tmp_path: Path) -> None:
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=1)) as sandbox:
        first, _ = run(sandbox, tmp_path / "store", tmp_path / "run1")
        second, _ = run(sandbox, tmp_path / "store", tmp_path / "run2")
    assert_answers_each_source_with_the_brokers_provenance(first)
    assert [step.decisions[0] for step in first.steps] == ["inline:requests", "inline:urllib", "forge"]
    assert_answers_each_source_with_the_brokers_provenance(second)
    assert second.model_calls == {"assistant.ask": 3}


def test_the_layer_reaches_only_the_three_feeds_with_only_lo(tmp_path: Path) -> None:
    with Sandbox(SandboxConfig(backend="subprocess", pool_size=1)) as sandbox:
        check_only_the_three_feeds(sandbox, tmp_path)
