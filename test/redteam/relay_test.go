package redteam

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/test/syncbuf"
)

// relayServer is a go-sdk MCP server over Streamable HTTP on 127.0.0.1 (a real server): its
// tool "work" reports progress, logs and asks its caller's client to sample, then answers with
// what was sampled; it serves res://open/a and res://secret/b, and reads any res:// URI the
// way a path-resolving server would (dot segments and percent-encoding resolved).
func relayServer(t *testing.T) string {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "relay", Version: "1"}, nil)
	s.AddTool(&mcp.Tool{Name: "work", InputSchema: map[string]any{"type": "object"}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			who := string(req.Params.Arguments)
			if tok := req.Params.GetProgressToken(); tok != nil {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Message: "progress " + who})
			}
			_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: "log " + who})
			res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 5,
				Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "sample " + who}}}})
			if err != nil {
				return nil, err
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: res.Content.(*mcp.TextContent).Text}}}, nil
		})
	read := func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "content of " + req.Params.URI}}}, nil
	}
	for _, uri := range []string{"res://open/a", "res://secret/b"} {
		s.AddResource(&mcp.Resource{URI: uri, Name: uri}, read)
	}
	s.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "res://{+path}", Name: "any"}, read)
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)
	return srv.URL
}

// relayAgent is an agent over HTTP that answers sampling with its name and keeps what reached it.
type relayAgent struct {
	name string
	cs   *mcp.ClientSession
	mu   sync.Mutex
	got  []string
}

func (a *relayAgent) note(s string) {
	a.mu.Lock()
	a.got = append(a.got, s)
	a.mu.Unlock()
}

func (a *relayAgent) seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.got)
}

// TestRelayAgentsApart (issue 19): the `reversi gateway` process over HTTP in front of an HTTP
// upstream (session: per_client by default). Two agents call the same tool at once: each gets
// only its own progress, logs and sampling request, and the upstream gets each one's answer.
// Then an agent tries to read a denied resource by other spellings of its URI (dot segments,
// percent-encoded unreserved characters, case, a deeper path): refused, while the honest read of an allowed resource works.
func TestRelayAgentsApart(t *testing.T) {
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cfg := fmt.Sprintf("listen: {host: 127.0.0.1, port: %d}\nmode: observe\ndeny: [\"res://secret/*\"]\nupstreams:\n- name: up\n  url: %s\n", port, relayServer(t))
	if err := os.WriteFile(filepath.Join(dir, "gateway.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var stderr syncbuf.Buffer
	cmd := exec.Command(reversiBin, "gateway", "--config", filepath.Join(dir, "gateway.yaml"), "--store", "sqlite", "--data", filepath.Join(dir, "data"))
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(stderr.String(), "listening on"); {
		if time.Now().After(deadline) {
			t.Fatalf("the gateway did not listen within 30s:\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	endpoint := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	connect := func(name string) *relayAgent {
		a := &relayAgent{name: name}
		c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, &mcp.ClientOptions{
			ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
				a.note(fmt.Sprintf("progress %v %s", r.Params.ProgressToken, r.Params.Message))
			},
			LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) { a.note(fmt.Sprint("log ", r.Params.Data)) },
			CreateMessageHandler: func(_ context.Context, r *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
				a.note("sampling " + r.Params.Messages[0].Content.(*mcp.TextContent).Text)
				return &mcp.CreateMessageResult{Role: "assistant", Model: name, Content: &mcp.TextContent{Text: "answer of " + name}}, nil
			},
		})
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint}, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
			t.Fatal(err)
		}
		a.cs = cs
		return a
	}
	agents := []*relayAgent{connect("alice"), connect("bob")}
	answers := make([]string, len(agents))
	var wg sync.WaitGroup
	for i, a := range agents {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			res, err := a.cs.CallTool(ctx, &mcp.CallToolParams{Name: "up.work", Arguments: map[string]any{"who": a.name},
				Meta: mcp.Meta{"progressToken": "tok-" + a.name}})
			if err != nil || len(res.Content) == 0 {
				t.Errorf("%s: %v %v", a.name, res, err)
				return
			}
			answers[i] = res.Content[0].(*mcp.TextContent).Text
		})
	}
	wg.Wait()
	for i, a := range agents {
		if answers[i] != "answer of "+a.name {
			t.Errorf("%s's call answered %q: the upstream must get this agent's own sampling answer", a.name, answers[i])
		}
		who := fmt.Sprintf(`{"who":%q}`, a.name)
		want := []string{"progress tok-" + a.name + " progress " + who, "log log " + who, "sampling sample " + who}
		var got []string
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if got = a.seen(); len(got) >= len(want) || time.Now().After(deadline) {
				break
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s received %q, want only its own %q", a.name, got, want)
		}
	}

	bob := agents[1]
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if res, err := bob.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "res://open/a"}); err != nil || res.Contents[0].Text != "content of res://open/a" {
		t.Fatalf("the honest read: %v %v", res, err)
	}
	for _, uri := range []string{"res://secret/b", "res://secret/x/../b", "res://%73ecret/b", "res://secret/%62", "RES://secret/b", "res://SECRET/b", "res://secret/sub/c", "res://secret//b", "res://secret/./b"} {
		res, err := bob.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err == nil {
			t.Errorf("read %s under deny res://secret/*: %q", uri, res.Contents[0].Text)
		} else if !strings.Contains(err.Error(), "Blocked by Reversi") {
			t.Errorf("read %s: %v, want a refusal by Reversi", uri, err)
		}
	}
}
