package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/proxy"
	"github.com/reversi-gitops/reversi/gateway/suggest"
	"github.com/reversi-gitops/reversi/internal/lint"
)

// upstreamFlags are the flags that name the upstream MCP servers to read tools from, shared by
// suggest-manifest and lint (seed "Tool manifests", Lint: "With --upstream-cmd, --upstream-url
// or --gateway-config").
type upstreamFlags struct {
	cmd, url, gatewayConfig string
	args                    []string
	timeout                 time.Duration
}

func (u *upstreamFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&u.cmd, "upstream-cmd", "", "command of one stdio MCP server")
	f.StringArrayVar(&u.args, "upstream-arg", nil, "argument of --upstream-cmd (repeatable, in order)")
	f.StringVar(&u.url, "upstream-url", "", "Streamable HTTP URL of one MCP server")
	f.StringVar(&u.gatewayConfig, "gateway-config", "", "gateway.yaml: every upstream, tools named as the gateway exposes them (<upstream>.<tool>)")
	f.DurationVar(&u.timeout, "upstream-timeout", time.Minute, "how long to wait for the upstreams to start and list their tools")
}

// given reports whether any upstream flag was given.
func (u *upstreamFlags) given() bool {
	return u.cmd != "" || u.url != "" || len(u.args) > 0 || u.gatewayConfig != ""
}

// gateway is the upstream configuration the flags describe. --upstream-cmd and --upstream-url
// name one upstream that is not namespaced, as `reversi gateway` does with them.
func (u *upstreamFlags) gateway() (*config.Gateway, error) {
	if u.gatewayConfig != "" {
		if u.cmd != "" || u.url != "" || len(u.args) > 0 {
			return nil, errors.New("give --gateway-config or --upstream-cmd/--upstream-url, not both")
		}
		g, errs := config.Load(u.gatewayConfig)
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		return g, nil
	}
	return config.FromFlags(config.Flags{UpstreamCmd: u.cmd, UpstreamArgs: u.args, UpstreamURL: u.url})
}

// tools connects to the upstreams, lists their tools as the gateway names them, and
// disconnects. Upstream stderr goes to the command's stderr.
func (u *upstreamFlags) tools(cmd *cobra.Command) ([]suggest.Tool, error) {
	g, err := u.gateway()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), u.timeout)
	defer cancel()
	ts, err := proxy.ListTools(ctx, g, cmd.ErrOrStderr())
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (no answer within --upstream-timeout %s)", err, u.timeout)
		}
		return nil, err
	}
	return ts, nil
}

// lintTools is what lint needs of the listed tools: exposed names and input schemas.
func lintTools(ts []suggest.Tool) []lint.UpstreamTool {
	out := make([]lint.UpstreamTool, len(ts))
	for i, t := range ts {
		out[i] = lint.UpstreamTool{Name: t.Tool.Name, InputSchema: t.Tool.InputSchema}
	}
	return out
}
