#!/usr/bin/env node
// An MCP client of another implementation (the TypeScript SDK, @modelcontextprotocol/sdk) that
// exercises every part of the protocol beyond tools against @modelcontextprotocol/server-everything
// over Streamable HTTP, directly or through a relay such as the Reversi gateway (issue 19), and
// prints ONE JSON object on stdout:
//
//   {"features": {"<feature>": {"ok": bool, "detail": any, "ms": number}, ...},
//    "order": ["<feature>", ...], "errors": ["<client onerror message>", ...]}
//
// Usage:
//   node ts-relay.mjs --url URL [--header 'Name: value']... [--prefix PREFIX]
//
// PREFIX is put before the names of server-everything's tools and prompts: empty (the default)
// directly, "everything." through a gateway that namespaces the upstream "everything". Resource
// URIs are never prefixed. The client advertises sampling, elicitation (form) and roots
// (listChanged) and answers those requests itself.
//
// Each feature judges itself (ok) and says why in detail; one feature failing does not stop the
// others. Every request has a timeout (REQUEST_MS) and every wait for a notification a bound.
// Exit status: 0 when the script ran (whatever the features' ok), 1 on a crash or when the
// watchdog (WATCHDOG_MS) fires, 2 on bad usage.
import { gunzipSync } from "node:zlib";
import { randomUUID } from "node:crypto";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import {
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  ListRootsRequestSchema,
  LoggingMessageNotificationSchema,
  ResourceListChangedNotificationSchema,
  ResourceUpdatedNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";

const REQUEST_MS = 15000; // per request
const WATCHDOG_MS = 120000; // whole script

function usage(msg) {
  process.stderr.write(`ts-relay: ${msg}\nusage: ts-relay.mjs --url URL [--header 'Name: value']... [--prefix PREFIX]\n`);
  process.exit(2);
}

const argv = process.argv.slice(2);
let url;
let prefix = "";
const headers = {};
for (let i = 0; i < argv.length; i++) {
  const a = argv[i];
  const next = () => (i + 1 < argv.length ? argv[++i] : usage(`${a} needs a value`));
  if (a === "--url") url = next();
  else if (a === "--prefix") prefix = next();
  else if (a === "--header") {
    const h = next();
    const c = h.indexOf(":");
    if (c <= 0) usage(`bad header ${JSON.stringify(h)}`);
    headers[h.slice(0, c).trim()] = h.slice(c + 1).trim();
  } else usage(`unknown argument ${JSON.stringify(a)}`);
}
if (!url) usage("no --url given");

const nonce = randomUUID().slice(0, 8);
const tool = (n) => prefix + n;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const opts = (extra = {}) => ({ timeout: REQUEST_MS, ...extra });

const out = { features: {}, order: [], errors: [] };
const watchdog = setTimeout(() => {
  out.errors.push(`watchdog: the script did not finish within ${WATCHDOG_MS} ms`);
  process.stdout.write(JSON.stringify(out) + "\n");
  process.exit(1);
}, WATCHDOG_MS);

// What the server sent us, in arrival order.
const seen = { updated: [], listChanged: [], logs: [], roots: [], sampling: [], elicit: [], sent: [] };

/** waitFor polls pred every 25 ms until it returns a truthy value or ms pass; returns it or undefined. */
async function waitFor(pred, ms) {
  const end = Date.now() + ms;
  for (;;) {
    const v = pred();
    if (v) return v;
    if (Date.now() >= end) return undefined;
    await sleep(25);
  }
}

/** feature runs fn; ok when it returns (its value is the detail), not ok when it throws. */
async function feature(name, fn) {
  const t0 = Date.now();
  let r;
  try {
    r = { ok: true, detail: (await fn()) ?? null };
  } catch (e) {
    r = { ok: false, detail: String(e?.message ?? e) };
  }
  r.ms = Date.now() - t0;
  out.features[name] = r;
  out.order.push(name);
}

function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

function texts(result) {
  return (result?.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n");
}

let roots = [{ uri: `file:///reversi-relay/${nonce}/a`, name: "relay-a" }];
const client = new Client(
  { name: "reversi-ts-relay", version: "0.0.0" },
  { capabilities: { sampling: {}, elicitation: { form: {} }, roots: { listChanged: true } } },
);
client.onerror = (e) => out.errors.push(String(e?.message ?? e));
client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => void seen.updated.push(n.params));
client.setNotificationHandler(ResourceListChangedNotificationSchema, () => void seen.listChanged.push(Date.now()));
client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => void seen.logs.push(n.params));
client.setRequestHandler(ListRootsRequestSchema, async () => {
  seen.roots.push(roots.map((r) => r.uri));
  return { roots };
});
client.setRequestHandler(CreateMessageRequestSchema, async (req) => {
  seen.sampling.push(req.params);
  return {
    model: "reversi-relay-model",
    role: "assistant",
    content: { type: "text", text: `sampled answer ${nonce}` },
    stopReason: "endTurn",
  };
});
client.setRequestHandler(ElicitRequestSchema, async (req) => {
  seen.elicit.push(req.params);
  return { action: "accept", content: { name: `Reversi ${nonce}`, check: true, integer: 7 } };
});

const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
// Record what the client sends, to find the request id of the call it cancels.
const send = transport.send.bind(transport);
transport.send = (msg, o) => {
  seen.sent.push(msg);
  return send(msg, o);
};

try {
  await client.connect(transport, opts());
  out.server = { info: client.getServerVersion() ?? null, capabilities: client.getServerCapabilities() ?? null };

  await feature("ping", async () => {
    await client.ping(opts());
    return "pong";
  });

  await feature("tools_list", async () => {
    const names = [];
    let cursor;
    let pages = 0;
    do {
      check(++pages <= 50, "more than 50 pages of tools");
      const page = await client.listTools(cursor ? { cursor } : {}, opts());
      names.push(...page.tools.map((t) => t.name));
      cursor = page.nextCursor;
    } while (cursor);
    const want = ["toggle-subscriber-updates", "toggle-simulated-logging", "trigger-long-running-operation",
      "gzip-file-as-resource", "trigger-sampling-request", "trigger-elicitation-request", "get-roots-list"].map(tool);
    const missing = want.filter((n) => !names.includes(n));
    check(missing.length === 0, `tools/list lacks ${missing.join(", ")} (has ${names.join(", ")})`);
    return { count: names.length, pages };
  });

  let textResource;
  await feature("resources_list", async () => {
    const all = [];
    let cursor;
    let pages = 0;
    do {
      check(++pages <= 50, "more than 50 pages of resources");
      const page = await client.listResources(cursor ? { cursor } : {}, opts());
      all.push(...page.resources);
      cursor = page.nextCursor;
    } while (cursor);
    textResource = all.find((r) => r.uri.startsWith("demo://resource/static/document/") && /^text\//.test(r.mimeType ?? ""));
    check(textResource, `no demo://resource/static/document/ text resource among ${all.length}: ${all.map((r) => r.uri).join(", ")}`);
    return { count: all.length, pages, text: textResource.uri };
  });

  await feature("resources_read_text", async () => {
    check(textResource, "no text resource listed");
    const r = await client.readResource({ uri: textResource.uri }, opts());
    const c = r.contents?.[0];
    check(c && c.uri === textResource.uri, `contents[0].uri ${c?.uri}, want ${textResource.uri}`);
    check(typeof c.text === "string" && c.text.length > 0, "no text in contents[0]");
    return { uri: c.uri, mimeType: c.mimeType, chars: c.text.length };
  });

  await feature("resources_read_blob", async () => {
    // gzip-file-as-resource registers a session resource (a blob) from a data: URI, which makes
    // the server send notifications/resources/list_changed; the resource is then listed and read.
    const plain = `reversi relay blob ${nonce}\n`;
    const name = `relay-${nonce}.txt.gz`;
    const uri = `demo://resource/session/${name}`;
    const before = seen.listChanged.length;
    const res = await client.callTool({ name: tool("gzip-file-as-resource"), arguments: {
      name, data: `data:text/plain;base64,${Buffer.from(plain).toString("base64")}`, outputType: "resourceLink" } }, undefined, opts());
    check(!res.isError, `gzip-file-as-resource: ${texts(res)}`);
    const link = (res.content ?? []).find((c) => c.type === "resource_link");
    check(link?.uri === uri, `resource_link ${JSON.stringify(link)}, want uri ${uri}`);
    const changed = await waitFor(() => seen.listChanged.length > before, 3000);
    check(changed, "no notifications/resources/list_changed within 3 s of registering a resource");
    const page = await client.listResources({}, opts());
    check(page.resources.some((r) => r.uri === uri), `${uri} not listed after list_changed`);
    const r = await client.readResource({ uri }, opts());
    const c = r.contents?.[0];
    check(c && typeof c.blob === "string", `contents[0] of ${uri} is not a blob: ${JSON.stringify(c)?.slice(0, 200)}`);
    const got = gunzipSync(Buffer.from(c.blob, "base64")).toString("utf8");
    check(got === plain, `the blob gunzips to ${JSON.stringify(got)}, want ${JSON.stringify(plain)}`);
    return { uri, mimeType: c.mimeType, bytes: Buffer.from(c.blob, "base64").length, listChanged: true };
  });

  await feature("resources_templates", async () => {
    const all = [];
    let cursor;
    let pages = 0;
    do {
      check(++pages <= 50, "more than 50 pages of resource templates");
      const page = await client.listResourceTemplates(cursor ? { cursor } : {}, opts());
      all.push(...page.resourceTemplates);
      cursor = page.nextCursor;
    } while (cursor);
    const want = ["demo://resource/dynamic/text/{resourceId}", "demo://resource/dynamic/blob/{resourceId}"];
    const have = all.map((t) => t.uriTemplate);
    check(want.every((w) => have.includes(w)), `templates ${have.join(", ")}, want ${want.join(", ")}`);
    const text = await client.readResource({ uri: "demo://resource/dynamic/text/7" }, opts());
    check(/^Resource 7: This is a plaintext resource/.test(text.contents?.[0]?.text ?? ""), `text/7: ${JSON.stringify(text.contents)}`);
    const blob = await client.readResource({ uri: "demo://resource/dynamic/blob/8" }, opts());
    const decoded = Buffer.from(blob.contents?.[0]?.blob ?? "", "base64").toString("utf8");
    check(/^Resource 8: This is a base64 blob/.test(decoded), `blob/8 decodes to ${JSON.stringify(decoded)}`);
    return { templates: have, text: text.contents[0].uri, blob: blob.contents[0].uri };
  });

  // Subscribed, then toggle-subscriber-updates: the server sends one updated notification per
  // subscribed URI at once, then every 5 s.
  const watched = "demo://resource/dynamic/text/42";
  let updatesOn = false;
  await feature("resources_subscribe", async () => {
    await client.subscribeResource({ uri: watched }, opts());
    const before = seen.updated.length;
    const res = await client.callTool({ name: tool("toggle-subscriber-updates"), arguments: {} }, undefined, opts());
    check(!res.isError && /^Started/.test(texts(res)), `toggle-subscriber-updates: ${texts(res)}`);
    updatesOn = true;
    const got = await waitFor(() => seen.updated.slice(before).find((p) => p.uri === watched), 7000);
    check(got, `no notifications/resources/updated for ${watched} within 7 s (got ${JSON.stringify(seen.updated)})`);
    return { uri: got.uri };
  });

  await feature("resources_unsubscribe", async () => {
    check(updatesOn, "updates were not started (resources_subscribe failed)");
    await client.unsubscribeResource({ uri: watched }, opts());
    // Restart the updates: the server sends at once for every URI still subscribed, so nothing
    // must come for the unsubscribed one.
    let res = await client.callTool({ name: tool("toggle-subscriber-updates"), arguments: {} }, undefined, opts());
    check(/^Stopped/.test(texts(res)), `toggle off: ${texts(res)}`);
    const before = seen.updated.length;
    res = await client.callTool({ name: tool("toggle-subscriber-updates"), arguments: {} }, undefined, opts());
    check(/^Started/.test(texts(res)), `toggle on: ${texts(res)}`);
    await sleep(1500);
    const late = seen.updated.slice(before).filter((p) => p.uri === watched);
    res = await client.callTool({ name: tool("toggle-subscriber-updates"), arguments: {} }, undefined, opts());
    updatesOn = false;
    check(late.length === 0, `${late.length} updated notification(s) for ${watched} after unsubscribe`);
    return { uri: watched, quietMs: 1500 };
  });

  await feature("prompts_list", async () => {
    const names = [];
    let cursor;
    let pages = 0;
    do {
      check(++pages <= 50, "more than 50 pages of prompts");
      const page = await client.listPrompts(cursor ? { cursor } : {}, opts());
      names.push(...page.prompts.map((p) => p.name));
      cursor = page.nextCursor;
    } while (cursor);
    const want = ["simple-prompt", "args-prompt", "completable-prompt", "resource-prompt"].map(tool);
    const missing = want.filter((n) => !names.includes(n));
    check(missing.length === 0, `prompts/list lacks ${missing.join(", ")} (has ${names.join(", ")})`);
    return { names };
  });

  await feature("prompts_get_simple", async () => {
    const r = await client.getPrompt({ name: tool("simple-prompt") }, opts());
    const t = r.messages?.[0]?.content?.text;
    check(t === "This is a simple prompt without arguments.", `messages: ${JSON.stringify(r.messages)}`);
    return { text: t };
  });

  await feature("prompts_get_args", async () => {
    const r = await client.getPrompt({ name: tool("args-prompt"), arguments: { city: "Lisbon", state: `S${nonce}` } }, opts());
    const t = r.messages?.[0]?.content?.text;
    check(t === `What's weather in Lisbon, S${nonce}?`, `messages: ${JSON.stringify(r.messages)}`);
    return { text: t };
  });

  await feature("completion_prompt", async () => {
    const dept = await client.complete({ ref: { type: "ref/prompt", name: tool("completable-prompt") }, argument: { name: "department", value: "Eng" } }, opts());
    check(JSON.stringify(dept.completion?.values) === '["Engineering"]', `department "Eng": ${JSON.stringify(dept.completion)}`);
    const who = await client.complete({ ref: { type: "ref/prompt", name: tool("completable-prompt") }, argument: { name: "name", value: "" },
      context: { arguments: { department: "Sales" } } }, opts());
    check(JSON.stringify(who.completion?.values) === '["David","Eve","Frank"]', `name in Sales: ${JSON.stringify(who.completion)}`);
    return { department: dept.completion.values, name: who.completion.values };
  });

  await feature("completion_resource_template", async () => {
    const r = await client.complete({ ref: { type: "ref/resource", uri: "demo://resource/dynamic/text/{resourceId}" }, argument: { name: "resourceId", value: "12" } }, opts());
    check(JSON.stringify(r.completion?.values) === '["12"]', `resourceId "12": ${JSON.stringify(r.completion)}`);
    const none = await client.complete({ ref: { type: "ref/resource", uri: "demo://resource/dynamic/text/{resourceId}" }, argument: { name: "resourceId", value: "x" } }, opts());
    check(JSON.stringify(none.completion?.values) === "[]", `resourceId "x": ${JSON.stringify(none.completion)}`);
    return { values: r.completion.values };
  });

  await feature("logging", async () => {
    // The subscribe handler logs an info message to the session: filtered at warning, sent at debug.
    const ack = (from) => seen.logs.slice(from).find((l) => String(l.data).startsWith(`Received Subscribe Resource request for URI: ${watched}`));
    await client.setLoggingLevel("warning", opts());
    let from = seen.logs.length;
    await client.subscribeResource({ uri: watched }, opts());
    await sleep(500);
    check(!ack(from), "an info message came through after logging/setLevel warning");
    await client.setLoggingLevel("debug", opts());
    from = seen.logs.length;
    await client.subscribeResource({ uri: watched }, opts());
    const got = await waitFor(() => ack(from), 3000);
    await client.unsubscribeResource({ uri: watched }, opts());
    check(got, "no info message within 3 s after logging/setLevel debug");
    // toggle-simulated-logging sends one random-level message at once (then every 5 s).
    from = seen.logs.length;
    let res = await client.callTool({ name: tool("toggle-simulated-logging"), arguments: {} }, undefined, opts());
    check(/^Started/.test(texts(res)), `toggle-simulated-logging: ${texts(res)}`);
    const sim = await waitFor(() => seen.logs.slice(from).find((l) => /[Ll]evel[- ]message/.test(String(l.data))), 3000);
    res = await client.callTool({ name: tool("toggle-simulated-logging"), arguments: {} }, undefined, opts());
    check(sim, `no simulated log message within 3 s (got ${JSON.stringify(seen.logs.slice(from))})`);
    return { ack: got.level, simulated: sim.level };
  });

  await feature("progress", async () => {
    const ticks = [];
    const res = await client.callTool({ name: tool("trigger-long-running-operation"), arguments: { duration: 1, steps: 3 } }, undefined,
      opts({ onprogress: (p) => ticks.push(p) }));
    check(texts(res) === "Long running operation completed. Duration: 1 seconds, Steps: 3.", `result: ${texts(res)}`);
    const got = JSON.stringify(ticks.map((p) => [p.progress, p.total]));
    check(got === "[[1,3],[2,3],[3,3]]", `progress notifications ${got}, want [[1,3],[2,3],[3,3]]`);
    return { progress: ticks };
  });

  await feature("sampling", async () => {
    const before = seen.sampling.length;
    const res = await client.callTool({ name: tool("trigger-sampling-request"), arguments: { prompt: `relay ${nonce}`, maxTokens: 20 } }, undefined, opts());
    const req = seen.sampling[before];
    check(req, "the sampling handler did not run");
    check(req.messages?.[0]?.content?.text === `Resource trigger-sampling-request context: relay ${nonce}`, `sampling request: ${JSON.stringify(req)}`);
    check(!res.isError && texts(res).includes(`sampled answer ${nonce}`), `the upstream did not get the answer: ${texts(res)}`);
    return { maxTokens: req.maxTokens, systemPrompt: req.systemPrompt };
  });

  await feature("elicitation", async () => {
    const before = seen.elicit.length;
    const res = await client.callTool({ name: tool("trigger-elicitation-request"), arguments: {} }, undefined, opts());
    const req = seen.elicit[before];
    check(req, "the elicitation handler did not run");
    check(req.requestedSchema?.required?.includes("name"), `elicitation request: ${JSON.stringify(req).slice(0, 300)}`);
    const t = texts(res);
    check(!res.isError && t.includes(`- Name: Reversi ${nonce}`) && t.includes("- Favorite Integer: 7"), `the upstream did not get the answer: ${t}`);
    return { message: req.message };
  });

  await feature("roots", async () => {
    // The server asks for roots 350 ms after initialized (and when get-roots-list needs them).
    const res = await client.callTool({ name: tool("get-roots-list"), arguments: {} }, undefined, opts());
    check(seen.roots.length > 0, "the server never asked for roots/list");
    check(!res.isError && texts(res).includes(roots[0].uri), `get-roots-list: ${texts(res)}`);
    return { asked: seen.roots.length, uri: roots[0].uri };
  });

  await feature("roots_list_changed", async () => {
    const before = seen.roots.length;
    const old = roots[0].uri;
    roots = [{ uri: `file:///reversi-relay/${nonce}/b`, name: "relay-b" }];
    await client.sendRootsListChanged();
    const asked = await waitFor(() => seen.roots.length > before, 3000);
    check(asked, "no roots/list within 3 s of notifications/roots/list_changed");
    const res = await client.callTool({ name: tool("get-roots-list"), arguments: {} }, undefined, opts());
    const t = texts(res);
    check(t.includes(roots[0].uri) && !t.includes(old), `get-roots-list after the change: ${t}`);
    return { uri: roots[0].uri };
  });

  await feature("cancel", async () => {
    // trigger-long-running-operation (2 s, 4 steps) cancelled after its first progress. The
    // upstream's SDK then never answers the request; a late answer would reach onerror as a
    // response for an unknown message ID.
    const ac = new AbortController();
    const reason = `reversi cancel ${nonce}`;
    const t0 = Date.now();
    const call = client.callTool({ name: tool("trigger-long-running-operation"), arguments: { duration: 2, steps: 4 } }, undefined,
      opts({ signal: ac.signal, onprogress: () => ac.abort(reason) }));
    setTimeout(() => ac.abort(reason), 1500).unref(); // in case no progress comes
    let err;
    try {
      await call;
    } catch (e) {
      err = e;
    }
    const id = seen.sent.find((m) => m.method === "tools/call" && m.params?.arguments?.steps === 4 && m.params?.arguments?.duration === 2)?.id;
    check(err, "the cancelled call resolved");
    check(String(err.message).includes(reason), `the call failed with ${err.message}, not the cancellation`);
    const cancelledAfter = Date.now() - t0;
    const notice = seen.sent.find((m) => m.method === "notifications/cancelled" && m.params?.requestId === id);
    check(notice, `no notifications/cancelled sent for request ${id}`);
    // The server goes on with the operation (it does not watch the cancellation) and sends its
    // progress to the end; a late answer would follow the last one (4 of 4). Without that
    // progress, wait past the operation's end.
    const last = await waitFor(() => out.errors.some((e) => e.startsWith("Received a progress notification for an unknown token") &&
      e.includes(`"progressToken":${id}`) && e.includes('"progress":4')), 4000);
    await sleep(last ? 300 : Math.max(0, 3500 - (Date.now() - t0)));
    const late = out.errors.filter((e) => e.startsWith("Received a response for an unknown message ID") && e.includes(`"id":${id}`));
    check(late.length === 0, `a response to the cancelled request ${id} arrived: ${late[0]}`);
    await client.ping(opts());
    return { requestId: id, cancelledAfterMs: cancelledAfter, sawLastProgress: Boolean(last) };
  });
} catch (e) {
  out.errors.push(`crash: ${e?.stack ?? e}`);
  process.stdout.write(JSON.stringify(out) + "\n");
  process.stderr.write(`ts-relay: ${e?.stack ?? e}\n`);
  await client.close().catch(() => {});
  process.exit(1);
}
clearTimeout(watchdog);
process.stdout.write(JSON.stringify(out) + "\n");
await client.close().catch(() => {});
process.exit(0);
