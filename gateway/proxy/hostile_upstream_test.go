package proxy

// Acceptance of issue 18, the upstream side: a hostile upstream (test/upstreams/hostile, a raw
// JSON-RPC server that misbehaves on purpose) cannot exhaust the gateway or break the other
// sessions. Real go-sdk clients, a real gateway, a real SQLite journal; every wait bounded.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/syncbuf"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// heapBound is the growth of the heap in use over its level before a hostile case that the
// tests allow (issue 18's bound: +200 MiB over idle).
const heapBound = 200 << 20

// hostileConfig fronts the hostile server, run with args, as the namespaced upstream "h" (no
// manifests: observe mode, every call forwarded and journaled).
func hostileConfig(t *testing.T, args ...string) *config.Gateway {
	u := config.Upstream{Name: "h", Command: upstreams.Hostile(t), Args: args, Env: map[string]string{}, Namespace: true}
	return &config.Gateway{Mode: config.ModeAuto, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
		Actor: "dev-laptop", Upstreams: []config.Upstream{u}}
}

// upstreamGW is a gateway with its SQLite journal's folder.
type upstreamGW struct {
	*fixture
	data string
}

// newUpstreamGW builds a gateway on cfg with a SQLite journal in a fresh folder; ctx bounds New.
func newUpstreamGW(ctx context.Context, t *testing.T, cfg *config.Gateway) (*upstreamGW, error) {
	t.Helper()
	data := t.TempDir()
	st, err := store.OpenSQLite(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	errw := &syncbuf.Buffer{}
	gw, err := New(ctx, Options{Config: cfg, Store: st, Stderr: errw})
	if err != nil {
		return &upstreamGW{fixture: &fixture{store: st, stderr: errw}, data: data}, err
	}
	t.Cleanup(func() { _ = gw.Close() })
	return &upstreamGW{fixture: &fixture{gw: gw, store: st, stderr: errw}, data: data}, nil
}

func startUpstreamGW(t *testing.T, cfg *config.Gateway) *upstreamGW {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := newUpstreamGW(ctx, t, cfg)
	if err != nil {
		t.Fatalf("New: %v\nstderr:\n%s", err, h.stderr)
	}
	return h
}

// checkJournal: the SQLite file passes integrity_check, every intent of every run has exactly
// one outcome after it, and no step is pending.
func (h *upstreamGW) checkJournal(t *testing.T) []store.Record {
	t.Helper()
	if err := store.CheckSQLiteIntegrity(h.data); err != nil {
		t.Error(err)
	}
	ctx := context.Background()
	runs, err := h.store.ListRuns(ctx, store.RunFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var all []store.Record
	for _, r := range runs {
		recs, err := h.store.Records(ctx, r.ID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		checkIntentBeforeOutcome(t, recs)
		if p, err := h.store.PendingSteps(ctx, r.ID); err != nil || len(p) > 0 {
			t.Errorf("run %s: pending steps %+v %v", r.ID, p, err)
		}
		all = append(all, recs...)
	}
	return all
}

// notes are the gateway journal's notes.
func (h *upstreamGW) notes(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, r := range gatewayRecords(t, h.store, store.KindNote) {
		out = append(out, r.Note)
	}
	return out
}

// waitNote waits (at most within) for a gateway note containing all of want.
func (h *upstreamGW) waitNote(t *testing.T, within time.Duration, want ...string) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, n := range h.notes(t) {
			hasAll := true
			for _, w := range want {
				hasAll = hasAll && strings.Contains(n, w)
			}
			if hasAll {
				return n
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no gateway note with %q within %s; notes: %q\nstderr:\n%s", want, within, h.notes(t), h.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// heapWatch samples the heap in use every 10 ms: the peak growth over the level at the start
// (after a GC). Past the bound it calls over once, so that a test can stop a load before it
// harms the machine (without the bounds under test, a hostile upstream grows the heap by
// gigabytes).
type heapWatch struct {
	base, peak atomic.Uint64
	stop, done chan struct{}
}

func watchHeap(over func()) *heapWatch {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	w := &heapWatch{stop: make(chan struct{}), done: make(chan struct{})}
	w.base.Store(ms.HeapInuse)
	w.peak.Store(ms.HeapInuse)
	go func() {
		defer close(w.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		called := false
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > w.peak.Load() {
				w.peak.Store(ms.HeapInuse)
			}
			if !called && over != nil && ms.HeapInuse > w.base.Load()+heapBound {
				called = true
				over()
			}
		}
	}()
	return w
}

// Stop ends sampling and returns the peak growth in bytes.
func (w *heapWatch) Stop() uint64 {
	close(w.stop)
	<-w.done
	if p, b := w.peak.Load(), w.base.Load(); p > b {
		return p - b
	}
	return 0
}

func mibs(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// callCtx calls tool with a deadline, returning the error instead of failing.
func callCtx(cs *mcp.ClientSession, within time.Duration, tool string, args any) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
}

// alongside runs a slow call on other while fault runs on one: the other session's call must
// succeed whatever the fault does.
func alongside(t *testing.T, other *mcp.ClientSession, fault func()) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		res, err := callCtx(other, 30*time.Second, "h.slow", map[string]any{"ms": 700})
		if err == nil && (res.IsError || strings.Join(texts(res), "") != "slow") {
			err = fmt.Errorf("result %v", texts(res))
		}
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // the slow call is upstream when the fault happens
	fault()
	if err := <-done; err != nil {
		t.Errorf("the other session's call during the fault: %v", err)
	}
}

// TestHostileListingAtStart: an upstream whose tools/list cycles, never ends, or offers 2,500
// tools is refused at start, quickly, with an error naming the limit and the field to raise,
// and the heap stays within heapBound on the way.
func TestHostileListingAtStart(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want func(error) bool
		text []string
	}{
		{"cyclic cursor", []string{"-list", "cycle"}, func(err error) bool { return errors.Is(err, ErrCursorCycle) },
			[]string{"upstream h", "a cycle"}},
		{"endless cursors", []string{"-list", "endless", "-pad", "65536"}, func(err error) bool {
			var le *LimitError
			return errors.As(err, &le) && le.Limit == "pages_per_listing"
		}, []string{"upstream h", "more than 100 pages", "limits.pages_per_listing is 100", "raise limits.pages_per_listing in gateway.yaml"}},
		// 15 tools of 1 MB each per page: within message_bytes page by page, 1.5 GB by the 100th.
		{"huge tools", []string{"-list", "endless", "-page", "15", "-pad", "1000000"}, func(err error) bool {
			var le *LimitError
			return errors.As(err, &le) && le.Limit == "listing_bytes"
		}, []string{"upstream h", "the tools of tools/list take more than 16777216 bytes", "raise limits.listing_bytes in gateway.yaml"}},
		{"2,500 tools", []string{"-list", "many"}, func(err error) bool {
			var le *LimitError
			return errors.As(err, &le) && le.Limit == "tools_per_upstream"
		}, []string{"upstream h", "more than 2000 tools", "raise limits.tools_per_upstream in gateway.yaml"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			w := watchHeap(cancel)
			began := time.Now()
			_, err := newUpstreamGW(ctx, t, hostileConfig(t, c.args...))
			took, growth := time.Since(began), w.Stop()
			t.Logf("refused after %s: %v; heap growth %s", took.Round(time.Millisecond), err, mibs(growth))
			if err == nil || !c.want(err) {
				t.Fatalf("New: %v, want the listing refused", err)
			}
			for _, s := range c.text {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q lacks %q", err, s)
				}
			}
			if took > 10*time.Second {
				t.Errorf("refused after %s, want well within ListTimeout", took)
			}
			if growth > heapBound {
				t.Errorf("heap grew by %s, over %s", mibs(growth), mibs(heapBound))
			}
		})
	}
}

// TestHostileListingRefresh: after list_changed, a listing over a limit (endless cursors, a
// cycle, 2,500 tools) is refused and journaled, counted in the metric, and the previous tools
// keep serving; the heap stays within heapBound.
func TestHostileListingRefresh(t *testing.T) {
	h := startUpstreamGW(t, hostileConfig(t, "-page", "1"))
	cs := h.client(t)
	before := toolNames(t, cs)
	w := watchHeap(nil)
	for _, c := range []struct{ list, limit, text string }{
		{"endless", "pages_per_listing", "more than 100 pages"},
		{"cycle", "pages_per_listing", "a cycle"},
		{"many", "tools_per_upstream", "more than 2000 tools"},
	} {
		hits := limitHits(h.gw, c.limit)
		if res := call(t, cs, "h.relist", map[string]any{"list": c.list}); res.IsError {
			t.Fatalf("relist %s: %v", c.list, texts(res))
		}
		h.waitNote(t, 10*time.Second, "the tool list was not refreshed", "upstream h", c.text)
		if got := limitHits(h.gw, c.limit); got != hits+1 {
			t.Errorf("%s: limit_hits_total{limit=%q} %v, want %v", c.list, c.limit, got, hits+1)
		}
		if after := toolNames(t, cs); !slices.Equal(after, before) {
			t.Errorf("%s: the tools changed to %q", c.list, after)
		}
		if res := call(t, cs, "h.echo", map[string]any{"text": "still"}); res.IsError || texts(res)[0] != "still" {
			t.Errorf("%s: echo after the refused refresh: %v", c.list, texts(res))
		}
	}
	if g := w.Stop(); g > heapBound {
		t.Errorf("heap grew by %s, over %s", mibs(g), mibs(heapBound))
	} else {
		t.Logf("heap growth over the three refreshes: %s", mibs(g))
	}
	h.checkJournal(t)
}

// TestHostileStaleToolsList: an agent's tools/list on a stale cache does not wait for an
// upstream whose tools/list never answers: it gets the cached tools within ListWait.
func TestHostileStaleToolsList(t *testing.T) {
	h := startUpstreamGW(t, hostileConfig(t))
	cs := h.client(t)
	before := toolNames(t, cs)
	if res := call(t, cs, "h.relist", map[string]any{"list": "hang"}); res.IsError {
		t.Fatalf("relist: %v", texts(res))
	}
	h.gw.stateMu.Lock()
	h.gw.listedAt = time.Now().Add(-ListCacheTTL - time.Second)
	h.gw.stateMu.Unlock()
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), ListWait+8*time.Second)
	defer cancel()
	res, err := cs.ListTools(ctx, nil)
	took := time.Since(began)
	if err != nil {
		t.Fatalf("tools/list on a stale cache, upstream not answering: %v after %s", err, took)
	}
	t.Logf("tools/list answered after %s (ListWait %s)", took.Round(time.Millisecond), ListWait)
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	if !slices.Equal(names, before) || took > ListWait+2*time.Second {
		t.Errorf("after %s: tools %q, want the cached %q within ListWait", took, names, before)
	}
}

// TestHostileFraming: a banner before initialize and a garbage line before every message do
// not stop the gateway; a non-JSON line, a 20 MiB answer (id first or last) and a 20 MiB
// message without an id fail at most the call concerned, while another session's call on the
// same upstream completes; the upstream is never restarted; the heap stays within heapBound.
func TestHostileFraming(t *testing.T) {
	cfg := hostileConfig(t, "-banner", "hostile v1 \x1b[2J starting", "-garbage")
	cfg.CallTimeout = 2 * time.Second
	h := startUpstreamGW(t, cfg)
	if s := h.stderr.String(); !strings.Contains(s, "upstream h: skipped a line before initialize") || !strings.Contains(s, `"hostile v1 \x1b[2J starting"`) {
		t.Errorf("the banner was not logged escaped:\n%s", s)
	}
	a, b := h.client(t), h.client(t)
	w := watchHeap(nil)

	alongside(t, b, func() {
		if res := call(t, a, "h.noise", map[string]any{}); res.IsError || texts(res)[0] != "ok" {
			t.Errorf("noise: %v", texts(res))
		}
	})
	for _, idLast := range []bool{false, true} {
		alongside(t, b, func() {
			res := call(t, a, "h.big", map[string]any{"bytes": 20 << 20, "id_last": idLast})
			if got := strings.Join(texts(res), ""); !res.IsError || !strings.Contains(got, "over limits.message_bytes (16777216 bytes)") || !strings.Contains(got, "uncertain") {
				t.Errorf("big (id last %v): %q", idLast, got)
			}
		})
	}
	alongside(t, b, func() {
		res := call(t, a, "h.big_noid", map[string]any{"bytes": 20 << 20})
		if got := strings.Join(texts(res), ""); !res.IsError || !strings.Contains(got, "timed out after 2s (call_timeout") {
			t.Errorf("big_noid: %q", got)
		}
	})
	if res := call(t, a, "h.echo", map[string]any{"text": "after"}); res.IsError || texts(res)[0] != "after" {
		t.Errorf("echo after the faults: %v", texts(res))
	}
	g := w.Stop()
	t.Logf("heap growth over the framing faults: %s", mibs(g))
	if g > heapBound {
		t.Errorf("heap grew by %s, over %s", mibs(g), mibs(heapBound))
	}
	if n := limitHits(h.gw, "message_bytes"); n != 3 {
		t.Errorf("limit_hits_total{limit=\"message_bytes\"} %v, want 3", n)
	}
	if n := limitHits(h.gw, "call_timeout"); n != 1 {
		t.Errorf("limit_hits_total{limit=\"call_timeout\"} %v, want 1", n)
	}
	for _, n := range h.notes(t) {
		if strings.Contains(n, "stopped") {
			t.Errorf("the upstream was restarted: %q", n)
		}
	}
	recs := h.checkJournal(t)
	for tool, want := range map[string]string{"h.big": "over limits.message_bytes", "h.big_noid": "call_timeout"} {
		for _, o := range outcomesOf(recs, tool) {
			if o.Status != store.Uncertain || !strings.Contains(o.Note, want) {
				t.Errorf("%s outcome %s %q, want uncertain with %q", tool, o.Status, o.Note, want)
			}
		}
	}
	if o := outcomesOf(recs, "h.slow"); len(o) != 4 || slices.ContainsFunc(o, func(r store.Record) bool { return r.Status != store.Succeeded }) {
		t.Errorf("the other session's slow calls: %+v, want 4 succeeded", o)
	}
}

func outcomesOf(recs []store.Record, tool string) []store.Record {
	var out []store.Record
	for _, r := range recs {
		if r.Kind == store.KindOutcome && r.Tool == tool {
			out = append(out, r)
		}
	}
	return out
}

// TestHostileCrash: an upstream that exits mid-call is restarted (the last resort), the restart
// is journaled with its cause (the exit status), the calls in flight are uncertain, and the
// gateway serves again; also when a child it left behind holds its stdout open.
func TestHostileCrash(t *testing.T) {
	for _, orphan := range []bool{false, true} {
		t.Run(fmt.Sprintf("orphan=%v", orphan), func(t *testing.T) { testHostileCrash(t, orphan) })
	}
}

func testHostileCrash(t *testing.T, orphan bool) {
	var args []string
	if orphan {
		args = append(args, "-orphan")
	}
	h := startUpstreamGW(t, hostileConfig(t, args...))
	a, b := h.client(t), h.client(t)
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := callCtx(b, 20*time.Second, "h.slow", map[string]any{"ms": 5000})
		done <- res
	}()
	time.Sleep(200 * time.Millisecond)
	if res := call(t, a, "h.crash", map[string]any{}); !res.IsError || !strings.Contains(strings.Join(texts(res), ""), "uncertain") {
		t.Errorf("crash: %v", texts(res))
	}
	if res := <-done; res == nil || !res.IsError {
		t.Errorf("the call in flight when the upstream exited: %+v, want an uncertain error", res)
	}
	h.waitNote(t, 10*time.Second, "upstream h stopped (the upstream process exited (exit status 3)); restarting it")
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := callCtx(a, 10*time.Second, "h.echo", map[string]any{"text": "back"})
		if err == nil && !res.IsError {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the upstream was not restarted: %v %v", err, res)
		}
		time.Sleep(100 * time.Millisecond)
	}
	recs := h.checkJournal(t)
	for _, tool := range []string{"h.crash", "h.slow"} {
		if o := outcomesOf(recs, tool); len(o) != 1 || o[0].Status != store.Uncertain {
			t.Errorf("%s outcomes %+v, want one uncertain", tool, o)
		}
	}
}

// hostileHTTP starts the hostile server in HTTP mode (args added) and returns its /mcp URL.
func hostileHTTP(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(upstreams.Hostile(t), append([]string{"-http", "127.0.0.1:0"}, args...)...)
	errw := &syncbuf.Buffer{}
	cmd.Stderr = errw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, url, ok := strings.Cut(errw.String(), "listening on "); ok {
			return strings.TrimSpace(url)
		}
	}
	t.Fatalf("the hostile HTTP server did not listen: %s", errw)
	return ""
}

// TestHostileHTTPAnswer: a 20 MiB answer of an HTTP upstream (as JSON or as an SSE event)
// fails that call only: the other session's call completes and the connection serves on.
func TestHostileHTTPAnswer(t *testing.T) {
	for _, mode := range []string{"json", "sse"} {
		t.Run(mode, func(t *testing.T) {
			var args []string
			if mode == "sse" {
				args = append(args, "-sse")
			}
			cfg := &config.Gateway{Mode: config.ModeAuto, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
				Actor: "dev-laptop", Upstreams: []config.Upstream{{Name: "h", URL: hostileHTTP(t, args...), Namespace: true}}}
			h := startUpstreamGW(t, cfg)
			a, b := h.client(t), h.client(t)
			w := watchHeap(nil)
			alongside(t, b, func() {
				res := call(t, a, "h.big", map[string]any{"bytes": 20 << 20})
				if got := strings.Join(texts(res), ""); !res.IsError || !strings.Contains(got, "over limits.message_bytes (16777216 bytes)") {
					t.Errorf("big: %q", got)
				}
			})
			if res := call(t, a, "h.echo", map[string]any{"text": "after"}); res.IsError || texts(res)[0] != "after" {
				t.Errorf("echo after the fault: %v", texts(res))
			}
			g := w.Stop()
			t.Logf("heap growth: %s", mibs(g))
			if g > heapBound {
				t.Errorf("heap grew by %s, over %s", mibs(g), mibs(heapBound))
			}
			if n := limitHits(h.gw, "message_bytes"); n != 1 {
				t.Errorf("limit_hits_total{limit=\"message_bytes\"} %v, want 1", n)
			}
			h.checkJournal(t)
		})
	}
}

// lines counts the non-empty lines of file (0 if it does not exist yet).
func lines(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return len(strings.Fields(string(b)))
}

func waitLines(t *testing.T, file string, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for lines(t, file) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s has %d lines after %s, want %d", filepath.Base(file), lines(t, file), within, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHostileSessionsLeaveMidCall: 20 sessions leave with a call in flight on a tool that
// never answers: the upstream receives 20 notifications/cancelled, every call is journaled
// uncertain (cancelled), nothing stays pending (journal, upstream connection), and the
// goroutines return to their baseline. Then 5 calls cancelled by their (HTTP) client: the same.
func TestHostileSessionsLeaveMidCall(t *testing.T) {
	dir := t.TempDir()
	cancels, calls := filepath.Join(dir, "cancelled"), filepath.Join(dir, "calls")
	h := startUpstreamGW(t, hostileConfig(t, "-cancel-log", cancels, "-calls-log", calls))
	hc := httpClient(t, serveHTTP(t, h.gw))
	call(t, hc, "h.echo", map[string]any{"text": "its run is open"}) // part of the baseline
	began := time.Now()
	base := goroutines()
	const sessions = 20
	var wg sync.WaitGroup
	var closers []func()
	for range sessions {
		ct, stt := mcp.NewInMemoryTransports()
		ss, err := h.gw.Server().Connect(context.Background(), stt, nil)
		if err != nil {
			t.Fatal(err)
		}
		nt := &noted{Transport: ct}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "leaver", Version: "1"}, nil).Connect(context.Background(), nt, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Leaving: the connection goes (as when the client process dies), then the session.
		closers = append(closers, func() { _ = nt.conn.Close(); _ = cs.Close(); _ = ss.Wait() })
		wg.Go(func() { _, _ = callCtx(cs, 30*time.Second, "h.hang", map[string]any{}) })
	}
	waitLines(t, calls, 1+sessions, 10*time.Second) // the echo, then the hangs
	for _, c := range closers {
		c()
	}
	wg.Wait()
	waitLines(t, cancels, sessions, 10*time.Second)
	t.Logf("%d sessions left mid-call; the upstream had %d cancellations after %s", sessions, lines(t, cancels), time.Since(began).Round(time.Millisecond))

	// Client-side cancellation over HTTP: the go-sdk client cancels, the gateway cancels upstream.
	for i := range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := hc.CallTool(ctx, &mcp.CallToolParams{Name: "h.hang", Arguments: map[string]any{}})
			errc <- err
		}()
		waitLines(t, calls, 1+sessions+i+1, 10*time.Second)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("HTTP call %d: %v, want context.Canceled", i, err)
		}
		waitLines(t, cancels, sessions+i+1, 10*time.Second)
	}
	time.Sleep(200 * time.Millisecond)
	if n := lines(t, cancels); n != sessions+5 {
		t.Errorf("the upstream received %d notifications/cancelled, want %d", n, sessions+5)
	}

	// The outcomes are journaled after the handlers see the cancellation: wait for them.
	deadline := time.Now().Add(10 * time.Second)
	var uncertain int
	for ; ; time.Sleep(50 * time.Millisecond) {
		uncertain = 0
		runs, _ := h.store.ListRuns(context.Background(), store.RunFilter{})
		for _, r := range runs {
			recs, _ := h.store.Records(context.Background(), r.ID, 0, 0)
			for _, o := range outcomesOf(recs, "h.hang") {
				if o.Status == store.Uncertain && strings.Contains(o.Note, "notifications/cancelled") {
					uncertain++
				}
			}
		}
		if uncertain == sessions+5 || time.Now().After(deadline) {
			break
		}
	}
	if uncertain != sessions+5 {
		t.Errorf("%d uncertain (cancelled) outcomes of h.hang, want %d", uncertain, sessions+5)
	}
	h.checkJournal(t)
	up := h.gw.upstreams[0]
	up.mu.Lock()
	pending := up.conn.(*passthroughConn).pendingCalls()
	up.mu.Unlock()
	if pending != 0 {
		t.Errorf("%d calls still pending on the upstream connection", pending)
	}
	deadline = time.Now().Add(10 * time.Second)
	for goroutines() > base && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := goroutines(); n > base {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines %d, baseline %d:\n%s", n, base, buf[:runtime.Stack(buf, true)])
	} else {
		t.Logf("goroutines back to %d (baseline %d) after %s", n, base, time.Since(began).Round(time.Millisecond))
	}
}

// noted is a client transport that keeps the connection it opens, to drop it abruptly.
type noted struct {
	mcp.Transport
	conn mcp.Connection
}

func (n *noted) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := n.Transport.Connect(ctx)
	n.conn = c
	return c, err
}

// goroutines counts the goroutines once idle HTTP client connections are closed (their read
// and write loops are the pool's, not a leak).
func goroutines() int {
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	time.Sleep(50 * time.Millisecond)
	return runtime.NumGoroutine()
}

// TestDefaultCallTimeout: a call whose manifest sets no timeout_ms is bounded by call_timeout:
// journaled uncertain, answered, counted, and cancelled upstream.
func TestDefaultCallTimeout(t *testing.T) {
	cancels := filepath.Join(t.TempDir(), "cancelled")
	cfg := hostileConfig(t, "-cancel-log", cancels)
	cfg.CallTimeout = time.Second
	h := startUpstreamGW(t, cfg)
	cs := h.client(t)
	began := time.Now()
	res := call(t, cs, "h.hang", map[string]any{})
	took := time.Since(began)
	got := strings.Join(texts(res), "")
	if !res.IsError || !strings.Contains(got, "timed out after 1s (call_timeout") || !strings.Contains(got, "uncertain") || took > 5*time.Second {
		t.Fatalf("after %s: %q", took, got)
	}
	if n := limitHits(h.gw, "call_timeout"); n != 1 {
		t.Errorf("limit_hits_total{limit=\"call_timeout\"} %v, want 1", n)
	}
	waitLines(t, cancels, 1, 10*time.Second)
	_, recs := onlyRun(t, h.store)
	if o := outcomesOf(recs, "h.hang"); len(o) != 1 || o[0].Status != store.Uncertain || !strings.Contains(o[0].Note, "call_timeout") {
		t.Errorf("outcome %+v", o)
	}
	h.checkJournal(t)
}

// TestHostileToolTheSDKRefuses (issue 19 review): a tool that go-sdk's Server.AddTool panics on
// (an x-mcp-header on an object property) never stops the gateway. The SDK's client already
// leaves it out of tools/list; were it to reach buildTools, sdkAccepts refuses it with an error
// naming it instead of the panic.
func TestHostileToolTheSDKRefuses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gw, err := newUpstreamGW(ctx, t, hostileConfig(t, "-list", "badheader"))
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	if gw.gw.route("h.badheader") != nil || gw.gw.route("h.echo") == nil {
		t.Errorf("h.badheader offered (or h.echo not): %v %v", gw.gw.route("h.badheader"), gw.gw.route("h.echo"))
	}
	bad := &mcp.Tool{Name: "badheader", InputSchema: map[string]any{"type": "object",
		"properties": map[string]any{"o": map[string]any{"type": "object", "x-mcp-header": "X-O"}}}}
	scratch := mcp.NewServer(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	if err := sdkAccepts(scratch, bad); err == nil || !strings.Contains(err.Error(), "the MCP SDK refuses the tool") || !strings.Contains(err.Error(), "x-mcp-header") {
		t.Errorf("sdkAccepts of a tool AddTool panics on: %v", err)
	}
	if err := sdkAccepts(scratch, &mcp.Tool{Name: "ok", InputSchema: map[string]any{"type": "object"}}); err != nil {
		t.Errorf("sdkAccepts of a good tool: %v", err)
	}
}
