package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// Client-side limits (issue 18): how many tools/call requests a session and a principal may
// have in flight, and the end of those calls when their session ends. The HTTP limits (body,
// batch, timeouts, connections) are in httplimits.go, the stdio line filter in stdio.go.

// LimitError is a request refused because a limit of gateway.yaml's `limits:` was reached.
type LimitError struct {
	// Limit is the field of limits: that was reached, e.g. "calls_per_session"; it is also the
	// label of reversi_gateway_limit_hits_total.
	Limit string
	// Max is the limit's value (a count or a size in bytes).
	Max int64
	// Text says what reached it and what to do.
	Text string
}

func (e *LimitError) Error() string { return e.Text }

// effectiveLimits is l with every unset (zero) field at its default: a config built in code
// without limits gets the defaults, never "unlimited". BatchSize 0 is the default (refused).
func effectiveLimits(l config.Limits) config.Limits {
	d := config.DefaultLimits()
	orDefault(&l.ToolsPerUpstream, d.ToolsPerUpstream)
	orDefault(&l.PagesPerListing, d.PagesPerListing)
	orDefault(&l.CallsPerSession, d.CallsPerSession)
	orDefault(&l.CallsPerPrincipal, d.CallsPerPrincipal)
	orDefault(&l.Connections, d.Connections)
	orDefault(&l.Sessions, d.Sessions)
	orDefault(&l.SessionsPerPrincipal, d.SessionsPerPrincipal)
	orDefault(&l.MessageBytes, d.MessageBytes)
	orDefault(&l.ListingBytes, d.ListingBytes)
	orDefault(&l.RequestBodyBytes, d.RequestBodyBytes)
	orDefault(&l.HeaderBytes, d.HeaderBytes)
	orDefault(&l.ReadTimeout, d.ReadTimeout)
	orDefault(&l.WriteTimeout, d.WriteTimeout)
	orDefault(&l.IdleTimeout, d.IdleTimeout)
	orDefault(&l.SubscriptionsPerSession, d.SubscriptionsPerSession)
	orDefault(&l.ServerRequestsPerSession, d.ServerRequestsPerSession)
	l.BatchSize = max(l.BatchSize, 0)
	return l
}

// orDefault sets *v to def when it is unset (zero or negative).
func orDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// inflight holds the tools/call requests in flight, by session and by principal, each with
// the cancel func of its context.
type inflight struct {
	perSession, perPrincipal int

	mu         sync.Mutex
	sessions   map[*mcp.ServerSession]*sessionCalls
	principals map[string]int
}

type sessionCalls struct {
	principal string
	calls     map[*inflightCall]struct{}
}

type inflightCall struct{ cancel context.CancelCauseFunc }

func newInflight(l config.Limits) *inflight {
	return &inflight{perSession: l.CallsPerSession, perPrincipal: l.CallsPerPrincipal,
		sessions: map[*mcp.ServerSession]*sessionCalls{}, principals: map[string]int{}}
}

// acquire admits one call of ss by principal, or refuses it at once with a *LimitError (calls
// are never queued). what names the requests counted in the refusal's text: relayed reads
// (resources/read, prompts/get) count with the calls. The returned context is ctx, cancelled with a cause by cancel, when the
// session ends (cancelSession) or when the gateway stops (cancelAll); release frees the slot
// and must be called once the call is done.
func (f *inflight) acquire(ctx context.Context, ss *mcp.ServerSession, principal, what string) (_ context.Context, release func(), cancel context.CancelCauseFunc, _ error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sc := f.sessions[ss]
	if sc != nil && len(sc.calls) >= f.perSession {
		return nil, nil, nil, &LimitError{Limit: "calls_per_session", Max: int64(f.perSession),
			Text: fmt.Sprintf("this session already has %d %s in flight (limits.calls_per_session is %d): wait for one to finish", len(sc.calls), what, f.perSession)}
	}
	if n := f.principals[principal]; n >= f.perPrincipal {
		return nil, nil, nil, &LimitError{Limit: "calls_per_principal", Max: int64(f.perPrincipal),
			Text: fmt.Sprintf("%s already has %d %s in flight across its sessions (limits.calls_per_principal is %d): wait for one to finish", principal, n, what, f.perPrincipal)}
	}
	if sc == nil {
		sc = &sessionCalls{principal: principal, calls: map[*inflightCall]struct{}{}}
		f.sessions[ss] = sc
	}
	cctx, cancel := context.WithCancelCause(ctx)
	c := &inflightCall{cancel: cancel}
	sc.calls[c] = struct{}{}
	f.principals[principal]++
	var once sync.Once
	release = func() {
		once.Do(func() {
			cancel(nil)
			f.mu.Lock()
			defer f.mu.Unlock()
			delete(sc.calls, c)
			if len(sc.calls) == 0 && f.sessions[ss] == sc {
				delete(f.sessions, ss)
			}
			if f.principals[principal]--; f.principals[principal] <= 0 {
				delete(f.principals, principal)
			}
		})
	}
	return cctx, release, cancel, nil
}

// cancelSession cancels, with cause, the calls ss has in flight when principal is the one
// making them (a caller naming another principal's session cancels nothing), and reports how
// many it cancelled.
func (f *inflight) cancelSession(ss *mcp.ServerSession, principal string, cause error) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	sc := f.sessions[ss]
	if sc == nil || sc.principal != principal {
		return 0
	}
	for c := range sc.calls {
		c.cancel(cause)
	}
	return len(sc.calls)
}

// cancelAll cancels every call in flight with cause.
func (f *inflight) cancelAll(cause error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, sc := range f.sessions {
		for c := range sc.calls {
			c.cancel(cause)
		}
	}
}

// Causes of a call's cancellation by the gateway, visible in the journaled outcome.
var (
	// ErrSessionClosed: the client closed its session (HTTP DELETE) while the call was in flight.
	ErrSessionClosed = errors.New("the client closed its session")
	// ErrClientGone: the HTTP request that carried the call ended (the client disconnected)
	// before its result could be sent; without resumable streams the result could never reach
	// the client.
	ErrClientGone = errors.New("the client disconnected before the result was sent")
	// ErrGatewayStopping: the gateway is shutting down.
	ErrGatewayStopping = errors.New("the gateway is stopping")
)

// callMiddleware runs before every tools/call on the agent and operator endpoints: it admits
// the call within limits.calls_per_session and limits.calls_per_principal (a refusal is
// journaled, counted and answered at once), ties the call's context to its session and to the
// HTTP request that carried it (postContext), and journals the SDK's refusal of an unknown
// tool, answered as an isError result. Refusals go to the gateway journal, since no run step is
// opened for them.
func (g *Gateway) callMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/call" {
			return next(ctx, method, req)
		}
		creq, ok := req.(*mcp.CallToolRequest)
		if !ok {
			return next(ctx, method, req)
		}
		return g.limitedCall(ctx, creq, func(ctx context.Context) (mcp.Result, error) { return next(ctx, method, req) })
	}
}

// limitedCall runs a tools/call within the session's and the principal's limits on calls in
// flight (a refusal is journaled and answered as a blocked result), cancelled when the HTTP
// POST that carried it ends (ErrClientGone), and answers an unknown tool as a tool execution
// error. The SDK's path (callMiddleware) and the fast path (fastcall.go) both go through it.
func (g *Gateway) limitedCall(ctx context.Context, creq *mcp.CallToolRequest, run func(context.Context) (mcp.Result, error)) (mcp.Result, error) {
	principal := g.principal(creq)
	name := ""
	if creq.Params != nil {
		name = creq.Params.Name
	}
	cctx, release, cancel, err := g.calls.acquire(ctx, creq.Session, principal, "tools/call requests")
	if err != nil {
		var le *LimitError
		if errors.As(err, &le) {
			g.metrics.limitHit(le.Limit)
		}
		g.journalRefusal(ctx, principal, name, err.Error())
		return textResult(engine.BlockedPrefix + err.Error()), nil
	}
	defer release()
	if pctx := g.postContext(creq); pctx != nil {
		stop := context.AfterFunc(pctx, func() { cancel(ErrClientGone) })
		defer stop()
	}
	res, err := run(cctx)
	var je *jsonrpc.Error
	if errors.As(err, &je) && je.Message == fmt.Sprintf("unknown tool %q", name) {
		g.journalRefusal(ctx, principal, name, je.Message)
		// A tool execution error, as the TypeScript SDK's servers answer: the agent (and the
		// conformance suite) reads it like any refusal (issue 19).
		return textResult(engine.BlockedPrefix + je.Message), nil
	}
	return res, err
}

// journalRefusal writes a tools/call refused before any run step was opened for it (a limit, an
// unknown tool, a run id that cannot be used) as a note of the gateway journal. What the client
// chose (the tool name, a run id in why) is clipped, so that a note stays small.
func (g *Gateway) journalRefusal(ctx context.Context, principal, tool, why string) {
	note := fmt.Sprintf("refused a tools/call of %s to %q: %s", principal, clip(tool, 200), clip(why, 1000))
	if _, err := g.store.AppendEvent(context.WithoutCancel(ctx), store.Event{Run: store.GatewayJournal, Kind: store.KindNote, Note: note}); err != nil {
		g.warn("journal the refusal %s: %v", note, err)
	}
}

// clip cuts s to at most n bytes, on a rune boundary, marking the cut with "...".
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
