package proxy

import (
	"context"
	"errors"
	"io"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/suggest"
)

// ListTools connects to every upstream of g exactly as the gateway does (same transports,
// environment and working folder), lists all their tools (every page), names them as the
// gateway exposes them (`<upstream>.<tool>` unless namespace: false) and disconnects. The
// result is in upstream order, then each upstream's order. It is what `reversi
// suggest-manifest` and `reversi lint --upstream-…` read. Upstream stderr goes to stderr (nil
// discards it).
//
// Errors: an upstream that cannot be started, reached or listed (named), and the name clashes
// the gateway refuses (two upstreams exposing one name, a reversi.* name).
func ListTools(ctx context.Context, g *config.Gateway, stderr io.Writer) ([]suggest.Tool, error) {
	if stderr == nil {
		stderr = io.Discard
	}
	stderr = &lockedWriter{w: stderr}
	var ups []*upstream
	defer func() {
		for _, up := range ups {
			_ = up.cs.Close()
		}
	}()
	for _, u := range g.Upstreams {
		up, err := connect(ctx, dialer{cfg: g, stderr: stderr}, u, func(*upstream) *mcp.Client {
			return mcp.NewClient(&mcp.Implementation{Name: Name, Version: Version}, nil)
		})
		if err != nil {
			return nil, err
		}
		ups = append(ups, up)
	}
	if len(ups) == 0 {
		return nil, errors.New("no upstreams to list")
	}
	ts, err := buildTools(ups)
	if err != nil {
		return nil, err
	}
	var out []suggest.Tool
	for _, up := range ups {
		server := ""
		if ir := up.cs.InitializeResult(); ir != nil && ir.ServerInfo != nil {
			server = ir.ServerInfo.Name
		}
		for _, t := range up.listed() {
			r := ts.routes[exposedName(up.cfg, t.Name)]
			out = append(out, suggest.Tool{Upstream: up.name, Server: server, Tool: r.tool})
		}
	}
	return out, nil
}
