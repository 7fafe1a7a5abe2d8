package proxy

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// The bound on HTTP connections (limits.connections). netutil.LimitListener alone made the
// bound a lockout that anyone could trigger without a credential (found by attack): 1,024
// connections that each made one GET /healthz and then stayed idle (idle_timeout, 120 s), or
// that sent their headers one byte at a time, took every slot, and the next clients, probes
// and agents alike, waited in the listen backlog. A slot is now taken back, when every one is
// taken, from a connection that is doing nothing for anyone: the longest idle one, else one
// that has been reading a request's headers for longer than stalledAfter (a client sends its
// headers at once). Connections whose request reached a handler (an authenticated call, an
// SSE stream; each bounded by its own limit) keep their slot.

// stalledAfter is how long a connection may take to send a request's headers before it may
// lose its slot to a new connection when all are taken.
const stalledAfter = time.Second

// connLimiter is a net.Listener with at most max connections open.
type connLimiter struct {
	net.Listener
	slots chan struct{}
	m     *metrics
	done  chan struct{} // closed by Close
	close sync.Once

	mu    sync.Mutex
	conns map[*limitedConn]struct{}
}

// limitedConn is one accepted connection and what the server is doing with it.
type limitedConn struct {
	net.Conn
	l     *connLimiter
	once  sync.Once
	state http.ConnState // guarded by l.mu
	since time.Time      // when it entered state, or when a handler returned (guarded by l.mu)
	serve int            // requests of it in a handler (guarded by l.mu)
}

// limitListener bounds ln to limits.connections open connections; the server must use the
// returned listener's connState, connContext and handler (serve.go).
func (g *Gateway) limitListener(ln net.Listener) *connLimiter {
	return &connLimiter{Listener: ln, slots: make(chan struct{}, g.limits.Connections), m: g.metrics,
		conns: map[*limitedConn]struct{}{}, done: make(chan struct{})}
}

// Close closes the listener; an Accept waiting for a slot returns.
func (l *connLimiter) Close() error {
	l.close.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// Accept takes a slot, evicting a connection that does nothing when none is free, then
// accepts. While no slot is free (every connection is in a handler), new connections wait in
// the listen backlog.
func (l *connLimiter) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	default:
		l.m.limitHit("connections")
		for acquired := false; !acquired; {
			l.evict()
			select {
			case l.slots <- struct{}{}:
				acquired = true
			case <-time.After(stalledAfter / 4):
			case <-l.done:
				return nil, net.ErrClosed
			}
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	lc := &limitedConn{Conn: c, l: l, state: http.StateNew, since: time.Now()}
	l.mu.Lock()
	l.conns[lc] = struct{}{}
	l.mu.Unlock()
	return lc, nil
}

// evict closes the connection that does least: the longest idle, else the one reading its
// request's headers for longest, past stalledAfter. It reports whether it closed one.
func (l *connLimiter) evict() bool {
	l.mu.Lock()
	var idle, stalled *limitedConn
	now := time.Now()
	for c := range l.conns {
		switch {
		case c.serve > 0:
		case c.state == http.StateIdle:
			if idle == nil || c.since.Before(idle.since) {
				idle = c
			}
		case (c.state == http.StateNew || c.state == http.StateActive) && now.Sub(c.since) > stalledAfter:
			if stalled == nil || c.since.Before(stalled.since) {
				stalled = c
			}
		}
	}
	l.mu.Unlock()
	victim := idle
	if victim == nil {
		victim = stalled
	}
	if victim == nil {
		return false
	}
	_ = victim.Close()
	return true
}

// connState is the server's ConnState hook.
func (l *connLimiter) connState(c net.Conn, s http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s == http.StateClosed || s == http.StateHijacked {
		delete(l.conns, lc)
		return
	}
	if s != lc.state {
		lc.state, lc.since = s, time.Now()
	}
}

type limitedConnKey struct{}

// connContext is the server's ConnContext hook: it lets handler find the request's connection.
func (l *connLimiter) connContext(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitedConn); ok {
		return context.WithValue(ctx, limitedConnKey{}, lc)
	}
	return ctx
}

// handler marks the connection of each request served by next as busy while next runs.
func (l *connLimiter) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lc, _ := r.Context().Value(limitedConnKey{}).(*limitedConn)
		if lc == nil {
			next.ServeHTTP(w, r)
			return
		}
		l.mu.Lock()
		lc.serve++
		l.mu.Unlock()
		defer func() {
			l.mu.Lock()
			lc.serve--
			lc.since = time.Now()
			l.mu.Unlock()
		}()
		next.ServeHTTP(w, r)
	})
}

// headerRefusal is how net/http starts its answer to a request whose headers passed
// limits.header_bytes (it writes it to the connection itself, past every handler).
var headerRefusal = []byte("HTTP/1.1 431 Request Header Fields Too Large\r\n")

// Write counts net/http's refusals of oversized headers (limits.header_bytes).
func (c *limitedConn) Write(p []byte) (int, error) {
	if bytes.HasPrefix(p, headerRefusal) {
		c.l.m.limitHit("header_bytes")
	}
	return c.Conn.Write(p)
}

// Close frees the connection's slot (once).
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
		<-c.l.slots
	})
	return err
}
