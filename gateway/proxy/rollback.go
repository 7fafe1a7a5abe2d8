package proxy

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/rollback"
)

var _ rollback.Caller = (*Gateway)(nil)

// CallTool calls tool (an exposed name) directly on the upstream that exposes it, with meta as
// the request's `_meta`, bypassing the engine and the call journal: it is how a rollback runs
// compensations and read-backs "on the upstream" (seed "MCP gateway": Limits, "Rollback
// executes against the upstream the compensation tool is exposed by"; `reversi.*` tools,
// "Compensations bypass allow/deny and scope"). Without a deadline in ctx it waits at most
// call_timeout. Errors: no upstream exposes tool, arguments that are not JSON, or the
// upstream's transport error (a timeout among them); an isError answer is a result.
func (g *Gateway) CallTool(ctx context.Context, tool string, args, meta map[string]any) (*mcp.CallToolResult, error) {
	r := g.route(tool)
	if r == nil {
		return nil, fmt.Errorf("no upstream exposes %s", tool)
	}
	params := &mcp.CallToolParams{Name: r.name, Meta: meta}
	if args != nil {
		raw, err := json.Marshal(args)
		if err != nil {
			return nil, fmt.Errorf("the arguments of %s are not JSON: %w", tool, err)
		}
		params.Arguments = json.RawMessage(raw)
	}
	cs, err := r.up.session()
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok { // every wait on an upstream has a deadline (issue 18)
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, callTimeoutOf(g.cfg))
		defer cancel()
	}
	return cs.CallTool(ctx, params)
}

// ExecuteRollback rolls back run against this gateway's upstreams, with the manifests the
// engine holds now (rollback.Execute: dry run unless o.Confirm). It is what the operator tool
// `reversi.execute_rollback` and `reversi rollback` run. Errors: store.ErrNotFound for an
// unknown run, or the store's errors.
func (g *Gateway) ExecuteRollback(ctx context.Context, run string, o rollback.Options) (rollback.Result, error) {
	e := g.engine.Load()
	return rollback.Execute(ctx, rollback.Env{Store: g.store, Manifests: e, Tools: e, Caller: g}, run, o)
}
