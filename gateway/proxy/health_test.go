package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// Tests of /readyz (seed "MCP gateway", Endpoints: "readiness pings every upstream (cached
// 2 s) and answers {"ok","upstreams":[{"name","ok"}],"sessions"}, 503 if any is down") and of
// the acceptance point of issue 5 "a killed upstream gives uncertain and 503 on /readyz".

// serveHTTP serves the gateway's Handler on a loopback port until the test ends and returns
// its base URL.
func serveHTTP(t *testing.T, gw *Gateway) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.ServeListener(ctx, ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("ServeListener: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// httpClient connects a go-sdk client to the gateway's /mcp over Streamable HTTP.
func httpClient(t *testing.T, base string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "http-test", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: base + "/mcp", DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// get fetches url and returns the status code and body.
func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, body
}

// readyz fetches /readyz, checks the seed's JSON shape (exactly ok, upstreams and sessions;
// each upstream exactly name and ok, plus error when down) and decodes it.
func readyz(t *testing.T, base string) (int, Readiness) {
	t.Helper()
	code, body := get(t, base+"/readyz")
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("/readyz body %q: %v", body, err)
	}
	if keys := sortedKeys(raw); !slices.Equal(keys, []string{"ok", "sessions", "upstreams"}) {
		t.Errorf("/readyz keys %v, want ok, sessions, upstreams: %s", keys, body)
	}
	var ups []map[string]any
	if err := json.Unmarshal(raw["upstreams"], &ups); err != nil {
		t.Fatalf("/readyz upstreams %s: %v", raw["upstreams"], err)
	}
	for _, u := range ups {
		want := []string{"name", "ok"}
		if u["ok"] == false {
			want = []string{"error", "name", "ok"}
		}
		if keys := sortedKeys(u); !slices.Equal(keys, want) {
			t.Errorf("/readyz upstream keys %v, want %v: %s", keys, want, body)
		}
	}
	var r Readiness
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	return code, r
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// killableMemory is server-memory as the upstream "memory", started through /bin/sh so that
// the test learns its process id (the shell execs node, keeping its pid) and can kill it.
func killableMemory(t *testing.T) (config.Upstream, func() int) {
	cmd, args, env := upstreams.Memory(t)
	pidFile := filepath.Join(t.TempDir(), "memory.pid")
	u := config.Upstream{Name: "memory", Command: "/bin/sh", Namespace: true,
		Args: append([]string{"-c", `echo $$ > "$PIDFILE" && exec "$0" "$@"`, cmd}, args...),
		Env:  map[string]string{"PIDFILE": pidFile}}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		u.Env[k] = v
	}
	return u, func() int {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			t.Fatalf("upstream pid: %v", err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("upstream pid %q: %v", b, err)
		}
		return pid
	}
}

// TestReadyzKilledUpstream: with server-memory and server-filesystem up, /readyz is 200 with
// both ok and counts the open session; once the server-memory process is killed, /readyz
// turns 503 with memory ok:false (after the 2 s cache) and a call to it is journaled
// uncertain.
func TestReadyzKilledUpstream(t *testing.T) {
	mem, pid := killableMemory(t)
	fcmd, fargs, _ := upstreams.Filesystem(t, t.TempDir())
	fsu := config.Upstream{Name: "fs", Command: fcmd, Args: fargs, Env: map[string]string{}, Namespace: true}
	cfg := &config.Gateway{Mode: config.ModeAuto, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
		Actor: "dev-laptop", Upstreams: []config.Upstream{mem, fsu}}
	f := start(t, cfg, loadManifests(t))
	base := serveHTTP(t, f.gw)

	code, r := readyz(t, base)
	want := Readiness{OK: true, Upstreams: []UpstreamHealth{{Name: "memory", OK: true}, {Name: "fs", OK: true}}}
	if code != http.StatusOK || !reflect.DeepEqual(r, want) {
		t.Fatalf("/readyz before any session: %d %+v, want 200 %+v", code, r, want)
	}
	cs := httpClient(t, base)
	if res := call(t, cs, "memory.read_graph", map[string]any{}); res.IsError {
		t.Fatalf("read_graph: %v", texts(res))
	}
	// Sessions are counted on every request, not cached with the pings.
	if code, r = readyz(t, base); code != http.StatusOK || !r.OK || r.Sessions != 1 {
		t.Fatalf("/readyz with one session: %d %+v, want 200, ok, sessions 1", code, r)
	}

	p := pid()
	if err := syscall.Kill(p, syscall.SIGKILL); err != nil {
		t.Fatalf("kill server-memory (pid %d): %v", p, err)
	}
	killed := time.Now()
	deadline := killed.Add(ReadyCacheTTL + 15*time.Second)
	for {
		code, r = readyz(t, base)
		if code == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d %+v %s after killing server-memory", code, r, time.Since(killed))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("/readyz answered 503 %s after the kill (cache %s)", time.Since(killed).Round(time.Millisecond), ReadyCacheTTL)
	if r.OK || len(r.Upstreams) != 2 || r.Upstreams[0].Name != "memory" || r.Upstreams[0].OK ||
		!strings.HasPrefix(r.Upstreams[0].Error, "ping: ") || r.Upstreams[1] != (UpstreamHealth{Name: "fs", OK: true}) ||
		r.Sessions != 1 {
		t.Fatalf("/readyz after the kill: %+v", r)
	}

	res := call(t, cs, "memory.create_entities", map[string]any{"entities": []any{
		map[string]any{"name": "bob", "entityType": "person", "observations": []any{}}}})
	if !res.IsError || !strings.Contains(strings.Join(texts(res), ""), "outcome is uncertain") {
		t.Errorf("create_entities with the upstream killed: %v", texts(res))
	}
	_, recs := onlyRun(t, f.store)
	s := stepsOf(recs, "memory.create_entities")
	if len(s) != 1 || s[0][0].Decision != "allow" || s[0][1].Status != store.Uncertain {
		t.Fatalf("create_entities steps %+v, want one allowed step with an uncertain outcome", s)
	}
	// The other upstream still serves through the same session.
	if res := call(t, cs, "fs.list_allowed_directories", map[string]any{}); !res.IsError ||
		!strings.Contains(strings.Join(texts(res), ""), "no manifest") {
		t.Errorf("fs.list_allowed_directories (no manifest, enforce): %v", texts(res))
	}
}

// TestReadinessCache: one round of pings serves every request for ReadyCacheTTL (concurrent
// requests share it), so an upstream that went away is reported only once the cache expires.
func TestReadinessCache(t *testing.T) {
	f := start(t, memoryConfig(t, config.ModeAuto), loadManifests(t))
	var mu sync.Mutex
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	f.gw.health.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }

	var wg sync.WaitGroup
	results := make([]Readiness, 16)
	for i := range results {
		wg.Go(func() { results[i] = f.gw.Readiness() })
	}
	wg.Wait()
	for i, r := range results {
		if !r.OK || len(r.Upstreams) != 1 || !r.Upstreams[0].OK {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	if n := f.gw.health.rounds.Load(); n != 1 {
		t.Fatalf("16 concurrent requests ran %d ping rounds, want 1", n)
	}

	// The upstream goes away (its stdin is closed and the process stops).
	_ = f.gw.upstreams[0].session.Close()
	advance(ReadyCacheTTL - time.Millisecond)
	if r := f.gw.Readiness(); !r.OK || f.gw.health.rounds.Load() != 1 {
		t.Fatalf("within the cache: %+v after %d rounds, want the cached ok", r, f.gw.health.rounds.Load())
	}
	advance(time.Millisecond)
	r := f.gw.Readiness()
	if r.OK || r.Upstreams[0].OK || r.Upstreams[0].Error == "" || f.gw.health.rounds.Load() != 2 {
		t.Fatalf("after the cache expired: %+v after %d rounds, want memory down in a second round", r, f.gw.health.rounds.Load())
	}
	t.Logf("down upstream: %s", r.Upstreams[0].Error)
}
