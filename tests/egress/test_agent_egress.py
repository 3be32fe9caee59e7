"""The agent's brokered egress end to end (issue 18): real programs calling ``fetch()`` in real sandboxes,
under a Workspace's policy, against loopback servers, inside a network namespace with only lo up.

The typed outcomes take their lanes, every outcome of an execution that fetched carries the host's records,
the call log holds them per attempt, and a credential reaches the server but never the program, an
outcome, the call log, a log line or an error message. ``sandforge exec`` brokers the same way.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sandforge.runtime.agent import Budgets, CallLog, Outcome, Workspace, read_records
from sandforge.runtime.guardrails import Policy, default_policy, load_policy
from sandforge.runtime.providers import ScriptedProvider
from sandforge.sandbox import Limits, SandboxConfig
from tests.egress.conftest import Net

pytestmark = pytest.mark.netns

SECRET = "s3cr3t-agent-token-0123456789"


def layer(tmp_path: Path, net: Net, extra: str = "") -> Policy:
    """allowed.test -> 127.0.0.1 (exempted), any path on the allowed server's port; forbidden.test ->
    127.0.0.2 (not exempted); closed.test -> 127.0.0.1 on a port nobody listens on."""
    directory = tmp_path / "policy"
    directory.mkdir(exist_ok=True)
    (directory / "egress.yaml").write_text(
        "grant: [http_fetch]\n"
        "egress:\n"
        "  allow:\n"
        f'    - {{url: "http://allowed.test:{net.port}/**", name: loopback}}\n'
        f'    - {{url: "http://forbidden.test:{net.port}/**"}}\n'
        '    - {url: "http://closed.test:9/**"}\n'
        '  allow_ranges: ["127.0.0.1/32"]\n'
        "  resolve: {allowed.test: 127.0.0.1, forbidden.test: 127.0.0.2, closed.test: 127.0.0.1}\n" + extra
    )
    return load_policy([*default_policy().sources, directory])


@pytest.fixture
def backend(sandbox_backend: str) -> str:
    if sandbox_backend not in ("subprocess", "docker", "runsc"):
        pytest.skip("the agent's egress is backend-neutral: subprocess and two container backends suffice here")
    return sandbox_backend


class Run:
    def __init__(
        self, tmp_path: Path, backend: str, policy: Policy, programs: list[str], *, limits: Limits | None = None,
        **budgets: int,
    ) -> None:  # fmt: skip
        self.log_path = tmp_path / "calls.jsonl"
        self.provider = ScriptedProvider(programs)
        config = SandboxConfig(backend=backend, pool_size=0, limits=limits or Limits())
        self.ws = Workspace(
            provider=self.provider, sandbox=config, policy=policy,
            log=CallLog(self.log_path), budgets=Budgets(**budgets),
        )  # fmt: skip

    def call(self) -> Outcome:
        return self.ws.call("news", "latest")

    def records(self) -> list[Any]:
        return list(read_records(self.log_path))


@pytest.fixture
def runs() -> Iterator[list[Run]]:
    made: list[Run] = []
    yield made
    for run in made:
        run.ws.close()


def program(url: str, body: str = "return {'status': r.status, 'text': r.text}") -> str:
    return f"r = fetch({url!r})\n{body}\n"


def test_an_allowed_fetch_returns_its_data_with_the_hosts_provenance(
    tmp_path: Path, net: Net, backend: str, runs: list[Run]
) -> None:
    url = f"http://allowed.test:{net.port}/hello"
    run = Run(tmp_path, backend, layer(tmp_path, net), [program(url)])
    runs.append(run)
    outcome = run.call()
    assert outcome.ok, outcome
    assert outcome.value == {"status": 200, "text": "hello"}
    [entry] = outcome.metadata["egress"]
    assert (entry["method"], entry["url"], entry["final_url"], entry["status"], entry["bytes"]) == (
        "GET", url, url, 200, 5,
    )  # fmt: skip
    assert entry["rule"] == f"loopback (http://allowed.test:{net.port}/**)" and entry["denied"] is None
    [record] = run.records()
    assert record.egress_requests == 1 and record.egress[0].status == 200 and record.egress[0].url == url
    assert record.usage.fetch_duration_s > 0
    assert len(net.allowed.seen) == 1 and net.nothing_reached_forbidden()


def test_a_denied_fetch_is_terminal_and_the_server_receives_nothing(
    tmp_path: Path, net: Net, backend: str, runs: list[Run]
) -> None:
    run = Run(tmp_path, backend, layer(tmp_path, net), [program(f"http://forbidden.test:{net.port}/x")] * 2)
    runs.append(run)
    outcome = run.call()
    assert (outcome.error_type, outcome.retriable) == ("egress_denied", False)
    assert "127.0.0.2" in (outcome.error_message or "") and "will not help" in (outcome.error_message or "")
    assert run.provider.calls == 1 and not net.forbidden.seen
    assert outcome.metadata["egress"][0]["error"] == "egress_denied"


def test_without_the_grant_nothing_is_sent(tmp_path: Path, net: Net, backend: str, runs: list[Run]) -> None:
    """The guardrail refuses a fetching program before it runs (terminal); the bridge's own refusal of an
    ungranted fetch at run time is tests/agent/test_egress_lanes.py's (a program the guardrail let through)."""
    run = Run(tmp_path, backend, default_policy(), [program(f"http://allowed.test:{net.port}/hello")] * 2)
    runs.append(run)
    outcome = run.call()
    assert (outcome.error_type, outcome.retriable) == ("guardrail_violation", False)
    assert "http_fetch" in (outcome.error_message or "") and run.provider.calls == 1
    assert not net.allowed.seen


def test_a_network_error_is_returned_retriable_without_regeneration(
    tmp_path: Path, net: Net, backend: str, runs: list[Run]
) -> None:
    run = Run(tmp_path, backend, layer(tmp_path, net), [program("http://closed.test:9/x")] * 2)
    runs.append(run)
    outcome = run.call()
    assert (outcome.error_type, outcome.retriable) == ("network_error", True)
    assert outcome.metadata["failure_class"] == "extrinsic" and run.provider.calls == 1


def test_a_limit_goes_to_execution_repair_and_each_attempt_keeps_its_requests(
    tmp_path: Path, net: Net, backend: str, runs: list[Run]
) -> None:
    policy = layer(tmp_path, net, "  limits: {max_response_bytes: 1000}\n")
    big, small = f"http://allowed.test:{net.port}/big?n=5000", f"http://allowed.test:{net.port}/hello"
    run = Run(tmp_path, backend, policy, [program(big), program(small)])
    runs.append(run)
    outcome = run.call()
    assert outcome.ok and outcome.value == {"status": 200, "text": "hello"}
    [record] = run.records()
    [failed] = record.attempt_failures
    assert failed.error_type == "egress_limit" and [e.error for e in failed.egress] == ["egress_limit"]
    assert "max_response_bytes" in (failed.egress[0].denied or "")
    assert [e.url for e in record.egress] == [small]


def test_a_credential_reaches_the_server_and_nowhere_else(
    tmp_path: Path,
    net: Net,
    backend: str,
    runs: list[Run],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("AGENT_EGRESS_TOKEN", SECRET)
    creds = (
        '  credentials:\n    - {host: allowed.test, header: Authorization, value: "Bearer ${AGENT_EGRESS_TOKEN}", '
        "schemes: [http]}\n"
    )
    echo = f"http://allowed.test:{net.port}/echo"
    leaks = (
        "seen = r.json()\n"
        "context['seen'] = seen\n"
        "raise ValueError('server saw ' + str(seen.get('headers')) + ' ' + str(r.headers))"
    )
    ok = "return {'headers': r.json()['headers'], 'response_headers': dict(r.headers)}"
    run = Run(tmp_path, backend, layer(tmp_path, net, creds), [program(echo, leaks), program(echo, ok)])
    runs.append(run)
    with caplog.at_level(logging.DEBUG):
        outcome = run.call()
    assert outcome.ok, outcome
    assert [s.headers.get("authorization") for s in net.allowed.seen] == [f"Bearer {SECRET}"] * 2
    assert outcome.value["headers"]["authorization"] == "[redacted]"  # the broker redacts what it echoes
    everything = [
        json.dumps(outcome.value),
        json.dumps(outcome.metadata, default=str),
        run.log_path.read_text(),
        caplog.text,
        json.dumps(run.ws.context("news"), default=str),
    ]
    assert "server saw" in run.log_path.read_text()  # the failed attempt's error message is in the log
    for text in everything:
        assert SECRET not in text


def test_sandforge_exec_brokers_under_its_policy(tmp_path: Path, net: Net, backend: str) -> None:
    from sandforge.runtime.cli import main as cli

    layer(tmp_path, net)
    source = tmp_path / "prog.py"
    source.write_text(program(f"http://allowed.test:{net.port}/hello"))
    result = CliRunner().invoke(
        cli, ["exec", str(source), "--backend", backend, "--policy", str(tmp_path / "policy"), "--json"]
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["value"] == {"status": 200, "text": "hello"}
    assert shown["metadata"]["egress"][0]["status"] == 200 and shown["metadata"]["fetches"] == 1
    text = CliRunner().invoke(cli, ["exec", str(source), "--backend", backend, "--policy", str(tmp_path / "policy")])
    assert text.exit_code == 0 and f"fetch GET http://allowed.test:{net.port}/hello -> 200, 5 bytes" in text.stderr
    denied = CliRunner().invoke(cli, ["exec", str(source), "--backend", backend])  # the default policy: no grant
    assert denied.exit_code == 4 and "capability_not_granted" in denied.stderr and "http_fetch" in denied.stderr
    assert len(net.allowed.seen) == 2  # the two runs above; the refused one sent nothing


STYLES = {
    "requests": "import requests\nr = requests.get({url!r}, timeout=5)\n"
    "return {{'status': r.status_code, 'text': r.text}}\n",
    "urllib": "import urllib.request\nf = urllib.request.urlopen({url!r})\n"
    "return {{'status': f.status, 'text': f.read().decode()}}\n",
}


@pytest.mark.parametrize("style", sorted(STYLES))
def test_programs_written_by_habit_fetch_through_the_broker_too(
    tmp_path: Path, net: Net, backend: str, runs: list[Run], style: str
) -> None:
    url, denied = f"http://allowed.test:{net.port}/hello", f"http://forbidden.test:{net.port}/x"
    programs = [STYLES[style].format(url=url), STYLES[style].format(url=denied), "return 0"]
    run = Run(tmp_path, backend, layer(tmp_path, net), programs)
    runs.append(run)
    outcome = run.call()
    assert outcome.ok and outcome.value == {"status": 200, "text": "hello"}, outcome
    assert outcome.metadata["egress"][0]["final_url"] == url
    refused = run.call()  # a call without a store generates again: this time the denied URL
    assert (refused.error_type, refused.retriable) == ("egress_denied", False), refused
    assert run.provider.calls == 2 and not net.forbidden.seen  # terminal: "return 0" was never asked for


def test_agents_on_one_policy_fetch_at_once(tmp_path: Path, net: Net, runs: list[Run]) -> None:
    """Four workspaces on one policy (one broker): the server holds each request until all four arrived, so
    an agent side that serialised fetches (one lock, one session, one thread) would break the barrier."""
    import threading

    policy = layer(tmp_path, net)
    net.allowed.barrier = threading.Barrier(4)
    url = f"http://allowed.test:{net.port}/wait"
    for index in range(4):
        (tmp_path / str(index)).mkdir()
        # each waits at the barrier for the slowest cold start (seconds on a loaded CI machine): a limit past
        # the barrier's own 20 s, so only an agent side that serialised the fetches fails here
        runs.append(Run(tmp_path / str(index), "subprocess", policy, [program(url)], limits=Limits(timeout_s=30)))
    outcomes: list[Outcome] = []
    threads = [threading.Thread(target=lambda run=run: outcomes.append(run.call())) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [o.value for o in outcomes] == [{"status": 200, "text": "together"}] * 4, outcomes


def test_sandforge_exec_never_shows_a_credential(tmp_path: Path, net: Net, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandforge.runtime.cli import main as cli

    monkeypatch.setenv("AGENT_EGRESS_TOKEN", SECRET)
    layer(tmp_path, net, '  credentials:\n    - {host: allowed.test, header: X-Key, value: "${AGENT_EGRESS_TOKEN}", '
          "schemes: [http]}\n")  # fmt: skip
    source = tmp_path / "prog.py"
    source.write_text(program(f"http://allowed.test:{net.port}/echo", "print(r.text)\nraise ValueError(r.text)"))
    for extra in (["--json"], []):
        result = CliRunner().invoke(cli, ["exec", str(source), "--policy", str(tmp_path / "policy"), *extra])
        assert result.exit_code == 1 and "[redacted]" in result.output + result.stderr
        assert SECRET not in result.output and SECRET not in result.stderr
    assert [seen.headers.get("x-key") for seen in net.allowed.seen] == [SECRET, SECRET]
