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

// upstreamLimit is the *LimitError (limits.go) of an upstream that reached the limit field
// of limits: (whose value is max) with what.
func upstreamLimit(upstream, field string, max int, what string) *LimitError {
	return &LimitError{Limit: field, Max: int64(max),
		Text: fmt.Sprintf("upstream %s: %s: limits.%s is %d; raise limits.%s in gateway.yaml if the upstream is trusted to need more",
			upstream, what, field, max, field)}
}

// callTimeoutOf is cfg's call_timeout, its default when unset.
func callTimeoutOf(cfg *config.Gateway) time.Duration {
	if cfg.CallTimeout > 0 {
		return cfg.CallTimeout
	}
	return config.DefaultCallTimeout
}
