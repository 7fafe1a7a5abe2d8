package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/auth"
	"github.com/reversi-gitops/reversi/gateway/auth/authtest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/proxy"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// auth-load (issue 7): N concurrent authenticated Streamable HTTP sessions (half API keys,
// half OIDC tokens from a test issuer on 127.0.0.1) against one gateway in this process, for a
// duration, each calling memory.read_graph (journaled to SQLite) in a loop and reconnecting
// every -reconnect. Fails on any error, and when goroutines or heap do not come back to the
// baseline after the sessions close.

const authAudience = "https://gateway.bench"

func authLoadMain(argv []string) error {
	fs := flag.NewFlagSet("auth-load", flag.ContinueOnError)
	sessions := fs.Int("sessions", 200, "concurrent sessions")
	dur := fs.Duration("duration", 60*time.Second, "how long the sessions run")
	reconnect := fs.Duration("reconnect", 15*time.Second, "each session is closed and reopened this often (0: never)")
	pause := fs.Duration("pause", 0, "pause between one session's calls")
	if err := fs.Parse(argv); err != nil {
		return err
	}
	if *sessions < 2 || *dur <= 0 {
		return errors.New("-sessions must be at least 2 and -duration positive")
	}
	dir, err := os.MkdirTemp("", "reversi-auth-load-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e, err := setup(dir, "-") // "-": no binary needed
	if err != nil {
		return err
	}

	is, err := authtest.NewIssuer()
	if err != nil {
		return err
	}
	defer is.Close()
	keyFile := filepath.Join(dir, "keys.json")
	tokens := make([]string, *sessions)
	for i := range tokens {
		if i%2 == 0 { // API key, one principal per session
			_, secret, err := auth.AddKey(keyFile, fmt.Sprintf("key-agent-%03d", i), auth.Agent, nil, nil)
			if err != nil {
				return err
			}
			tokens[i] = secret
			continue
		}
		tokens[i], err = is.Token(authtest.Claims{Subject: fmt.Sprintf("oidc-agent-%03d", i), Audience: []string{authAudience},
			Expiry: time.Now().Add(*dur + 10*time.Minute), Extra: map[string]any{"groups": []string{"bots"}}})
		if err != nil {
			return err
		}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	upEnv := map[string]string{}
	for _, kv := range e.memEnv {
		k, v, _ := strings.Cut(kv, "=")
		upEnv[k] = v
	}
	cfg := &config.Gateway{Mode: config.ModeEnforce, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true, Actor: actor,
		Upstreams: []config.Upstream{{Name: "memory", Command: e.memCmd, Args: e.memArgs, Env: upEnv, Namespace: true}},
		Listen:    &config.Listen{Host: "127.0.0.1", Port: ln.Addr().(*net.TCPAddr).Port},
		Auth: config.Auth{Keys: keyFile, OIDC: &config.OIDC{Issuer: is.URL, Audience: authAudience,
			RoleMap: map[string]string{"bots": "agent"}}}}
	docs, errs := manifest.ReadPaths(e.manifests)
	mans, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		return errors.Join(errs...)
	}
	st, err := store.OpenSQLite(filepath.Join(dir, "data"), nil)
	if err != nil {
		return err
	}
	defer st.Close()
	ctx := context.Background()
	gw, err := proxy.New(ctx, proxy.Options{Config: cfg, Manifests: mans, Store: st})
	if err != nil {
		return err
	}
	defer gw.Close()
	sctx, stopServe := context.WithCancel(ctx)
	defer stopServe()
	served := make(chan error, 1)
	go func() { served <- gw.ServeListener(sctx, ln) }()
	url := "http://" + ln.Addr().String() + proxy.PathAgent

	// Warm up (one session: first-use allocations, the SQLite pages), then the baseline.
	if err := oneSession(ctx, url, tokens[0], 20, 0, nil); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	base := settle(gw, 0)
	fmt.Fprintf(os.Stderr, "auth-load: baseline %d goroutines, heap %.1f MB; %d sessions for %s ...\n",
		base.goroutines, mb(base.heap), *sessions, *dur)

	var calls, failures, reconnects atomic.Int64
	var errMu sync.Mutex
	var firstErrs []string
	lat := make([][]time.Duration, *sessions)
	start := time.Now()
	deadline := start.Add(*dur)
	var wg sync.WaitGroup
	for i := range *sessions {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				until := deadline
				if *reconnect > 0 && time.Now().Add(*reconnect).Before(deadline) {
					until = time.Now().Add(*reconnect)
				}
				err := sessionUntil(ctx, url, tokens[i], until, *pause, &lat[i], &calls)
				if err != nil {
					failures.Add(1)
					errMu.Lock()
					if len(firstErrs) < 5 {
						firstErrs = append(firstErrs, fmt.Sprintf("session %d: %v", i, err))
					}
					errMu.Unlock()
				}
				reconnects.Add(1)
			}
		})
	}
	peak := sample()
	go func() { // peak goroutines and heap while the load runs
		for time.Now().Before(deadline) {
			time.Sleep(time.Second)
			s := sample()
			errMu.Lock()
			peak.goroutines, peak.heap = max(peak.goroutines, s.goroutines), max(peak.heap, s.heap)
			errMu.Unlock()
		}
	}()
	wg.Wait()
	wall := time.Since(start)
	after := settle(gw, 30*time.Second)
	stopServe()
	if err := <-served; err != nil {
		return err
	}

	r := newResult(lat, wall)
	errMu.Lock()
	defer errMu.Unlock()
	fmt.Printf("| sessions | duration | session opens | calls | calls/s | p50 ms | p99 ms | errors | goroutines before / peak / after | heap MB before / peak / after |\n")
	fmt.Printf("| -: | -: | -: | -: | -: | -: | -: | -: | - | - |\n")
	fmt.Printf("| %d | %s | %d | %d | %.0f | %.3f | %.3f | %d | %d / %d / %d | %.1f / %.1f / %.1f |\n",
		*sessions, dur.String(), reconnects.Load(), calls.Load(), r.perSecond(), ms(r.percentile(50)), ms(r.percentile(99)),
		failures.Load(), base.goroutines, peak.goroutines, after.goroutines, mb(base.heap), mb(peak.heap), mb(after.heap))
	var problems []string
	if failures.Load() > 0 {
		problems = append(problems, fmt.Sprintf("%d sessions failed: %s", failures.Load(), strings.Join(firstErrs, "; ")))
	}
	if after.sessions != 0 {
		problems = append(problems, fmt.Sprintf("%d MCP sessions still open on the gateway", after.sessions))
	}
	// Back to baseline: a few goroutines of slack (the HTTP server's idle connection
	// closers), and the heap within 4 MB or 25%.
	if after.goroutines > base.goroutines+5 {
		problems = append(problems, fmt.Sprintf("goroutines %d after, %d before", after.goroutines, base.goroutines))
	}
	if after.heap > max(base.heap*5/4, base.heap+4<<20) {
		problems = append(problems, fmt.Sprintf("heap %.1f MB after, %.1f MB before", mb(after.heap), mb(base.heap)))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

type snapshot struct {
	goroutines int
	heap       uint64
	sessions   int
}

func sample() snapshot {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return snapshot{goroutines: runtime.NumGoroutine(), heap: m.HeapAlloc}
}

// settle waits (up to wait) for the gateway's MCP sessions to close, then collects garbage
// and samples goroutines and heap.
func settle(gw *proxy.Gateway, wait time.Duration) snapshot {
	deadline := time.Now().Add(wait)
	n := 0
	for {
		n = 0
		for range gw.Server().Sessions() {
			n++
		}
		if n == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	var s snapshot
	for range 3 { // finalizers and the connection closers need a moment
		time.Sleep(300 * time.Millisecond)
		runtime.GC()
	}
	s = sample()
	s.sessions = n
	return s
}

func mb(b uint64) float64 { return float64(b) / (1 << 20) }

// oneSession opens a session, makes n calls and closes it.
func oneSession(ctx context.Context, url, token string, n int, pause time.Duration, lat *[]time.Duration) error {
	var calls atomic.Int64
	cs, tr, err := openSession(ctx, url, token)
	if err != nil {
		return err
	}
	defer tr.CloseIdleConnections()
	defer cs.Close()
	for range n {
		if err := callOnce(ctx, cs, lat, &calls); err != nil {
			return err
		}
		time.Sleep(pause)
	}
	return nil
}

// sessionUntil opens a session, calls until the deadline, and closes it.
func sessionUntil(ctx context.Context, url, token string, until time.Time, pause time.Duration, lat *[]time.Duration, calls *atomic.Int64) error {
	cs, tr, err := openSession(ctx, url, token)
	if err != nil {
		return err
	}
	defer tr.CloseIdleConnections()
	defer cs.Close()
	for time.Now().Before(until) {
		if err := callOnce(ctx, cs, lat, calls); err != nil {
			return err
		}
		if pause > 0 {
			time.Sleep(pause)
		}
	}
	return cs.Close()
}

func openSession(ctx context.Context, url, token string) (*mcp.ClientSession, *http.Transport, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	hc := &http.Client{Transport: bearerRT{token: token, base: tr}}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "auth-load", Version: "1"}, nil).Connect(cctx,
		&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, DisableStandaloneSSE: true}, nil)
	if err != nil {
		tr.CloseIdleConnections()
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	return cs, tr, nil
}

func callOnce(ctx context.Context, cs *mcp.ClientSession, lat *[]time.Duration, calls *atomic.Int64) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t0 := time.Now()
	res, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: gatewayTool, Arguments: map[string]any{}})
	if err != nil {
		return err
	}
	if res.IsError {
		return fmt.Errorf("%s: isError: %v", gatewayTool, res.Content)
	}
	if lat != nil {
		*lat = append(*lat, time.Since(t0))
	}
	calls.Add(1)
	return nil
}

type bearerRT struct {
	token string
	base  http.RoundTripper
}

func (b bearerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}
