package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
)

// Protocol versions (issue 19, protocol.go): every version go-sdk speaks is negotiated with raw
// JSON-RPC messages against the gateway in front of the real server-memory, and server/discover
// lists exactly the versions the session then accepts.

// rpcReply is a JSON-RPC response as the tests read it.
type rpcReply struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

// httpReply decodes the JSON-RPC response of a Streamable HTTP POST, sent as JSON or as the
// data of one SSE event.
func httpReply(t *testing.T, res *http.Response) rpcReply {
	t.Helper()
	body := readBody(t, res)
	if strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		var data []string
		for line := range strings.SplitSeq(body, "\n") {
			if d, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), "data: "); ok {
				data = append(data, d)
			}
		}
		body = strings.Join(data, "\n")
	}
	var r rpcReply
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("HTTP %d: not a JSON-RPC response: %v: %q", res.StatusCode, err, body)
	}
	return r
}

// newProtocolMeta is the `_meta` of a 2026-07-28 request (SEP-2575: version, client, capabilities).
func newProtocolMeta(version string) string {
	return fmt.Sprintf(`{"io.modelcontextprotocol/protocolVersion":%q,"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`, version)
}

const (
	latestVersion = "2026-07-28" // the SDK's newest; no initialize (SEP-2575)
	handshakeMax  = "2025-11-25" // the newest version initialize negotiates
)

// callReadGraph checks that a tools/call of memory.read_graph reply is the upstream's graph.
func callReadGraph(t *testing.T, version string, r rpcReply) {
	t.Helper()
	var res mcp.CallToolResult
	if r.Error != nil || json.Unmarshal(r.Result, &res) != nil || res.IsError || len(res.Content) == 0 {
		t.Fatalf("%s: tools/call memory.read_graph: %s %+v", version, r.Result, r.Error)
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); !ok || !strings.Contains(tc.Text, `"entities"`) {
		t.Fatalf("%s: tools/call memory.read_graph: %s", version, r.Result)
	}
}

// unsupported decodes a -32022 reply's data.
func unsupported(t *testing.T, r rpcReply) mcp.UnsupportedProtocolVersionData {
	t.Helper()
	var d mcp.UnsupportedProtocolVersionData
	if r.Error == nil || r.Error.Code != mcp.CodeUnsupportedProtocolVersion || json.Unmarshal(r.Error.Data, &d) != nil {
		t.Fatalf("want error %d with data {supported, requested}, got result %s error %+v", mcp.CodeUnsupportedProtocolVersion, r.Result, r.Error)
	}
	return d
}

// TestProtocolVersionsAgree: over Streamable HTTP (stateful: one session per run) initialize
// with each of mcp.SupportedProtocolVersions() negotiates that version, or 2025-11-25 for
// 2026-07-28, which initialize cannot negotiate, and a tools/call then works; server/discover at
// 2026-07-28 is -32022 listing exactly the versions initialize accepted (the SDK alone answered
// it with a success, which mark3labs/mcp-go took as 2026-07-28 accepted). Over stdio, discover
// at 2026-07-28 succeeds and lists every version: 2026-07-28 by a sessionless tools/call, the
// others by initialize.
func TestProtocolVersionsAgree(t *testing.T) {
	f := start(t, memoryConfig(t, config.ModeObserve), nil)
	versions := mcp.SupportedProtocolVersions()
	if !slices.Contains(versions, latestVersion) || !slices.Contains(versions, handshakeMax) {
		t.Fatalf("go-sdk speaks %v; this test expects %s and %s among them", versions, latestVersion, handshakeMax)
	}

	t.Run("http", func(t *testing.T) {
		url := serveHTTP(t, f.gw) + PathAgent
		var accepted []string
		for _, v := range versions {
			init := fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, v)
			res := post(t, url, init)
			sid := res.Header.Get("Mcp-Session-Id")
			r := httpReply(t, res)
			var ir mcp.InitializeResult
			if r.Error != nil || json.Unmarshal(r.Result, &ir) != nil || sid == "" {
				t.Fatalf("%s: initialize: %s %+v (session %q)", v, r.Result, r.Error, sid)
			}
			want := v
			if v >= latestVersion {
				want = handshakeMax
			}
			if ir.ProtocolVersion != want {
				t.Errorf("initialize at %s negotiated %s, want %s", v, ir.ProtocolVersion, want)
			}
			if ir.ProtocolVersion == v {
				accepted = append(accepted, v)
			}
			hdr := []string{"Mcp-Session-Id", sid, "Mcp-Protocol-Version", ir.ProtocolVersion}
			if res := post(t, url, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr...); res.StatusCode != http.StatusAccepted {
				t.Fatalf("%s: initialized: %d %s", v, res.StatusCode, readBody(t, res))
			}
			callReadGraph(t, v, httpReply(t, post(t, url, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"memory.read_graph","arguments":{}}}`, hdr...)))
		}
		disc := fmt.Sprintf(`{"jsonrpc":"2.0","id":3,"method":"server/discover","params":{"_meta":%s}}`, newProtocolMeta(latestVersion))
		res := post(t, url, disc, "Mcp-Protocol-Version", latestVersion, "Mcp-Method", "server/discover") // SEP-2243 headers
		d := unsupported(t, httpReply(t, res))
		if !slices.Equal(d.Supported, accepted) || d.Requested != latestVersion {
			t.Errorf("discover at %s: supported %v requested %q; initialize accepted %v", latestVersion, d.Supported, d.Requested, accepted)
		}
		if res.Header.Get("Mcp-Session-Id") != "" {
			t.Errorf("the refused discover opened a session: %s", res.Header.Get("Mcp-Session-Id"))
		}
	})

	t.Run("stdio", func(t *testing.T) {
		// One stdio session per version, each through the gateway's own stdio path (line filter).
		session := func(t *testing.T) (send func(string), recv func(id int) rpcReply) {
			ctx, cancel := context.WithCancel(context.Background())
			inR, inW := io.Pipe()
			outR, outW := io.Pipe()
			done := make(chan struct{})
			go func() { _ = f.gw.serveStdio(ctx, inR, outW); _ = outW.Close(); close(done) }()
			t.Cleanup(func() { _ = inW.Close(); cancel(); <-done })
			sc := bufio.NewScanner(outR)
			sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
			send = func(line string) {
				if _, err := io.WriteString(inW, line+"\n"); err != nil {
					t.Fatal(err)
				}
			}
			recv = func(id int) rpcReply {
				deadline := time.AfterFunc(10*time.Second, func() { _ = outR.Close() })
				defer deadline.Stop()
				for sc.Scan() {
					var r rpcReply
					if json.Unmarshal(sc.Bytes(), &r) == nil && string(r.ID) == fmt.Sprint(id) {
						return r
					}
				}
				t.Fatalf("no reply %d on stdio: %v", id, sc.Err())
				return rpcReply{}
			}
			return send, recv
		}
		var discovered mcp.DiscoverResult
		send, recv := session(t)
		send(fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":%s}}`, newProtocolMeta(latestVersion)))
		if r := recv(1); r.Error != nil || json.Unmarshal(r.Result, &discovered) != nil {
			t.Fatalf("discover at %s over stdio: %s %+v", latestVersion, r.Result, r.Error)
		}
		if !slices.Equal(discovered.SupportedVersions, versions) {
			t.Errorf("discover over stdio lists %v, want every version %v", discovered.SupportedVersions, versions)
		}
		send(fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"memory.read_graph","arguments":{},"_meta":%s}}`, newProtocolMeta(latestVersion)))
		callReadGraph(t, latestVersion, recv(2))
		for _, v := range versions {
			if v >= latestVersion {
				continue
			}
			send, recv := session(t)
			send(fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`, v))
			var ir mcp.InitializeResult
			if r := recv(1); r.Error != nil || json.Unmarshal(r.Result, &ir) != nil || ir.ProtocolVersion != v {
				t.Fatalf("initialize at %s over stdio: %s %+v", v, r.Result, r.Error)
			}
			send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
			send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"memory.read_graph","arguments":{}}}`)
			callReadGraph(t, v, recv(2))
		}
	})
}
