// One session of the official TypeScript SDK client (@modelcontextprotocol/sdk 1.x) against an MCP server,
// for tests/service/mcp/test_real_clients.py. Reads a plan as JSON on stdin:
//   {"target": {"command": "...", "args": [...], "env": {...}} | {"url": "http://.../mcp", "headers": {...}},
//    "calls": [{"name": "tool", "arguments": {...}, "progress": true?}, ...]}   (progress: the notifications heard)
// prints one JSON object: the server's identity and capabilities, tools/list, then each call's result, or
// the error the client threw for it ({"code", "message"}: e.g. -32602 when structuredContent does not match the
// tool's outputSchema, which this client checks even on isError results).
// The clients live in $SANDFORGE_MCP_CLIENTS (.ci/npm-clients installs them there), outside the repository.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const home = process.env.SANDFORGE_MCP_CLIENTS;
if (!home) throw new Error("SANDFORGE_MCP_CLIENTS is not set");
const require = createRequire(join(home, "package.json"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = require("@modelcontextprotocol/sdk/client/stdio.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");

const plan = JSON.parse(readFileSync(0, "utf8"));
const target = plan.target;
const transport = target.url
  ? new StreamableHTTPClientTransport(new URL(target.url), { requestInit: { headers: target.headers ?? {} } })
  : new StdioClientTransport({ command: target.command, args: target.args ?? [], env: target.env, stderr: "ignore" });
const client = new Client({ name: "sandforge-tests", version: "1.0.0" });
const started = performance.now();
await client.connect(transport);
const out = {
  initialize_ms: performance.now() - started,
  protocol_version: transport.protocolVersion ?? null,
  server: client.getServerVersion() ?? null,
  capabilities: client.getServerCapabilities() ?? null,
  instructions: client.getInstructions() ?? null,
  tools: (await client.listTools()).tools,
  results: [],
};
for (const call of plan.calls) {
  try {
    const progress = [];
    const options = { timeout: 120000 };
    if (call.progress) options.onprogress = (p) => progress.push(p); // asks for notifications/progress
    const result = await client.callTool({ name: call.name, arguments: call.arguments ?? {} }, undefined, options);
    out.results.push(call.progress ? { name: call.name, ok: true, result, progress } : { name: call.name, ok: true, result });
  } catch (error) {
    out.results.push({ name: call.name, ok: false, error: { code: error.code ?? null, message: String(error.message ?? error) } });
  }
}
await client.close();
process.stdout.write(JSON.stringify(out));
