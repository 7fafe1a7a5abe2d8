package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"sort"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
)

// upstream is one connected upstream MCP server.
type upstream struct {
	name    string
	cfg     config.Upstream
	session *mcp.ClientSession

	ready chan struct{} // closed once session is set and the first list is kept

	mu    sync.Mutex
	tools []*mcp.Tool // the last complete tools/list (every page)
}

// listed returns the upstream's last tool list.
func (u *upstream) listed() []*mcp.Tool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.tools
}

// list fetches every page of the upstream's tools/list and keeps it.
func (u *upstream) list(ctx context.Context) ([]*mcp.Tool, error) {
	var tools []*mcp.Tool
	for t, err := range u.session.Tools(ctx, nil) {
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
		return &mcp.CommandTransport{Command: cmd, TerminateDuration: UpstreamTerminateWait}
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
	client := mcp.NewClient(&mcp.Implementation{Name: Name, Version: Version}, &mcp.ClientOptions{
		// Not in the notification's goroutine: re-listing waits for a response on the same session.
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			go func() { <-up.ready; changed(up) }()
		},
	})
	cs, err := client.Connect(ctx, transport(g, u, stderr), nil)
	if err != nil {
		return nil, fmt.Errorf("upstream %s: connect: %w", u.Name, err)
	}
	up.session = cs
	if _, err := up.list(ctx); err != nil {
		_ = cs.Close()
		return nil, err
	}
	close(up.ready)
	return up, nil
}

// exposedName is the name the gateway offers an upstream tool under: `<upstream>.<tool>`
// unless the upstream has namespace: false.
func exposedName(u config.Upstream, tool string) string {
	if u.Namespace {
		return u.Name + "." + tool
	}
	return tool
}
