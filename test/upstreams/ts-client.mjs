#!/usr/bin/env node
// An MCP client of another implementation (the TypeScript SDK, @modelcontextprotocol/sdk) for
// Reversi's tests: it connects to one MCP server, lists its tools (every page) and prints one
// JSON object on stdout:
//
//   {"tools": ["name", ...]}                          tool names in the server's order
//   {"tools": [...], "result": {CallToolResult}}      with --call
//
// Usage:
//   node ts-client.mjs [--call TOOL [--args JSON]] -- COMMAND [ARG...]   stdio server
//   node ts-client.mjs [--call TOOL [--args JSON]] --url URL [--header 'Name: value']...
//
// A stdio server gets this process's environment. Errors go to stderr with exit status 1;
// a tool result with isError is still printed (exit status 0): the caller judges it.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

function usage(msg) {
  process.stderr.write(`ts-client: ${msg}\n` +
    "usage: ts-client.mjs [--call TOOL [--args JSON]] (-- COMMAND [ARG...] | --url URL [--header 'Name: value']...)\n");
  process.exit(2);
}

const argv = process.argv.slice(2);
let url, call, callArgs = {}, command;
const headers = {};
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  const next = () => (i + 1 < argv.length ? argv[++i] : usage(`${a} needs a value`));
  if (a === "--") {
    command = argv.slice(i + 1);
    break;
  } else if (a === "--url") {
    url = next();
  } else if (a === "--header") {
    const h = next();
    const c = h.indexOf(":");
    if (c <= 0) usage(`bad header ${JSON.stringify(h)}`);
    headers[h.slice(0, c).trim()] = h.slice(c + 1).trim();
  } else if (a === "--call") {
    call = next();
  } else if (a === "--args") {
    try {
      callArgs = JSON.parse(next());
    } catch (e) {
      usage(`--args: ${e.message}`);
    }
  } else {
    usage(`unknown argument ${JSON.stringify(a)}`);
  }
}
if (url && command) usage("give either --url or -- COMMAND, not both");
if (!url && !(command && command.length > 0)) usage("no server given");

const transport = url
  ? new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } })
  : new StdioClientTransport({ command: command[0], args: command.slice(1), env: { ...process.env }, stderr: "inherit" });

const client = new Client({ name: "reversi-ts-client", version: "0.0.0" });
try {
  await client.connect(transport);
  const tools = [];
  let cursor;
  do {
    const page = await client.listTools(cursor ? { cursor } : {});
    for (const t of page.tools) tools.push(t.name);
    cursor = page.nextCursor;
  } while (cursor);
  const out = { tools };
  if (call) out.result = await client.callTool({ name: call, arguments: callArgs });
  process.stdout.write(JSON.stringify(out) + "\n");
} catch (e) {
  process.stderr.write(`ts-client: ${e?.stack ?? e}\n`);
  process.exitCode = 1;
} finally {
  await client.close().catch(() => {});
}
