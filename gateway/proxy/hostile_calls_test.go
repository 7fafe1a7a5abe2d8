package proxy

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// Calls in flight of the hostile client suite (hostile_client_test.go): limits and the end
// of a session.

// longCall starts a call of everything.trigger-long-running-operation (30 s) on cs; the channel
// gets its result text or error.
func longCall(cs *mcp.ClientSession) chan string {
	out := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "everything.trigger-long-running-operation", Arguments: map[string]any{"duration": 30, "steps": 1}})
		switch {
		case err != nil:
			out <- "error: " + err.Error()
		default:
			out <- strings.Join(texts(res), " ")
		}
	}()
	return out
}

// waitInflight waits until principal has n calls in flight at the gateway.
func waitInflight(t *testing.T, g *Gateway, principal string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		g.calls.mu.Lock()
		got := g.calls.principals[principal]
		g.calls.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has %d calls in flight, want %d", principal, got, n)
		}
	}
}

// quickCall makes a call that must be answered within 2 s.
func quickCall(t *testing.T, cs *mcp.ClientSession, tool string, args any) (*mcp.CallToolResult, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v after %s", tool, err, time.Since(start))
	}
	return res, time.Since(start)
}

// TestHostileConcurrentCalls: limits.calls_per_session (2) and calls_per_principal (3) refuse
// the excess at once, journaled and counted, while another principal is served; closing the
// sessions (DELETE) with three 30 s calls in flight returns at once, the calls are journaled
// uncertain with the cause, and the goroutines return to their baseline.
func TestHostileConcurrentCalls(t *testing.T) {
	h := startHostile(t, true, func(c *config.Gateway) {
		c.Limits.CallsPerSession, c.Limits.CallsPerPrincipal = 2, 3
	})
	h.stillServes(t) // warms the upstreams' connections before the baseline
	idleGoroutines := func() int {
		http.DefaultClient.CloseIdleConnections() // each idle client connection has two
		return runtime.NumGoroutine()
	}
	baseline := idleGoroutines()
	a1 := mustConnect(t, h.base+PathAgent, h.key("ci-bot"))
	a2 := mustConnect(t, h.base+PathAgent, h.key("ci-bot"))
	b := mustConnect(t, h.base+PathAgent, h.key("other-bot"))
	long := []chan string{longCall(a1), longCall(a1)}
	waitInflight(t, h.gw, "ci-bot", 2)

	res, took := quickCall(t, a1, "everything.echo", map[string]any{"message": "third"})
	if !res.IsError || !strings.Contains(texts(res)[0], "this session already has 2 tools/call requests in flight (limits.calls_per_session is 2)") {
		t.Errorf("a third call in one session: %v", texts(res))
	}
	long = append(long, longCall(a2))
	waitInflight(t, h.gw, "ci-bot", 3)
	res, took2 := quickCall(t, a2, "everything.echo", map[string]any{"message": "fourth"})
	if !res.IsError || !strings.Contains(texts(res)[0], "ci-bot already has 3 tools/call requests in flight across its sessions (limits.calls_per_principal is 3)") {
		t.Errorf("a fourth call of the principal: %v", texts(res))
	}
	t.Logf("refused in %s and %s", took, took2)
	if r, _ := quickCall(t, b, "memory.read_graph", map[string]any{}); r.IsError {
		t.Errorf("another principal: %v", texts(r))
	}
	notes := gatewayNotes(t, h.store)
	if !containsAll(notes, `refused a tools/call of ci-bot to "everything.echo"`, "limits.calls_per_session") ||
		!containsAll(notes, `refused a tools/call of ci-bot to "everything.echo"`, "limits.calls_per_principal") {
		t.Errorf("the refusals are not journaled: %q", notes)
	}
	if limitHits(h.gw, "calls_per_session") != 1 || limitHits(h.gw, "calls_per_principal") != 1 {
		t.Errorf("limit hits: %v %v", limitHits(h.gw, "calls_per_session"), limitHits(h.gw, "calls_per_principal"))
	}

	// The clients end their sessions with calls in flight: DELETE returns at once. (The go-sdk
	// client's Close sends its DELETE only once its own calls are answered.)
	for _, cs := range []*mcp.ClientSession{a1, a2} {
		start := time.Now()
		code := h.deleteSession(t, cs.ID(), h.key("ci-bot"))
		if took := time.Since(start); code != http.StatusNoContent || took > 3*time.Second {
			t.Errorf("DELETE of a session with calls in flight: %d after %s", code, took)
		}
	}
	for i, c := range long {
		select {
		case r := <-c:
			t.Logf("long call %d: %s", i, r)
		case <-time.After(5 * time.Second):
			t.Errorf("long call %d still waits after its session closed", i)
		}
	}
	for _, cs := range []*mcp.ClientSession{a1, a2, b} {
		_ = cs.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		recs, err := h.store.SearchRecords(context.Background(), store.RecordSearch{Tool: "everything.trigger-long-running-operation", Status: store.Uncertain})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, r := range recs {
			if strings.Contains(r.Note, ErrSessionClosed.Error()) {
				n++
			}
		}
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 3 calls journaled uncertain with the cause: %+v", n, recs)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); idleGoroutines() > baseline; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Errorf("goroutines: %d, baseline %d\n%s", runtime.NumGoroutine(), baseline, buf[:runtime.Stack(buf, true)])
			break
		}
	}
	h.stillServes(t)
}

// deleteSession sends DELETE /mcp for session sid and returns the status.
func (h *hostile) deleteSession(t *testing.T, sid, key string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, h.base+PathAgent, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("DELETE: %v", err)
	}
	_ = res.Body.Close()
	return res.StatusCode
}

// TestHostileClientLeavesMidCall: a client that sends a 30 s call and drops its connection gets
// the call cancelled (its result could never reach it), journaled uncertain with the cause.
func TestHostileClientLeavesMidCall(t *testing.T) {
	h := startHostile(t, false, nil)
	sid := h.initSession(t, "", "2025-06-18")
	c := h.rawConn(t)
	body := `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"everything.trigger-long-running-operation","arguments":{"duration":30,"steps":1}}}`
	if _, err := io.WriteString(c, h.postHead("Mcp-Session-Id: "+sid, "Mcp-Protocol-Version: 2025-06-18", "Content-Length: "+strconv.Itoa(len(body)))+body); err != nil {
		t.Fatal(err)
	}
	waitInflight(t, h.gw, "dev-laptop", 1)
	// Leave once the call is upstream (its intent journaled): before that, nothing was
	// forwarded, and nothing is uncertain.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		recs, err := h.store.SearchRecords(context.Background(), store.RecordSearch{Tool: "everything.trigger-long-running-operation"})
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the call's intent was not journaled within 5 s")
		}
	}
	_ = c.Close()
	left := time.Now()
	for deadline := left.Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		recs, err := h.store.SearchRecords(context.Background(), store.RecordSearch{Tool: "everything.trigger-long-running-operation", Status: store.Uncertain})
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 1 && strings.Contains(recs[0].Note, ErrClientGone.Error()) {
			t.Logf("journaled %s after the client left: %s", time.Since(left).Round(time.Millisecond), recs[0].Note)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not journaled uncertain with the cause within 5 s: %+v", recs)
		}
	}
	waitInflight(t, h.gw, "dev-laptop", 0)
	h.stillServes(t)
}
