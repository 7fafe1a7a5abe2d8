package proxy

import (
	"context"
	"errors"
	"sort"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/rollback"
	"github.com/reversi-gitops/reversi/gateway/suggest"
)

// Operator tools built on issue 6 (seed: "`reversi.*` tools", operator table).
const (
	ToolSuggestManifest = "reversi.suggest_manifest"
	ToolExecuteRollback = "reversi.execute_rollback"
)

// Inputs and outputs of the two tools.
type (
	SuggestIn struct {
		Tools []string `json:"tools,omitempty" jsonschema:"exposed tool names to draft; empty: every tool without a manifest"`
	}
	DraftOut struct {
		Tool       string   `json:"tool"`
		File       string   `json:"file" jsonschema:"suggested file name"`
		Confidence string   `json:"confidence" jsonschema:"low, medium or high"`
		Guesses    []string `json:"guesses,omitempty" jsonschema:"what was guessed"`
		YAML       string   `json:"yaml" jsonschema:"the draft manifest (status: draft)"`
	}
	RefusedOut struct {
		Tool   string `json:"tool"`
		Reason string `json:"reason"`
	}
	SuggestOut struct {
		Drafts  []DraftOut   `json:"drafts"`
		Skipped []string     `json:"skipped" jsonschema:"tools that already have a manifest"`
		Refused []RefusedOut `json:"refused,omitempty"`
	}
	ExecuteRollbackIn struct {
		Run                  string `json:"run"`
		Confirm              bool   `json:"confirm,omitempty" jsonschema:"execute; without it this is a dry run"`
		ApproveCompensations bool   `json:"approve_compensations,omitempty" jsonschema:"also approve the compensations that require approval"`
	}
)

// addSuggestAndRollbackTools registers suggest_manifest (auditor) and execute_rollback
// (operator) on the operator server s.
func (g *Gateway) addSuggestAndRollbackTools(s *mcp.Server) {
	closed := false
	ro := &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: &closed}
	addTool(s, &mcp.Tool{Name: ToolSuggestManifest, Annotations: ro,
		Description: "Draft manifests (status: draft) for the upstream tools that have none. Drafts only: nothing is written or enforced."},
		g.suggestTool)
	addTool(s, &mcp.Tool{Name: ToolExecuteRollback, Annotations: &mcp.ToolAnnotations{OpenWorldHint: &closed},
		Description: "Roll a run back: dry run unless confirm is true. Each compensation runs on its upstream, newest first, " +
			"3 attempts with backoff and one idempotency key in _meta[\"reversi/idempotency_key\"]; read-backs go through the upstream.",
		InputSchema: schemaFor[ExecuteRollbackIn](func(p map[string]*jsonschema.Schema) { nonEmpty(p, "run") })},
		g.executeRollbackTool)
}

// suggestTool drafts manifests from the tools the gateway exposes now (gateway/suggest).
func (g *Gateway) suggestTool(_ context.Context, _ *mcp.CallToolRequest, in SuggestIn) (*mcp.CallToolResult, SuggestOut, error) {
	want := map[string]bool{}
	for _, t := range in.Tools {
		want[t] = true
	}
	ts := *g.tools.Load()
	names := make([]string, 0, len(ts.routes))
	for name := range ts.routes {
		if len(want) == 0 || want[name] {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	tools := make([]suggest.Tool, 0, len(names))
	for _, name := range names {
		r := ts.routes[name]
		server := ""
		if cs, err := r.up.session(); err == nil {
			if ir := cs.InitializeResult(); ir != nil && ir.ServerInfo != nil {
				server = ir.ServerInfo.Name
			}
		}
		tools = append(tools, suggest.Tool{Upstream: r.up.name, Server: server, Tool: r.tool})
	}
	g.stateMu.Lock()
	ms := g.manifests
	g.stateMu.Unlock()
	res := suggest.Suggest(tools, ms)
	out := SuggestOut{Drafts: []DraftOut{}, Skipped: res.Skipped}
	if out.Skipped == nil {
		out.Skipped = []string{}
	}
	for _, d := range res.Drafts {
		out.Drafts = append(out.Drafts, DraftOut{Tool: d.Tool, File: d.File, Confidence: string(d.Confidence), Guesses: d.Guesses, YAML: string(d.YAML)})
	}
	for _, r := range res.Refused {
		out.Refused = append(out.Refused, RefusedOut{Tool: r.Tool, Reason: r.Reason})
	}
	return nil, out, nil
}

// executeRollbackTool runs ExecuteRollback as the authenticated operator.
func (g *Gateway) executeRollbackTool(ctx context.Context, req *mcp.CallToolRequest, in ExecuteRollbackIn) (*mcp.CallToolResult, rollback.Result, error) {
	id := identity(req)
	if id == nil {
		return nil, rollback.Result{}, errors.New("only an authenticated operator can roll a run back")
	}
	res, err := g.ExecuteRollback(ctx, in.Run, rollback.Options{Confirm: in.Confirm, ApproveCompensations: in.ApproveCompensations,
		Operator: id.Principal})
	return nil, res, err
}
