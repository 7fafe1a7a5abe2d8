package proxy

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Agent sessions and the upstream sessions they open (issue 19). An upstream with
// `session: per_client` (the default for url upstreams) gets one upstream session per agent
// session, opened on the agent's first request that needs it, with the client capabilities the
// agent declared; what that upstream session sends back (progress, logs, sampling, elicitation,
// roots, resource updates) reaches only that agent. A `session: shared` upstream (the default
// for stdio) has one session for every agent: its progress goes back by token, and a request it
// sends goes to the one agent with a request in flight on it, or is refused (see peerOf).

// agentSession is the gateway's state of one agent session.
type agentSession struct {
	g  *Gateway
	ss *mcp.ServerSession
	id string // random: the owner stamp of what a shared upstream sends during its requests (owner.go)

	mu      sync.Mutex
	peers   map[*upstream]*peer // per_client upstream sessions
	flights map[*flight]struct{}
	subs    map[string]*upstream // resource URIs this agent subscribed to, and their upstream
	level   mcp.LoggingLevel     // logging/setLevel, "" before
	asked   map[*upstream]*int   // requests of its upstream sessions waiting for it (admitServerRequest)
	closed  bool
}

// peer is one per_client upstream session of an agent.
type peer struct {
	ready chan struct{} // closed once cs or err is set
	cs    *mcp.ClientSession
	conn  mcp.Connection
	err   error
}

// flight is a request of an agent forwarded to an upstream and not answered yet: what the
// upstream sends while it runs belongs to it.
type flight struct {
	g     *Gateway
	agent *agentSession // nil for a request without an agent session
	up    *upstream
	// ctx carries the agent request's values without its cancel: a notification or request
	// sent with it goes on that request's stream (Streamable HTTP), where the agent expects it.
	ctx   context.Context
	step  int64 // the tool call's step, 0 for a read
	token any   // the agent's progress token, nil when it sent none
	relay string
	// pending counts progress notifications of relay read from the upstream and not yet given
	// to the agent: the SDK hands notifications to their handler on another goroutine than the
	// response, and end waits for them so that the agent gets them before the result.
	pending atomic.Int64
}

// progressWait bounds how long the end of a request waits for its progress notifications.
const progressWait = time.Second

// progressToken is the progressToken of msg when it is a notifications/progress with one of the
// gateway's relay tokens.
func progressToken(msg jsonrpc.Message) (string, bool) {
	req, ok := msg.(*jsonrpc.Request)
	if !ok || req.Method != "notifications/progress" {
		return "", false
	}
	var p struct {
		ProgressToken any `json:"progressToken"`
	}
	if json.Unmarshal(req.Params, &p) != nil {
		return "", false
	}
	tok, ok := p.ProgressToken.(string)
	return tok, ok && strings.HasPrefix(tok, relayTokenPrefix)
}

// relayTokenPrefix starts the progress tokens the gateway gives upstreams.
const relayTokenPrefix = "reversi-"

// progressSeen counts a progress notification read from an upstream (dialer.progress).
func (g *Gateway) progressSeen(token string) {
	if v, ok := g.tokens.Load(token); ok {
		v.(*flight).pending.Add(1)
	}
}

// relayed uncounts a progress notification given to the agent.
func (f *flight) relayed() {
	for {
		n := f.pending.Load()
		if n <= 0 || f.pending.CompareAndSwap(n, n-1) {
			return
		}
	}
}

// agentOf returns the state of ss, made on first use; nil for a nil session (in-process
// callers). Its upstream sessions close when ss ends.
func (g *Gateway) agentOf(ss *mcp.ServerSession) *agentSession {
	if ss == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if a, ok := g.agents[ss]; ok {
		return a
	}
	a := &agentSession{g: g, ss: ss, id: rand.Text(), peers: map[*upstream]*peer{}, flights: map[*flight]struct{}{}, subs: map[string]*upstream{}}
	g.agents[ss] = a
	g.agentIDs.Store(a.id, a)
	go func() {
		_ = ss.Wait()
		g.mu.Lock()
		delete(g.agents, ss)
		g.mu.Unlock()
		g.agentIDs.Delete(a.id)
		a.close()
	}()
	return a
}

// agentList returns every agent session the gateway keeps.
func (g *Gateway) agentList() []*agentSession {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]*agentSession, 0, len(g.agents))
	for _, a := range g.agents {
		out = append(out, a)
	}
	return out
}

// close ends the agent's upstream sessions (the connection first: a session's Close alone waits
// for answers a hung upstream never sends), and gives up its subscriptions on shared upstreams
// (the last subscriber of a URI gone, the upstream is unsubscribed).
func (a *agentSession) close() {
	a.mu.Lock()
	a.closed = true
	peers, subs := a.peers, a.subs
	a.peers, a.subs = map[*upstream]*peer{}, map[string]*upstream{}
	a.mu.Unlock()
	for uri, up := range subs {
		if !up.cfg.PerClient() && up.share(uri, false) {
			if cs, err := up.session(); err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), ConnectTimeout)
				_ = cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri})
				cancel()
			}
		}
	}
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Go(func() {
			<-p.ready
			if p.conn != nil {
				_ = p.conn.Close()
			}
			if p.cs != nil {
				_ = p.cs.Close()
			}
		})
	}
	wg.Wait()
}

// ErrAgentGone is returned (wrapped) for an upstream session asked for after the agent's session
// ended.
var ErrAgentGone = errors.New("the agent's session has ended")

// session returns the upstream session a's requests to up go over: the shared one, or a's own
// (opened now, within ConnectTimeout, for a per_client upstream). A nil a (no agent session)
// gets the shared one. Errors wrap ErrUpstreamDown when the session cannot be opened (nothing
// was sent).
func (a *agentSession) session(ctx context.Context, up *upstream) (*mcp.ClientSession, error) {
	if a == nil || !up.cfg.PerClient() {
		return up.session()
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, fmt.Errorf("upstream %s: %w: %w", up.name, ErrUpstreamDown, ErrAgentGone)
	}
	p, ok := a.peers[up]
	if !ok {
		p = &peer{ready: make(chan struct{})}
		a.peers[up] = p
		a.mu.Unlock()
		a.open(ctx, up, p)
	} else {
		a.mu.Unlock()
		select {
		case <-p.ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("upstream %s: %w: %w", up.name, ErrUpstreamDown, context.Cause(ctx))
		}
	}
	if p.err != nil {
		return nil, p.err
	}
	return p.cs, nil
}

// open connects a's own session to up, replays the agent's log level and subscriptions on it,
// and forgets it when it ends (the next request opens another).
func (a *agentSession) open(ctx context.Context, up *upstream, p *peer) {
	defer close(p.ready)
	client := a.g.newClient(up, a)
	// Not the request's context: the session outlives it, and must not take the SDK's values
	// of the agent's request (sdkValuesHidden). The request ending still stops the connect.
	cctx, cancel := context.WithTimeout(context.Background(), ConnectTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	t := &capturingTransport{Transport: transport(up.dial, up.cfg)}
	cs, err := client.Connect(cctx, t, nil)
	forget := func() {
		a.mu.Lock()
		if a.peers[up] == p {
			delete(a.peers, up)
		}
		a.mu.Unlock()
	}
	if err != nil {
		p.err = fmt.Errorf("upstream %s: %w (a session for this agent could not be opened: %v)", up.name, ErrUpstreamDown, err)
		forget()
		return
	}
	p.cs, p.conn = cs, t.conn
	a.mu.Lock()
	level, subs := a.level, make([]string, 0, len(a.subs))
	for uri := range a.subs {
		subs = append(subs, uri)
	}
	a.mu.Unlock()
	if level != "" && hasLogging(cs) {
		_ = cs.SetLoggingLevel(cctx, &mcp.SetLoggingLevelParams{Level: level})
	}
	for _, uri := range subs {
		if r, _ := a.g.catalog().resourceRoute(uri); r == up {
			_ = cs.Subscribe(cctx, &mcp.SubscribeParams{URI: uri})
		}
	}
	go func() {
		_ = cs.Wait()
		forget()
	}()
}

// capturingTransport notes the connection it opens (returned as it is: the SDK type-asserts
// its own connections).
type capturingTransport struct {
	mcp.Transport
	conn mcp.Connection
}

func (t *capturingTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	t.conn = c
	return c, err
}

// hasLogging reports whether the upstream of cs declared the logging capability.
func hasLogging(cs *mcp.ClientSession) bool {
	r := cs.InitializeResult()
	return r != nil && r.Capabilities != nil && r.Capabilities.Logging != nil
}

// begin notes a request of a (nil: no agent session) forwarded to up. When the agent's request carries a progress
// token, the upstream gets a token of the gateway's own in its place (agents' tokens may clash
// on a shared upstream, and an upstream must not be able to address another agent's request):
// relay is that token, "" when there is none. end must be called once the answer is in.
func (g *Gateway) begin(ctx context.Context, a *agentSession, up *upstream, step int64, token any) *flight {
	f := &flight{g: g, agent: a, up: up, ctx: context.WithoutCancel(ctx), step: step, token: token}
	if token != nil {
		f.relay = relayTokenPrefix + rand.Text()
		g.tokens.Store(f.relay, f)
	}
	if a != nil {
		a.mu.Lock()
		a.flights[f] = struct{}{}
		a.mu.Unlock()
	}
	up.fmu.Lock()
	up.flights[f] = struct{}{}
	up.fmu.Unlock()
	return f
}

// end forgets f, once the progress notifications read before the answer were relayed (within
// progressWait).
func (f *flight) end() {
	if f.relay != "" {
		for deadline := time.Now().Add(progressWait); f.pending.Load() > 0 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		f.g.tokens.Delete(f.relay)
	}
	if a := f.agent; a != nil {
		a.mu.Lock()
		delete(a.flights, f)
		a.mu.Unlock()
	}
	f.up.fmu.Lock()
	delete(f.up.flights, f)
	f.up.fmu.Unlock()
}

// meta is the _meta to forward in place of the agent's: the same with the relay token as
// progressToken.
func (f *flight) meta(m mcp.Meta) mcp.Meta {
	if f.relay == "" {
		return m
	}
	out := make(mcp.Meta, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	out["progressToken"] = f.relay
	return out
}

// only returns the one flight of a on up, nil when there is none or more than one.
func (a *agentSession) only(up *upstream) *flight {
	a.mu.Lock()
	defer a.mu.Unlock()
	var one *flight
	for f := range a.flights {
		if f.up != up {
			continue
		}
		if one != nil {
			return nil
		}
		one = f
	}
	return one
}

// onlyFlight returns the one flight in progress on up (any agent), nil when there is none or
// more than one.
func (up *upstream) onlyFlight() (*flight, int) {
	up.fmu.Lock()
	defer up.fmu.Unlock()
	if len(up.flights) != 1 {
		return nil, len(up.flights)
	}
	for f := range up.flights {
		return f, 1
	}
	return nil, 0
}

// logLevel is the level the agent set with logging/setLevel, "" when it set none.
func (a *agentSession) logLevel() mcp.LoggingLevel {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.level
}
