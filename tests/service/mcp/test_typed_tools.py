"""Issue 37 item 2: a stored tool's MCP schemas come from its contract, and a tenant lists only the stored
tools its policy would approve. In-process through the Python SDK's client; schemas checked with jsonschema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from mcp import Client

from sandforge.runtime.service.tenants import standalone_tenant
from sandforge.runtime.store import ToolContract
from tests.service.mcp.test_server import run
from tests.service.mcp.test_stdio import failure, ok
from tests.store.test_health_attribution import FETCH, store_program

WEB_FETCHER = ToolContract(
    role="web_fetcher", purpose="Fetch a URL and return its body", deliverable={"type": "string"},
    inputs={"fetch": [{"name": "url", "type": "string", "description": "the page to fetch"}]},
)  # fmt: skip
CALCULATOR = ToolContract(
    role="calculator", purpose="Arithmetic.", deliverable={"type": "number"},
    inputs={"add": [{"name": "a", "type": "number"}, {"name": "b", "type": "number", "default": 1}]},
)  # fmt: skip
ADD = "b = args[1] if len(args) > 1 else 1\nreturn args[0] + b\n"


def seeded(state: Path) -> Path:
    store_program(state, "web_fetcher", "fetch", FETCH, WEB_FETCHER)
    store_program(state, "calculator", "add", ADD, CALCULATOR)
    store_program(state, "echo", "say", "return [args, kwargs]\n")  # no contract: untyped
    return state


def grant_fetch(tmp_path: Path) -> Path:
    layer = tmp_path / "egress"
    layer.mkdir(exist_ok=True)
    (layer / "egress.yaml").write_text("grant: [http_fetch]\negress:\n  allow:\n    - url: 'https://example.com/**'\n")
    return layer


def test_a_stored_fetcher_is_typed_by_its_contract(tmp_path: Path) -> None:
    state = seeded(tmp_path / "state")
    tools: dict[str, Any] = {}

    async def body(client: Client) -> None:
        tools.update({t.name: t for t in (await client.list_tools()).tools})

    run(standalone_tenant("a", state, policy=(grant_fetch(tmp_path),), backend="subprocess"), body)
    fetch = tools["web_fetcher.fetch"]
    assert fetch.input_schema == {
        "type": "object",
        "properties": {"url": {"type": "string", "description": "the page to fetch"}},
        "required": ["url"],
        "additionalProperties": False,
    }
    assert fetch.output_schema["properties"]["value"] == {"type": "string"}
    for tool in tools.values():
        Draft202012Validator.check_schema(tool.input_schema)
        if tool.output_schema is not None:
            Draft202012Validator.check_schema(tool.output_schema)
    Draft202012Validator(fetch.input_schema).validate({"url": "https://example.com/"})
    assert tools["calculator.add"].input_schema["required"] == ["a"]  # b has a default
    assert set(tools["echo.say"].input_schema["properties"]) == {"args", "kwargs"}  # untyped: the generic form
    assert "args" not in fetch.description and "\n    " not in fetch.description


def test_named_arguments_map_back_to_the_methods_positional_parameters(tmp_path: Path) -> None:
    state = seeded(tmp_path / "state")

    async def body(client: Client) -> None:
        assert ok(await client.call_tool("calculator.add", {"a": 2, "b": 3}))["value"] == 5
        assert ok(await client.call_tool("calculator.add", {"a": 2}))["value"] == 3  # the program's default
        refused = failure(await client.call_tool("calculator.add", {"a": "two"}))
        assert refused["error_type"] == "invalid_request" and "a" in refused["error_message"]
        assert failure(await client.call_tool("calculator.add", {"b": 1}))["error_type"] == "invalid_request"
        assert ok(await client.call_tool("echo.say", {"args": [1], "kwargs": {"k": 2}}))["value"] == [[1], {"k": 2}]

    run(standalone_tenant("a", state, backend="subprocess"), body)


def test_a_tenant_does_not_list_what_its_policy_would_refuse(tmp_path: Path) -> None:
    state = seeded(tmp_path / "state")
    names: set[str] = set()

    async def body(client: Client) -> None:
        names.update(t.name for t in (await client.list_tools()).tools)
        assert failure(await client.call_tool("web_fetcher.fetch", {"url": "https://example.com/"}))[
            "error_type"
        ] == "unknown_tool"

    run(standalone_tenant("strict", state, backend="subprocess"), body)  # the default policy: no http_fetch
    assert "web_fetcher.fetch" not in names and {"calculator.add", "echo.say"} <= names


def test_typed_inputs_survive_a_registry_rebuild(tmp_path: Path) -> None:
    """The registry is rebuilt from the role directories' manifests: the contract's inputs come back with it."""
    from sandforge.runtime.store import ToolStore

    state = seeded(tmp_path / "state")
    before = ToolStore(state).get_tool("web_fetcher")
    for path in (state / "tools").glob("registry.sqlite*"):
        path.unlink()
    after = ToolStore(state).get_tool("web_fetcher")
    assert before is not None and after is not None
    assert after.inputs == WEB_FETCHER.inputs and after.contract_fingerprint == before.contract_fingerprint
