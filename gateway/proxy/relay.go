package proxy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/yosida95/uritemplate/v3"

	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// The relay of what is not a tool (issue 19; the seed's "does not proxy resources, prompts or
// sampling" is lifted). Prompts, resources, templates and completions are forwarded to the
// upstream that serves them (catalog.go) over the agent's upstream session (agents.go);
// allow/deny apply to exposed prompt names and to resource URIs as they do to tool names, and
// resources/read and prompts/get are journaled as read records of the agent's run. Lists are
// the union of the upstreams', in config order, in one page.

// relayMiddleware serves the relayed methods of the agent server; logging/setLevel is the
// SDK's (which keeps the level the gateway filters upstream logs with) and then forwarded.
func (g *Gateway) relayMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if relayedMethods[method] { // within limits.calls_per_session and calls_per_principal, as calls are
			ss, _ := req.GetSession().(*mcp.ServerSession)
			principal := g.principalOf(req.GetExtra())
			cctx, release, _, err := g.calls.acquire(ctx, ss, principal, "requests (tools/call and relayed ones)")
			if err != nil {
				var le *LimitError
				if errors.As(err, &le) {
					g.metrics.limitHit(le.Limit)
				}
				g.journalNote(ctx, fmt.Sprintf("refused a %s of %s: %s", method, principal, clip(err.Error(), 1000)))
				return nil, blocked(err.Error())
			}
			defer release()
			ctx = cctx
		}
		switch r := req.(type) {
		case *mcp.ListPromptsRequest:
			return g.relayListPrompts(ctx, r)
		case *mcp.GetPromptRequest:
			return g.relayGetPrompt(ctx, r)
		case *mcp.ListResourcesRequest:
			return g.relayListResources(ctx, r)
		case *mcp.ListResourceTemplatesRequest:
			return g.relayListTemplates(ctx, r)
		case *mcp.ReadResourceRequest:
			return g.relayRead(ctx, r)
		}
		res, err := next(ctx, method, req)
		if method == "logging/setLevel" && err == nil {
			if p, ok := req.GetParams().(*mcp.SetLoggingLevelParams); ok && p != nil {
				g.relaySetLevel(ctx, req.GetSession(), req.GetExtra(), p.Level)
			}
		}
		return res, err
	}
}

// allowed is the verdict of nameAllowed or uriAllowed.
func allowed(_ string, ok bool) bool { return ok }

// relayedMethods are the agents' requests the gateway relays to upstreams (besides tools/call).
var relayedMethods = map[string]bool{"prompts/list": true, "prompts/get": true, "resources/list": true,
	"resources/templates/list": true, "resources/read": true, "resources/subscribe": true, "resources/unsubscribe": true,
	"completion/complete": true}

// blocked is the error of a relayed request the gateway refuses.
func blocked(text string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: engine.BlockedPrefix + text}
}

// errCursor refuses a list cursor: the gateway's lists are one page.
var errCursor = &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "unknown cursor: the gateway returns every item in one page"}

// agentFor is the agent state of a request's session.
func (g *Gateway) agentFor(req mcp.Request) *agentSession {
	ss, _ := req.GetSession().(*mcp.ServerSession)
	return g.agentOf(ss)
}

// each runs list on every upstream of ups over the agent's session to it, and returns what
// they gave in order. An upstream that cannot be reached or listed is left out (it is down, and
// its tools are refused meanwhile); when all of them fail, the errors are returned.
func each[T any](ctx context.Context, a *agentSession, ups []*upstream,
	list func(context.Context, *upstream, *mcp.ClientSession) ([]T, error)) ([]T, error) {
	ctx = upstreamContext(ctx)
	var out []T
	var errs []error
	for _, up := range ups {
		cs, err := a.session(ctx, up)
		if err == nil {
			var items []T
			if items, err = list(ctx, up, cs); err == nil {
				out = append(out, items...)
				continue
			}
		}
		errs = append(errs, err)
	}
	if len(ups) > 0 && len(errs) == len(ups) {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

func (g *Gateway) relayListPrompts(ctx context.Context, r *mcp.ListPromptsRequest) (mcp.Result, error) {
	if r.Params != nil && r.Params.Cursor != "" {
		return nil, errCursor
	}
	e := g.engine.Load()
	prompts, err := each(ctx, g.agentFor(r), g.catalog().withPrompts, func(ctx context.Context, up *upstream, cs *mcp.ClientSession) ([]*mcp.Prompt, error) {
		ps, err := up.listPrompts(ctx, cs)
		out := make([]*mcp.Prompt, 0, len(ps))
		for _, p := range ps {
			if p = exposedPrompt(up, p); allowed(nameAllowed(e, p.Name)) {
				out = append(out, p)
			}
		}
		return out, err
	})
	if err != nil {
		return nil, err
	}
	return &mcp.ListPromptsResult{Prompts: prompts}, nil
}

func (g *Gateway) relayListResources(ctx context.Context, r *mcp.ListResourcesRequest) (mcp.Result, error) {
	if r.Params != nil && r.Params.Cursor != "" {
		return nil, errCursor
	}
	e := g.engine.Load()
	res, err := each(ctx, g.agentFor(r), g.catalog().withResources, func(ctx context.Context, up *upstream, cs *mcp.ClientSession) ([]*mcp.Resource, error) {
		rs, err := up.listResources(ctx, cs)
		return slices.DeleteFunc(rs, func(x *mcp.Resource) bool { return !allowed(uriAllowed(e, x.URI)) }), err
	})
	if err != nil {
		return nil, err
	}
	return &mcp.ListResourcesResult{Resources: res}, nil
}

func (g *Gateway) relayListTemplates(ctx context.Context, r *mcp.ListResourceTemplatesRequest) (mcp.Result, error) {
	if r.Params != nil && r.Params.Cursor != "" {
		return nil, errCursor
	}
	e := g.engine.Load()
	ts, err := each(ctx, g.agentFor(r), g.catalog().withResources, func(ctx context.Context, up *upstream, cs *mcp.ClientSession) ([]*mcp.ResourceTemplate, error) {
		ts, err := up.listTemplates(ctx, cs)
		return slices.DeleteFunc(ts, func(x *mcp.ResourceTemplate) bool { return !allowed(uriAllowed(e, x.URITemplate)) }), err
	})
	if err != nil {
		return nil, err
	}
	return &mcp.ListResourceTemplatesResult{ResourceTemplates: ts}, nil
}

// read is one relayed read (resources/read or prompts/get): decided by the kill switch
// (reversi.halt) and allow/deny (of a resource URI as the upstream may read it, uriAllowed),
// journaled in the agent's run, forwarded over the agent's session to up with the progress
// token relayed.
func (g *Gateway) read(ctx context.Context, req mcp.Request, method, target string, args map[string]any, token any,
	up *upstream, routeErr error, send func(ctx context.Context, cs *mcp.ClientSession, f *flight) error) error {
	ss, _ := req.GetSession().(*mcp.ServerSession)
	principal := g.principalOf(req.GetExtra())
	rec := store.Event{Kind: store.KindRead, Tool: target, Reason: method, Decision: string(engine.Allow)}
	if len(args) > 0 {
		rec.ArgsDigest, _ = engine.ArgsDigest(args)
	}
	run, err := g.runOf(ctx, ss, req.GetExtra())
	if err != nil {
		text := "the run could not be opened: " + err.Error()
		g.journalNote(ctx, fmt.Sprintf("refused a %s of %s to %q: %s", method, principal, clip(target, 200), clip(text, 1000)))
		return blocked(text)
	}
	rec.Run = run
	e := g.engine.Load()
	decide := func(name string) (string, bool) { return nameAllowed(e, name) }
	if method == "resources/read" {
		decide = func(uri string) (string, bool) { return uriAllowed(e, uri) }
	}
	var refused error
	if text, halted := g.haltedText(); halted { // the kill switch stops every upstream call
		refused = blocked(text)
	} else if why, ok := decide(target); !ok {
		refused = blocked(why)
	} else if routeErr != nil {
		refused = &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: routeErr.Error()}
	}
	if refused != nil {
		rec.Decision, rec.Note = string(engine.Block), refused.Error()
		g.journalRead(ctx, rec)
		return refused
	}
	a := g.agentOf(ss)
	uctx, timedOut, cancel := g.relayContext(ctx, method+" of "+target)
	defer cancel()
	cs, err := a.session(uctx, up)
	if err == nil {
		f := g.begin(ctx, a, up, 0, token)
		err = timedOut(send(uctx, cs, f))
		f.end()
	}
	if err != nil {
		rec.Note = "failed: " + err.Error()
	}
	g.journalRead(ctx, rec)
	return err
}

// relayContext bounds one relayed request to an upstream by call_timeout, as a forwarded call
// whose manifest sets no timeout (issue 18: every path that waits on an upstream has a
// deadline). timedOut says so of the error of a request that ran out of it (counted as
// call_timeout), and returns any other as it is.
func (g *Gateway) relayContext(ctx context.Context, what string) (_ context.Context, timedOut func(error) error, cancel context.CancelFunc) {
	t := callTimeoutOf(g.cfg)
	cctx, cancel := context.WithTimeout(upstreamContext(ctx), t)
	return cctx, func(err error) error {
		if err == nil || !errors.Is(cctx.Err(), context.DeadlineExceeded) || ctx.Err() != nil {
			return err
		}
		g.metrics.limitHit("call_timeout")
		return fmt.Errorf("%s: the upstream did not answer within %s (call_timeout): %w", what, t, err)
	}, cancel
}

func (g *Gateway) journalRead(ctx context.Context, e store.Event) {
	e.Note = clip(e.Note, maxNoteBytes)
	if _, err := g.store.AppendEvent(context.WithoutCancel(ctx), e); err != nil {
		g.warn("journal %s of %s in run %s: %v", e.Reason, e.Tool, e.Run, err)
	}
}

func (g *Gateway) relayGetPrompt(ctx context.Context, r *mcp.GetPromptRequest) (mcp.Result, error) {
	if r.Params == nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "prompts/get needs params"}
	}
	p := r.Params
	route, rerr := g.catalog().promptRoute(p.Name)
	args := make(map[string]any, len(p.Arguments))
	for k, v := range p.Arguments {
		args[k] = v
	}
	var res *mcp.GetPromptResult
	err := g.read(ctx, r, "prompts/get", p.Name, args, p.GetProgressToken(), route.up, rerr,
		func(ctx context.Context, cs *mcp.ClientSession, f *flight) (err error) {
			res, err = cs.GetPrompt(ctx, &mcp.GetPromptParams{Meta: f.meta(forwardMeta(p.Meta)), Name: route.name, Arguments: p.Arguments})
			return err
		})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func (g *Gateway) relayRead(ctx context.Context, r *mcp.ReadResourceRequest) (mcp.Result, error) {
	if r.Params == nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "resources/read needs params"}
	}
	p := r.Params
	up, rerr := g.catalog().resourceRoute(p.URI)
	var res *mcp.ReadResourceResult
	err := g.read(ctx, r, "resources/read", p.URI, nil, p.GetProgressToken(), up, rerr,
		func(ctx context.Context, cs *mcp.ClientSession, f *flight) (err error) {
			res, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{Meta: f.meta(forwardMeta(p.Meta)), URI: p.URI})
			return err
		})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// forwardMeta is the _meta of an agent's request as it goes upstream: without the gateway's
// own keys (reversi/...) and the protocol's (io.modelcontextprotocol/...: the agent's protocol
// version, client info and capabilities of 2026-07-28 belong to the agent's hop, and an
// upstream session negotiated otherwise refuses them). progressToken is replaced by flight.meta.
func forwardMeta(m mcp.Meta) mcp.Meta {
	var out mcp.Meta
	for k, v := range m {
		if strings.HasPrefix(k, metaPrefix) || strings.HasPrefix(k, protocolMetaPrefix) || k == "progressToken" {
			continue
		}
		if out == nil {
			out = mcp.Meta{}
		}
		out[k] = v
	}
	return out
}

// metaPrefix starts the _meta keys that are the gateway's (ReasonMeta); protocolMetaPrefix
// those the MCP specification reserves for the protocol of one hop (mcp.MetaKeyProtocolVersion).
const (
	metaPrefix         = "reversi/"
	protocolMetaPrefix = "io.modelcontextprotocol/"
)

// relaySubscribe is the SDK's SubscribeHandler: the subscription is the agent's (updates go to
// it only) and is forwarded to the upstream serving the URI; a shared upstream is subscribed
// once for all the agents that asked.
func (g *Gateway) relaySubscribe(ctx context.Context, r *mcp.SubscribeRequest) error {
	return g.subscription(ctx, r, r.Params.URI, true)
}

// relayUnsubscribe is the SDK's UnsubscribeHandler.
func (g *Gateway) relayUnsubscribe(ctx context.Context, r *mcp.UnsubscribeRequest) error {
	return g.subscription(ctx, r, r.Params.URI, false)
}

func (g *Gateway) subscription(ctx context.Context, req mcp.Request, uri string, on bool) error {
	if text, halted := g.haltedText(); halted && on {
		return blocked(text)
	}
	if why, ok := uriAllowed(g.engine.Load(), uri); !ok && on {
		return blocked(why)
	}
	up, err := g.catalog().resourceRoute(uri)
	if err != nil {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
	}
	a := g.agentFor(req)
	if a == nil {
		return errors.New("subscriptions need a session")
	}
	method := "resources/unsubscribe"
	if on {
		method = "resources/subscribe"
	}
	ctx, timedOut, cancel := g.relayContext(ctx, method+" of "+uri)
	defer cancel()
	a.mu.Lock()
	had := a.subs[uri] != nil
	switch max := a.g.limits.SubscriptionsPerSession; {
	case a.closed:
		a.mu.Unlock()
		return ErrAgentGone
	case on && !had && len(a.subs) >= max:
		a.mu.Unlock()
		g.metrics.limitHit("subscriptions_per_session")
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: fmt.Sprintf(
			"this session is subscribed to %d resources (limits.subscriptions_per_session is %d): unsubscribe from one first", max, max)}
	case on:
		a.subs[uri] = up
	default:
		delete(a.subs, uri)
	}
	// The agent's own session is told every time, as the server would be directly; a shared
	// one once per URI for all agents (counted under a.mu: close releases what it holds).
	tell := up.cfg.PerClient() || had != on && up.share(uri, on)
	a.mu.Unlock()
	if !tell {
		return nil
	}
	cs, err := a.session(ctx, up)
	if err != nil {
		return err
	}
	if on {
		return timedOut(cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}))
	}
	return timedOut(cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri}))
}

// share counts the agents subscribed to uri on a shared upstream and reports whether the
// upstream must be told (the first subscription, or the last one gone).
func (up *upstream) share(uri string, on bool) bool {
	up.fmu.Lock()
	defer up.fmu.Unlock()
	if up.subs == nil {
		up.subs = map[string]int{}
	}
	if on {
		up.subs[uri]++
		return up.subs[uri] == 1
	}
	if up.subs[uri] == 0 {
		return false
	}
	up.subs[uri]--
	if up.subs[uri] == 0 {
		delete(up.subs, uri)
		return true
	}
	return false
}

// relayComplete is the SDK's CompletionHandler: a prompt argument goes to the prompt's
// upstream (under its own name), a resource template argument to the template's.
func (g *Gateway) relayComplete(ctx context.Context, r *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
	p := r.Params
	if p == nil || p.Ref == nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "completion/complete needs a ref"}
	}
	c := g.catalog()
	q := *p
	ref := *p.Ref
	q.Ref = &ref
	var up *upstream
	var err error
	var target string
	switch ref.Type {
	case "ref/prompt":
		target = ref.Name
		var route promptRoute
		if route, err = c.promptRoute(ref.Name); err == nil {
			up, ref.Name = route.up, route.name
		}
	case "ref/resource":
		target = ref.URI
		up, err = c.templateRoute(ref.URI)
	default:
		err = fmt.Errorf("unknown ref type %q", ref.Type)
	}
	if text, halted := g.haltedText(); halted {
		return nil, blocked(text)
	}
	if err == nil {
		e := g.engine.Load()
		decide := func(name string) (string, bool) { return nameAllowed(e, name) }
		if ref.Type == "ref/resource" {
			decide = func(uri string) (string, bool) { return uriAllowed(e, uri) }
		}
		if why, ok := decide(target); !ok {
			return nil, blocked(why)
		}
	}
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
	}
	if !slices.Contains(c.withCompletions, up) {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("upstream %s does not offer completions", up.name)}
	}
	ctx, timedOut, cancel := g.relayContext(ctx, "completion/complete of "+target)
	defer cancel()
	cs, err := g.agentFor(r).session(ctx, up)
	if err != nil {
		return nil, err
	}
	q.Meta = forwardMeta(p.Meta)
	res, err := cs.Complete(ctx, &q)
	if err == nil && res != nil && ref.Type == "ref/resource" {
		n := len(res.Completion.Values)
		res.Completion.Values = c.allowedCompletions(g.engine.Load(), ref.URI, p, res.Completion.Values)
		res.Completion.Total = max(0, res.Completion.Total-(n-len(res.Completion.Values)))
	}
	return res, timedOut(err)
}

// allowedCompletions keeps the values of a template argument whose URI (the template expanded
// with the value and the arguments already given) allow/deny lets be read: resources/list
// hides the others, and so must completion.
func (c *catalog) allowedCompletions(e *engine.Engine, template string, p *mcp.CompleteParams, values []string) []string {
	var t *uritemplate.Template
	for _, tr := range c.templates {
		if tr.t.Raw() == template {
			t = tr.t
		}
	}
	if t == nil {
		return values
	}
	return slices.DeleteFunc(values, func(v string) bool {
		vars := uritemplate.Values{}
		if p.Context != nil {
			for k, x := range p.Context.Arguments {
				vars.Set(k, uritemplate.String(x))
			}
		}
		vars.Set(p.Argument.Name, uritemplate.String(v))
		uri, err := t.Expand(vars)
		if err != nil {
			return true
		}
		_, ok := uriAllowed(e, uri)
		return !ok
	})
}

// templateRoute returns the upstream whose template is exactly t (completion refs name the
// template, not a URI), else the resource route of t.
func (c *catalog) templateRoute(t string) (*upstream, error) {
	for _, tr := range c.templates {
		if tr.t.Raw() == t {
			return tr.up, nil
		}
	}
	return c.resourceRoute(t)
}

// relaySetLevel keeps the agent's level (replayed on the upstream sessions it opens later) and
// forwards it to its per_client upstream sessions with logging; a shared upstream is set to
// debug once, as the gateway filters its messages per agent.
func (g *Gateway) relaySetLevel(ctx context.Context, s mcp.Session, extra *mcp.RequestExtra, level mcp.LoggingLevel) {
	ss, _ := s.(*mcp.ServerSession)
	a := g.agentOf(ss)
	if a == nil {
		return
	}
	a.mu.Lock()
	a.level = level
	a.mu.Unlock()
	ctx, _, cancel := g.relayContext(ctx, "logging/setLevel")
	defer cancel()
	for _, up := range g.catalog().withLogging {
		if !up.cfg.PerClient() {
			if up.debugSet.CompareAndSwap(false, true) {
				if cs, err := up.session(); err == nil {
					_ = cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"})
				}
			}
			continue
		}
		if cs, err := a.session(ctx, up); err == nil {
			_ = cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: level})
		}
	}
}
