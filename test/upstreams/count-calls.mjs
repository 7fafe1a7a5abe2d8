// A Node preload (node --import=<this file>) that counts the tools/call requests a real stdio
// MCP server receives, without changing what the server sees: it observes process.stdin's
// "data" events and appends one line "<tool name>\n" per tools/call request to the file named
// by $REVERSI_COUNT_CALLS. Tests use it to count how often a gateway forwarded a call (retries).
import { appendFileSync } from "node:fs";

const file = process.env.REVERSI_COUNT_CALLS;
if (file) {
  let buf = "";
  const stdin = process.stdin;
  const emit = stdin.emit;
  stdin.emit = function (event, chunk, ...rest) {
    if (event === "data") {
      buf += chunk.toString("utf8");
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        try {
          const msg = JSON.parse(line);
          if (msg.method === "tools/call") appendFileSync(file, `${msg.params?.name}\n`);
        } catch {
          // not JSON-RPC: the server will answer it
        }
      }
    }
    return emit.call(this, event, chunk, ...rest);
  };
}
