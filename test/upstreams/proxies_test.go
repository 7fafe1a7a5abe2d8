package upstreams_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/test/upstreams"
)

// TestNPMProxies: mcp-proxy and supergateway, each in front of server-memory, serve two
// go-sdk Streamable HTTP sessions on 127.0.0.1 (the server's read_graph through each), and Stop
// leaves none of their processes (supergateway's per-session servers included).
func TestNPMProxies(t *testing.T) {
	t.Parallel()
	mem := filepath.Join(t.TempDir(), "memory.jsonl")
	if err := os.WriteFile(mem, []byte(`{"type":"entity","name":"svc","entityType":"service","observations":["x"]}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, args, env := upstreams.MemoryAt(t, mem)
	for _, c := range []struct {
		name  string
		start func(string, []string, []string) (*upstreams.NPMProxy, error)
	}{{upstreams.MCPProxyPackage, upstreams.StartMCPProxy}, {upstreams.SupergatewayPackage, upstreams.StartSupergateway}} {
		t.Run(c.name, func(t *testing.T) {
			p, err := c.start(cmd, args, env)
			if err != nil {
				t.Fatal(err)
			}
			stopped := false
			t.Cleanup(func() {
				if !stopped {
					p.Stop()
				}
			})
			if !strings.HasPrefix(p.URL, "http://127.0.0.1:") {
				t.Fatalf("URL %s, want one on 127.0.0.1", p.URL)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for i := range 2 {
				client := mcp.NewClient(&mcp.Implementation{Name: "reversi-upstreams-test", Version: "v0.0.0"}, nil)
				cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: p.URL, HTTPClient: &http.Client{}}, nil)
				if err != nil {
					t.Fatalf("session %d: %v\nstderr:\n%s", i, err, p.Stderr())
				}
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read_graph", Arguments: map[string]any{}})
				if err != nil || res.IsError {
					t.Fatalf("session %d: read_graph: %v %+v\nstderr:\n%s", i, err, res, p.Stderr())
				}
				if text := res.Content[0].(*mcp.TextContent).Text; !strings.Contains(text, `"svc"`) {
					t.Fatalf("session %d: read_graph answered %.200s, want the entity svc", i, text)
				}
				defer cs.Close()
			}
			p.Stop()
			stopped = true
			if err := syscall.Kill(-p.Pid, 0); err == nil || err != syscall.ESRCH {
				t.Fatalf("after Stop, process group %d: %v, want none left (ESRCH)", p.Pid, err)
			}
		})
	}
}
