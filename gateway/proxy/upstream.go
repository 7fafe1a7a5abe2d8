package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os/exec"
	"sort"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/reversi-gitops/reversi/gateway/config"
)

// upstream is one upstream MCP server. Its session is replaced when the upstream goes away and
// is reconnected (supervise); callers take the current one with session().
type upstream struct {
	name   string
	cfg    config.Upstream
	client *mcp.Client

	ready chan struct{} // closed once the first session is set and listed

	mu    sync.Mutex
	cs    *mcp.ClientSession // nil while the upstream is down
	down  error              // why it is down
	tools []*mcp.Tool        // the last complete tools/list (every page)
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

// list fetches every page of the upstream's tools/list and keeps it.
func (u *upstream) list(ctx context.Context) ([]*mcp.Tool, error) {
	cs, err := u.session()
	if err != nil {
		return nil, err
	}
	var tools []*mcp.Tool
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("upstream %s: tools/list: %w", u.name, err)
		}
		tools = append(tools, t)
	}
	u.mu.Lock()
	u.tools = tools
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

// UpstreamTerminateWait is how long closing a stdio upstream waits for it to exit after its
// stdin closes before sending SIGTERM (some servers, e.g. server-everything, ignore EOF).
const UpstreamTerminateWait = time.Second

// transport builds the client transport of one upstream.
func transport(g *config.Gateway, u config.Upstream, stderr io.Writer) mcp.Transport {
	if u.Stdio() {
		cmd := exec.Command(u.Command, u.Args...)
		cmd.Env = Env(u)
		cmd.Dir = g.Resolve(u.Cwd)
		cmd.Stderr = stderr
		return passthroughTransport{&mcp.CommandTransport{Command: cmd, TerminateDuration: UpstreamTerminateWait}}
	}
	return &mcp.StreamableClientTransport{
		Endpoint:   u.URL,
		HTTPClient: &http.Client{Transport: headerTransport{headers: u.Headers, base: http.DefaultTransport}},
	}
}

// connect starts or dials one upstream and lists all its tools (every page). changed is
// called, on its own goroutine, when the upstream sends notifications/tools/list_changed.
func connect(ctx context.Context, g *config.Gateway, u config.Upstream, stderr io.Writer, changed func(*upstream)) (*upstream, error) {
	up := &upstream{name: u.Name, cfg: u, ready: make(chan struct{})}
	up.client = mcp.NewClient(&mcp.Implementation{Name: Name, Version: Version}, &mcp.ClientOptions{
		// Not in the notification's goroutine: re-listing waits for a response on the same session.
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			go func() { <-up.ready; changed(up) }()
		},
	})
	cs, err := up.client.Connect(ctx, transport(g, u, stderr), nil)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: connect: %w", u.Name, err)
	}
	up.cs = cs
	if _, err := up.list(ctx); err != nil {
		_ = cs.Close()
		return nil, err
	}
	close(up.ready)
	return up, nil
}

// Reconnect backoff of a lost upstream: 0.5 s doubling to 30 s (stdio upstreams are started
// again, HTTP ones dialled again).
var reconnectBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: 30 * time.Second}

// supervise watches an upstream's session. When it ends while the gateway runs (the process
// exited, the connection broke, a frame over the SDK's 16 MiB line limit), the upstream is
// marked down, which is said on stderr and journaled, so that calls are refused without being
// forwarded; it is then reconnected with backoff, listed again, and its tools refreshed.
func (g *Gateway) supervise(up *upstream) {
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
		if werr == nil {
			werr = errors.New("the session ended")
		}
		up.mu.Lock()
		if up.cs == cs {
			up.cs, up.down = nil, werr
		}
		up.mu.Unlock()
		_ = cs.Close()
		g.note("upstream %s stopped (%v); reconnecting", up.name, werr)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-g.closed:
			case <-ctx.Done():
			}
			cancel()
		}()
		err = wait.ExponentialBackoffWithContext(ctx, reconnectBackoff, func(ctx context.Context) (bool, error) {
			cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
			defer ccancel()
			ncs, err := up.client.Connect(cctx, transport(g.cfg, up.cfg, g.stderr), nil)
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
		g.note("upstream %s reconnected", up.name)
		rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = g.refreshTools(rctx, up) // a failure is journaled; the previous tools keep serving
		rcancel()
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
