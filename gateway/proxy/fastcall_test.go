package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// stdioLines reads the gateway's response lines by id.
type stdioLines struct {
	t   *testing.T
	in  io.Writer
	got chan map[string]json.RawMessage
}

func newStdioLines(t *testing.T, p *stdioGW) *stdioLines {
	l := &stdioLines{t: t, in: p.in, got: make(chan map[string]json.RawMessage, 64)}
	go func() {
		sc := bufio.NewScanner(p.out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var m map[string]json.RawMessage
			if json.Unmarshal(sc.Bytes(), &m) == nil && m["method"] == nil {
				l.got <- m
			}
		}
		close(l.got)
	}()
	return l
}

// call sends line and returns the response (the next one the gateway writes).
func (l *stdioLines) call(line string) map[string]json.RawMessage {
	l.t.Helper()
	if _, err := io.WriteString(l.in, line+"\n"); err != nil {
		l.t.Fatal(err)
	}
	select {
	case m, ok := <-l.got:
		if !ok {
			l.t.Fatal("the gateway closed stdout")
		}
		return m
	case <-time.After(20 * time.Second):
		l.t.Fatalf("no response to %s within 20 s", line)
		return nil
	}
}

func memoryStdio(t *testing.T) *stdioGW {
	t.Helper()
	mem := filepath.Join(t.TempDir(), "memory.jsonl")
	// svc-a's long observation makes a result larger than net/http's buffer before it chunks.
	graph := `{"type":"entity","name":"svc-b","entityType":"service","observations":["zeta","alpha"]}
{"type":"entity","name":"svc-a","entityType":"service","observations":["port 80","` + strings.Repeat("runbook line. ", 400) + `"]}
`
	if err := os.WriteFile(mem, []byte(graph), 0o600); err != nil {
		t.Fatal(err)
	}
	upstreams.MemoryAt(t, mem) // skips without the upstreams
	cfg := memoryConfig(t, config.ModeObserve)
	cfg.Upstreams[0].Env = map[string]string{"MEMORY_FILE_PATH": mem}
	return startStdio(t, cfg)
}

// A tools/call served by the fast path gets the answer the SDK's path gives (the same call with
// a progress token, which the SDK serves), at both kinds of protocol: the handshake (2025-11-25)
// and per-request `_meta` (2026-07-28, where the SDK adds resultType and its serverInfo).
func TestFastPathAnswersAsTheSDKPath(t *testing.T) {
	for _, tc := range []struct{ name, meta string }{
		{"2025-11-25", ""},
		{"2026-07-28", `"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := memoryStdio(t)
			l := newStdioLines(t, p)
			metaWith := func(extra string) string {
				switch {
				case tc.meta == "" && extra == "":
					return ""
				case tc.meta == "":
					return `,"_meta":{` + extra + `}`
				case extra == "":
					return `,"_meta":{` + tc.meta + `}`
				}
				return `,"_meta":{` + tc.meta + `,` + extra + `}`
			}
			if tc.meta == "" {
				l.call(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
				if _, err := io.WriteString(p.in, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n"); err != nil {
					t.Fatal(err)
				}
			}
			// The SDK serves this one: it initializes the session of a per-request client.
			l.call(`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{` + trimComma(metaWith("")) + `}}`)
			for _, tool := range []struct{ name, args string }{
				{"memory.read_graph", `{}`},
				{"memory.search_nodes", `{"query":"svc-a"}`},
			} {
				fast := l.call(`{"jsonrpc":"2.0","id":"f-` + tool.name + `","method":"tools/call","params":{"name":"` + tool.name + `","arguments":` + tool.args + metaWith("") + `}}`)
				sdk := l.call(`{"jsonrpc":"2.0","id":"s-` + tool.name + `","method":"tools/call","params":{"name":"` + tool.name + `","arguments":` + tool.args + metaWith(`"progressToken":"p"`) + `}}`)
				if string(fast["id"]) != `"f-`+tool.name+`"` || fast["result"] == nil {
					t.Fatalf("fast path: %v", fast)
				}
				var fr, sr map[string]any
				if err := json.Unmarshal(fast["result"], &fr); err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(sdk["result"], &sr); err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(fr, sr) {
					t.Errorf("%s: the fast path answered\n %s\nthe SDK's path\n %s", tool.name, fast["result"], sdk["result"])
				}
				if tc.meta != "" && fr["resultType"] != "complete" {
					t.Errorf("%s at 2026-07-28: resultType %v, want complete", tool.name, fr["resultType"])
				}
			}
			_, recs := onlyRun(t, p.st)
			for _, tool := range []string{"memory.read_graph", "memory.search_nodes"} {
				steps := stepsOf(recs, tool)
				if len(steps) != 2 || steps[0][1].Status != "succeeded" || steps[1][1].Status != "succeeded" {
					t.Errorf("%s: want two steps, each with an intent and a succeeded outcome: %+v", tool, steps)
				}
			}
		})
	}
}

func trimComma(s string) string {
	if len(s) > 0 && s[0] == ',' {
		return s[1:]
	}
	return s
}

// The fast path takes a plain call of an upstream tool on an initialized session, and leaves
// every other request to the SDK, which serves (or refuses) it as before.
func TestFastPathTakesOnlyPlainCalls(t *testing.T) {
	p := memoryStdio(t)
	l := newStdioLines(t, p)
	l.call(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	var ss *mcp.ServerSession
	for s := range p.gw.server.Sessions() {
		ss = s
	}
	if ss == nil {
		t.Fatal("no session")
	}
	newProto := `"io.modelcontextprotocol/protocolVersion":"2026-07-28"`
	for _, tc := range []struct {
		params      string
		take, newer bool
	}{
		{`{"name":"memory.read_graph","arguments":{}}`, true, false},
		{`{"name":"memory.read_graph"}`, true, false},
		{`{"name":"memory.read_graph","_meta":{"reversi/reason":"why"}}`, true, false},
		{`{"name":"memory.read_graph","_meta":{` + newProto + `,"io.modelcontextprotocol/clientCapabilities":{}}}`, true, true},
		{`{"name":"memory.read_graph","_meta":{"progressToken":1}}`, false, false},
		{`{"name":"reversi.list_runs","arguments":{}}`, false, false},
		{`{"name":"memory.nope","arguments":{}}`, false, false},
		{`{"Name":"memory.read_graph","arguments":{}}`, false, false}, // the SDK reads no name
		{`{"name":"memory.read_graph","inputResponses":{"a":{}}}`, false, false},
		{`{"name":"memory.read_graph","requestState":"s"}`, false, false},
		{`{"name":"memory.read_graph","_meta":{` + newProto + `}}`, false, false}, // no capabilities: the SDK refuses
		{`{"name":"memory.read_graph","_meta":{"io.modelcontextprotocol/protocolVersion":"2027-01-01","io.modelcontextprotocol/clientCapabilities":{}}}`, false, false},
		{`{"name":"memory.read_graph","_meta":{` + newProto + `,"io.modelcontextprotocol/clientCapabilities":5}}`, false, false},
		{`{"name":"memory.read_graph","_meta":{` + newProto + `,"io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":"x"}}`, false, false},
		{`{"name":"memory.read_graph","arguments":{}`, false, false}, // not JSON
	} {
		req, newer, ok := p.gw.fastRequest(ss, json.RawMessage(tc.params))
		if ok != tc.take || newer != tc.newer {
			t.Errorf("%s: fast path %v (per-request protocol %v), want %v (%v)", tc.params, ok, newer, tc.take, tc.newer)
			continue
		}
		if ok && (req.Session != ss || req.Params.Name != "memory.read_graph") {
			t.Errorf("%s: request %+v", tc.params, req.Params)
		}
		if ok && req.Params.Meta[protocolMetaPrefix+"protocolVersion"] != nil {
			t.Errorf("%s: the agent's protocol keys are not for the upstream: %v", tc.params, req.Params.Meta)
		}
	}

	// A session that has not initialized: the SDK answers (with its error).
	st, ct := mcp.NewInMemoryTransports()
	fresh, err := p.gw.server.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	_ = ct
	if _, _, ok := p.gw.fastRequest(fresh, json.RawMessage(`{"name":"memory.read_graph","arguments":{}}`)); ok {
		t.Error("a call on a session that has not initialized took the fast path")
	}
}

// A raw call's params are what the SDK's client writes for the same call (as JSON values),
// on one line.
func TestRawToolParamsAsTheSDKWritesThem(t *testing.T) {
	for _, tc := range []struct {
		args json.RawMessage
		meta mcp.Meta
	}{
		{nil, nil},
		{json.RawMessage(`{}`), nil},
		{json.RawMessage("{\n  \"query\": \"a\\nb\",\r\n  \"n\": [1, 2]\n}"), mcp.Meta{"progressToken": "reversi-x", "trace/id": map[string]any{"a": 1.0}}},
		{json.RawMessage(`null`), mcp.Meta{}},
	} {
		got, err := rawToolParams("read_graph", tc.args, tc.meta)
		if err != nil {
			t.Fatal(err)
		}
		p := &mcp.CallToolParams{Name: "read_graph", Meta: tc.meta}
		if len(tc.args) > 0 {
			p.Arguments = tc.args
		}
		want, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("%s: %v", got, err)
		}
		_ = json.Unmarshal(want, &w)
		if !reflect.DeepEqual(g, w) {
			t.Errorf("raw params %s, the SDK's %s", got, want)
		}
		if bytes.ContainsAny(got, "\r\n") {
			t.Errorf("raw params span lines: %q", got)
		}
	}
}

// httpMemory serves a gateway in front of server-memory (two entities) on a loopback listener
// and returns its agent endpoint's URL.
func httpMemory(t *testing.T) (*fixture, string) {
	t.Helper()
	mem := filepath.Join(t.TempDir(), "memory.jsonl")
	// svc-a's long observation makes a result larger than net/http's buffer before it chunks.
	graph := `{"type":"entity","name":"svc-b","entityType":"service","observations":["zeta","alpha"]}
{"type":"entity","name":"svc-a","entityType":"service","observations":["port 80","` + strings.Repeat("runbook line. ", 400) + `"]}
`
	if err := os.WriteFile(mem, []byte(graph), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := memoryConfig(t, config.ModeObserve)
	cfg.Upstreams[0].Env = map[string]string{"MEMORY_FILE_PATH": mem}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen = &config.Listen{Host: "127.0.0.1", Port: ln.Addr().(*net.TCPAddr).Port}
	f := start(t, cfg, nil)
	return f, serveOn(t, f.gw, ln) + PathAgent
}

// httpSession initializes a session at url (2025-06-18) and returns its id.
func httpSession(t *testing.T, url string) string {
	t.Helper()
	res := post(t, url, initBody)
	sid := res.Header.Get("Mcp-Session-Id")
	if res.StatusCode != 200 || sid == "" {
		t.Fatalf("initialize: %d %s", res.StatusCode, readBody(t, res))
	}
	if res := post(t, url, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-06-18"); res.StatusCode != 202 {
		t.Fatalf("initialized: %d", res.StatusCode)
	}
	return sid
}

// rpcResult is the result of the JSON-RPC response in body, a JSON body or an event stream.
func rpcResult(t *testing.T, body string) map[string]any {
	t.Helper()
	if i := strings.Index(body, "data: "); i >= 0 {
		body = strings.TrimSpace(strings.SplitN(body[i+len("data: "):], "\n", 2)[0])
	}
	var m struct {
		Result map[string]any `json:"result"`
	}
	if err := json.Unmarshal([]byte(body), &m); err != nil || m.Result == nil {
		t.Fatalf("not a JSON-RPC result: %v: %q", err, body)
	}
	return m.Result
}

// Over Streamable HTTP, a call the fast path serves (a JSON body) gets the result the SDK's
// path gives (an event stream, for a call with a progress token); POSTs the SDK's handler
// refuses are still refused by it, whatever they carry.
func TestFastPathHTTP(t *testing.T) {
	f, url := httpMemory(t)
	sid := httpSession(t, url)
	callBody := func(id, meta string) string {
		return `{"jsonrpc":"2.0","id":"` + id + `","method":"tools/call","params":{"name":"memory.search_nodes","arguments":{"query":"svc-a"}` + meta + `}}`
	}
	hdr := []string{"Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-06-18"}
	fast := post(t, url, callBody("f", ""), hdr...)
	fastBody := readBody(t, fast)
	if fast.StatusCode != 200 || fast.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("the fast path: %d %s %s", fast.StatusCode, fast.Header.Get("Content-Type"), fastBody)
	}
	if fast.ContentLength != int64(len(fastBody)) || len(fast.TransferEncoding) > 0 { // its length is known: not chunked
		t.Errorf("the fast path's body: Content-Length %d, Transfer-Encoding %v, for %d bytes", fast.ContentLength, fast.TransferEncoding, len(fastBody))
	}
	sdk := post(t, url, callBody("s", `,"_meta":{"progressToken":"p"}`), hdr...)
	sdkBody := readBody(t, sdk)
	if sdk.StatusCode != 200 || sdk.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("the SDK's path: %d %s %s", sdk.StatusCode, sdk.Header.Get("Content-Type"), sdkBody)
	}
	if fr, sr := rpcResult(t, fastBody), rpcResult(t, sdkBody); !reflect.DeepEqual(fr, sr) {
		t.Errorf("the fast path answered\n %s\nthe SDK's path\n %s", fastBody, sdkBody)
	}

	// What the SDK's handler refuses stays refused, with the SDK's status.
	for _, tc := range []struct {
		name    string
		headers []string
		want    int
	}{
		{"another session", []string{"Mcp-Session-Id", "nope", "Mcp-Protocol-Version", "2025-06-18"}, 404},
		{"an unknown protocol version", []string{"Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2099-01-01"}, 400},
		{"a content type that is not JSON", []string{"Mcp-Session-Id", sid, "Content-Type", "text/plain"}, 415},
		{"an Accept without event streams", []string{"Mcp-Session-Id", sid, "Accept", "application/json"}, 400},
	} {
		res := post(t, url, callBody("x", ""), tc.headers...)
		if body := readBody(t, res); res.StatusCode != tc.want {
			t.Errorf("%s: %d, want %d: %s", tc.name, res.StatusCode, tc.want, body)
		}
	}
	_, recs := onlyRun(t, f.store)
	if steps := stepsOf(recs, "memory.search_nodes"); len(steps) != 2 {
		t.Errorf("want the two calls journaled, each with its outcome: %+v", steps)
	}
}
