package proxy

import (
	"context"
	"encoding/json"
	"fmt"
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
	"golang.org/x/sys/unix"

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

// killable is server-memory started through /bin/sh, so the test knows its process id and can
// kill it, and can hold it down: while held, a restart by the gateway's reconnect fails.
type killable struct {
	u        config.Upstream
	pidFile  string
	holdFile string
}

func killableMemory(t *testing.T) *killable {
	cmd, args, env := upstreams.Memory(t)
	dir := t.TempDir()
	k := &killable{pidFile: filepath.Join(dir, "memory.pid"), holdFile: filepath.Join(dir, "hold")}
	k.u = config.Upstream{Name: "memory", Command: "/bin/sh", Namespace: true,
		Args: append([]string{"-c", `[ -e "$HOLD" ] && exit 3; echo $$ > "$PIDFILE" && exec "$0" "$@"`, cmd}, args...),
		Env:  map[string]string{"PIDFILE": k.pidFile, "HOLD": k.holdFile, "MEMORY_FILE_PATH": filepath.Join(dir, "graph.jsonl")}}
	for _, kv := range env {
		key, v, _ := strings.Cut(kv, "=")
		if key != "MEMORY_FILE_PATH" {
			k.u.Env[key] = v
		}
	}
	return k
}

func (k *killable) pid(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(k.pidFile)
	if err != nil {
		t.Fatalf("upstream pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("upstream pid %q: %v", b, err)
	}
	return pid
}

// hold makes restarts fail (on) or work again (off).
func (k *killable) hold(t *testing.T, on bool) {
	t.Helper()
	if on {
		write(t, k.holdFile, "")
		return
	}
	if err := os.Remove(k.holdFile); err != nil {
		t.Fatal(err)
	}
}

// waitInput waits until the upstream's stdin pipe holds bytes it has not read (a message the
// gateway wrote while the upstream is stopped).
func (k *killable) waitInput(t *testing.T) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/fd/0", k.pid(t))) // the same pipe, read end
	if err != nil {
		t.Fatalf("the upstream's stdin: %v", err)
	}
	defer f.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCINQ) // FIONREAD
		if err != nil {
			t.Fatalf("FIONREAD on the upstream's stdin: %v", err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the gateway wrote nothing to the stopped upstream")
		}
	}
}

// kill sends sig to the upstream process.
func (k *killable) kill(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(k.pid(t), sig); err != nil {
		t.Fatalf("signal %v to server-memory: %v", sig, err)
	}
}

// waitDown waits until the gateway has marked its first upstream down.
func waitDown(t *testing.T, g *Gateway) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := g.upstreams[0].session(); err != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the gateway did not notice that the upstream went away")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReadyzKilledUpstream: with server-memory and server-filesystem up, /readyz is 200 with
// both ok and counts the open session. server-memory is killed with a call in flight: that call
// is journaled uncertain (with $args resolved and $result missing, unrecoverable); /readyz turns
// 503 with memory ok:false; a call while it is down is not forwarded (failed); once it can start
// again the gateway reconnects it, journals both events, and calls pass.
func TestReadyzKilledUpstream(t *testing.T) {
	mem := killableMemory(t)
	fcmd, fargs, _ := upstreams.Filesystem(t, t.TempDir())
	fsu := config.Upstream{Name: "fs", Command: fcmd, Args: fargs, Env: map[string]string{}, Namespace: true}
	cfg := &config.Gateway{Mode: config.ModeAuto, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
		Actor: "dev-laptop", Upstreams: []config.Upstream{mem.u, fsu}}
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

	// A call in flight when the upstream dies: frozen (SIGSTOP) so the call is surely upstream,
	// then killed.
	mem.hold(t, true)
	mem.kill(t, syscall.SIGSTOP)
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		done <- call(t, cs, "memory.create_entities", map[string]any{"entities": []any{
			map[string]any{"name": "bob", "entityType": "person", "observations": []any{}}}})
	}()
	runs, err := f.store.ListRuns(context.Background(), store.RunFilter{}) // not onlyRun: a step is in flight
	if err != nil || len(runs) != 1 {
		t.Fatalf("runs: %v %v, want exactly one", runs, err)
	}
	run := runs[0]
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if p, _ := f.store.PendingSteps(context.Background(), run.ID); len(p) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the call's intent was not journaled")
		}
	}
	// The intent is durable before the request is written: wait until the request is in the
	// stopped upstream's stdin (the pipe, opened again through /proc, holds unread bytes).
	mem.waitInput(t)
	mem.kill(t, syscall.SIGKILL)
	killed := time.Now()
	if res := <-done; !res.IsError || !strings.Contains(strings.Join(texts(res), ""), "outcome is uncertain") {
		t.Errorf("create_entities in flight when the upstream died: %v", texts(res))
	}
	_, recs := onlyRun(t, f.store)
	s := stepsOf(recs, "memory.create_entities")
	if len(s) != 1 || s[0][0].Decision != "allow" || s[0][1].Status != store.Uncertain ||
		!strings.Contains(s[0][1].Note, "the upstream did not answer") {
		t.Fatalf("create_entities steps %+v, want one allowed step with an uncertain outcome", s)
	}
	// $args references still resolve; $result has no value, so the step is unrecoverable.
	if s[0][1].CompensationTool != "memory.delete_entities" || !strings.Contains(s[0][1].Note, "unrecoverable: no value for $result.entities.0.name") {
		t.Errorf("uncertain outcome %+v", s[0][1])
	}

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

	// While it is down a call is not forwarded: failed, not uncertain.
	waitDown(t, f.gw)
	res := call(t, cs, "memory.read_graph", map[string]any{})
	if !res.IsError || !strings.Contains(strings.Join(texts(res), ""), "memory.read_graph was not called: upstream memory: the upstream is down") {
		t.Errorf("read_graph while the upstream is down: %v", texts(res))
	}
	_, recs = onlyRun(t, f.store)
	if s := stepsOf(recs, "memory.read_graph"); len(s) != 2 || s[1][1].Status != store.Failed || !strings.HasPrefix(s[1][1].Note, "not forwarded: ") {
		t.Errorf("read_graph steps %+v, want the second failed, not forwarded", s)
	}
	// The other upstream still serves through the same session.
	if res := call(t, cs, "fs.list_allowed_directories", map[string]any{}); !res.IsError ||
		!strings.Contains(strings.Join(texts(res), ""), "no manifest") {
		t.Errorf("fs.list_allowed_directories (no manifest, enforce): %v", texts(res))
	}

	// It can start again: the gateway reconnects with backoff, and calls pass.
	mem.hold(t, false)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if res := call(t, cs, "memory.read_graph", map[string]any{}); !res.IsError {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the upstream was not reconnected")
		}
	}
	t.Logf("reconnected %s after the kill", time.Since(killed).Round(time.Millisecond))
	var notes []string
	for _, n := range gatewayRecords(t, f.store, store.KindNote) {
		notes = append(notes, n.Note)
	}
	if len(notes) < 2 || !strings.HasPrefix(notes[0], "upstream memory stopped (") || notes[len(notes)-1] != "upstream memory reconnected" {
		t.Errorf("gateway notes %q, want the stop and the reconnection", notes)
	}
}

// TestReadinessCache: one round of pings serves every request for ReadyCacheTTL (concurrent
// requests share it), so an upstream that went away is reported only once the cache expires.
func TestReadinessCache(t *testing.T) {
	mem := killableMemory(t)
	cfg := memoryConfig(t, config.ModeAuto)
	cfg.Upstreams = []config.Upstream{mem.u}
	f := start(t, cfg, loadManifests(t))
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

	// The upstream goes away and cannot start again.
	mem.hold(t, true)
	mem.kill(t, syscall.SIGKILL)
	waitDown(t, f.gw)
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
