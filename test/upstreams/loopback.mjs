// A Node preload (node --import=<this file>) for real MCP servers that listen on HTTP, such as
// server-everything's streamableHttp transport (which calls app.listen(PORT) and so would bind
// every interface). It
//   - binds every TCP listen of the process to 127.0.0.1, whatever host the server asked for,
//     and refuses (throws) a listen on a Unix path, a handle or a file descriptor;
//   - once listening, checks the bound address is 127.0.0.1 (else exits with status 1) and
//     prints one line to stderr: "reversi-loopback: listening on 127.0.0.1:<port>", so a server
//     started with PORT=0 gets a free port from the kernel and its parent learns which;
//   - with $REVERSI_RECORD_HTTP set to a file, appends one JSON line per JSON-RPC message a
//     POST request body carried (a batch gives one line per message):
//       {"session": "<mcp-session-id header or empty>", "message": {...}}
//     read off IncomingMessage.push, so it sees the bytes whichever way the server reads them.
// The server itself is unchanged.
import net from "node:net";
import http from "node:http";
import { appendFileSync } from "node:fs";

const HOST = "127.0.0.1";
const MARK = "reversi-loopback:";

function refuse(what) {
  throw new Error(`${MARK} refusing to listen on ${what}: only TCP on ${HOST} is allowed`);
}

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const cb = typeof args[args.length - 1] === "function" ? args.pop() : undefined;
  let opts;
  const a0 = args[0];
  if (a0 !== null && typeof a0 === "object") {
    if (a0.path !== undefined || a0.fd !== undefined || a0._handle || a0.handle) refuse(JSON.stringify(Object.keys(a0)));
    opts = { ...a0 };
  } else if (a0 === undefined || typeof a0 === "number" || (typeof a0 === "string" && /^\d+$/.test(a0))) {
    opts = { port: a0 === undefined ? 0 : Number(a0) };
    if (typeof args[1] === "string") opts.host = args[1];
    const backlog = typeof args[1] === "number" ? args[1] : args[2];
    if (typeof backlog === "number") opts.backlog = backlog;
  } else {
    refuse(JSON.stringify(a0));
  }
  opts.host = HOST;
  delete opts.ipv6Only;
  this.once("listening", () => {
    const addr = this.address();
    if (!addr || typeof addr !== "object" || addr.address !== HOST) {
      process.stderr.write(`${MARK} bound to ${JSON.stringify(addr)}, not ${HOST}; exiting\n`);
      process.exit(1);
    }
    process.stderr.write(`${MARK} listening on ${HOST}:${addr.port}\n`);
  });
  return cb ? listen.call(this, opts, cb) : listen.call(this, opts);
};

const file = process.env.REVERSI_RECORD_HTTP;
if (file) {
  const emit = http.Server.prototype.emit;
  http.Server.prototype.emit = function (event, req, ...rest) {
    if (event === "request" && req.method === "POST") tap(req);
    return emit.call(this, event, req, ...rest);
  };
}

function tap(req) {
  const session = String(req.headers["mcp-session-id"] ?? "");
  const chunks = [];
  const push = req.push;
  req.push = function (chunk, encoding) {
    if (chunk === null) {
      record(session, Buffer.concat(chunks).toString("utf8"));
    } else if (chunk !== undefined) {
      chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk, encoding));
    }
    return push.call(this, chunk, encoding);
  };
}

function record(session, body) {
  let msg;
  try {
    msg = JSON.parse(body);
  } catch {
    return; // not JSON: the server answers it with its own error
  }
  const lines = (Array.isArray(msg) ? msg : [msg]).map((m) => JSON.stringify({ session, message: m }) + "\n");
  appendFileSync(file, lines.join(""));
}
