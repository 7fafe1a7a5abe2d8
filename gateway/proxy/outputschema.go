package proxy

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// hideOutputSchemas removes outputSchema from the tools the agent sees in tools/list.
//
// Why: a client that validates (the TypeScript SDK's Client.callTool) throws on any result of
// a tool with an outputSchema that either breaks the schema or has no structuredContent. The
// gateway checks results against the upstream's schema itself, journals a mismatch and drops
// the structuredContent that breaks it (issue 5, seed "MCP gateway", Schema validation: the
// call has already happened, so the result must reach the agent). With the schema advertised
// the client would still throw on the stripped result and the agent would lose a call that took
// effect; without it the client accepts both the valid structuredContent and the stripped one.
// The tools stay registered with their schemas, so the gateway's own checks are unchanged.
func hideOutputSchemas(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if method != "tools/list" || err != nil {
			return res, err
		}
		lr, ok := res.(*mcp.ListToolsResult)
		if !ok {
			return res, err
		}
		out := *lr
		out.Tools = make([]*mcp.Tool, len(lr.Tools))
		for i, t := range lr.Tools {
			if t.OutputSchema == nil {
				out.Tools[i] = t
				continue
			}
			c := *t // the registered tool is shared: change a copy
			c.OutputSchema = nil
			out.Tools[i] = &c
		}
		return &out, nil
	}
}
