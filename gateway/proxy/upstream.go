package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"sort"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
)

// upstream is one connected upstream MCP server.
type upstream struct {
	name    string
	session *mcp.ClientSession
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

// transport builds the client transport of one upstream.
func transport(g *config.Gateway, u config.Upstream, stderr io.Writer) mcp.Transport {
	if u.Stdio() {
		cmd := exec.Command(u.Command, u.Args...)
		cmd.Env = Env(u)
		cmd.Dir = g.Resolve(u.Cwd)
		cmd.Stderr = stderr
		return &mcp.CommandTransport{Command: cmd}
	}
	return &mcp.StreamableClientTransport{
		Endpoint:   u.URL,
		HTTPClient: &http.Client{Transport: headerTransport{headers: u.Headers, base: http.DefaultTransport}},
	}
}

// connect starts or dials one upstream and lists all its tools (every page).
func connect(ctx context.Context, g *config.Gateway, u config.Upstream, stderr io.Writer) (*upstream, []*mcp.Tool, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "reversi-gateway", Version: Version}, nil)
	cs, err := client.Connect(ctx, transport(g, u, stderr), nil)
	if err != nil {
		return nil, nil, fmt.Errorf("upstream %s: connect: %w", u.Name, err)
	}
	var tools []*mcp.Tool
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			_ = cs.Close()
			return nil, nil, fmt.Errorf("upstream %s: tools/list: %w", u.Name, err)
		}
		tools = append(tools, t)
	}
	return &upstream{name: u.Name, session: cs}, tools, nil
}

// exposedName is the name the gateway offers an upstream tool under: `<upstream>.<tool>`
// unless the upstream has namespace: false.
func exposedName(u config.Upstream, tool string) string {
	if u.Namespace {
		return u.Name + "." + tool
	}
	return tool
}
