// An OAuth-capable host, as MCP Inspector's web UI and IDEs built on the TypeScript SDK are: the SDK's
// StreamableHTTPClientTransport with an OAuthClientProvider, connecting with the bearer token given (for
// tests/service/mcp/test_auth_challenge.py). Usage: node oauth_client.mjs URL TOKEN. Prints one JSON object:
// the error the connection ended with, whether the SDK sent the user to an authorization page, and every HTTP
// request it made (method, path, status).
const home = process.env.SANDFORGE_MCP_CLIENTS;
if (!home) throw new Error("SANDFORGE_MCP_CLIENTS is not set");
const sdk = `${home}/node_modules/@modelcontextprotocol/sdk/dist/esm`;
const { Client } = await import(`${sdk}/client/index.js`);
const { StreamableHTTPClientTransport } = await import(`${sdk}/client/streamableHttp.js`);

const [url, token] = process.argv.slice(2);
const requests = [];
const counted = async (target, init) => {
  const response = await fetch(target, init);
  requests.push(`${init?.method ?? "GET"} ${new URL(String(target)).pathname} ${response.status}`);
  return response;
};
const saved = {};
let redirected = null;
const provider = {
  get redirectUrl() { return "http://127.0.0.1:9/callback"; },
  get clientMetadata() { return { redirect_uris: ["http://127.0.0.1:9/callback"], client_name: "oauth-host" }; },
  clientInformation: () => saved.client,
  saveClientInformation: (info) => { saved.client = info; },
  tokens: () => undefined,
  saveTokens: (tokens) => { saved.tokens = tokens; },
  redirectToAuthorization: (where) => { redirected = String(where); },
  saveCodeVerifier: (verifier) => { saved.verifier = verifier; },
  codeVerifier: () => saved.verifier,
};
const transport = new StreamableHTTPClientTransport(new URL(url), {
  authProvider: provider, fetch: counted, requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
let error = null;
try {
  await new Client({ name: "oauth-host", version: "0" }).connect(transport);
} catch (e) {
  error = `${e?.constructor?.name}: ${e?.message}`;
}
console.log(JSON.stringify({ error, redirected, requests }));
process.exit(0);
