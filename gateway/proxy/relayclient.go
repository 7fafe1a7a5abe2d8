package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// What an upstream sends the gateway's client (issue 19): notifications and requests that
// belong to an agent are relayed to it (see agents.go for which agent), the rest is handled
// here (list changes refresh the catalog and are announced to every agent).

// newClient makes the client of one upstream session: the shared one (a nil) or agent a's own.
// The capabilities a's session declares upstream are those the agent declared to the gateway
// (an upstream must not ask an agent for what it cannot do); the shared session declares
// sampling, elicitation and roots, and refuses such a request when it cannot tell the agent.
func (g *Gateway) newClient(up *upstream, a *agentSession) *mcp.Client {
	c := &mcp.ClientCapabilities{
		RootsV2:     &mcp.RootCapabilities{ListChanged: true},
		Sampling:    &mcp.SamplingCapabilities{},
		Elicitation: &mcp.ElicitationCapabilities{Form: &mcp.FormElicitationCapabilities{}},
	}
	if a != nil {
		c = agentCapabilities(a.ss)
	}
	opts := &mcp.ClientOptions{
		Capabilities:           c,
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { up.listChanged(g.upstreamChanged) },
		PromptListChangedHandler: func(context.Context, *mcp.PromptListChangedRequest) {
			g.relayListChanged(up, a, "notifications/prompts/list_changed", &mcp.PromptListChangedParams{})
		},
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) {
			g.relayListChanged(up, a, "notifications/resources/list_changed", &mcp.ResourceListChangedParams{})
		},
		ResourceUpdatedHandler: func(ctx context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			g.relayUpdated(up, a, req.Params)
		},
		LoggingMessageHandler: func(ctx context.Context, req *mcp.LoggingMessageRequest) {
			g.relayLog(up, a, req.Params)
		},
		ProgressNotificationHandler: func(ctx context.Context, req *mcp.ProgressNotificationClientRequest) {
			g.relayProgress(up, a, req.Params)
		},
		ElicitationCompleteHandler: func(ctx context.Context, req *mcp.ElicitationCompleteNotificationRequest) {
			if to, f, err := g.target(up, a, takeOwner(req.Params), "notifications/elicitation/complete"); err == nil {
				_ = to.ss.NotifyElicitationComplete(f.context(ctx), req.Params)
			}
		},
	}
	if c.Sampling != nil {
		opts.CreateMessageWithToolsHandler = func(ctx context.Context, req *mcp.CreateMessageWithToolsRequest) (*mcp.CreateMessageWithToolsResult, error) {
			return relayRequest(g, ctx, up, a, "sampling/createMessage", req.Params,
				func(ctx context.Context, to *agentSession) (*mcp.CreateMessageWithToolsResult, error) {
					return to.ss.CreateMessageWithTools(ctx, req.Params)
				})
		}
	}
	if c.Elicitation != nil {
		opts.ElicitationHandler = func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return relayRequest(g, ctx, up, a, "elicitation/create", req.Params,
				func(ctx context.Context, to *agentSession) (*mcp.ElicitResult, error) {
					return to.ss.Elicit(ctx, req.Params)
				})
		}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: Name, Version: Version}, opts)
	client.AddSendingMiddleware(notifyMiddleware)
	if c.RootsV2 != nil {
		client.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
			return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
				if method != "roots/list" {
					return next(ctx, method, req)
				}
				params, _ := req.GetParams().(*mcp.ListRootsParams)
				return relayRequest(g, ctx, up, a, method, params,
					func(ctx context.Context, to *agentSession) (*mcp.ListRootsResult, error) {
						return to.ss.ListRoots(ctx, params)
					})
			}
		})
	}
	return client
}

// agentCapabilities are the client capabilities ss declared (none: the zero value, so that
// nothing is declared upstream on its behalf).
func agentCapabilities(ss *mcp.ServerSession) *mcp.ClientCapabilities {
	c := &mcp.ClientCapabilities{}
	if p := ss.InitializeParams(); p != nil && p.Capabilities != nil {
		in := p.Capabilities
		c.Sampling, c.Elicitation, c.RootsV2 = in.Sampling, in.Elicitation, in.RootsV2
		if c.RootsV2 == nil && in.Roots.ListChanged {
			c.RootsV2 = &mcp.RootCapabilities{ListChanged: true}
		}
	}
	return c
}

// ErrNoAgent is returned (wrapped) to an upstream request the gateway cannot give to one agent.
var ErrNoAgent = fmt.Errorf("the gateway cannot tell which agent this is for")

// target says which agent what up sent over one of its sessions belongs to: the agent of its
// own (per_client) session a; for the shared session of a shared upstream, the agent of the
// one request in flight on it when the message was read (owner, its stamp: owner.go).
// Otherwise (none or several in flight, an agent gone since, or the listing-only shared
// session of a per_client upstream) it is ErrNoAgent: a request is refused rather than given
// to an agent it may not be for. f is the flight it came during, nil when not known.
func (g *Gateway) target(up *upstream, a *agentSession, owner, what string) (*agentSession, *flight, error) {
	if a != nil {
		return a, a.only(up), nil
	}
	if up.cfg.PerClient() {
		return nil, nil, fmt.Errorf("upstream %s sent %s on the gateway's own session, which no agent uses: %w", up.name, what, ErrNoAgent)
	}
	to := g.agentByID(owner)
	if to == nil {
		return nil, nil, fmt.Errorf("upstream %s is shared by every agent (session: shared) and no one agent's request was in flight on it when it sent %s, so %w; set session: per_client on it", up.name, what, ErrNoAgent)
	}
	return to, to.only(up), nil
}

// context is ctx (the upstream's request: its cancel) with the values of f's agent request, so
// that what is sent with it goes on that request's stream; ctx itself when f is nil.
func (f *flight) context(ctx context.Context) context.Context {
	if f == nil {
		return sdkValuesHidden{ctx}
	}
	return valuesOf{Context: ctx, values: f.ctx}
}

type valuesOf struct {
	context.Context
	values context.Context
}

func (v valuesOf) Value(key any) any {
	if x := v.values.Value(key); x != nil {
		return x
	}
	return sdkValuesHidden{v.Context}.Value(key)
}

// sdkValuesHidden is a context without the SDK's own values. A context crosses from the
// gateway's server side to its client side (an agent's request forwarded upstream) and back
// (an upstream's request relayed to the agent); the SDK keeps request state in context values
// (the request's protocol version, its id, its stream), which on the other side would steer
// the wrong session: an agent on 2025-06-18 would have the upstream called with that version
// header.
type sdkValuesHidden struct{ context.Context }

var sdkPackage = reflect.TypeFor[mcp.Implementation]().PkgPath()

func (c sdkValuesHidden) Value(key any) any {
	if t := reflect.TypeOf(key); t != nil && t.PkgPath() == sdkPackage {
		return nil
	}
	return c.Context.Value(key)
}

// upstreamContext is ctx, an agent's request, as the gateway calls an upstream with it: its
// cancel and deadline and the gateway's values, not the SDK's (see sdkValuesHidden).
func upstreamContext(ctx context.Context) context.Context { return sdkValuesHidden{ctx} }

// relayRequest gives an upstream's request to the agent it belongs to (target) and returns the
// agent's answer, journaling it in the agent's run as a server_request record with the step of
// the call it came during. ctx ends when the upstream cancels its request; the agent is then
// sent notifications/cancelled by the SDK.
func relayRequest[P mcp.Params, R any](g *Gateway, ctx context.Context, up *upstream, a *agentSession, method string, params P,
	send func(context.Context, *agentSession) (R, error)) (R, error) {
	var zero R
	to, f, err := g.target(up, a, takeOwner(params), method)
	if err != nil {
		g.warn("%v", err)
		return zero, err
	}
	if err := declares(to.ss, method); err != nil {
		// Asked anyway (a shared session declares everything upstream; a hostile upstream
		// need not care), the agent would never answer, and the request would hold its place
		// until call_timeout.
		g.journalServerRequest(ctx, to, f, up, method, params, "not answered: "+err.Error())
		return zero, err
	}
	release, err := g.admitServerRequest(up, a)
	if err != nil {
		return zero, err
	}
	defer release()
	res, err := send(f.context(ctx), to)
	note := "answered"
	if err != nil {
		note = "not answered: " + err.Error()
	}
	g.journalServerRequest(ctx, to, f, up, method, params, note)
	return res, err
}

// declares says why the agent of ss cannot be asked method (a capability it did not declare),
// nil when it can.
func declares(ss *mcp.ServerSession, method string) error {
	c := agentCapabilities(ss)
	var missing string
	switch {
	case method == "sampling/createMessage" && c.Sampling == nil:
		missing = "sampling"
	case method == "elicitation/create" && c.Elicitation == nil:
		missing = "elicitation"
	case method == "roots/list" && c.RootsV2 == nil:
		missing = "roots"
	default:
		return nil
	}
	return fmt.Errorf("the agent did not declare the %s capability, so it is not asked %s", missing, method)
}

// admitServerRequest admits one request of the upstream session (a's own session to up, or
// up's shared one when a is nil) within limits.server_requests_per_session: each waits for an
// agent (a human, for an elicitation) with a goroutine and its message held, and an upstream
// could send any number at once. release must follow an admission.
func (g *Gateway) admitServerRequest(up *upstream, a *agentSession) (release func(), err error) {
	mu, asked := &up.fmu, &up.asked
	if a != nil {
		mu = &a.mu
		a.mu.Lock()
		if a.asked == nil {
			a.asked = map[*upstream]*int{}
		}
		if a.asked[up] == nil {
			a.asked[up] = new(int)
		}
		asked = a.asked[up]
		a.mu.Unlock()
	}
	mu.Lock()
	defer mu.Unlock()
	if max := g.limits.ServerRequestsPerSession; *asked >= max {
		g.metrics.limitHit("server_requests_per_session")
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: fmt.Sprintf(
			"%d requests of this session already wait for the agent: refused (limits.server_requests_per_session of gateway %s)", max, Name)}
	}
	*asked++
	return func() {
		mu.Lock()
		*asked--
		mu.Unlock()
	}, nil
}

// journalServerRequest writes a server_request record in the run of agent a, or in the gateway
// journal when its session has not opened one yet (it only listed or completed): the request
// reached the agent all the same.
func (g *Gateway) journalServerRequest(ctx context.Context, a *agentSession, f *flight, up *upstream, method string, params any, note string) {
	run := g.existingRun(a.ss)
	if run == "" {
		note += " (to an agent session with no run yet)"
	}
	e := store.Event{Run: run, Kind: store.KindServerRequest, Tool: up.name, Reason: method, Note: clip(note, maxNoteBytes)}
	if f != nil {
		e.Step = f.step
	}
	if b, err := json.Marshal(params); err == nil {
		var m map[string]any
		if json.Unmarshal(b, &m) == nil {
			e.ArgsDigest, _ = engine.ArgsDigest(m)
		}
	}
	if _, err := g.store.AppendEvent(context.WithoutCancel(ctx), e); err != nil {
		g.warn("journal %s of upstream %s in run %s: %v", method, up.name, run, err)
	}
}

// relayLog gives an upstream's log message to the agent of its session (filtered by the level
// that agent set, by the SDK); from a shared session, to the agent of the one request in
// flight when it was read (owner.go), to every agent when none was (the upstream's own), and
// to no one when several were (it may be any of theirs).
func (g *Gateway) relayLog(up *upstream, a *agentSession, p *mcp.LoggingMessageParams) {
	ctx := context.Background()
	owner := takeOwner(p)
	if a != nil {
		_ = a.ss.Log(a.only(up).context(ctx), p)
		return
	}
	if up.cfg.PerClient() {
		return // the listing session: no agent's
	}
	if owner != ownerNone {
		if to := g.agentByID(owner); to != nil {
			_ = to.ss.Log(to.only(up).context(ctx), p)
		}
		return
	}
	for _, to := range g.agentList() {
		_ = to.ss.Log(ctx, p)
	}
}

// relayProgress gives a progress notification to the request it is about, with the agent's own
// token. A token of another upstream, or of another agent's session, is dropped.
func (g *Gateway) relayProgress(up *upstream, a *agentSession, p *mcp.ProgressNotificationParams) {
	tok, ok := p.ProgressToken.(string)
	if !ok {
		return
	}
	v, ok := g.tokens.Load(tok)
	if !ok {
		return
	}
	f := v.(*flight)
	defer f.relayed()
	if f.up != up || f.agent == nil || (up.cfg.PerClient() && f.agent != a) || (!up.cfg.PerClient() && a != nil) {
		return
	}
	q := *p
	q.ProgressToken = f.token
	_ = f.agent.ss.NotifyProgress(f.ctx, &q)
}

// relayRootsChanged is the agent server's RootsListChangedHandler: the agent's own upstream
// sessions are told, and the shared ones (their roots/list goes to an agent with a request in
// flight, see target).
func (g *Gateway) relayRootsChanged(ctx context.Context, req *mcp.RootsListChangedRequest) {
	a := g.agentFor(req)
	for _, up := range g.upstreams {
		var cs *mcp.ClientSession
		if up.cfg.PerClient() {
			if a == nil {
				continue
			}
			a.mu.Lock()
			p := a.peers[up]
			a.mu.Unlock()
			if p == nil {
				continue // not opened yet: it will ask when it needs them
			}
			<-p.ready
			cs = p.cs
		} else {
			cs, _ = up.session()
		}
		if cs != nil {
			_ = notifyUpstream(upstreamContext(ctx), cs, "notifications/roots/list_changed", &mcp.RootsListChangedParams{})
		}
	}
}

// relayListChanged tells the agent of a per_client session at once that up's prompts or
// resources changed (its list may be its own), and has the catalog refreshed (coalesced, at most
// once per relistInterval). A shared session's change is announced to every agent by that
// refresh (refreshFeatures) when the listing did change: passed on one for one, an upstream
// sending them in a loop had the gateway write as many to every agent.
func (g *Gateway) relayListChanged(up *upstream, a *agentSession, method string, p mcp.Params) {
	if a != nil {
		_ = notify(context.Background(), a.ss, method, p)
	}
	up.listChanged(g.upstreamChanged)
}

// relayUpdated gives notifications/resources/updated to the agents subscribed to the URI (or
// to a resource it is part of): the agent of a per_client session, or any agent for a shared
// one. The update of a URI allow/deny refuses reaches no one (a subscription to a folder above
// it would otherwise tell its name).
func (g *Gateway) relayUpdated(up *upstream, a *agentSession, p *mcp.ResourceUpdatedNotificationParams) {
	if p == nil {
		return
	}
	if _, ok := uriAllowed(g.engine.Load(), p.URI); !ok {
		return
	}
	targets := []*agentSession{a}
	if a == nil {
		if up.cfg.PerClient() {
			return
		}
		targets = g.agentList()
	}
	for _, to := range targets {
		if to.subscribed(p.URI) {
			_ = notify(context.Background(), to.ss, "notifications/resources/updated", p)
		}
	}
}

// subscribed reports whether a subscribed to uri or to a resource uri is part of.
func (a *agentSession) subscribed(uri string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.subs[uri] != nil {
		return true
	}
	for s := range a.subs {
		if strings.HasPrefix(uri, strings.TrimSuffix(s, "/")+"/") {
			return true
		}
	}
	return false
}

// notify sends one notification of any method to one agent session. The SDK has no such call,
// so it goes as a progress notification that notifyMiddleware (a sending middleware) turns into
// method with params before it is written.
func notify(ctx context.Context, ss *mcp.ServerSession, method string, params mcp.Params) error {
	return ss.NotifyProgress(context.WithValue(ctx, notifyKey{}, notifyAs{method: method, params: params}), &mcp.ProgressNotificationParams{})
}

// notifyUpstream is notify for an upstream session (the client's sending middleware is
// notifyMiddleware too).
func notifyUpstream(ctx context.Context, cs *mcp.ClientSession, method string, params mcp.Params) error {
	return cs.NotifyProgress(context.WithValue(ctx, notifyKey{}, notifyAs{method: method, params: params}), &mcp.ProgressNotificationParams{})
}

type notifyKey struct{}

type notifyAs struct {
	method string
	params mcp.Params
}

// notifyMiddleware is the sending half of notify.
func notifyMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if n, ok := ctx.Value(notifyKey{}).(notifyAs); ok && method == "notifications/progress" {
			switch s := req.GetSession().(type) {
			case *mcp.ServerSession:
				return next(ctx, n.method, &mcp.ServerRequest[mcp.Params]{Session: s, Params: n.params})
			case *mcp.ClientSession:
				return next(ctx, n.method, &mcp.ClientRequest[mcp.Params]{Session: s, Params: n.params})
			}
		}
		return next(ctx, method, req)
	}
}
