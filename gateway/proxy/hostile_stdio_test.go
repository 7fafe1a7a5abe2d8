package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// TestHostileStdioLines: over stdio, lines that are not JSON-RPC are answered (-32700 for text
// that is not JSON, -32600 for the rest, with the line's id when it has one) and skipped, a
// batch and a line beyond limits.request_body_bytes too, and the session goes on: the next call
// works and the gateway ends only when the client closes its stdin.
func TestHostileStdioLines(t *testing.T) {
	cfg := memoryConfig(t, config.ModeObserve)
	cfg.Deny = nil
	cfg.Limits = config.DefaultLimits()
	cfg.Limits.RequestBodyBytes = 64 << 10
	p := startStdio(t, cfg)
	gw, st, data, inW, outR, served := p.gw, p.st, p.data, p.in, p.out, p.served
	lines := make(chan []byte, 16)
	go func() {
		sc := bufio.NewScanner(outR)
		sc.Buffer(nil, 4*mib)
		for sc.Scan() {
			lines <- append([]byte(nil), sc.Bytes()...)
		}
		close(lines)
	}()
	send := func(s string) {
		t.Helper()
		if _, err := io.WriteString(inW, s+"\n"); err != nil {
			t.Fatalf("the gateway stopped reading: %v", err)
		}
	}
	recv := func() []byte {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				select {
				case err := <-served:
					t.Fatalf("the gateway stopped: %v", err)
				case <-time.After(time.Second):
				}
				t.Fatal("the gateway closed its stdout")
			}
			return l
		case <-time.After(10 * time.Second):
			t.Fatal("no answer within 10 s")
		}
		return nil
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"stdio","version":"1"}}}`)
	if l := recv(); !bytes.Contains(l, []byte(`"id":1,"result"`)) {
		t.Fatalf("initialize: %s", l)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	for _, tc := range []struct {
		line string
		id   any
		code int
		msg  string
	}{
		{"this is not JSON-RPC, not even JSON", nil, -32700, "Parse error"},
		{`{"jsonrpc":"2.0","id":7,"method":5}`, json.Number("7"), -32600, "Invalid Request"},
		{`{"jsonrpc":"1.0","id":"x","method":"ping"}`, "x", -32600, "Invalid Request"},
		{`[{"jsonrpc":"2.0","id":8,"method":"ping"}]`, nil, -32600, "limits.batch_size is 0"},
		{`{"jsonrpc":"2.0","id":3,"method":"ping","params":{"pad":"` + strings.Repeat("x", 100<<10) + `"}}`, nil, -32600, "limits.request_body_bytes (65536 bytes)"},
		{"\x00\x01\x02 {", nil, -32700, "Parse error"},
	} {
		send(tc.line)
		var r struct {
			ID    any `json:"id"`
			Error struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		l := recv()
		dec := json.NewDecoder(bytes.NewReader(l))
		dec.UseNumber()
		if err := dec.Decode(&r); err != nil || r.ID != tc.id || r.Error.Code != tc.code || !strings.Contains(r.Error.Message, tc.msg) {
			t.Errorf("%.50q: answered %s, want id %v, code %d, %q", tc.line, l, tc.id, tc.code, tc.msg)
		}
	}
	send(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"memory.read_graph","arguments":{}}}`)
	if l := recv(); !bytes.Contains(l, []byte(`"id":9,"result"`)) || bytes.Contains(l, []byte(`"isError":true`)) {
		t.Fatalf("the call after the bad lines: %s", l)
	}
	if got := limitHits(gw, "batch_size") + limitHits(gw, "request_body_bytes"); got != 2 {
		t.Errorf("limit hits: %v, want 2", got)
	}
	_ = inW.Close()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway did not end after its stdin closed")
	}
	_, recs := onlyRun(t, st)
	if len(stepsOf(recs, "memory.read_graph")) != 1 {
		t.Errorf("records: %+v", recs)
	}
	integrityOK(t, data)
}

// stdioGW is a gateway serving MCP over stdio on in-memory pipes, with a SQLite journal in data:
// a test writes the client's lines to in and reads the gateway's from out; served gets Serve's
// result when the client closes in.
type stdioGW struct {
	gw     *Gateway
	st     *store.SQLite
	data   string
	in     *io.PipeWriter
	out    *io.PipeReader
	served chan error
}

// startStdio builds and serves a gateway on cfg over pipes (New bounded to 30 s).
func startStdio(t *testing.T, cfg *config.Gateway) *stdioGW {
	t.Helper()
	p := &stdioGW{data: t.TempDir(), served: make(chan error, 1)}
	st, err := store.OpenSQLite(p.data, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	p.st = st
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	p.in, p.out = inW, outR
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if p.gw, err = New(ctx, Options{Config: cfg, Store: st, Stdin: inR, Stdout: outW, Stderr: &syncBuffer{}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.gw.Close() })
	go func() { p.served <- p.gw.Serve(context.Background()); _ = outW.Close() }()
	return p
}
