package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
)

// ReadyCacheTTL is how long /readyz reuses one round of upstream pings (seed: Endpoints,
// "readiness pings every upstream (cached 2 s)").
const ReadyCacheTTL = 2 * time.Second

// PingTimeout bounds one upstream's ping in a readiness round: an upstream that does not
// answer within it is reported down. Probes calling /readyz should allow at least this long.
const PingTimeout = 2 * time.Second

// Readiness is the body of /readyz (seed: Endpoints, `{"ok","upstreams":[{"name","ok"}],
// "sessions"}`): OK is true when every upstream answered its ping; Sessions is the number
// of open MCP sessions on the gateway.
type Readiness struct {
	OK        bool             `json:"ok"`
	Upstreams []UpstreamHealth `json:"upstreams"`
	Sessions  int              `json:"sessions"`
}

// UpstreamHealth is one upstream's ping result. Error says why it is down (omitted when OK).
type UpstreamHealth struct {
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// health caches the last round of upstream pings; concurrent requests share one round.
type health struct {
	now    func() time.Time // nil is time.Now; tests set it to step over the cache
	flight singleflight.Group
	rounds atomic.Int64 // ping rounds run, for tests

	mu   sync.Mutex
	last []UpstreamHealth
	at   time.Time
}

func (h *health) clock() time.Time {
	if h.now != nil {
		return h.now()
	}
	return time.Now()
}

// Readiness pings every upstream (MCP ping, at most PingTimeout each, all at once), reusing
// the results of a round that finished less than ReadyCacheTTL ago, and counts the open
// sessions (never cached). It does not fail: a down upstream is reported, not returned.
func (g *Gateway) Readiness() Readiness {
	h := &g.health
	h.mu.Lock()
	ups, fresh := h.last, h.last != nil && h.clock().Sub(h.at) < ReadyCacheTTL
	h.mu.Unlock()
	if !fresh {
		v, _, _ := h.flight.Do("ping", func() (any, error) {
			res := g.pingAll()
			h.mu.Lock()
			h.last, h.at = res, h.clock()
			h.mu.Unlock()
			return res, nil
		})
		ups = v.([]UpstreamHealth)
	}
	r := Readiness{OK: true, Upstreams: ups, Sessions: g.sessionCount()}
	for _, u := range ups {
		r.OK = r.OK && u.OK
	}
	return r
}

// pingAll pings every upstream concurrently. It does not use a request's context: the round
// is shared by every request waiting for it, and one client going away must not fail it for
// the others.
func (g *Gateway) pingAll() []UpstreamHealth {
	g.health.rounds.Add(1)
	out := make([]UpstreamHealth, len(g.upstreams))
	var wg sync.WaitGroup
	for i, u := range g.upstreams {
		out[i].Name = u.name
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), PingTimeout)
			defer cancel()
			cs, err := u.session()
			if err == nil {
				err = cs.Ping(ctx, nil)
			}
			if err != nil {
				out[i].Error = "ping: " + err.Error()
				return
			}
			out[i].OK = true
		})
	}
	wg.Wait()
	return out
}

// serveReadyz answers /readyz: Readiness as JSON, 200 when ok, 503 when an upstream is down.
func (g *Gateway) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	r := g.Readiness()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !r.OK {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(r)
}
