package gateway

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	mcpgoclient "github.com/mark3labs/mcp-go/client"
	mcpgotransport "github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// Third-party clients (issue 19): mark3labs/mcp-go v1.2.1 (a Go client of another
// implementation, which probes server/discover at 2026-07-28 first) and go-sdk's own client
// list and call tools through the `reversi gateway` process over Streamable HTTP and over
// stdio, with no protocol version pinned. Over HTTP (stateful) both settle on 2025-11-25, the
// newest version initialize negotiates; over stdio on 2026-07-28 (SEP-2575, no initialize).

// memoryGateway writes a gateway.yaml fronting server-memory as "mem" (observe: no manifests)
// with listen when port is not 0, and returns its path and the data folder of its ledger.
func memoryGateway(t *testing.T, port int) (cfg, data string) {
	t.Helper()
	dir := t.TempDir()
	node, args, env := upstreams.MemoryAt(t, filepath.Join(dir, "graph.jsonl"))
	body := "mode: observe\nactor: clients\n"
	if port != 0 {
		body += fmt.Sprintf("listen: {host: 127.0.0.1, port: %d}\n", port)
	}
	body += "upstreams:\n" + upstreamYAML("mem", node, args, env)
	return writeFile(t, dir, "gateway.yaml", body), filepath.Join(dir, "data")
}

// goClientRoundTrip lists the tools through a connected mcp-go client, creates entity name and
// reads it back; it returns the protocol version the client settled on.
func goClientRoundTrip(t *testing.T, c *mcpgoclient.Client, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ir, err := c.Initialize(ctx, mcpgo.InitializeRequest{Params: mcpgo.InitializeParams{
		ClientInfo: mcpgo.Implementation{Name: "mcp-go", Version: "1.2.1"}}})
	if err != nil {
		t.Fatalf("mcp-go initialize: %v", err)
	}
	lt, err := c.ListTools(ctx, mcpgo.ListToolsRequest{})
	if err != nil {
		t.Fatalf("mcp-go tools/list at %s: %v", ir.ProtocolVersion, err)
	}
	var names []string
	for _, tool := range lt.Tools {
		names = append(names, tool.Name)
	}
	for _, want := range []string{"mem.create_entities", "mem.read_graph", "reversi.list_runs"} {
		if !slices.Contains(names, want) {
			t.Errorf("mcp-go tools/list at %s: %v lacks %s", ir.ProtocolVersion, names, want)
		}
	}
	texts := func(tool string, args map[string]any) string {
		res, err := c.CallTool(ctx, mcpgo.CallToolRequest{Params: mcpgo.CallToolParams{Name: tool, Arguments: args}})
		if err != nil {
			t.Fatalf("mcp-go tools/call %s at %s: %v", tool, ir.ProtocolVersion, err)
		}
		var parts []string
		for _, ct := range res.Content {
			parts = append(parts, mcpgo.GetTextFromContent(ct))
		}
		if res.IsError {
			t.Fatalf("mcp-go tools/call %s at %s: isError: %v", tool, ir.ProtocolVersion, parts)
		}
		return strings.Join(parts, "\n")
	}
	texts("mem.create_entities", map[string]any{"entities": []any{map[string]any{"name": name, "entityType": "client", "observations": []any{}}}})
	if g := texts("mem.read_graph", map[string]any{}); !strings.Contains(g, name) {
		t.Errorf("mcp-go: the graph lacks %s: %s", name, g)
	}
	return c.ProtocolVersion()
}

// sdkRoundTrip is goClientRoundTrip for a go-sdk client session.
func sdkRoundTrip(t *testing.T, cs *mcp.ClientSession, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatalf("go-sdk tools/list: %v", err)
		}
		names = append(names, tool.Name)
	}
	if !slices.Contains(names, "mem.create_entities") || !slices.Contains(names, "reversi.list_runs") {
		t.Errorf("go-sdk tools/list: %v", names)
	}
	if res := call(t, cs, "mem.create_entities", map[string]any{"entities": []any{map[string]any{"name": name, "entityType": "client", "observations": []any{}}}}); res.IsError {
		t.Fatalf("go-sdk create_entities: %+v", res.Content)
	}
	res := call(t, cs, "mem.read_graph", map[string]any{})
	if tc, ok := res.Content[0].(*mcp.TextContent); res.IsError || !ok || !strings.Contains(tc.Text, name) {
		t.Errorf("go-sdk: the graph lacks %s: %+v", name, res.Content)
	}
	return cs.InitializeResult().ProtocolVersion
}

// succeededCalls counts the succeeded mem.create_entities outcomes in the ledger in data.
func succeededCalls(t *testing.T, data string) int {
	n := 0
	for _, o := range outcomes(records(t, openLedger(t, data)), "mem.create_entities") {
		if o.Status == store.Succeeded {
			n++
		}
	}
	return n
}

func TestThirdPartyClients(t *testing.T) {
	t.Run("http", func(t *testing.T) {
		cfg, data := memoryGateway(t, freePort(t))
		url, _ := startHTTP(t, bins.reversi, "gateway", "--config", cfg, "--store", "sqlite", "--data", data)

		c, err := mcpgoclient.NewStreamableHttpClient(url)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if v := goClientRoundTrip(t, c, "mcp-go-http"); v != "2025-11-25" {
			t.Errorf("mcp-go over HTTP settled on %s, want 2025-11-25", v)
		}

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "go-sdk", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		if v := sdkRoundTrip(t, cs, "go-sdk-http"); v != "2025-11-25" {
			t.Errorf("go-sdk over HTTP settled on %s, want 2025-11-25", v)
		}
		if n := succeededCalls(t, data); n != 2 {
			t.Errorf("the ledger holds %d succeeded mem.create_entities, want 2", n)
		}
	})

	t.Run("stdio", func(t *testing.T) {
		// One gateway process per client: a stdio gateway is one session.
		cfg, data := memoryGateway(t, 0)
		dir := t.TempDir() // no reversi.config.yaml or ./manifests to find
		inDir := mcpgotransport.WithCommandFunc(func(ctx context.Context, command string, env []string, args []string) (*exec.Cmd, error) {
			cmd := exec.CommandContext(ctx, command, args...)
			cmd.Dir, cmd.Env = dir, env
			return cmd, nil
		})
		c, err := mcpgoclient.NewStdioMCPClientWithOptions(bins.reversi, env(),
			[]string{"gateway", "--config", cfg, "--store", "sqlite", "--data", data}, inDir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if v := goClientRoundTrip(t, c, "mcp-go-stdio"); v != "2026-07-28" {
			t.Errorf("mcp-go over stdio settled on %s, want 2026-07-28", v)
		}
		if n := succeededCalls(t, data); n != 1 {
			t.Errorf("the ledger of mcp-go's gateway holds %d succeeded mem.create_entities, want 1", n)
		}

		cfg, data = memoryGateway(t, 0)
		p := startStdio(t, bins.reversi, "gateway", "--config", cfg, "--store", "sqlite", "--data", data)
		if v := sdkRoundTrip(t, p.cs, "go-sdk-stdio"); v != "2026-07-28" {
			t.Errorf("go-sdk over stdio settled on %s, want 2026-07-28", v)
		}
		if n := succeededCalls(t, data); n != 1 {
			t.Errorf("the ledger of go-sdk's gateway holds %d succeeded mem.create_entities, want 1", n)
		}
	})
}
