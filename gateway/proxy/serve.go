package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ShutdownGrace is how long a stopping HTTP gateway lets requests in progress finish before it
// closes their connections.
const ShutdownGrace = 5 * time.Second

// SessionTimeout closes idle HTTP sessions (seed: Endpoints).
const SessionTimeout = 30 * time.Minute

// Serve speaks MCP until ctx ends or the client goes away: on stdio when the config has no
// listen, otherwise Streamable HTTP at /mcp (and /healthz, /readyz, /metrics) on the listen
// address, which must be loopback (authentication is not implemented yet).
func (g *Gateway) Serve(ctx context.Context) error {
	if g.cfg.Listen == nil {
		if g.stdin == nil || g.stdout == nil {
			return g.server.Run(ctx, &mcp.StdioTransport{})
		}
		return g.server.Run(ctx, &mcp.IOTransport{Reader: readCloser(g.stdin), Writer: writeCloser(g.stdout)})
	}
	if !g.cfg.Listen.Loopback() {
		return fmt.Errorf("listen.host %q is not loopback: the gateway refuses to listen beyond loopback without authentication", g.cfg.Listen.Host)
	}
	ln, err := net.Listen("tcp", g.cfg.Listen.Address())
	if err != nil {
		return err
	}
	fmt.Fprintf(g.stderr, "reversi-gateway: listening on http://%s/mcp\n", ln.Addr())
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

// Handler is the HTTP handler of HTTP mode: /mcp, /healthz, /readyz (health.go) and /metrics
// (metrics.go).
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server },
		&mcp.StreamableHTTPOptions{SessionTimeout: SessionTimeout}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}` + "\n"))
	})
	mux.HandleFunc("/readyz", g.serveReadyz)
	mux.Handle("/metrics", g.metrics.handler())
	return mux
}

// ServeListener serves Handler on ln until ctx ends.
func (g *Gateway) ServeListener(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: g.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		// End the MCP sessions first: their streams would otherwise keep connections busy.
		for ss := range g.server.Sessions() {
			_ = ss.Close()
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
