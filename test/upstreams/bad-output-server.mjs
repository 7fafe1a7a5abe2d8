#!/usr/bin/env node
// A real MCP server (stdio, @modelcontextprotocol/sdk's low-level Server) that breaks its own
// output schema on purpose, for tests of what a gateway does with such results. It is the one
// fault the pinned npm servers cannot produce on demand.
//
// Tools:
//   weather  {city}  declares outputSchema {temperature: number, conditions: string} (both
//                    required, no other properties) and returns structuredContent
//                    {temperature: "warm", wind: 3}, which breaks it, plus a text block
//                    "weather in <city>: warm".
//   ping     {}      no outputSchema; returns the text "pong".
//
// The low-level Server is used because McpServer checks a tool's structured result against its
// own outputSchema and would refuse to send it.
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const server = new Server({ name: "bad-output-server", version: "1.0.0" }, { capabilities: { tools: {} } });

server.setRequestHandler(ListToolsRequestSchema, async () => ({
  tools: [
    {
      name: "weather",
      description: "Weather for a city (its structured result breaks its output schema on purpose).",
      inputSchema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
      outputSchema: {
        type: "object",
        properties: { temperature: { type: "number" }, conditions: { type: "string" } },
        required: ["temperature", "conditions"],
        additionalProperties: false,
      },
      annotations: { readOnlyHint: true },
    },
    {
      name: "ping",
      description: "Answers pong.",
      inputSchema: { type: "object", properties: {} },
      annotations: { readOnlyHint: true },
    },
  ],
}));

server.setRequestHandler(CallToolRequestSchema, async (req) => {
  switch (req.params.name) {
    case "weather": {
      const city = String(req.params.arguments?.city ?? "");
      return {
        content: [{ type: "text", text: `weather in ${city}: warm` }],
        structuredContent: { temperature: "warm", wind: 3 },
      };
    }
    case "ping":
      return { content: [{ type: "text", text: "pong" }] };
    default:
      return { isError: true, content: [{ type: "text", text: `unknown tool ${req.params.name}` }] };
  }
});

await server.connect(new StdioServerTransport());
