package proxy

import (
	"github.com/reversi-gitops/reversi/gateway/config"
)

// Client-side limits (issue 18). The HTTP limits (body, batch, timeouts, connections) are in
// httplimits.go.

// LimitError is a request refused because a limit of gateway.yaml's `limits:` was reached.
type LimitError struct {
	// Limit is the field of limits: that was reached, e.g. "calls_per_session"; it is also the
	// label of reversi_gateway_limit_hits_total.
	Limit string
	// Max is the limit's value (a count or a size in bytes).
	Max int64
	// Text says what reached it and what to do.
	Text string
}

func (e *LimitError) Error() string { return e.Text }

// effectiveLimits is l with every unset (zero) field at its default: a config built in code
// without limits gets the defaults, never "unlimited". BatchSize 0 is the default (refused).
func effectiveLimits(l config.Limits) config.Limits {
	d := config.DefaultLimits()
	set := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	set(&l.ToolsPerUpstream, d.ToolsPerUpstream)
	set(&l.PagesPerListing, d.PagesPerListing)
	set(&l.CallsPerSession, d.CallsPerSession)
	set(&l.CallsPerPrincipal, d.CallsPerPrincipal)
	set(&l.Connections, d.Connections)
	if l.BatchSize < 0 {
		l.BatchSize = 0
	}
	if l.MessageBytes <= 0 {
		l.MessageBytes = d.MessageBytes
	}
	if l.RequestBodyBytes <= 0 {
		l.RequestBodyBytes = d.RequestBodyBytes
	}
	if l.ReadTimeout <= 0 {
		l.ReadTimeout = d.ReadTimeout
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = d.WriteTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = d.IdleTimeout
	}
	return l
}
