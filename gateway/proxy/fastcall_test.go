package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
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
	graph := `{"type":"entity","name":"svc-b","entityType":"service","observations":["zeta","alpha"]}
{"type":"entity","name":"svc-a","entityType":"service","observations":["port 80"]}
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
