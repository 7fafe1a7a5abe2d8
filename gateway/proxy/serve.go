package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ShutdownGrace is how long a stopping HTTP gateway lets requests in progress finish before it
// closes their connections.
const ShutdownGrace = 5 * time.Second

// SessionTimeout closes idle HTTP sessions (seed: Endpoints).
const SessionTimeout = 30 * time.Minute

// Serve speaks MCP until ctx ends or the client goes away: on stdio when the config has no
// listen, otherwise Streamable HTTP (Handler) on the listen address, which must be loopback
// unless auth.keys or auth.oidc is set.
func (g *Gateway) Serve(ctx context.Context) error {
	if g.cfg.Listen == nil {
		in, out := io.Reader(os.Stdin), io.Writer(os.Stdout)
		if g.stdin != nil && g.stdout != nil {
			in, out = g.stdin, g.stdout
		}
		return g.serveStdio(ctx, in, out)
	}
	if !g.cfg.Listen.Loopback() && g.sec.auth == nil {
		return refuseBeyondLoopback(g.cfg.Listen.Host)
	}
	ln, err := net.Listen("tcp", g.cfg.Listen.Address())
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stderr, "reversi-gateway: listening on %s\n", listenURL(ln.Addr().String()))
	return g.ServeListener(ctx, ln)
}

func readCloser(r io.Reader) io.ReadCloser {
	if rc, ok := r.(io.ReadCloser); ok {
		return rc
	}
	return io.NopCloser(r)
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

func writeCloser(w io.Writer) io.WriteCloser {
	if wc, ok := w.(io.WriteCloser); ok {
		return wc
	}
	return nopWriteCloser{w}
}

// Handler is the HTTP handler of HTTP mode: /mcp, /operator/mcp, /healthz, /readyz, /metrics
// and the protected-resource metadata, behind the Host/Origin guard and authentication
// (httpauth.go).
func (g *Gateway) Handler() http.Handler { return g.httpHandler() }

// ServeListener serves Handler on ln until ctx ends, with the HTTP limits of the config's
// `limits:` (read_timeout for a whole request, write_timeout for a response, per write on the
// MCP endpoints' streams, idle_timeout between requests, at most connections open at once).
func (g *Gateway) ServeListener(ctx context.Context, ln net.Listener) error {
	lim := g.limits
	// MaxHeaderBytes: headers are read before authentication, and net/http holds about 2.7 times
	// their size while it parses them (its default, 1 MiB, let 200 unauthenticated connections
	// that never finish their headers hold 530 MiB).
	cl := g.limitListener(ln) // connlimit.go
	srv := &http.Server{Handler: cl.handler(g.Handler()), ReadHeaderTimeout: min(10*time.Second, lim.ReadTimeout),
		ReadTimeout: lim.ReadTimeout, WriteTimeout: lim.WriteTimeout, IdleTimeout: lim.IdleTimeout,
		MaxHeaderBytes: int(lim.HeaderBytes), ConnState: cl.connState, ConnContext: cl.connContext}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(cl) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		g.calls.cancelAll(ErrGatewayStopping) // the sessions' Close waits for their calls
		// End the MCP sessions first: their streams would otherwise keep connections busy.
		for _, s := range []*mcp.Server{g.server, g.sec.opServer} {
			for ss := range s.Sessions() {
				_ = ss.Close()
			}
		}
		sctx, cancel := context.WithTimeout(context.Background(), ShutdownGrace)
		defer cancel()
		err := srv.Shutdown(sctx)
		if errors.Is(err, context.DeadlineExceeded) {
			g.warn("connections still open %s after the stop was asked for; closing them", ShutdownGrace)
			err = srv.Close()
		}
		if e := <-errc; e != nil && !errors.Is(e, http.ErrServerClosed) && err == nil {
			err = e
		}
		return err
	}
}
