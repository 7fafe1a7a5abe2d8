package proxy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// An upstream that sends the gateway requests (pings here) and never takes the answers: a
// stdio upstream that stops reading its stdin, an HTTP one that never answers the POSTs that
// carry them. Without answers.go each request held a goroutine for good (and, over HTTP, a
// connection to the upstream), and the gateway's Close hung on them.

// settleGoroutines waits, up to within, for the goroutines to fall to at most want; it
// returns the last count.
func settleGoroutines(want int, within time.Duration) int {
	n := runtime.NumGoroutine()
	for deadline := time.Now().Add(within); n > want && time.Now().Before(deadline); n = runtime.NumGoroutine() {
		time.Sleep(50 * time.Millisecond)
	}
	return n
}

// closeWithin closes the gateway, failing the test when that takes longer than within.
func closeWithin(t *testing.T, h *upstreamGW, within time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { _ = h.gw.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(within):
		t.Fatalf("Close did not return within %s", within)
	}
}

func TestHostileUpstreamRequestFlood(t *testing.T) {
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			n := 20000
			cfg := hostileConfig(t)
			if mode == "http" {
				n = 2000 // each one a POST, and without the bound a socket held for good
				cfg = &config.Gateway{Mode: config.ModeAuto, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
					Actor: "dev-laptop", Upstreams: []config.Upstream{{Name: "h", URL: hostileHTTP(t, "-sse"), Namespace: true}}}
			}
			cfg.CallTimeout = 20 * time.Second
			h := startUpstreamGW(t, cfg)
			a, b := h.client(t), h.client(t)

			// An honest burst first: 50 pings, every one answered.
			if res := call(t, a, "h.flood", map[string]any{"n": 50}); res.IsError {
				t.Fatalf("flood: %v", texts(res))
			}
			answered := ""
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if answered = texts(call(t, a, "h.answers", map[string]any{}))[0]; answered == "50" {
					break
				}
			}
			if answered != "50" {
				t.Fatalf("the upstream got %s answers to its 50 pings, want 50", answered)
			}

			base := settleGoroutines(0, 0)
			start := time.Now()
			if res := call(t, a, "h.flood", map[string]any{"n": n, "deaf": true}); res.IsError {
				t.Fatalf("deaf flood: %v", texts(res))
			}
			// Within the bound at once, whatever the upstream does next: a waiting answer is a
			// goroutine (over HTTP three: the POST and its connection's two).
			limit := base + 3*maxPendingAnswers + 60
			got := settleGoroutines(limit, 3*time.Second)
			t.Logf("%d pings never taken (%s): goroutines %d -> %d", n, time.Since(start).Round(time.Millisecond), base, got)
			if got > limit {
				t.Fatalf("%d goroutines after %d unanswerable pings, over %d (%d before)", got, n, limit, base)
			}
			if mode == "http" { // the calls of the other session still go through
				if res, err := callCtx(b, 10*time.Second, "h.echo", map[string]any{"text": "other"}); err != nil || res.IsError {
					t.Errorf("the other session's call: %v %v", err, res)
				}
			}
			// Once answerTimeout passed, none is left.
			if got := settleGoroutines(base+20, answerTimeout+5*time.Second); got > base+20 {
				t.Errorf("%d goroutines %s after the flood, want about %d", got, answerTimeout+5*time.Second, base)
			}
			if s := h.stderr.String(); !containsAll([]string{s}, "upstream h: dropped the answer to a request it sent") {
				t.Errorf("the dropped answers were not logged:\n%s", s)
			}
			for _, note := range h.notes(t) {
				if containsAll([]string{note}, "stopped") {
					t.Errorf("the upstream was restarted: %q", note)
				}
			}
			closeWithin(t, h, 15*time.Second)
			h.checkJournal(t)
		})
	}
}

// TestHostileUpstreamStderr: what a stdio upstream prints on stderr reaches the gateway's log
// as its own lines, prefixed and escaped: it cannot forge a banner line or a gateway line, nor
// send terminal escapes, nor flood the log (a 20 MB burst and a 4 MiB line without a line end).
func TestHostileUpstreamStderr(t *testing.T) {
	t.Run("forged", func(t *testing.T) {
		h := startUpstreamGW(t, hostileConfig(t, "-stderr", `\nOK h.crash - irreversible, approved\x1b[2K\nreversi-gateway: upstream h reconnected\n`))
		if res := call(t, h.client(t), "h.echo", map[string]any{"text": "x"}); res.IsError {
			t.Fatalf("echo: %v", texts(res))
		}
		log := h.stderr.String()
		for _, l := range strings.Split(log, "\n") {
			if strings.HasPrefix(l, "OK h.crash") || strings.HasPrefix(l, "reversi-gateway: upstream h reconnected") || strings.Contains(l, "\x1b") {
				t.Errorf("the upstream forged the line %q:\n%s", l, log)
			}
		}
		if !strings.Contains(log, `upstream h stderr: OK h.crash - irreversible, approved\x1b[2K`+"\n") {
			t.Errorf("the upstream's line is not in the log, prefixed and escaped:\n%s", log)
		}
	})
	t.Run("flood", func(t *testing.T) {
		h := startUpstreamGW(t, hostileConfig(t, "-stderr", strings.Repeat("e", 99)+`\n`, "-stderr-lines", "200000"))
		a := h.client(t)
		if res := call(t, a, "h.echo", map[string]any{"text": "x"}); res.IsError {
			t.Fatalf("echo: %v", texts(res))
		}
		var size int
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if size = len(h.stderr.String()); strings.Contains(h.stderr.String(), "lines dropped") {
				break
			}
		}
		if size > 1<<20 {
			t.Errorf("20 MB on the upstream's stderr made %d bytes of gateway log, over 1 MiB", size)
		}
		if !strings.Contains(h.stderr.String(), "lines dropped: over 50 lines a second") {
			t.Errorf("the dropped lines are not said")
		}
		if res := call(t, a, "h.echo", map[string]any{"text": "after"}); res.IsError || texts(res)[0] != "after" {
			t.Errorf("echo after the flood: %v", texts(res))
		}
	})
	t.Run("long line", func(t *testing.T) {
		h := startUpstreamGW(t, hostileConfig(t, "-stderr", strings.Repeat("L", 1<<12), "-stderr-lines", "1024"))
		if res := call(t, h.client(t), "h.crash", map[string]any{}); !res.IsError {
			t.Fatalf("crash: %v", texts(res))
		}
		var log string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if log = h.stderr.String(); strings.Contains(log, "more bytes)") {
				break
			}
		}
		if want := "upstream h stderr: " + strings.Repeat("L", stderrLineBytes) + "… (" + strconv.Itoa(4<<20-stderrLineBytes) + " more bytes)\n"; !strings.Contains(log, want) {
			t.Errorf("a 4 MiB line without a line end is not cut at %d bytes (log of %d bytes)", stderrLineBytes, len(log))
		}
		if len(log) > 64<<10 {
			t.Errorf("%d bytes of log for one line", len(log))
		}
	})
}

// TestHostileListChangedSpam: an upstream that sends notifications/tools/list_changed in a
// loop while its listing fails (a cursor cycle) had the gateway list it as fast as it answered
// and journal each failure: about 9 listings and 9 notes a second for as long as it liked. Now
// it is listed at most once per relistInterval and the same failure is noted once.
func TestHostileListChangedSpam(t *testing.T) {
	h := startUpstreamGW(t, hostileConfig(t))
	a := h.client(t)
	pages := func() int {
		n, err := strconv.Atoi(texts(call(t, a, "h.lists", map[string]any{}))[0])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if res := call(t, a, "h.relist", map[string]any{"list": "cycle"}); res.IsError {
		t.Fatalf("relist: %v", texts(res))
	}
	h.waitNote(t, 10*time.Second, "the tool list was not refreshed", "a cycle")
	before, start := pages(), time.Now()
	for range 5 {
		if res := call(t, a, "h.flood", map[string]any{"n": 20000, "notify": true, "method": "notifications/tools/list_changed"}); res.IsError {
			t.Fatalf("flood: %v", texts(res))
		}
	}
	time.Sleep(2 * relistInterval)
	elapsed := time.Since(start)
	listings := (pages() - before) / 3 // a cycle listing is three pages
	notes := 0
	for _, n := range h.notes(t) {
		if strings.Contains(n, "a cycle") {
			notes++
		}
	}
	t.Logf("100,000 list_changed in %s: %d listings, %d notes", elapsed.Round(time.Millisecond), listings, notes)
	if max := int(elapsed/relistInterval) + 2; listings > max {
		t.Errorf("%d listings in %s, over %d", listings, elapsed.Round(time.Millisecond), max)
	}
	if notes != 1 {
		t.Errorf("the same failed listing was noted %d times, want once", notes)
	}
	if res := call(t, a, "h.echo", map[string]any{"text": "after"}); res.IsError || texts(res)[0] != "after" {
		t.Errorf("echo after the spam: %v", texts(res))
	}
	h.checkJournal(t)
}

// TestHostileHTTPBadAnswer: an HTTP upstream that answers one call with something that is not
// a JSON-RPC message (a JSON body that is not JSON, an SSE event whose data is not, an SSE line
// without a colon, or an HTTP error status with an error page) fails that call only. go-sdk's
// client fails the whole connection on each, and with it every session's calls on that
// upstream (they are all on one connection), which it then dials again.
func TestHostileHTTPBadAnswer(t *testing.T) {
	for _, c := range []struct {
		name   string
		args   []string
		line   bool
		status int // answered with this HTTP status and a text body instead
	}{{"json", nil, false, 0}, {"sse", []string{"-sse"}, false, 0}, {"sse line", []string{"-sse"}, true, 0},
		{"500", nil, false, 500}, {"400", nil, false, 400}, {"403", nil, false, 403}} {
		t.Run(c.name, func(t *testing.T) {
			cfg := &config.Gateway{Mode: config.ModeAuto, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
				Actor: "dev-laptop", Upstreams: []config.Upstream{{Name: "h", URL: hostileHTTP(t, c.args...), Namespace: true}}}
			h := startUpstreamGW(t, cfg)
			a, b := h.client(t), h.client(t)
			alongside(t, b, func() {
				tool, args, want := "h.bad_answer", map[string]any{"line": c.line}, "not a JSON-RPC message"
				if c.status != 0 {
					tool, args, want = "h.http_error", map[string]any{"status": c.status}, fmt.Sprintf("answered HTTP %d", c.status)
					if c.status == 500 { // transient to the SDK: refused, as it says
						want = "Internal Server Error"
					}
				}
				res, err := callCtx(a, 20*time.Second, tool, args)
				if err != nil || !res.IsError || !strings.Contains(strings.Join(texts(res), ""), want) {
					t.Errorf("%s: %v %v, want %q", tool, err, res, want)
				}
			})
			if res := call(t, a, "h.echo", map[string]any{"text": "after"}); res.IsError || texts(res)[0] != "after" {
				t.Errorf("echo after the bad answer: %v", texts(res))
			}
			for _, n := range h.notes(t) {
				if strings.Contains(n, "stopped") {
					t.Errorf("the upstream's connection was lost: %q", n)
				}
			}
			h.checkJournal(t)
		})
	}
}

// TestHostileBigError: an upstream's JSON-RPC error message (8 MiB here, within message_bytes)
// was journaled whole in the call's outcome note, and a client's reason (_meta reversi/reason,
// 2 MiB here) in each record of the call, so that every call could add megabytes to the
// journal; both are cut there (the agent still gets the upstream's answer).
func TestHostileBigError(t *testing.T) {
	h := startUpstreamGW(t, hostileConfig(t))
	a := h.client(t)
	for range 3 {
		res := call(t, a, "h.big_error", map[string]any{"bytes": 8 << 20})
		if !res.IsError || !strings.Contains(strings.Join(texts(res), ""), "EEEE") {
			t.Fatalf("big_error: %.200v", texts(res))
		}
	}
	// A client's reason is cut too.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.CallTool(ctx, &mcp.CallToolParams{Name: "h.echo", Arguments: map[string]any{"text": "r"},
		Meta: mcp.Meta{ReasonMeta: strings.Repeat("R", 2<<20)}}); err != nil {
		t.Fatal(err)
	}
	recs := h.checkJournal(t)
	for _, r := range recs {
		if len(r.Reason) > maxReasonBytes+3 {
			t.Errorf("a %s record of %s with a reason of %d bytes", r.Kind, r.Tool, len(r.Reason))
		}
	}
	for _, o := range outcomesOf(recs, "h.big_error") {
		if len(o.Note) > maxNoteBytes+16 || o.Status != store.Uncertain {
			t.Errorf("outcome %s with a note of %d bytes, want uncertain and at most %d", o.Status, len(o.Note), maxNoteBytes)
		}
	}
	var size int64
	_ = filepath.Walk(h.data, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			size += fi.Size()
		}
		return nil
	})
	t.Logf("journal folder after three 8 MiB errors: %.1f MiB", float64(size)/(1<<20))
	if size > 8<<20 {
		t.Errorf("the journal takes %.1f MiB after three calls", float64(size)/(1<<20))
	}
}
