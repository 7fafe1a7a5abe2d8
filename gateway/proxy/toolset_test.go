package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/engine"
)

// goUpstream is an MCP server of the go-sdk served over Streamable HTTP on loopback, whose
// tool list the test changes while the gateway runs (the npm servers' lists are fixed).
type goUpstream struct {
	server *mcp.Server
	url    string
}

func newGoUpstream(t *testing.T, pageSize int, notify bool, tools ...string) *goUpstream {
	t.Helper()
	caps := &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: notify}}
	s := mcp.NewServer(&mcp.Implementation{Name: "go-upstream", Version: "1"}, &mcp.ServerOptions{PageSize: pageSize, Capabilities: caps})
	u := &goUpstream{server: s}
	for _, name := range tools {
		u.add(name)
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	u.url = srv.URL
	return u
}

func (u *goUpstream) add(name string) {
	u.server.AddTool(&mcp.Tool{Name: name, Description: "echo " + name, InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "hello from " + name}}}, nil
		})
}

func goUpstreamConfig(u *goUpstream) *config.Gateway {
	return &config.Gateway{Mode: config.ModeObserve, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
		Actor: "dev-laptop", Upstreams: []config.Upstream{{Name: "up", URL: u.url, Namespace: true}}}
}

// listAll lists every tool of cs, page by page, and returns the upstream tools' names (not the
// gateway's own reversi.* tools) and the page count.
func listAll(t *testing.T, cs *mcp.ClientSession) ([]string, int) {
	t.Helper()
	var names []string
	pages := 0
	params := &mcp.ListToolsParams{}
	for {
		res, err := cs.ListTools(context.Background(), params)
		if err != nil {
			t.Fatalf("tools/list: %v", err)
		}
		pages++
		for _, tl := range res.Tools {
			if !isAgentTool(tl.Name) {
				names = append(names, tl.Name)
			}
		}
		if res.NextCursor == "" {
			return names, pages
		}
		params = &mcp.ListToolsParams{Cursor: res.NextCursor}
	}
}

// TestToolListPaginationAndListChanged: the gateway reads every page of an upstream that
// paginates, pages its own tools/list, and follows an upstream's list_changed at once,
// telling its own clients.
func TestToolListPaginationAndListChanged(t *testing.T) {
	up := newGoUpstream(t, 2, true, "t1", "t2", "t3", "t4", "t5")
	f := startWith(t, goUpstreamConfig(up), Options{PageSize: 2})
	changed := make(chan struct{}, 16)
	ct, stt := mcp.NewInMemoryTransports()
	if _, err := f.gw.Server().Connect(context.Background(), stt, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
	}).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })

	names, pages := listAll(t, cs)
	want := []string{"up.t1", "up.t2", "up.t3", "up.t4", "up.t5"}
	if !slices.Equal(names, want) || pages != 7 {
		t.Fatalf("tools %v in %d pages, want %v in 7 pages of 2 (with the 8 reversi.* tools)", names, pages, want)
	}

	up.add("t6")
	select {
	case <-changed:
	case <-time.After(15 * time.Second):
		t.Fatal("the gateway's client got no notifications/tools/list_changed after the upstream added a tool")
	}
	deadline := time.Now().Add(15 * time.Second)
	for names, _ = listAll(t, cs); !slices.Contains(names, "up.t6"); names, _ = listAll(t, cs) {
		if time.Now().After(deadline) {
			t.Fatalf("up.t6 not listed after list_changed: %v", names)
		}
		time.Sleep(20 * time.Millisecond)
	}
	res := call(t, cs, "up.t6", map[string]any{})
	if res.IsError || texts(res)[0] != "hello from t6" {
		t.Fatalf("call of the new tool: %v", texts(res))
	}
	if c := f.gw.Engine().Classify(); len(c.Tools) != 6 {
		t.Fatalf("the engine classifies %d tools after the refresh, want 6", len(c.Tools))
	}

	up.server.RemoveTools("t1")
	deadline = time.Now().Add(15 * time.Second)
	for names, _ = listAll(t, cs); slices.Contains(names, "up.t1"); names, _ = listAll(t, cs) {
		if time.Now().After(deadline) {
			t.Fatalf("up.t1 still listed after the upstream removed it: %v", names)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if res, err := cs.CallTool(context.Background(), mcpCall("up.t1")); !refusedUnknown(res, err, "up.t1") {
		t.Fatalf("calling a removed tool: %v %v, want unknown tool", res, err)
	}
}

// TestToolListCache: without list_changed notifications, the gateway re-lists its upstreams
// only once the cached list is older than ListCacheTTL.
func TestToolListCache(t *testing.T) {
	up := newGoUpstream(t, 0, false, "a")
	f := startWith(t, goUpstreamConfig(up), Options{})
	cs := f.client(t)
	up.add("b")
	if names, _ := listAll(t, cs); !slices.Equal(names, []string{"up.a"}) {
		t.Fatalf("within the cache TTL the list changed: %v", names)
	}
	f.gw.stateMu.Lock()
	f.gw.listedAt = time.Now().Add(-ListCacheTTL - time.Second)
	f.gw.stateMu.Unlock()
	if names, _ := listAll(t, cs); !slices.Equal(names, []string{"up.a", "up.b"}) {
		t.Fatalf("after the cache TTL the list is %v, want up.a and up.b", names)
	}
	if f.gw.listStale() {
		t.Fatal("the refresh did not renew the cache")
	}
}

// TestToolListClashOnRefreshKeepsTools: a refresh that would expose one name twice is refused
// and journaled; the tools in use keep serving.
func TestToolListClashOnRefreshKeepsTools(t *testing.T) {
	a := newGoUpstream(t, 0, true, "x")
	b := newGoUpstream(t, 0, true, "y")
	cfg := goUpstreamConfig(a)
	cfg.Upstreams = []config.Upstream{{Name: "a", URL: a.url}, {Name: "b", URL: b.url}}
	f := startWith(t, cfg, Options{})
	cs := f.client(t)
	b.add("x")
	deadline := time.Now().Add(15 * time.Second)
	for {
		notes := gatewayRecords(t, f.store, "note")
		if len(notes) > 0 {
			if want := "tool name clash: x is exposed by upstreams a and b"; !strings.Contains(notes[0].Note, want) {
				t.Fatalf("note %q, want it to contain %q", notes[0].Note, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no journaled note about the clash")
		}
		time.Sleep(20 * time.Millisecond)
	}
	res := call(t, cs, "x", map[string]any{})
	if res.IsError || texts(res)[0] != "hello from x" {
		t.Fatalf("x after the refused refresh: %v", texts(res))
	}
	if names, _ := listAll(t, cs); !slices.Equal(names, []string{"x", "y"}) {
		t.Fatalf("tools after the refused refresh: %v", names)
	}
}

// refusedUnknown reports whether a tools/call was answered as a call of an unknown tool: an
// isError result naming it (issue 19: as the TypeScript SDK's servers answer).
func refusedUnknown(res *mcp.CallToolResult, err error, name string) bool {
	if err != nil || res == nil || !res.IsError || len(res.Content) != 1 {
		return false
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	return ok && tc.Text == engine.BlockedPrefix+fmt.Sprintf("unknown tool %q", name)
}
