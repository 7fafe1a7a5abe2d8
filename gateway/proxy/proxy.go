// Package proxy is the MCP gateway's proxy: it connects to the upstream MCP servers (stdio or
// Streamable HTTP), offers their tools under the exposed names, and runs every `tools/call`
// through the call path: session = run, engine decision, durable intent, forward, outcome
// with the compensation handle. Both sides use modelcontextprotocol/go-sdk.
//
// Source: DESIGN.md "The call path (gateway)"; seed "MCP gateway"
// (../shared/seeds/003_0ebd38203277749f.txt): Observe first, Modes, What happens to a call,
// Config (upstreams, namespacing, allow/deny), Timeout and retry; issue 5.
//
// The tool set follows the upstreams (toolset.go: tools/list cache and list_changed refresh)
// and the manifests follow their files (reload.go: file watch, SIGHUP, Reload); both swap the
// engine atomically.
package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/egress"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/policy"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// Version is the gateway's MCP implementation version.
const Version = "0.1.0"

// Name is the gateway's name in runs and in the MCP handshake.
const Name = "reversi-gateway"

// ReasonMeta is the `_meta` key a client may send the reason of a call in (seed: What happens
// to a call). RunIDHeader continues a run over HTTP.
const (
	ReasonMeta  = "reversi/reason"
	RunIDHeader = "Reversi-Run-Id"
)

// Options are what a Gateway is built from.
type Options struct {
	// Config is the gateway config (config.Load, or config.FromFlags). Required.
	Config *config.Gateway
	// Manifests are the loaded manifests (none: the automatic observe mode applies).
	Manifests []*manifest.Manifest
	// Marks and Revision are the high-water marks and revision of the snapshots Manifests
	// came from (see Loaded): New refuses to start on a snapshot older than one served before.
	Marks    []store.HighWater
	Revision string
	// Policy is the compiled policy set served with Manifests (--policy; nil: none), and
	// Environment the policy's `environment` (--environment).
	Policy      *policy.Set
	Environment string
	// Now is the clock of the policy's `now` and of approval expiry; nil is time.Now.
	Now func() time.Time
	// Load re-reads the manifests and the policy on Reload (file watch, SIGHUP); nil: Reload
	// fails.
	Load LoadFunc
	// PageSize is the most tools one tools/list page holds; 0 is the SDK's default (1000).
	PageSize int
	// Store holds runs, the ledger and the approval queue. Required; the Gateway does not
	// close it.
	Store store.Store
	// Name is the gateway's name on its runs ("" is Name, the program's name); a
	// ReversiGateway's pods pass the object's name.
	Name string
	// RunID continues (or opens, with that id) a run for the stdio session: --run-id.
	RunID string
	// Stdin and Stdout carry MCP in stdio mode; nil means the process's own.
	Stdin  io.Reader
	Stdout io.Writer
	// Stderr receives the banner, the auto-observe message and the upstreams' stderr; nil
	// discards them.
	Stderr io.Writer
	// Egress are reversi.config.yaml's egress rules for url upstreams; nil: none (the cloud
	// metadata addresses are refused anyway). Signer signs reversi.export_evidence (--signing-key).
	Egress *egress.Rules
	Signer *signing.Signer
	// Collectors are more metrics served at /metrics with the gateway's own (the
	// notification worker's, gateway/notify).
	Collectors []prometheus.Collector
}

// Gateway fronts the upstreams. Build it with New; Close it when done.
type Gateway struct {
	cfg       *config.Gateway
	store     store.Store
	engine    *engine.Holder
	mode      engine.Mode // fixed at start (seed: Hot reload)
	load      LoadFunc
	upstreams []*upstream
	tools     atomic.Pointer[toolSet]
	server    *mcp.Server
	stderr    io.Writer
	stdin     io.Reader
	stdout    io.Writer
	runID     string
	name      string // on runs: Options.Name

	mu     sync.Mutex
	runs   map[*mcp.ServerSession]string
	agents map[*mcp.ServerSession]*agentSession // agents.go

	cat      atomic.Pointer[catalog] // prompts and resources by upstream (catalog.go)
	tokens   sync.Map                // relay progress token -> *flight (agents.go)
	agentIDs sync.Map                // agentSession.id -> *agentSession (owner.go)

	// stateMu serializes engine rebuilds (reload, tool refresh) and guards what they read.
	stateMu     sync.Mutex
	manifests   []*manifest.Manifest
	setChecksum string
	policy      *policy.Set // served with manifests; nil: none
	environment string      // the policy's `environment`: Options.Environment
	now         func() time.Time
	listedAt    time.Time
	listing     singleflight.Group // one upstream re-listing at a time for agents' tools/list
	listNote    string             // the last failed refresh noted (refreshTools), "" after a good one
	listNoteAt  time.Time

	sums atomic.Pointer[sync.Map] // *manifest.Manifest -> checksum string

	started chan struct{} // closed when New has built everything
	closed  chan struct{} // closed by Close
	close   sync.Once

	metrics *metrics // metrics.go
	health  health   // health.go
	sec     security // httpauth.go, operator.go

	limits   config.Limits // effectiveLimits of the config's (limits.go)
	calls    *inflight     // tools/call in flight (limits.go)
	sessions *sessionCount // HTTP sessions open (sessions.go)
	posts    posts         // HTTP POSTs being served (httplimits.go)
	gates    cancelGates   // calls' POSTs whose response a cancel drops (httpcancel.go)
	fastHTTP fastSessions  // when the SDK last served a POST of each HTTP session (fastcall.go)
}

// New connects to every upstream, lists and names their tools, builds the engine, prints the
// auto-observe message (when it applies) and the classification banner on Stderr, and builds
// the MCP server. Two upstreams exposing one name is an error.
func New(ctx context.Context, o Options) (*Gateway, error) {
	if o.Config == nil || o.Store == nil {
		return nil, errors.New("proxy: a config and a store are required")
	}
	if len(o.Config.Upstreams) == 0 {
		return nil, errors.New("proxy: no upstreams")
	}
	stderr := o.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	// The upstreams' stderr copiers and the gateway write to it concurrently.
	stderr = &lockedWriter{w: stderr}
	g := &Gateway{cfg: o.Config, store: o.Store, stderr: stderr, load: o.Load,
		stdin: o.Stdin, stdout: o.Stdout, runID: o.RunID, runs: map[*mcp.ServerSession]string{}, agents: map[*mcp.ServerSession]*agentSession{},
		started: make(chan struct{}), closed: make(chan struct{}), name: o.Name}
	if g.name == "" {
		g.name = Name
	}
	g.limits = effectiveLimits(o.Config.Limits)
	g.calls = newInflight(g.limits)
	g.sessions = newSessionCount(g.limits.SessionsPerPrincipal, g.limits.Sessions,
		func() []*mcp.Server { return []*mcp.Server{g.server, g.sec.opServer} })
	g.mode = engine.Mode(o.Config.Mode)
	if g.mode == "" { // the automatic choice, made once (seed: Observe first)
		g.mode = engine.Enforce
		if len(o.Manifests) == 0 {
			g.mode = engine.Observe
		}
	}
	if err := o.Store.AdvanceHighWater(ctx, o.Marks); err != nil {
		return nil, fmt.Errorf("refusing to start on these manifests: %w", err)
	}
	set, sums, err := digest(o.Manifests)
	if err != nil {
		return nil, err
	}
	g.manifests, g.setChecksum = o.Manifests, set
	g.policy, g.environment, g.now = o.Policy, o.Environment, o.Now
	g.storeSums(sums)
	if err := g.setupSecurity(ctx, o); err != nil {
		return nil, err
	}
	// Before the upstreams: a limit they hit while connecting is counted (read when scraped).
	g.metrics = newMetrics(g)
	for _, c := range o.Collectors {
		if err := g.metrics.reg.Register(c); err != nil {
			return nil, fmt.Errorf("proxy: metrics: %w", err)
		}
	}
	d := dialer{cfg: o.Config, stderr: stderr, hit: g.metrics.limitHit, progress: g.progressSeen}
	if o.Egress != nil {
		d.egress = *o.Egress
	}
	for _, u := range o.Config.Upstreams {
		up, err := connect(ctx, d, u, func(up *upstream) *mcp.Client { return g.newClient(up, nil) })
		if err != nil {
			_ = g.Close()
			return nil, err
		}
		g.upstreams = append(g.upstreams, up)
		if err := up.listFeatures(ctx); err != nil {
			_ = g.Close()
			return nil, err
		}
	}
	g.listedAt = time.Now()
	ts, err := buildTools(g.upstreams)
	if err != nil {
		_ = g.Close()
		return nil, err
	}
	cat, err := buildCatalog(g.upstreams)
	if err != nil {
		_ = g.Close()
		return nil, err
	}
	g.cat.Store(cat)
	e, err := g.newEngine(o.Manifests, ts.tools)
	if err != nil {
		_ = g.Close()
		return nil, err
	}
	g.engine = engine.NewHolder(e)
	if o.Config.Mode == "" && len(o.Manifests) == 0 {
		fmt.Fprintln(stderr, engine.AutoObserveMessage)
	}
	fmt.Fprintln(stderr, e.Banner())
	if o.Environment == "" && o.Policy.ReadsVariable("environment") {
		fmt.Fprintln(stderr, EnvironmentUnsetWarning)
	}
	g.warnUnmatched(e)

	sopts := &mcp.ServerOptions{PageSize: o.PageSize, Capabilities: serverCapabilities(cat), RootsListChangedHandler: g.relayRootsChanged,
		// Known from the start, so that what is announced to every agent (list changes, a
		// shared upstream's logs) reaches one that has not sent a relayed request yet.
		InitializedHandler: func(_ context.Context, req *mcp.InitializedRequest) { g.agentOf(req.Session) }}
	if sopts.Capabilities.Resources != nil && sopts.Capabilities.Resources.Subscribe {
		sopts.SubscribeHandler, sopts.UnsubscribeHandler = g.relaySubscribe, g.relayUnsubscribe
	}
	if sopts.Capabilities.Completions != nil {
		sopts.CompletionHandler = g.relayComplete
	}
	g.server = mcp.NewServer(&mcp.Implementation{Name: Name, Version: Version}, sopts)
	g.tools.Store(&toolSet{})
	g.publish(toolSet{}, ts)
	g.addAgentTools(g.server)
	g.addOperatorServer(o.PageSize)
	g.server.AddReceivingMiddleware(g.callMiddleware, g.listMiddleware, g.passMiddleware, g.relayMiddleware, discoverMiddleware)
	g.server.AddSendingMiddleware(notifyMiddleware)
	g.metrics.setRevision(o.Revision)
	close(g.started)
	for _, up := range g.upstreams {
		go g.supervise(up)
	}
	return g, nil
}

// upstreamChanged handles an upstream's notifications/tools/list_changed: its tools are
// listed again now, not when the cache expires.
func (g *Gateway) upstreamChanged(up *upstream) {
	select { // a notification can arrive while New is still building
	case <-g.started:
	case <-g.closed:
		return
	}
	_ = g.refreshTools(context.Background(), up) // within ListTimeout; a failure is journaled, the previous tools keep serving
	g.refreshFeatures(context.Background(), up)
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Server is the MCP server the agent talks to (for in-process transports and tests).
func (g *Gateway) Server() *mcp.Server { return g.server }

// Engine is the engine currently deciding calls.
func (g *Gateway) Engine() *engine.Engine { return g.engine.Load() }

// Close disconnects every upstream (stopping stdio upstreams), all at once. Calls still in
// flight upstream end at once with an error (journaled uncertain by their handlers).
func (g *Gateway) Close() error {
	g.close.Do(func() { close(g.closed) })
	var aw sync.WaitGroup
	for _, a := range g.agentList() {
		aw.Go(a.close)
	}
	aw.Wait()
	errs := make([]error, len(g.upstreams))
	var wg sync.WaitGroup
	for i, u := range g.upstreams {
		wg.Go(func() {
			cs, err := u.session()
			if err != nil {
				return // down: nothing to close
			}
			u.mu.Lock()
			conn := u.conn
			u.mu.Unlock()
			// The connection first: the session's Close alone waits for every call in flight
			// to be answered, which a hung upstream never does.
			if conn != nil {
				_ = conn.Close()
			}
			if err := cs.Close(); err != nil {
				errs[i] = fmt.Errorf("upstream %s: %w", u.name, err)
			}
		})
	}
	wg.Wait()
	g.upstreams = nil
	return errors.Join(errs...)
}

// succeeded reports whether tool succeeded earlier in run (manifest `requires`).
// runSteps lists the steps of run so far for the policy's `run` variable: every intent with
// the status of its outcome (blocked and would_block included; in_flight while it has none),
// oldest first.
// A run longer than MaxPolicyRecords records fails a rule reading `run` (it denies): the
// variable is read whole for every call such a rule matches, so its size is bounded.
func (g *Gateway) runSteps(ctx context.Context, run string) ([]policy.Step, error) {
	const page = 1000
	var recs []store.Record
	for after := int64(0); ; {
		p, err := g.store.Records(ctx, run, after, page)
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil // the run's first call
		}
		if err != nil {
			return nil, err
		}
		recs = append(recs, p...)
		if len(recs) > MaxPolicyRecords {
			return nil, fmt.Errorf("the run has more than %d records, more than a policy rule may read as `run`", MaxPolicyRecords)
		}
		if len(p) < page {
			return policySteps(recs), nil
		}
		after = p[len(p)-1].Seq
	}
}

// EnvironmentUnsetWarning is printed at start when a policy rule reads `environment` and the
// gateway was given none (--environment, environment: in gateway.yaml): such a rule sees "".
const EnvironmentUnsetWarning = "reversi-gateway: warning: policy rules read environment, but no --environment (or environment: in gateway.yaml) is set: they see an empty string"

// MaxPolicyRecords bounds the records of a run that the policy's `run` variable is read from.
const MaxPolicyRecords = 20000

// policySteps folds a run's records into its steps.
func policySteps(recs []store.Record) []policy.Step {
	var steps []policy.Step
	at := map[int64]int{} // intent seq -> index in steps
	for _, rec := range recs {
		switch rec.Kind {
		case store.KindIntent:
			at[rec.Seq] = len(steps)
			steps = append(steps, policy.Step{Tool: rec.Tool, Status: "in_flight"})
		case store.KindOutcome:
			if i, ok := at[rec.Step]; ok {
				steps[i].Status = string(rec.Status)
			}
		}
	}
	return steps
}

func (g *Gateway) succeeded(ctx context.Context, run, tool string) bool {
	// Only outcome records carry the status succeeded; one is enough.
	recs, err := g.store.SearchRecords(ctx, store.RecordSearch{Run: run, Tool: tool, Status: store.Succeeded, Limit: 1})
	return err == nil && len(recs) > 0
}

// MaxRunIDLength leaves room for the shadow run's suffix within a Kubernetes object name.
const MaxRunIDLength = 200

// ValidateRunID checks a run id given by --run-id or the Reversi-Run-Id header: a Kubernetes
// object name (lowercase letters, digits, '-' and '.'; runs become ReversiRun objects) of at
// most MaxRunIDLength characters.
func ValidateRunID(id string) error {
	if len(id) > MaxRunIDLength {
		return fmt.Errorf("run id is %d characters long, at most %d are allowed", len(id), MaxRunIDLength)
	}
	if errs := validation.IsDNS1123Subdomain(id); len(errs) > 0 {
		return fmt.Errorf("run id %q: %s", id, strings.Join(errs, "; "))
	}
	return nil
}

// runFor returns the run of a session: one session is one run. The first call of a session
// opens it, or continues the run named by --run-id (stdio) or the Reversi-Run-Id header
// (HTTP); only the run's actor may continue it.
func (g *Gateway) runFor(ctx context.Context, req *mcp.CallToolRequest) (string, error) {
	return g.runOf(ctx, req.Session, req.Extra)
}

// runOf is runFor for the session ss and a request's extra (headers, credential); reads
// (resources/read, prompts/get) open the run as calls do.
func (g *Gateway) runOf(ctx context.Context, ss *mcp.ServerSession, extra *mcp.RequestExtra) (string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if id, ok := g.runs[ss]; ok {
		return id, nil
	}
	id := g.runID
	if extra != nil && extra.Header != nil {
		if h := extra.Header.Get(RunIDHeader); h != "" {
			id = h
		}
	}
	if id != "" {
		if err := ValidateRunID(id); err != nil {
			return "", err
		}
	}
	actor := g.principalOf(extra)
	var run store.Run
	var err error
	if id != "" {
		run, err = g.openNamed(ctx, id, actor)
	} else {
		run, err = g.store.CreateRun(ctx, store.Run{Actor: actor, Gateway: g.name, Environment: g.environment})
	}
	if err != nil {
		return "", err
	}
	g.runs[ss] = run.ID
	if ss != nil {
		go func() {
			_ = ss.Wait()
			g.mu.Lock()
			delete(g.runs, ss)
			g.mu.Unlock()
			_ = g.store.SetRunStatus(context.Background(), run.ID, store.RunIdle)
		}()
	}
	return run.ID, nil
}

// existingRun is the run ss opened, "" when none yet.
func (g *Gateway) existingRun(ss *mcp.ServerSession) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.runs[ss]
}

// openNamed continues run id, or opens it with that id when this gateway's store does not have
// it. Run ids belong to one gateway (issue 16): a run of this store opened by another gateway
// (a store shared by name), or, with runs kept in Kubernetes, a ReversiRun of that name that
// another gateway owns (kube.Runs.CreateRun claims the name before the run opens), is refused
// with store.OtherGatewayError, the same text in both cases. Errors: that refusal,
// store.ErrNotOwner (another principal's run of this gateway), or the store's; handle
// journals the refusal in the gateway journal.
func (g *Gateway) openNamed(ctx context.Context, id, actor string) (store.Run, error) {
	run, err := g.store.GetRun(ctx, id)
	switch {
	case err == nil && run.Gateway != g.name:
		err = store.OtherGatewayError(id)
	case err == nil:
		return g.store.ContinueRun(ctx, id, actor)
	case errors.Is(err, store.ErrNotFound):
		run, err = g.store.CreateRun(ctx, store.Run{ID: id, Actor: actor, Gateway: g.name, Environment: g.environment})
		if errors.Is(err, store.ErrExists) { // opened by a concurrent session
			return g.store.ContinueRun(ctx, id, actor)
		}
	}
	if errors.Is(err, store.ErrOtherGateway) {
		err = store.OtherGatewayError(id) // one text, wherever the refusal came from
	}
	return run, err
}

// ensureRun opens a shadow run (`<run>-reads`) of actor the first time it is used.
func (g *Gateway) ensureRun(ctx context.Context, id, actor string) error {
	if _, err := g.store.GetRun(ctx, id); err == nil {
		return nil
	}
	_, err := g.store.CreateRun(ctx, store.Run{ID: id, Actor: actor, Gateway: g.name, Environment: g.environment})
	if errors.Is(err, store.ErrExists) {
		return nil
	}
	return err
}

// checksum is the manifest's checksum, computed once per manifest.
func (g *Gateway) checksum(m *manifest.Manifest) string {
	sums := g.sums.Load()
	if v, ok := sums.Load(m); ok {
		return v.(string)
	}
	sum, err := manifest.Checksum(m) // a call still deciding with the engine before a reload
	if err != nil {
		return ""
	}
	return sum
}

// textResult is an isError result with one text block.
func textResult(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}

// warn writes a problem on stderr, one line: what is not printable in it (tool names and
// errors from upstreams or clients) is escaped, so that it cannot forge lines.
func (g *Gateway) warn(format string, args ...any) {
	fmt.Fprintf(g.stderr, "reversi-gateway: %s\n", engine.EscapeControl(fmt.Sprintf(format, args...)))
}

// handle is the call path of one tools/call, as named steps (callpath.go): decode, decide,
// journal the intent, forward, journal the outcome, reply. A step that ends the call returns
// its answer.
func (g *Gateway) handle(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	c := &callPath{g: g, req: req, name: req.Params.Name}
	defer g.metrics.call(c.name, time.Now(), &c.d, &c.out)
	for _, step := range []func(context.Context) *mcp.CallToolResult{c.decode, c.decide, c.journalIntent} {
		if res := step(ctx); res != nil {
			return res, nil
		}
	}
	c.res, c.resRaw, c.resEnv, c.ferr = g.forward(ctx, c.r, req, c.step, c.d)
	c.journalOutcome(ctx)
	return c.reply(ctx), nil
}

// editRaw applies edit to a passed-through result (the decoded result carries the same change).
// An edit fails only on a result whose content is not an array: it returns nil, and the agent
// then gets the decoded result, which is what the gateway could read of it.
func (g *Gateway) editRaw(tool string, raw json.RawMessage, edit func(json.RawMessage) (json.RawMessage, error)) json.RawMessage {
	if raw == nil {
		return nil
	}
	edited, err := edit(raw)
	if err != nil {
		g.warn("the result of %s could not be passed through: %v", tool, err)
		return nil
	}
	return edited
}

// anyArgs is the arguments for $args references: a call without arguments resolves against {}.
func anyArgs(args map[string]any) any {
	if args == nil {
		return map[string]any{}
	}
	return args
}

// CallTimeoutError is a forwarded call the gateway stopped waiting for after After: the
// manifest's timeout_ms, or call_timeout when the manifest sets none (Default). The upstream
// may still act, so the step is journaled uncertain (seed: Timeout and retry).
type CallTimeoutError struct {
	After   time.Duration
	Default bool
	Err     error // what the upstream client returned
}

func (e *CallTimeoutError) Error() string {
	from := ""
	if e.Default {
		from = " (call_timeout: the manifest sets no timeout_ms)"
	}
	return fmt.Sprintf("timed out after %s%s: %v", e.After, from, e.Err)
}

func (e *CallTimeoutError) Unwrap() error { return e.Err }

// ErrCallCancelled is returned (wrapped, with the context's cause: ErrSessionClosed,
// ErrClientGone, or the client's cancel) for a forwarded call whose agent cancelled it or whose
// session ended before the upstream answered: the upstream was sent notifications/cancelled
// (by the go-sdk client, when the call's context ends), and the step is journaled uncertain.
var ErrCallCancelled = errors.New("the agent cancelled the call, or its session ended, before the upstream answered; the upstream was sent notifications/cancelled")

// forward sends the call to its upstream with the decision's timeout (call_timeout when the
// manifest sets none), retrying (read_only and idempotent tools only, as the engine decided)
// with exponential backoff. ctx is the agent's request: when it ends, the call is cancelled
// upstream. From a stdio upstream it also returns the result's raw bytes, and res is then
// lightResult's (see Result pass-through). Errors: ErrUpstreamDown (never sent),
// *CallTimeoutError, ErrCallCancelled, or the upstream's (MessageTooLargeError among them).
func (g *Gateway) forward(ctx context.Context, r *route, req *mcp.CallToolRequest, step int64, d engine.Decision) (res *mcp.CallToolResult, resRaw json.RawMessage, env envelopeMembers, err error) {
	attempts, base, max := 1, 200*time.Millisecond, 5*time.Second
	if d.Retry != nil {
		attempts = 3
		if d.Retry.Attempts > 0 {
			attempts = d.Retry.Attempts
		}
		if d.Retry.BaseMs > 0 {
			base = time.Duration(d.Retry.BaseMs) * time.Millisecond
		}
		if d.Retry.MaxMs > 0 {
			max = time.Duration(d.Retry.MaxMs) * time.Millisecond
		}
	}
	timeout, byDefault := d.Timeout, false
	if timeout <= 0 {
		timeout, byDefault = callTimeoutOf(g.cfg), true
	}
	// Over the agent's own upstream session (per_client) or the shared one, with the agent's
	// _meta and a relay progress token (agents.go).
	a := g.agentOf(req.Session)
	f := g.begin(ctx, a, r.up, step, req.Params.GetProgressToken())
	defer f.end()
	params := &mcp.CallToolParams{Name: r.name, Meta: f.meta(forwardMeta(req.Params.Meta))}
	if raw := req.Params.Arguments; len(raw) > 0 {
		params.Arguments = raw
	}
	wait := base
	for i := 0; i < attempts; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return nil, nil, envelopeMembers{}, fmt.Errorf("%w: %v", ErrCallCancelled, context.Cause(ctx))
			case <-time.After(wait):
			}
			wait = min(2*wait, max)
		}
		cctx, cancel := context.WithTimeout(upstreamContext(ctx), timeout)
		slot := &rawSlot{}
		var cs *mcp.ClientSession
		rawCall := false // the result is any answer (the SDK's path passes complete ones only)
		if cs, err = a.session(cctx, r.up); err == nil {
			if sc := r.up.rawConn(cs); sc != nil {
				rawCall = true
				slot.raw, err = rawToolCall(cctx, sc, params.Name, req.Params.Arguments, params.Meta)
			} else {
				res, err = cs.CallTool(context.WithValue(cctx, rawSlotKey{}, slot), params)
			}
		}
		slot.release() // an unanswered call's slot is not kept
		switch {
		case err == nil:
		case ctx.Err() != nil: // the cause: the session's end or the client gone (limits.go), or a cancel
			err = fmt.Errorf("%w: %v", ErrCallCancelled, context.Cause(ctx))
		case cctx.Err() != nil:
			if byDefault {
				g.metrics.limitHit("call_timeout")
			}
			err = &CallTimeoutError{After: timeout, Default: byDefault, Err: err}
		}
		cancel()
		resRaw = nil
		if err == nil && slot.raw != nil {
			resRaw = slot.raw
			if res, env, err = lightResult(resRaw); err != nil {
				err = fmt.Errorf("the upstream's result is not valid: %w", err)
				resRaw = nil
			} else if rawCall && env.incomplete {
				err = fmt.Errorf("upstream %s answered with a result that is not complete (resultType), which needs the 2026-07-28 protocol", r.up.name)
				res, resRaw, env = nil, nil, envelopeMembers{}
			}
		}
		if err == nil && !res.IsError || errors.Is(err, ErrCallCancelled) {
			return res, resRaw, env, err
		}
	}
	return res, resRaw, env, err
}

// ReplayText is the reason of a retry refused because its approval was already used (issue
// 16, "Replaying is refused and journaled"): "approval <id> was already used: <why>".
func ReplayText(id string, err error) string {
	return fmt.Sprintf("approval %s was already used: %v; a new call needs a new approval (retry to queue a request)", id, err)
}

// refuseApproval blocks a call whose intent could not consume its approval: it journals the
// call blocked (without the approval) and a replay_refused decision record of the request.
func (g *Gateway) refuseApproval(ctx context.Context, in store.Intent, err error) *mcp.CallToolResult {
	id := in.Approval
	text := ReplayText(id, err)
	if !errors.Is(err, store.ErrConsumed) {
		text = fmt.Sprintf("approval %s could not be used: %v", id, err)
	}
	in.Approval = ""
	in.Decision = string(engine.Block)
	g.journalBlocked(ctx, in, text)
	if _, jerr := g.store.AppendApproval(context.WithoutCancel(ctx), store.ApprovalRecord{Run: in.Run, Request: id, Tool: in.Tool,
		Event: store.EventReplayRefused, Note: text}); jerr != nil {
		g.warn("journal the refused replay of approval %s in run %s: %v", id, in.Run, jerr)
	}
	return textResult(engine.BlockedPrefix + text)
}

// journalBlocked writes the intent of a call the gateway refused and its blocked outcome.
func (g *Gateway) journalBlocked(ctx context.Context, in store.Intent, reason string) {
	step, err := g.store.RecordIntent(ctx, in)
	if err != nil {
		g.warn("journal %s (blocked): %v", in.Tool, err)
		return
	}
	g.outcome(ctx, in.Run, step, store.StepOutcome{Status: store.Blocked, Note: reason})
}

// maxNoteBytes and maxReasonBytes bound what a call journals of text an upstream or a client
// chose: an upstream's error message (up to limits.message_bytes) in an outcome's note, a
// client's reason (up to limits.request_body_bytes). Journaled whole, every call could add
// megabytes to the journal.
const (
	maxNoteBytes   = 4096
	maxReasonBytes = 1024
)

func (g *Gateway) outcome(ctx context.Context, run string, step int64, o store.StepOutcome) {
	o.Note = clip(o.Note, maxNoteBytes)
	// The outcome is journaled even if the client went away mid-call. It is queued: it
	// commits with the session's next intent (or within 5 ms), so a call pays one transaction.
	g.store.QueueOutcome(context.WithoutCancel(ctx), run, step, o, func(_ int64, err error) {
		if err != nil {
			g.warn("journal outcome of step %d in run %s: %v", step, run, err)
		}
	})
}

// releaseKey frees the duplicate-call key a call holds when it did not succeed.
func (g *Gateway) releaseKey(ctx context.Context, d engine.Decision) {
	if !d.KeyClaimed {
		return
	}
	if err := g.store.ReleaseKey(context.WithoutCancel(ctx), d.Key); err != nil {
		g.warn("release duplicate-call key %s: %v", d.Key, err)
	}
}
