// A Node preload (node --import=<this file>) that records the tools/call requests a real stdio
// MCP server receives, and can inject one fault. It observes process.stdin's "data" events:
// for each tools/call it appends one JSON line {"name": ..., "meta": params._meta} to the file
// named by $REVERSI_RECORD_META, so tests see the `_meta` (e.g. reversi/idempotency_key) exactly
// as the upstream received it. $REVERSI_FAULT injects a fault on the first tools/call of one tool
// (recorded first, never handed to the server):
//   exit:<tool>  the server process exits (status 1): the upstream is killed mid-call
//   hang:<tool>  the request is swallowed: the server never answers it
import { appendFileSync } from "node:fs";

const file = process.env.REVERSI_RECORD_META;
const [faultKind, faultTool] = (process.env.REVERSI_FAULT ?? "").split(":");
let faulted = false;
if (file) {
  let buf = "";
  const stdin = process.stdin;
  const emit = stdin.emit;
  stdin.emit = function (event, chunk, ...rest) {
    if (event !== "data") return emit.call(this, event, chunk, ...rest);
    buf += chunk.toString("utf8");
    const pass = [];
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      let msg;
      try {
        msg = JSON.parse(line);
      } catch {
        pass.push(line); // not JSON-RPC: the server will answer it
        continue;
      }
      if (msg.method === "tools/call") {
        const name = msg.params?.name;
        appendFileSync(file, JSON.stringify({ name, meta: msg.params?._meta ?? null }) + "\n");
        if (!faulted && name === faultTool) {
          faulted = true;
          if (faultKind === "exit") process.exit(1);
          if (faultKind === "hang") continue;
        }
      }
      pass.push(line);
    }
    if (pass.length === 0) return true;
    return emit.call(this, event, Buffer.from(pass.join("\n") + "\n"), ...rest);
  };
}
