package redteam

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/syncbuf"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// TestHostilePeers (issue 18), the `reversi gateway` process over HTTP on 127.0.0.1 in front of
// the hostile server, attacked from both sides: an upstream's 20 MiB answer fails only the call
// it answers while another session's call completes; a client's 3 MiB JSON-RPC batch is refused
// before it is decoded; a principal cannot open sessions without bound. After each attack the
// gateway serves an honest call, and its journal passes integrity_check. The in-process suites
// (gateway/proxy TestHostile*) cover every limit one by one.
func TestHostilePeers(t *testing.T) {
	hostile := upstreams.Hostile(t)
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cfg := fmt.Sprintf("listen: {host: 127.0.0.1, port: %d}\ncall_timeout: 5s\nlimits: {sessions_per_principal: 4}\nupstreams:\n- name: h\n  command: %s\n", port, strconv.Quote(hostile))
	if err := os.WriteFile(filepath.Join(dir, "gateway.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	var stderr syncbuf.Buffer
	cmd := exec.Command(reversiBin, "gateway", "--config", filepath.Join(dir, "gateway.yaml"), "--store", "sqlite", "--data", data)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	endpoint := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stderr.String(), "listening on") {
		if time.Now().After(deadline) {
			t.Fatalf("the gateway did not listen within 30s:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	connect := func(t *testing.T) (*mcp.ClientSession, error) {
		c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		return c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint}, nil)
	}
	echo := func(t *testing.T, cs *mcp.ClientSession, text string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "h.echo", Arguments: map[string]any{"text": text}})
		if err != nil || res.IsError || len(res.Content) == 0 || res.Content[0].(*mcp.TextContent).Text != text {
			t.Fatalf("the honest call after the attack: %v %+v", err, res)
		}
	}
	honest, err := connect(t)
	if err != nil {
		t.Fatal(err)
	}
	defer honest.Close()

	t.Run("UpstreamAnswerOverMessageBytes", func(t *testing.T) {
		attacker, err := connect(t)
		if err != nil {
			t.Fatal(err)
		}
		defer attacker.Close()
		var wg sync.WaitGroup
		var big *mcp.CallToolResult
		var bigErr error
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			big, bigErr = attacker.CallTool(ctx, &mcp.CallToolParams{Name: "h.big", Arguments: map[string]any{"bytes": 20 << 20}})
		}()
		echo(t, honest, "while the other session's answer is 20 MiB")
		wg.Wait()
		if bigErr != nil || !big.IsError || !strings.Contains(big.Content[0].(*mcp.TextContent).Text, "limits.message_bytes") {
			t.Fatalf("the 20 MiB answer: %v %+v, want an error naming limits.message_bytes", bigErr, big)
		}
		echo(t, attacker, "the attacker's session serves on")
	})

	t.Run("ClientBatch", func(t *testing.T) {
		post := func(body []byte, session string) *http.Response {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, endpoint, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if session != "" {
				req.Header.Set("Mcp-Session-Id", session)
			}
			resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			return resp
		}
		// A session of protocol 2025-03-26, the last one with batches, and no protocol header
		// after initialize: go-sdk decodes a batch in such a session whole before answering.
		init := post([]byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"batcher","version":"1"}}}`), "")
		session := init.Header.Get("Mcp-Session-Id")
		if init.StatusCode != http.StatusOK || session == "" {
			t.Fatalf("initialize: HTTP %d, session %q", init.StatusCode, session)
		}
		_ = post([]byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), session)
		var body bytes.Buffer
		body.WriteByte('[')
		for i := 0; body.Len() < 3<<20; i++ { // under request_body_bytes (4 MiB), so the batch rule decides
			if i > 0 {
				body.WriteByte(',')
			}
			fmt.Fprintf(&body, `{"jsonrpc":"2.0","id":%d,"method":"ping"}`, i+1)
		}
		body.WriteByte(']')
		if resp := post(body.Bytes(), session); resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("a 3 MiB batch: HTTP %d, want 400 (limits.batch_size is 0)", resp.StatusCode)
		}
		echo(t, honest, "after the batch")
		del, _ := http.NewRequestWithContext(t.Context(), http.MethodDelete, endpoint, nil)
		del.Header.Set("Mcp-Session-Id", session)
		if resp, err := http.DefaultClient.Do(del); err == nil {
			_ = resp.Body.Close()
		}
	})

	t.Run("SessionsPerPrincipal", func(t *testing.T) {
		var open []*mcp.ClientSession
		defer func() {
			for _, cs := range open {
				_ = cs.Close()
			}
		}()
		var refused error
		for range 8 { // the honest session holds one of the 4
			cs, err := connect(t)
			if err != nil {
				refused = err
				break
			}
			open = append(open, cs)
		}
		if refused == nil || len(open) != 3 {
			t.Fatalf("opened %d more sessions (refused: %v), want 3 and then a refusal (limits.sessions_per_principal 4)", len(open), refused)
		}
		echo(t, honest, "after the session flood")
	})

	if err := store.CheckSQLiteIntegrity(data); err != nil {
		t.Error(err)
	}
}
