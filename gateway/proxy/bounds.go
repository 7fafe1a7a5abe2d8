package proxy

import (
	"fmt"
	"time"

	"github.com/reversi-gitops/reversi/gateway/config"
)

// Deadlines of the paths that wait on an upstream besides a forwarded call (which has the
// manifest's timeout_ms or call_timeout): issue 18, "every path that waits on an upstream has
// a deadline".
const (
	// ConnectTimeout bounds starting or dialling an upstream and its MCP handshake.
	ConnectTimeout = 30 * time.Second
	// ListTimeout bounds one listing of an upstream's tools (every page).
	ListTimeout = 30 * time.Second
	// ListWait is how long an agent's tools/list on a stale cache waits for the upstreams to be
	// listed again before it is served the cached tools; the listing goes on in the background
	// (within ListTimeout) and serves the next tools/list.
	ListWait = 2 * time.Second
)

// LimitError is a limit of gateway.yaml that an upstream reached: Limit is its field under
// `limits:` (e.g. "tools_per_upstream"), Value the limit, and What what went over it.
type LimitError struct {
	Upstream string
	Limit    string
	Value    int64
	What     string
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("upstream %s: %s: limits.%s is %d; raise limits.%s in gateway.yaml if the upstream is trusted to need more",
		e.Upstream, e.What, e.Limit, e.Value, e.Limit)
}

// limitsOf is cfg's limits with every field left at zero set to its default (a config built
// in Go rather than by config.Load, such as the tests', is bounded too: fail closed).
func limitsOf(cfg *config.Gateway) config.Limits {
	l, d := cfg.Limits, config.DefaultLimits()
	if l.ToolsPerUpstream <= 0 {
		l.ToolsPerUpstream = d.ToolsPerUpstream
	}
	if l.PagesPerListing <= 0 {
		l.PagesPerListing = d.PagesPerListing
	}
	if l.MessageBytes <= 0 {
		l.MessageBytes = d.MessageBytes
	}
	return l
}

// callTimeoutOf is cfg's call_timeout, its default when unset.
func callTimeoutOf(cfg *config.Gateway) time.Duration {
	if cfg.CallTimeout > 0 {
		return cfg.CallTimeout
	}
	return config.DefaultCallTimeout
}
