package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/store"
)

// Attacks on the tools/call fast path (issue 20): what a client, another principal or a hostile
// upstream can make the fast path (fastcall.go, rawcall.go) do that the SDK's path does not.

// verbatimStdio serves, over stdio, a gateway in front of the hostile upstream with its
// verbatim tool (h.verbatim), on an initialized session.
func verbatimStdio(t *testing.T) (*stdioGW, *stdioLines) {
	t.Helper()
	p := startStdio(t, hostileConfig(t, "-verbatim"))
	l := newStdioLines(t, p)
	l.call(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	if _, err := io.WriteString(p.in, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n"); err != nil {
		t.Fatal(err)
	}
	return p, l
}

// verbatimCall has the upstream answer result (a JSON text, written as is) to a fast-path call
// with id, and returns the response line's result as the agent's client reads it: keys exactly
// as written (a JSON object decoded into a map), and the line's raw bytes.
func verbatimCall(t *testing.T, l *stdioLines, id, result string) (map[string]any, json.RawMessage) {
	t.Helper()
	args, _ := json.Marshal(map[string]string{"result": result})
	resp := l.call(`{"jsonrpc":"2.0","id":"` + id + `","method":"tools/call","params":{"name":"h.verbatim","arguments":` + string(args) + `}}`)
	raw := resp["result"]
	if raw == nil {
		t.Fatalf("%s: no result: %v", id, resp)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	return m, raw
}

// outcomeStatus is the journaled status of the calls of tool, in order.
func outcomeStatus(t *testing.T, st store.Store, tool string) []string {
	t.Helper()
	ctx := context.Background()
	runs, err := st.ListRuns(ctx, store.RunFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range runs {
		recs, err := st.Records(ctx, r.ID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range outcomesOf(recs, tool) {
			out = append(out, string(o.Status))
		}
	}
	return out
}

// A hostile upstream answers a raw call with members whose names differ from the protocol's
// only by case ("StructuredContent", "ISERROR"). The agent's client reads the exact names; the
// gateway must judge (output schema, isError, the journaled status) the same members it
// forwards, not the case variants a case-insensitive decoder picks last.
func TestAttackRawResultCaseVariantKeys(t *testing.T) {
	p, l := verbatimStdio(t)

	// The schema requires a number n: the structuredContent the agent reads breaks it.
	res, _ := verbatimCall(t, l, "schema", `{"content":[],"structuredContent":{"n":"not a number"},"StructuredContent":{"n":1}}`)
	if sc, ok := res["structuredContent"].(map[string]any); ok {
		if _, isNum := sc["n"].(float64); !isNum {
			t.Errorf("the agent got structuredContent %v, which breaks the tool's output schema (the gateway checked the case variant)", sc)
		}
	}

	// The agent reads isError true: the call failed, and must not be journaled succeeded (a
	// rollback would compensate a step that did not happen); and the reverse.
	res, _ = verbatimCall(t, l, "failed", `{"content":[{"type":"text","text":"boom"}],"isError":true,"ISERROR":false,"structuredContent":{"n":1}}`)
	if res["isError"] != true {
		t.Fatalf("isError %v", res["isError"])
	}
	res, _ = verbatimCall(t, l, "succeeded", `{"content":[{"type":"text","text":"ok"}],"isError":false,"IsError":true,"structuredContent":{"n":2}}`)
	if res["isError"] == true {
		t.Fatalf("isError %v", res["isError"])
	}
	got := outcomeStatus(t, p.st, "h.verbatim")
	if len(got) != 3 {
		t.Fatalf("outcomes %v, want 3", got)
	}
	if got[1] != string(store.Failed) || got[2] != string(store.Succeeded) {
		t.Errorf("journaled %s and %s for results the agent reads as failed and succeeded", got[1], got[2])
	}
}

// A tool's structured output may have a member named resultType (a search result's type, say):
// the raw call must read the result's own resultType, not any member of that name, and the
// call succeed as over the SDK's client, instead of failing uncertain (and read-only tools
// being retried).
func TestAttackRawResultNestedResultType(t *testing.T) {
	p, l := verbatimStdio(t)
	res, _ := verbatimCall(t, l, "nested", `{"content":[{"type":"text","text":"found"}],"structuredContent":{"n":1,"resultType":"file"}}`)
	if res["isError"] == true {
		t.Errorf("a complete result with a nested resultType failed: %v", res["content"])
	}
	if got := outcomeStatus(t, p.st, "h.verbatim"); len(got) != 1 || got[0] != string(store.Succeeded) {
		t.Errorf("journaled %v, want [succeeded]", got)
	}
	// A top-level resultType other than complete is still refused by the raw call.
	res, _ = verbatimCall(t, l, "input", `{"content":[],"resultType":"input_required","structuredContent":{"n":1,"resultType":"complete"}}`)
	if res["isError"] != true || !strings.Contains(strings.Join(textsOf(res), ""), "not complete") {
		t.Errorf("an input_required result (complete only in its structuredContent) was taken as complete: %v", res)
	}
}

// textsOf is the text of a decoded result's text blocks.
func textsOf(res map[string]any) []string {
	var out []string
	content, _ := res["content"].([]any)
	for _, c := range content {
		if m, ok := c.(map[string]any); ok {
			if s, ok := m["text"].(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// A hostile upstream's result with a carriage return between tokens: the SDK's path re-encodes
// (compacts) the result, the fast path splices the bytes into the agent's line. Clients that
// read lines with universal newlines would split the message there.
func TestAttackSplicedResultCarriageReturn(t *testing.T) {
	_, l := verbatimStdio(t)
	_, raw := verbatimCall(t, l, "cr", "{\"content\":[\r{\"type\":\"text\",\"text\":\"a\"}\r],\"structuredContent\":{\"n\":1}}")
	if bytes.ContainsAny(raw, "\r\n") {
		t.Errorf("the agent's line carries the upstream's line breaks: %q", raw)
	}
}

// Once the SDK's stdio session has ended (the gateway is stopping: Serve's context ended), the
// line filter may still read the client's lines: a tools/call it hands the fast path then must
// not be served, journaled or forwarded (the SDK's path serves nothing after its session).
func TestAttackFastPathAfterSessionEnd(t *testing.T) {
	callsLog := filepath.Join(t.TempDir(), "calls")
	h := startHostileStdio(t, "-calls-log", callsLog)
	l, st, cancel, served, inW := h.lines, h.st, h.cancel, h.served, h.in
	if r := l.call(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"h.echo","arguments":{"text":"before"}}}`); r["result"] == nil {
		t.Fatalf("before: %v", r)
	}
	cancel()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("serveStdio did not return")
	}
	go func() {
		_, _ = io.WriteString(inW, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"h.echo","arguments":{"text":"after"}}}`+"\n")
	}()
	select {
	case m, ok := <-l.got:
		if ok {
			t.Errorf("a call after the session's end was answered: %v", m)
		}
	case <-time.After(2 * time.Second):
	}
	b, _ := os.ReadFile(callsLog)
	if n := strings.Count(string(b), "echo"); n != 1 {
		t.Errorf("the upstream got %d calls, want 1 (the one before the end):\n%s", n, b)
	}
	if got := outcomeStatus(t, st, "h.echo"); len(got) != 1 {
		t.Errorf("journaled outcomes %v, want the one before the end", got)
	}
}

// hostileStdio is a gateway in front of the hostile upstream (hostileConfig's args), served
// over pipes by serveStdio (the stdio fast path) with an initialized session; its pipes close
// when the test ends.
type hostileStdio struct {
	lines  *stdioLines
	st     store.Store
	in     *io.PipeWriter // the agent's side of the gateway's stdin
	cancel context.CancelFunc
	served <-chan error // serveStdio's return
}

func startHostileStdio(t *testing.T, args ...string) *hostileStdio {
	t.Helper()
	cfg := hostileConfig(t, args...)
	st, err := store.OpenSQLite(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	nctx, ncancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ncancel()
	gw, err := New(nctx, Options{Config: cfg, Store: st, Stderr: &syncBuffer{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	t.Cleanup(func() { _ = inW.Close(); _ = outR.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	served := make(chan error, 1)
	go func() { served <- gw.serveStdio(ctx, inR, outW) }()
	l := newStdioLines(t, &stdioGW{in: inW, out: outR})
	l.call(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	l.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return &hostileStdio{lines: l, st: st, in: inW, cancel: cancel, served: served}
}

// responses reads the response lines the gateway writes within d.
func (l *stdioLines) responses(d time.Duration) []map[string]json.RawMessage {
	var out []map[string]json.RawMessage
	deadline := time.After(d)
	for {
		select {
		case m, ok := <-l.got:
			if !ok {
				return out
			}
			out = append(out, m)
		case <-deadline:
			return out
		}
	}
}

// send writes lines to the gateway's stdin.
func (l *stdioLines) send(lines ...string) {
	l.t.Helper()
	for _, line := range lines {
		if _, err := io.WriteString(l.in, line+"\n"); err != nil {
			l.t.Fatal(err)
		}
	}
}

// A request id already in flight is refused, as the SDK's connection refuses it ("request ID
// already in use"): whether the call in flight is the fast path's or the SDK's,
// the second call is neither forwarded nor answered with the first one's id.
func TestAttackFastPathDuplicateIDs(t *testing.T) {
	callsLog := filepath.Join(t.TempDir(), "calls")
	p := startStdio(t, hostileConfig(t, "-calls-log", callsLog))
	l := newStdioLines(t, p)
	l.call(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	l.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	for _, tc := range []struct{ name, first string }{
		{"fast then fast", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"h.slow","arguments":{"ms":1500}}}`},
		{"SDK then fast", `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"h.slow","arguments":{"ms":1500},"_meta":{"progressToken":"p"}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var first struct {
				ID json.RawMessage `json:"id"`
			}
			_ = json.Unmarshal([]byte(tc.first), &first)
			l.send(tc.first)
			time.Sleep(300 * time.Millisecond) // the first is in flight
			l.send(`{"jsonrpc":"2.0","id":` + string(first.ID) + `,"method":"tools/call","params":{"name":"h.echo","arguments":{"text":"twin"}}}`)
			got := l.responses(3 * time.Second)
			results, refused := 0, 0
			for _, m := range got {
				switch {
				case string(m["id"]) == string(first.ID) && m["result"] != nil:
					results++
					if bytes.Contains(m["result"], []byte("twin")) {
						t.Errorf("the second call with id %s was served: %s", first.ID, m["result"])
					}
				case m["error"] != nil && bytes.Contains(m["error"], []byte("already in use")):
					refused++
				}
			}
			// The SDK's connection drops a duplicate without a response (its refusal has no id to
			// go with); the fast path answers it with a null id.
			if want := map[bool]int{true: 1, false: 0}[tc.name == "fast then fast"]; results != 1 || refused != want {
				t.Errorf("responses %d results with id %s and %d refusals, want 1 and %d: %v", results, first.ID, refused, want, got)
			}
		})
	}
	b, _ := os.ReadFile(callsLog)
	if strings.Contains(string(b), "echo") {
		t.Errorf("a call with an id in flight reached the upstream:\n%s", b)
	}
}

// notifications/cancelled names a request id as the SDK reads ids (a number is a float64, made
// an int64): a cancel of 5.0 cancels the call 5 (the SDK's path cancels it and drops the
// response), and a cancel of "5" (a string) is another id.
func TestAttackFastPathCancelIDForms(t *testing.T) {
	cancelLog := filepath.Join(t.TempDir(), "cancels")
	p := startStdio(t, hostileConfig(t, "-cancel-log", cancelLog))
	l := newStdioLines(t, p)
	l.call(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	l.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)

	l.send(`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"h.slow","arguments":{"ms":1500}}}`)
	time.Sleep(300 * time.Millisecond)
	l.send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5.0,"reason":"stop"}}`)
	if got := l.responses(2500 * time.Millisecond); len(got) != 0 {
		t.Errorf("the call cancelled as 5.0 was answered: %v", got)
	}

	l.send(`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"h.slow","arguments":{"ms":800}}}`)
	time.Sleep(200 * time.Millisecond)
	l.send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"6","reason":"another id"}}`)
	if got := l.responses(2 * time.Second); len(got) != 1 || string(got[0]["id"]) != "6" || got[0]["result"] == nil {
		t.Errorf("the call 6 after a cancel of \"6\": %v, want its result", got)
	}
	if got := outcomeStatus(t, p.st, "h.slow"); len(got) != 2 || got[0] != string(store.Uncertain) || got[1] != string(store.Succeeded) {
		t.Errorf("journaled %v, want [uncertain succeeded]", got)
	}
}

// What the SDK's stateful handler refuses in a POST of one call is refused on the fast path
// too: a call whose `_meta` names a protocol version (any: a stateful session has none per
// request), and a POST with Last-Event-ID. Neither is decided, journaled or forwarded.
func TestAttackFastPathHTTPRefusals(t *testing.T) {
	f, url := httpMemory(t)
	sid := httpSession(t, url)
	hdr := []string{"Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-06-18"}
	for _, tc := range []struct {
		name, meta string
		headers    []string
	}{
		{"a per-request protocol version", `,"_meta":{"io.modelcontextprotocol/protocolVersion":"2025-06-18"}`, hdr},
		{"an empty per-request protocol version", `,"_meta":{"io.modelcontextprotocol/protocolVersion":""}`, hdr},
		{"Last-Event-ID", "", append([]string{"Last-Event-ID", "1"}, hdr...)},
	} {
		body := `{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"memory.search_nodes","arguments":{"query":"svc-a"}` + tc.meta + `}}`
		res := post(t, url, body, tc.headers...)
		got := readBody(t, res)
		// The SDK's own answer, on a session it serves: what the fast path must give as well.
		if tc.name == "an empty per-request protocol version" {
			if res.StatusCode != 200 {
				t.Errorf("%s: %d %s (the SDK serves it: an empty version is none)", tc.name, res.StatusCode, got)
			}
			continue
		}
		if res.StatusCode != 400 {
			t.Errorf("%s: %d, want the SDK's 400: %s", tc.name, res.StatusCode, got)
		}
	}
	_, recs := onlyRun(t, f.store)
	if steps := stepsOf(recs, "memory.search_nodes"); len(steps) != 1 {
		t.Errorf("want only the call the SDK serves journaled: %+v", steps)
	}
}
