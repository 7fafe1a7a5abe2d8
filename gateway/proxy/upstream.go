package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/egress"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/pkg/dialguard"
)

// upstream is one upstream MCP server. Its session is replaced when the upstream goes away and
// is reconnected (supervise); callers take the current one with session().
type upstream struct {
	name   string
	cfg    config.Upstream
	client *mcp.Client
	dial   dialer

	ready  chan struct{} // closed once the first session is set and listed
	failed chan struct{} // closed when connect fails (ready never closes then)

	relist    chan struct{}  // a list_changed waiting to be handled (at most one)
	relisting atomic.Bool    // a goroutine handles list_changed notifications
	relistAt  atomic.Int64   // when the last list_changed listing began (Unix ns)
	conn      mcp.Connection // the current session's connection (guarded by mu): see Gateway.Close

	mu       sync.Mutex
	cs       *mcp.ClientSession // nil while the upstream is down
	down     error              // why it is down
	tools    []*mcp.Tool        // the last complete tools/list (every page)
	raw      []json.RawMessage  // tools' JSON as the upstream sent it, by index (nil: not kept); toolmeta.go
	features features           // the last complete listings of prompts and resources

	fmu     sync.Mutex
	flights map[*flight]struct{} // requests in flight on it, of every agent (agents.go)
	subs    map[string]int       // agents subscribed per URI, shared upstreams (relay.go)
	asked   int                  // requests of the shared session waiting for an agent (admitServerRequest)

	debugSet atomic.Bool // a shared upstream's log level was set to debug (relay.go)
}

// ErrUpstreamDown is returned (wrapped) for an upstream that is reconnecting.
var ErrUpstreamDown = errors.New("the upstream is down")

// session returns the current session, or ErrUpstreamDown with the reason.
func (u *upstream) session() (*mcp.ClientSession, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.cs == nil {
		return nil, fmt.Errorf("upstream %s: %w (%v); the gateway is reconnecting it", u.name, ErrUpstreamDown, u.down)
	}
	return u.cs, nil
}

// listed returns the upstream's last tool list.
func (u *upstream) listed() []*mcp.Tool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.tools
}

// ErrCursorCycle is returned (wrapped) when an upstream's listing (tools/list, prompts/list, ...) gives a cursor that an
// earlier page of the same listing gave: the listing would never end.
var ErrCursorCycle = errors.New("the listing gave a cursor an earlier page gave (a cycle), so it would never end")

// list fetches every page of the upstream's tools/list and keeps it. The listing is bounded
// (issue 18): at most limits.pages_per_listing pages and limits.tools_per_upstream tools (a
// *LimitError past either, or past limits.listing_bytes of tools as JSON over all pages), no
// cursor twice (ErrCursorCycle), within ListTimeout; only the tools are kept, so memory is
// bounded by limits.listing_bytes and one page (limits.message_bytes). A failed listing keeps
// nothing: the previous list stays.
func (u *upstream) list(ctx context.Context) ([]*mcp.Tool, error) {
	cs, err := u.session()
	if err != nil {
		return nil, err
	}
	l := effectiveLimits(u.dial.cfg.Limits)
	var raws []json.RawMessage
	tools, err := listPages(ctx, u, "tools/list", "tools", l.ToolsPerUpstream, "tools_per_upstream",
		func(ctx context.Context, cursor string) ([]*mcp.Tool, string, int64, error) {
			slot := &rawSlot{keep: true} // the page as sent (toolmeta.go)
			res, err := cs.ListTools(context.WithValue(ctx, rawSlotKey{}, slot), &mcp.ListToolsParams{Cursor: cursor})
			slot.release()
			if err != nil {
				return nil, "", 0, err
			}
			pageRaw := rawTools(slot.raw, res.Tools)
			raws = append(raws, pageRaw...)
			return res.Tools, res.NextCursor, listingBytes(res.Tools, pageRaw), nil
		})
	if err != nil {
		return nil, err
	}
	u.mu.Lock()
	u.tools, u.raw = tools, raws
	u.mu.Unlock()
	return tools, nil
}

// route says which upstream serves an exposed tool and under which name.
type route struct {
	up   *upstream
	name string    // the tool's name on the upstream
	tool *mcp.Tool // the tool as the gateway exposes it
}

// Env returns a stdio upstream's environment as exec.Cmd.Env wants it: exactly the configured
// variables, sorted, and never nil, so that nothing is inherited from the gateway (seed: "A
// stdio upstream does not inherit the gateway's environment, only what you list").
func Env(u config.Upstream) []string {
	env := make([]string, 0, len(u.Env))
	for k, v := range u.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	return env
}

// headerTransport adds the configured headers to every request to an HTTP upstream.
type headerTransport struct {
	headers map[string]string
	base    http.RoundTripper
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.headers {
		r.Header.Set(k, v)
	}
	return h.base.RoundTrip(r)
}

// upstreamTransports are the HTTP transports of url upstreams, one per block_private (the
// only rule egress.Rules.Dialed reads), shared as http.DefaultTransport was so that
// connections are reused across sessions.
var upstreamTransports [2]struct {
	once sync.Once
	t    *http.Transport
}

// upstreamHTTP is http.DefaultTransport whose every connection is first checked with
// egress.Rules.Dialed on the address dialled: the start's egress check of the URL resolved its
// name once, and a name that later resolves to a metadata address (or a private one under
// block_private) must not be reached (DNS rebinding). The environment's proxy is used as
// http.DefaultTransport does (newUpstreamHTTP).
func upstreamHTTP(blockPrivate bool) *http.Transport {
	i := 0
	if blockPrivate {
		i = 1
	}
	u := &upstreamTransports[i]
	u.once.Do(func() { u.t = newUpstreamHTTP(blockPrivate, http.ProxyFromEnvironment) })
	return u.t
}

// newUpstreamHTTP is upstreamHTTP's transport with proxy as its Proxy. A connection to a
// proxy (the operator's HTTP(S)_PROXY, not a destination) is refused only at a metadata
// address, not under block_private: the proxy resolves the upstream's name itself, and the
// check at start is all the gateway can do of it then.
func newUpstreamHTTP(blockPrivate bool, proxy func(*http.Request) (*url.URL, error)) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	var proxies sync.Map // the host:port of every proxy URL proxy returned
	t.Proxy = func(r *http.Request) (*url.URL, error) {
		p, err := proxy(r)
		if err == nil && p != nil {
			proxies.Store(proxyAddr(p), struct{}{})
		}
		return p, err
	}
	direct := dialguard.Dialer(30*time.Second, egress.Rules{BlockPrivate: blockPrivate}.Dialed)
	toProxy := dialguard.Dialer(30*time.Second, egress.Rules{}.Dialed)
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if _, ok := proxies.Load(addr); ok {
			return toProxy.DialContext(ctx, network, addr)
		}
		return direct.DialContext(ctx, network, addr)
	}
	return t
}

// proxyAddr is the host:port net/http dials for proxy URL p (one it writes otherwise is
// checked as a destination: refused under block_private, never let through).
func proxyAddr(p *url.URL) string {
	port := p.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443", "socks5": "1080", "socks5h": "1080"}[p.Scheme]
	}
	return net.JoinHostPort(p.Hostname(), port)
}

// isRedirect reports whether resp is one net/http's client would follow.
func isRedirect(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		return resp.Header.Get("Location") != ""
	}
	return false
}

// redirectError is the error of a redirect from url upstream name: its target's scheme and
// host, quoted and cut (the upstream chose every byte of the Location). A redirect is not
// followed: its target was never egress-checked by name (allowed_hosts), and the upstream's
// headers (credentials) would go with the request to it.
func redirectError(name string, resp *http.Response) error {
	target := resp.Header.Get("Location")
	if resp.Request != nil && resp.Request.URL != nil {
		if u, err := resp.Request.URL.Parse(target); err == nil {
			target = u.Scheme + "://" + u.Host
		}
	}
	return fmt.Errorf("upstream %s answered %d redirecting to %s: redirects are not followed (set the url upstream's url to where it redirects, if that is meant)", name, resp.StatusCode, quoteCut(target))
}

// quoteCut is s quoted in ASCII, cut to its first 200 bytes.
func quoteCut(s string) string {
	const most = 200
	if len(s) > most {
		return strconv.QuoteToASCII(s[:most]) + "…"
	}
	return strconv.QuoteToASCII(s)
}

// UpstreamTerminateWait is how long closing a stdio upstream waits for it to exit after its
// stdin closes before sending SIGTERM (some servers, e.g. server-everything, ignore EOF).
const UpstreamTerminateWait = time.Second

// dialer is what connecting to an upstream needs from the gateway besides the upstream's config.
type dialer struct {
	cfg      *config.Gateway
	egress   egress.Rules // checked on the address of every connection to a url upstream
	stderr   io.Writer
	hit      func(limit string) // counts a limit hit; nil: not counted
	progress func(token string) // told of each progress notification read, in order; nil: not told
	owner    func() string      // the owner stamp of what a shared session reads now (owner.go); nil: none
}

func (d dialer) limitHit(limit string) {
	if d.hit != nil {
		d.hit(limit)
	}
}

// warn writes one line on stderr, escaped as Gateway.warn does (upstreams' bytes reach it).
func (d dialer) warn(format string, args ...any) {
	fmt.Fprintf(d.stderr, "reversi-gateway: %s\n", engine.EscapeControl(fmt.Sprintf(format, args...)))
}

// transport builds the client transport of one upstream. Both kinds bound the size of a
// message read from the upstream to limits.message_bytes, failing only the call it answers
// (stdioconn.go, upstreamhttp.go).
func transport(d dialer, u config.Upstream) mcp.Transport {
	limit := effectiveLimits(d.cfg.Limits).MessageBytes
	if u.Socket != "" { // stdio framing over a Unix socket (issue 23): the same connection code
		return passthroughTransport{Transport: &stdioTransport{socket: u.Socket, name: u.Name, limit: limit,
			terminate: UpstreamTerminateWait, warn: d.warn, hit: d.limitHit}, progress: d.progress, owner: d.owner}
	}
	if u.Stdio() {
		cmd := exec.Command(u.Command, u.Args...)
		cmd.Env = Env(u)
		cmd.Dir = d.cfg.Resolve(u.Cwd)
		lines := newStderrLines(d.stderr, u.Name) // prefixed, escaped, bounded (stderrlines.go)
		cmd.Stderr = lines
		return passthroughTransport{Transport: &stdioTransport{cmd: cmd, name: u.Name, limit: limit,
			terminate: UpstreamTerminateWait, warn: d.warn, hit: d.limitHit, stderr: lines}, progress: d.progress, owner: d.owner}
	}
	var base http.RoundTripper = headerTransport{headers: u.Headers, base: upstreamHTTP(d.egress.BlockPrivate)}
	return &mcp.StreamableClientTransport{
		Endpoint: u.URL,
		HTTPClient: &http.Client{Transport: &bodyLimitTransport{base: base, name: u.Name, limit: limit,
			warn: d.warn, hit: d.limitHit, answers: newAnswerGate(u.Name, d.warn), progress: d.progress, owner: d.owner},
			// bodyLimitTransport refuses every redirect net/http would follow (redirectError), so
			// this is never asked; should it be, the 3xx goes to the SDK as the answer.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		// Above the limit: bodyLimitTransport decides, so the SDK never fails the whole
		// connection for one oversized event.
		MaxEventSize: int(limit) + sseSlack,
	}
}

// transport is transport(u.dial, u.cfg), noting the connection it opens in u.conn; a shared
// upstream's stamps what it reads with its owner (owner.go).
func (u *upstream) transport() mcp.Transport {
	d := u.dial
	if !u.cfg.PerClient() {
		d.owner = u.owner
	}
	return notingTransport{Transport: transport(d, u.cfg), up: u}
}

// notingTransport notes the connection it opens and returns it as it is (the SDK
// type-asserts its own connections, which a wrapper would hide).
type notingTransport struct {
	mcp.Transport
	up *upstream
}

func (t notingTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err == nil {
		t.up.mu.Lock()
		t.up.conn = c
		t.up.mu.Unlock()
	}
	return c, err
}

// connect starts or dials one upstream (within ConnectTimeout) and lists all its tools
// (list: bounded, within ListTimeout). newClient makes the upstream's shared client (see
// Gateway.newClient; listing-only callers pass a plain one). Errors name the upstream; a
// listing over a limit is a *LimitError naming the field to raise.
func connect(ctx context.Context, d dialer, u config.Upstream, newClient func(*upstream) *mcp.Client) (*upstream, error) {
	up := &upstream{name: u.Name, cfg: u, dial: d, ready: make(chan struct{}), failed: make(chan struct{}),
		relist: make(chan struct{}, 1), flights: map[*flight]struct{}{}}
	up.client = newClient(up)
	cctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
	cs, err := up.client.Connect(cctx, up.transport(), nil)
	cancel()
	if err != nil {
		close(up.failed)
		return nil, fmt.Errorf("upstream %s: connect: %w", u.Name, err)
	}
	up.cs = cs
	if _, err := up.list(ctx); err != nil {
		close(up.failed)
		_ = cs.Close()
		return nil, err
	}
	close(up.ready)
	return up, nil
}

// listChanged handles a notifications/tools/list_changed: changed runs on another goroutine
// (re-listing waits for answers on the same session, which the notification's goroutine
// reads), one at a time per upstream; notifications that arrive meanwhile make one more run,
// so an upstream sending them in a loop costs one listing at a time, not a goroutine each.
func (u *upstream) listChanged(changed func(*upstream)) {
	select {
	case u.relist <- struct{}{}:
	default: // one is already waiting: it covers this one
	}
	if !u.relisting.CompareAndSwap(false, true) {
		return
	}
	go func() {
		select {
		case <-u.ready:
		case <-u.failed:
			return
		}
		for {
			select {
			case <-u.relist:
				// At most one listing per relistInterval: an upstream that sends list_changed in
				// a loop would otherwise have the gateway list it (and journal a failed listing)
				// as fast as it answers.
				if wait := relistInterval - time.Since(time.Unix(0, u.relistAt.Load())); wait > 0 {
					time.Sleep(wait)
				}
				u.relistAt.Store(time.Now().UnixNano())
				changed(u)
				continue
			default:
			}
			u.relisting.Store(false)
			// A notification that came between the check and the Store saw relisting set and
			// left its turn in relist: take it, unless another goroutine already has.
			if len(u.relist) == 0 || !u.relisting.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}

// relistInterval is the least time between two listings of one upstream that its
// notifications/tools/list_changed ask for.
const relistInterval = time.Second

// Reconnect backoff of a lost upstream: 0.5 s doubling to 30 s (stdio upstreams are started
// again, HTTP ones dialled again).
var reconnectBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: 30 * time.Second}

// stableSession is how long an upstream's session must have lasted for its end to be
// reconnected at once; one that ended sooner waits the next step of reconnectBackoff first.
var stableSession = 10 * time.Second

// upstreamAlertQuiet is the least time between two alert.upstream_down of one upstream: an
// outage that begins sooner after the last one announced (the upstream came back, stayed up
// for stableSession, and went down again) is journaled but not announced; the next alert
// says how many were. Without it an upstream that goes down just after stableSession, again
// and again (a hostile or broken MCP server), pages every receiver every few seconds and
// fills the outbox.
var upstreamAlertQuiet = 10 * time.Minute

// supervise watches an upstream's session. When it ends while the gateway runs (the process
// exited, the connection broke, a write broke the stdio framing), the upstream is
// marked down, which is said on stderr and journaled, so that calls are refused without being
// forwarded; it is then reconnected with backoff, listed again, and its tools refreshed. A
// session that lasted less than stableSession is not reconnected at once but after the next
// step of a backoff of its own, which a session lasting longer resets.
func (g *Gateway) supervise(up *upstream) {
	// flap backs off reconnecting to an upstream whose sessions end soon after they begin: an
	// upstream (or whatever holds its socket) that answers the handshake and hangs up, again
	// and again, would otherwise be reconnected, listed and journaled as fast as it answers.
	flap := reconnectBackoff
	began := time.Now()
	// alerted: the upstream's going down was announced (alert.upstream_down) and it has not
	// stayed up for stableSession since: a session that ends again sooner is the same outage
	// flapping, journaled but not announced again (issue 24: one alert per transition).
	alerted := false
	// lastAlert is when the last alert.upstream_down of up was announced, quieted how many
	// outages began since then without one (upstreamAlertQuiet).
	var lastAlert time.Time
	quieted := 0
	for {
		cs, err := up.session()
		if err != nil {
			return
		}
		werr := cs.Wait()
		select {
		case <-g.closed:
			return
		default:
		}
		lived := time.Since(began)
		if werr == nil {
			werr = errors.New("the session ended")
		}
		up.mu.Lock()
		if up.cs == cs {
			up.cs, up.down = nil, werr
		}
		up.mu.Unlock()
		_ = cs.Close()
		// The last resort (issue 18): a stdio upstream is restarted only when its process
		// exited or its stream broke, never for a message it framed badly; the cause is
		// journaled, and the calls in flight on it were journaled uncertain.
		verb := "reconnecting"
		if up.cfg.Command != "" {
			verb = "restarting it"
		}
		if lived >= stableSession {
			alerted = false
		}
		announce := !alerted && (lastAlert.IsZero() || time.Since(lastAlert) >= upstreamAlertQuiet)
		g.upstreamDown(up, werr, began, verb, announce, quieted)
		switch {
		case announce:
			lastAlert, quieted = time.Now(), 0
		case !alerted:
			quieted++
		}
		alerted = true
		if lived >= stableSession {
			flap = reconnectBackoff
		} else {
			select {
			case <-g.closed:
				return
			case <-time.After(flap.Step()):
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-g.closed:
			case <-ctx.Done():
			}
			cancel()
		}()
		err = wait.ExponentialBackoffWithContext(ctx, reconnectBackoff, func(ctx context.Context) (bool, error) {
			cctx, ccancel := context.WithTimeout(ctx, ConnectTimeout)
			defer ccancel()
			ncs, err := up.client.Connect(cctx, up.transport(), nil)
			if err != nil {
				up.mu.Lock()
				up.down = err
				up.mu.Unlock()
				return false, nil
			}
			up.mu.Lock()
			up.cs, up.down = ncs, nil
			up.mu.Unlock()
			return true, nil
		})
		cancel()
		if err != nil { // the gateway is closing
			return
		}
		began = time.Now()
		g.note("upstream %s reconnected", up.name)
		_ = g.refreshTools(context.Background(), up) // within ListTimeout; a failure is journaled, the previous tools keep serving
	}
}

// exposedName is the name the gateway offers an upstream tool under: `<upstream>.<tool>`
// unless the upstream has namespace: false.
func exposedName(u config.Upstream, tool string) string {
	if u.Namespace {
		return u.Name + "." + tool
	}
	return tool
}
