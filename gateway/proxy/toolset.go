package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/policy"
)

// listNoteRepeat is how often a tool listing that keeps failing the same way is noted again.
const listNoteRepeat = 10 * time.Minute

// ListCacheTTL is how long the upstreams' tools/list answers are reused before an agent's
// tools/list asks them again (seed: Limits, "tools/list results are cached for five seconds").
// A notifications/tools/list_changed from an upstream refreshes it at once.
const ListCacheTTL = 5 * time.Second

// toolSet is the upstream tools the gateway exposes, by exposed name.
type toolSet struct {
	routes map[string]*route
	tools  []engine.Tool         // in upstream order, for the engine
	listed map[string]listedTool // the tools' JSON as the upstream sent it, renamed (toolmeta.go)
}

// buildTools names every upstream's last-listed tools. Two upstreams exposing one name, or an
// input schema that is not an object schema, or a tool the SDK's server refuses, is an error
// naming the upstream and the tool.
func buildTools(ups []*upstream) (toolSet, error) {
	ts := toolSet{routes: map[string]*route{}, listed: map[string]listedTool{}}
	scratch := mcp.NewServer(&mcp.Implementation{Name: Name, Version: Version}, nil) // sdkAccepts
	for _, up := range ups {
		tools, raws := up.listing()
		for i, t := range tools {
			name := exposedName(up.cfg, t.Name)
			if err := reservedName(up.name, name); err != nil {
				return toolSet{}, err
			}
			if prev, dup := ts.routes[name]; dup {
				return toolSet{}, fmt.Errorf("tool name clash: %s is exposed by upstreams %s and %s; set namespace: true on one of them", name, prev.up.name, up.name)
			}
			if err := objectSchema(t.InputSchema); err != nil {
				return toolSet{}, fmt.Errorf("upstream %s: tool %s: %w", up.name, t.Name, err)
			}
			if err := sdkAccepts(scratch, t); err != nil {
				return toolSet{}, fmt.Errorf("upstream %s: tool %s: %w", up.name, t.Name, err)
			}
			exposed := *t
			exposed.Name = name
			ts.routes[name] = &route{up: up, name: t.Name, tool: &exposed}
			if i < len(raws) && raws[i] != nil {
				if lt, err := exposeTool(raws[i], name); err == nil {
					ts.listed[name] = lt
				}
			}
			et := engine.Tool{Name: name, InputSchema: t.InputSchema, OutputSchema: t.OutputSchema}
			if a := t.Annotations; a != nil {
				et.ReadOnlyHint = a.ReadOnlyHint
				et.DestructiveHint = a.DestructiveHint != nil && *a.DestructiveHint
			}
			ts.tools = append(ts.tools, et)
		}
	}
	return ts, nil
}

// sdkAccepts reports whether the SDK's server takes t, on a scratch server: Server.AddTool
// panics on what it refuses (e.g. invalid x-mcp-header annotations of an input schema), and
// an upstream's tool list must not be able to stop the gateway.
func sdkAccepts(scratch *mcp.Server, t *mcp.Tool) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("the MCP SDK refuses the tool: %v", r)
		}
	}()
	scratch.AddTool(t, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) { return nil, nil })
	return nil
}

// objectSchema checks that an upstream input schema is a JSON object of type "object", which
// the MCP server side requires.
func objectSchema(s any) error {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("input schema is not JSON: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m["type"] != "object" {
		return errors.New(`input schema is not an object schema of type "object"`)
	}
	return nil
}

// newEngine builds an engine for ms and tools with the gateway's config and the mode fixed
// at start (seed: Hot reload, "Mode is also fixed at start").
func (g *Gateway) newEngine(ms []*manifest.Manifest, tools []engine.Tool) (*engine.Engine, error) {
	validate := g.cfg.ValidateSchemas
	return engine.New(engine.Config{
		Manifests:         ms,
		Mode:              g.mode,
		UnclassifiedReads: engine.UnclassifiedReads(g.cfg.UnclassifiedReads),
		Permissions:       g.cfg.Permissions,
		Allow:             g.cfg.Allow,
		Deny:              g.cfg.Deny,
		ValidateSchemas:   &validate,
		Tools:             tools,
		Store:             g.store,
		Succeeded:         g.succeeded,
		Policy:            g.policy,
		Environment:       g.environment,
		Gateway:           g.name,
		Counter:           policyCounter(g.store),
		RunSteps:          g.runSteps,
		Now:               g.now,
	})
}

// policyCounter counts the calls of policy limit rules in st, so counts survive restarts and
// are shared by the gateways of one store.
func policyCounter(st store.Store) policy.Counter { return storeCounter{st} }

type storeCounter struct{ st store.Store }

func limitKey(k policy.CountKey) store.LimitKey {
	return store.LimitKey{Rule: k.Rule, Scope: string(k.Scope), Subject: k.Subject}
}

func (c storeCounter) Count(ctx context.Context, k policy.CountKey, since time.Time) (int, error) {
	return c.st.CountCalls(ctx, limitKey(k), since)
}

func (c storeCounter) Add(ctx context.Context, k policy.CountKey, at time.Time) error {
	return c.st.AddCall(ctx, limitKey(k), at)
}

// route returns the route of an exposed tool name, nil if no upstream exposes it now.
func (g *Gateway) route(name string) *route { return (*g.tools.Load()).routes[name] }

// publish makes ts the tools the MCP server offers: tools gone are removed, new or changed
// ones (re)added. The SDK tells connected clients with notifications/tools/list_changed.
func (g *Gateway) publish(old, ts toolSet) {
	var gone []string
	for name := range old.routes {
		if _, ok := ts.routes[name]; !ok {
			gone = append(gone, name)
		}
	}
	sort.Strings(gone)
	if len(gone) > 0 {
		g.server.RemoveTools(gone...)
	}
	names := make([]string, 0, len(ts.routes))
	for name := range ts.routes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		r := ts.routes[name]
		if prev, ok := old.routes[name]; ok && prev.up == r.up && reflect.DeepEqual(prev.tool, r.tool) {
			continue
		}
		// Server.AddTool (not the generic mcp.AddTool): the raw handler gets the arguments
		// unvalidated, so the engine is the only one to judge them.
		g.server.AddTool(r.tool, g.handle)
	}
	g.tools.Store(&ts)
}

// refreshTools lists the given upstreams again (all when none is given; each listing bounded
// and within ListTimeout) and, when the tool set changed, rebuilds the engine with the
// manifests in use and publishes the new tools. On any error (an upstream not answering, a
// listing over a limit, a name clash) the tools in use keep serving and the error is
// journaled as a gateway note.
func (g *Gateway) refreshTools(ctx context.Context, only ...*upstream) error {
	ups := only
	if len(ups) == 0 {
		ups = g.upstreams
	}
	var errs []error
	for _, up := range ups {
		if _, err := up.list(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	g.stateMu.Lock()
	defer g.stateMu.Unlock()
	if len(only) == 0 {
		// Also after a failure: an upstream that cannot be listed is asked again once the
		// cache expires, not on every agent's tools/list.
		g.listedAt = time.Now()
	}
	if err := errors.Join(errs...); err != nil {
		g.noteListing(fmt.Sprintf("the tool list was not refreshed: %v", err))
		return err
	}
	ts, err := buildTools(g.upstreams)
	if cur := g.tools.Load(); err == nil && reflect.DeepEqual(ts.tools, cur.tools) && reflect.DeepEqual(ts.listed, cur.listed) {
		g.listNote = ""
		return nil
	}
	var e *engine.Engine
	if err == nil {
		e, err = g.newEngine(g.manifests, ts.tools)
	}
	if err != nil {
		g.noteListing(fmt.Sprintf("the new tool list was refused, the previous one keeps serving: %v", err))
		return err
	}
	g.listNote = ""
	old := *g.tools.Load()
	g.engine.Swap(e)
	g.publish(old, ts)
	return nil
}

// noteListing notes a failed refresh of the tools (g.stateMu held). The same failure again (an
// upstream whose listing keeps failing, asked again on every list_changed) is noted once per
// listNoteRepeat, so that it cannot fill the journal.
func (g *Gateway) noteListing(text string) {
	if text == g.listNote && time.Since(g.listNoteAt) < listNoteRepeat {
		return
	}
	g.listNote, g.listNoteAt = text, time.Now()
	g.note("%s", text)
}

// listStale reports whether the upstreams were last listed longer than ListCacheTTL ago.
func (g *Gateway) listStale() bool {
	g.stateMu.Lock()
	defer g.stateMu.Unlock()
	return time.Since(g.listedAt) > ListCacheTTL
}

// note writes a gateway-level note to stderr and to the gateway journal.
func (g *Gateway) note(format string, args ...any) {
	text := clip(fmt.Sprintf(format, args...), maxNoteBytes) // errors may quote an upstream
	g.warn("%s", text)
	if _, err := g.store.AppendEvent(context.Background(), store.Event{Run: store.GatewayJournal, Kind: store.KindNote, Note: text}); err != nil {
		g.warn("journal note: %v", err)
	}
}

// listMiddleware serves an agent's tools/list: it refreshes the upstreams' lists when the
// cache is older than ListCacheTTL, drops the tools allow/deny refuse (calls to them are
// still decided, and journaled as blocked), and sends each upstream tool as the upstream
// listed it, renamed, without outputSchema under `output_schemas: hide` (toolmeta.go).
// Pagination is the SDK's (ServerOptions.PageSize).
func (g *Gateway) listMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/list" {
			return next(ctx, method, req)
		}
		if g.listStale() {
			// Concurrent lists share one refresh, which outlives this request (within
			// ListTimeout per upstream); this request waits for it at most ListWait, then
			// gets the cached tools. A failed refresh is journaled; the cached tools keep serving.
			done := g.listing.DoChan("", func() (any, error) { return nil, g.refreshTools(context.WithoutCancel(ctx)) })
			wait := time.NewTimer(ListWait)
			select {
			case <-done:
			case <-wait.C:
			case <-ctx.Done():
			}
			wait.Stop()
		}
		res, err := next(ctx, method, req)
		if err != nil {
			return res, err
		}
		lr, ok := res.(*mcp.ListToolsResult)
		if !ok {
			return res, err
		}
		e, ts := g.engine.Load(), g.tools.Load()
		hide := g.cfg.OutputSchemas == config.OutputSchemasHide
		kept := make([]*mcp.Tool, 0, len(lr.Tools))
		raws := make([]json.RawMessage, 0, len(lr.Tools))
		for _, t := range lr.Tools {
			if !isAgentTool(t.Name) && !e.Listed(t.Name) { // allow/deny govern upstream tools only
				continue
			}
			raw, err := toolJSON(ts, t, hide)
			if err != nil {
				return nil, fmt.Errorf("tools/list: tool %s: %w", t.Name, err)
			}
			kept, raws = append(kept, t), append(raws, raw)
		}
		out := *lr
		out.Tools = kept
		return &listedToolsResult{ListToolsResult: &out, tools: raws}, nil
	}
}
