package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// TestStdioCancelledCallGetsNoResponse (issue 19): over stdio, a call the client cancels gets
// no response (the SDK's server would send one); the upstream is sent notifications/cancelled,
// and the next request is answered as usual.
func TestStdioCancelledCallGetsNoResponse(t *testing.T) {
	// A call without a progress token takes the fast path (fastcall.go), one with a progress
	// token the SDK's: the client sees the same either way.
	t.Run("fast path", func(t *testing.T) { stdioCancelledCall(t, "") })
	t.Run("SDK path", func(t *testing.T) { stdioCancelledCall(t, `,"_meta":{"progressToken":"p1"}`) })
}

func stdioCancelledCall(t *testing.T, meta string) {
	upCancelled, upStarted := make(chan struct{}, 1), make(chan struct{}, 1)
	s := mcp.NewServer(&mcp.Implementation{Name: "slow", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "wait", InputSchema: map[string]any{"type": "object"}}, func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		upStarted <- struct{}{}
		<-ctx.Done()
		upCancelled <- struct{}{}
		return nil, ctx.Err()
	})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)
	cfg := &config.Gateway{Mode: config.ModeObserve, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
		Actor: "dev-laptop", Upstreams: []config.Upstream{{Name: "up", URL: srv.URL, Namespace: true}}}
	p := startStdio(t, cfg)
	st, inW, outR := p.st, p.in, p.out
	ids := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			var m struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if json.Unmarshal(sc.Bytes(), &m) == nil && m.Method == "" {
				ids <- string(m.ID)
			}
		}
		close(ids)
	}()
	send := func(s string) {
		t.Helper()
		if _, err := io.WriteString(inW, s+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	first := func() string {
		t.Helper()
		select {
		case id := <-ids:
			return id
		case <-time.After(10 * time.Second):
			t.Fatal("no response within 10 s")
			return ""
		}
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	if id := first(); id != "1" {
		t.Fatalf("initialize answered as %s", id)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"up.wait","arguments":{}` + meta + `}}`)
	select { // the call is upstream
	case <-upStarted:
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not reach the upstream")
	}
	send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2,"reason":"user"}}`)
	select {
	case <-upCancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream was not sent notifications/cancelled")
	}
	send(`{"jsonrpc":"2.0","id":3,"method":"ping"}`)
	// Every response for a second after the cancel: the ping's only (the cancelled call's
	// would come whenever its handler returns, before or after it).
	var got []string
	for quiet := time.After(time.Second); ; {
		select {
		case id := <-ids:
			got = append(got, id)
			continue
		case <-quiet:
		}
		break
	}
	if strings.Join(got, ",") != "3" {
		t.Fatalf("responses after the cancel: %v, want only the ping's (3); the cancelled call 2 gets none", got)
	}
	if !strings.Contains(gatewayOrRunNotes(t, st), "cancelled") {
		t.Errorf("the cancelled call is not journaled uncertain with its cause")
	}
}

// gatewayOrRunNotes joins the notes of every run's records.
func gatewayOrRunNotes(t *testing.T, st store.Store) string {
	t.Helper()
	runs, err := st.ListRuns(context.Background(), store.RunFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var notes []string
	for _, r := range runs {
		recs, err := st.Records(context.Background(), r.ID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			notes = append(notes, rec.Note)
		}
	}
	return strings.Join(notes, "\n")
}
