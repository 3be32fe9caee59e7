// MCP Inspector's CLI mode (`mcp-inspector --cli`, @modelcontextprotocol/inspector) against an MCP server, for
// tests/service/mcp/test_real_clients.py: one Inspector run per call, as a user would type it. Reads a plan as
// JSON on stdin:
//   {"target": {"command": "...", "args": [...], "env": {...}} | {"url": "http://.../mcp", "headers": {...}},
//    "calls": [{"name": "tool", "arguments": {...}}, ...], "concurrency": 2}
// prints one JSON object: tools/list's answer, then each call's exit status and what the Inspector printed
// (its JSON result, or its error message: e.g. "MCP error -32602: Structured content does not match ...").
// Arguments go as --tool-arg key=value with the value as JSON, which the Inspector parses back.
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const home = process.env.SANDFORGE_MCP_CLIENTS;
if (!home) throw new Error("SANDFORGE_MCP_CLIENTS is not set");
const inspector = join(home, "node_modules", "@modelcontextprotocol", "inspector", "cli", "build", "cli.js");
const plan = JSON.parse(readFileSync(0, "utf8"));
const target = plan.target;

function targetArgs() {
  if (target.url) {
    const headers = Object.entries(target.headers ?? {}).flatMap(([k, v]) => ["--header", `${k}: ${v}`]);
    return [target.url, "--transport", "http", ...headers];
  }
  return [target.command, ...(target.args ?? [])];
}

function run(args) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [inspector, "--cli", ...targetArgs(), ...args], {
      env: { ...process.env, ...(target.env ?? {}) },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "", stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    child.on("close", (code) => {
      let result = null;
      try { result = JSON.parse(stdout); } catch { /* not JSON: the failure is in stderr/stdout */ }
      resolve({ exit: code, result, output: result === null ? (stdout + stderr).slice(-4000) : null });
    });
  });
}

function callArgs(call) {
  const pairs = Object.entries(call.arguments ?? {}).flatMap(([k, v]) => ["--tool-arg", `${k}=${JSON.stringify(v)}`]);
  return ["--method", "tools/call", "--tool-name", call.name, ...pairs];
}

const listed = await run(["--method", "tools/list"]);
const results = new Array(plan.calls.length);
let next = 0;
async function worker() {
  while (next < plan.calls.length) {
    const i = next++;
    results[i] = { name: plan.calls[i].name, ...(await run(callArgs(plan.calls[i]))) };
  }
}
await Promise.all(Array.from({ length: plan.concurrency ?? 2 }, worker));
process.stdout.write(JSON.stringify({ tools: listed.result ? listed.result.tools : null, list: listed, results }));
