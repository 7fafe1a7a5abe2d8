package config

import (
	"fmt"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// DefaultLimits are the values of `limits:` when a field is absent (issue 18). They are sized
// for an honest deployment with room to spare: a large upstream lists a few hundred tools, a
// tool result rarely passes a few MiB.
func DefaultLimits() Limits {
	return Limits{
		ToolsPerUpstream:     2000,
		PagesPerListing:      100,
		MessageBytes:         16 << 20,
		ListingBytes:         16 << 20,
		RequestBodyBytes:     4 << 20,
		HeaderBytes:          32 << 10,
		BatchSize:            0,
		CallsPerSession:      16,
		CallsPerPrincipal:    64,
		Connections:          1024,
		Sessions:             4096,
		SessionsPerPrincipal: 128,
		ReadTimeout:          30 * time.Second,
		WriteTimeout:         120 * time.Second,
		IdleTimeout:          120 * time.Second,
		// Issue 19's relay: what one agent session may hold, and one upstream session ask.
		SubscriptionsPerSession:  256,
		ServerRequestsPerSession: 16,
	}
}

var limitFields = []string{"tools_per_upstream", "pages_per_listing", "message_bytes", "listing_bytes", "request_body_bytes", "header_bytes", "batch_size",
	"calls_per_session", "calls_per_principal", "connections", "sessions", "sessions_per_principal", "read_timeout", "write_timeout", "idle_timeout",
	"subscriptions_per_session", "server_requests_per_session"}

// LimitNames are the label values of reversi_gateway_limit_hits_total: call_timeout and every
// field of `limits:`.
var LimitNames = append([]string{"call_timeout"}, limitFields...)

func (d *decoder) limits(v any) Limits {
	l := DefaultLimits()
	m := d.object(v, "limits", limitFields...)
	if m == nil {
		return l
	}
	d.count(m, "limits", "tools_per_upstream", 1, &l.ToolsPerUpstream)
	d.count(m, "limits", "pages_per_listing", 1, &l.PagesPerListing)
	d.bytes(m, "limits", "message_bytes", &l.MessageBytes)
	d.bytes(m, "limits", "listing_bytes", &l.ListingBytes)
	d.bytes(m, "limits", "request_body_bytes", &l.RequestBodyBytes)
	d.bytes(m, "limits", "header_bytes", &l.HeaderBytes)
	d.count(m, "limits", "batch_size", 0, &l.BatchSize)
	d.count(m, "limits", "calls_per_session", 1, &l.CallsPerSession)
	d.count(m, "limits", "calls_per_principal", 1, &l.CallsPerPrincipal)
	d.count(m, "limits", "connections", 1, &l.Connections)
	d.count(m, "limits", "sessions", 1, &l.Sessions)
	d.count(m, "limits", "sessions_per_principal", 1, &l.SessionsPerPrincipal)
	d.duration(m, "limits", "read_timeout", &l.ReadTimeout)
	d.duration(m, "limits", "write_timeout", &l.WriteTimeout)
	d.duration(m, "limits", "idle_timeout", &l.IdleTimeout)
	d.count(m, "limits", "subscriptions_per_session", 1, &l.SubscriptionsPerSession)
	d.count(m, "limits", "server_requests_per_session", 1, &l.ServerRequestsPerSession)
	return l
}

// count reads an optional whole number of at least least into *out.
func (d *decoder) count(m map[string]any, p, key string, least int64, out *int) {
	v, ok := m[key]
	if !ok || v == nil {
		return
	}
	n, isInt := v.(int64)
	switch {
	case !isInt:
		d.fail(join(p, key), "expected a whole number, found %s", manifest.Describe(v))
	case n < least || n > 1<<31:
		d.fail(join(p, key), "%d is out of range: use %d to %d", n, least, int64(1)<<31)
	default:
		*out = int(n)
	}
}

// bytes reads an optional size in bytes (a whole number from 1 KiB to 1 GiB) into *out.
func (d *decoder) bytes(m map[string]any, p, key string, out *int64) {
	v, ok := m[key]
	if !ok || v == nil {
		return
	}
	n, isInt := v.(int64)
	switch {
	case !isInt:
		d.fail(join(p, key), "expected a size in bytes (a whole number, e.g. 4194304 for 4 MiB), found %s", manifest.Describe(v))
	case n < 1<<10 || n > 1<<30:
		d.fail(join(p, key), "%d bytes is out of range: use 1024 (1 KiB) to 1073741824 (1 GiB)", n)
	default:
		*out = n
	}
}

// duration reads an optional duration (manifest.ParseDuration syntax) into *out.
func (d *decoder) duration(m map[string]any, p, key string, out *time.Duration) {
	v, ok := m[key]
	if !ok || v == nil {
		return
	}
	ms, err := manifest.ParseDuration(v)
	if err != nil {
		d.fail(join(p, key), "%v", err)
		return
	}
	*out = time.Duration(ms) * time.Millisecond
}

// String lists the limits as `field=value` pairs, for logs.
func (l Limits) String() string {
	return fmt.Sprintf("tools_per_upstream=%d pages_per_listing=%d message_bytes=%d listing_bytes=%d request_body_bytes=%d header_bytes=%d batch_size=%d calls_per_session=%d calls_per_principal=%d connections=%d sessions=%d sessions_per_principal=%d read_timeout=%s write_timeout=%s idle_timeout=%s subscriptions_per_session=%d server_requests_per_session=%d",
		l.ToolsPerUpstream, l.PagesPerListing, l.MessageBytes, l.ListingBytes, l.RequestBodyBytes, l.HeaderBytes, l.BatchSize, l.CallsPerSession, l.CallsPerPrincipal, l.Connections, l.Sessions, l.SessionsPerPrincipal, l.ReadTimeout, l.WriteTimeout, l.IdleTimeout, l.SubscriptionsPerSession, l.ServerRequestsPerSession)
}
