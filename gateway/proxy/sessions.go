package proxy

import (
	"fmt"
	"net/http"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Open MCP sessions over HTTP (issue 18, found by attack): every POST without an
// Mcp-Session-Id opened a session that lived until its DELETE or 30 idle minutes, with no
// bound: one client opened 3,400 sessions a second (about 14 KiB and a goroutine each), so
// that one agent key, or anyone on a loopback gateway without auth, could exhaust memory. A
// new session is now admitted within limits.sessions_per_principal and limits.sessions (the
// sessions of both MCP endpoints), or refused before the SDK sees the request: 429 for the
// principal's bound, 503 for the gateway's.

// sessionCount tracks who opened each HTTP session.
type sessionCount struct {
	perPrincipal, total int
	servers             func() []*mcp.Server // the servers whose sessions count

	mu      sync.Mutex
	owner   map[string]string // session id -> principal
	opening map[string]int    // principal -> new-session POSTs being served
}

func newSessionCount(perPrincipal, total int, servers func() []*mcp.Server) *sessionCount {
	return &sessionCount{perPrincipal: perPrincipal, total: total, servers: servers,
		owner: map[string]string{}, opening: map[string]int{}}
}

// admit reserves a new session of principal, or refuses it with a *LimitError. done must be
// called once the request is served, with the session id the SDK gave it ("" when none).
func (c *sessionCount) admit(principal string) (done func(id string), _ error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	live := map[string]bool{}
	for _, s := range c.servers() {
		if s == nil {
			continue
		}
		for ss := range s.Sessions() {
			live[ss.ID()] = true
		}
	}
	mine, opening := 0, 0
	for id, p := range c.owner {
		switch {
		case !live[id]:
			delete(c.owner, id) // closed (DELETE, idle timeout, failed initialize)
		case p == principal:
			mine++
		}
	}
	for _, n := range c.opening {
		opening += n
	}
	mine += c.opening[principal]
	if mine >= c.perPrincipal {
		return nil, &LimitError{Limit: "sessions_per_principal", Max: int64(c.perPrincipal),
			Text: fmt.Sprintf("%s already has %d MCP sessions open (limits.sessions_per_principal is %d): close one (DELETE with its Mcp-Session-Id) before opening another; an idle session closes after %s", principal, mine, c.perPrincipal, SessionTimeout)}
	}
	// The sessions this count admitted: the SDK's list may still hold one a DELETE just closed.
	if n := len(c.owner) + opening; n >= c.total {
		return nil, &LimitError{Limit: "sessions", Max: int64(c.total),
			Text: fmt.Sprintf("the gateway has %d MCP sessions open (limits.sessions is %d): try again once some have closed", n, c.total)}
	}
	c.opening[principal]++
	var once sync.Once
	return func(id string) {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.opening[principal]--; c.opening[principal] <= 0 {
				delete(c.opening, principal)
			}
			if id != "" {
				c.owner[id] = principal
			}
		})
	}, nil
}

// ownerOf is the principal that opened session id, false when the count does not know it.
func (c *sessionCount) ownerOf(id string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.owner[id]
	return p, ok
}

// closed frees the place of session id at once (a DELETE closed it).
func (c *sessionCount) closed(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.owner, id)
}

// admitSession applies sessionCount to a POST that opens a session (one without an
// Mcp-Session-Id): it returns what to call once the request was served, or answers the
// refusal and returns false.
func (g *Gateway) admitSession(w http.ResponseWriter, r *http.Request) (done func(), ok bool) {
	if r.Header.Get("Mcp-Session-Id") != "" {
		return func() {}, true
	}
	principal := g.httpPrincipal(r)
	finish, err := g.sessions.admit(principal)
	if err != nil {
		le := err.(*LimitError)
		g.metrics.limitHit(le.Limit)
		status := http.StatusTooManyRequests
		if le.Limit == "sessions" {
			status = http.StatusServiceUnavailable
		}
		writeRPCError(w, status, codeInvalidRequest, le.Text, false)
		return nil, false
	}
	return func() { finish(w.Header().Get("Mcp-Session-Id")) }, true
}
