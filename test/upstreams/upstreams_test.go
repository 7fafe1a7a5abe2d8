package upstreams_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/test/upstreams"
)

// syncBuffer collects a server's stderr for failure messages (written by exec's copier).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// connect starts the server over stdio with the go-sdk client and closes it when the test ends.
func connect(t *testing.T, cmd string, args, env []string) (context.Context, *mcp.ClientSession, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	c := upstreams.Command(cmd, args, env)
	stderr := &syncBuffer{}
	c.Stderr = stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "reversi-upstreams-test", Version: "v0.0.0"}, nil)
	// server-everything does not exit on stdin EOF once it has asked a client that advertises
	// roots (go-sdk's default) for them; Close then waits TerminateDuration (5 s by default)
	// before SIGTERM. The other servers exit within milliseconds.
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: c, TerminateDuration: time.Second}, nil)
	if err != nil {
		t.Fatalf("connect %s %v: %v\nstderr:\n%s", cmd, args, err, stderr)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return ctx, cs, stderr
}

func toolNames(ctx context.Context, t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatalf("tools/list: %v", err)
		}
		if tool.InputSchema == nil {
			t.Errorf("tool %s has no inputSchema", tool.Name)
		}
		names = append(names, tool.Name)
	}
	return names
}

func requireTools(t *testing.T, have []string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(have, w) {
			t.Errorf("tool %q missing from tools/list %v", w, have)
		}
	}
}

func call(ctx context.Context, t *testing.T, cs *mcp.ClientSession, stderr *syncBuffer, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("tools/call %s: %v\nstderr:\n%s", name, err, stderr)
	}
	return res
}

func text(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	if len(parts) == 0 {
		t.Fatalf("result has no text content: %+v", res)
	}
	return strings.Join(parts, "\n")
}

type graph struct {
	Entities []struct {
		Name         string   `json:"name"`
		EntityType   string   `json:"entityType"`
		Observations []string `json:"observations"`
	} `json:"entities"`
	Relations []struct {
		From         string `json:"from"`
		To           string `json:"to"`
		RelationType string `json:"relationType"`
	} `json:"relations"`
}

func TestMemory(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "graph.jsonl")
	cmd, args, env := upstreams.MemoryAt(t, file)
	ctx, cs, stderr := connect(t, cmd, args, env)

	requireTools(t, toolNames(ctx, t, cs),
		"read_graph", "create_entities", "delete_entities", "create_relations", "delete_relations",
		"add_observations", "search_nodes", "open_nodes")

	var g graph
	res := call(ctx, t, cs, stderr, "read_graph", map[string]any{})
	if res.IsError {
		t.Fatalf("read_graph isError: %s", text(t, res))
	}
	if err := json.Unmarshal([]byte(text(t, res)), &g); err != nil {
		t.Fatalf("read_graph text is not a graph: %v", err)
	}
	if len(g.Entities)+len(g.Relations) != 0 {
		t.Fatalf("fresh memory file holds a graph: %+v", g)
	}

	res = call(ctx, t, cs, stderr, "create_entities", map[string]any{"entities": []any{
		map[string]any{"name": "alice", "entityType": "person", "observations": []string{"likes reversi"}},
		map[string]any{"name": "bob", "entityType": "person", "observations": []string{}},
	}})
	if res.IsError {
		t.Fatalf("create_entities isError: %s", text(t, res))
	}
	res = call(ctx, t, cs, stderr, "create_relations", map[string]any{"relations": []any{
		map[string]any{"from": "alice", "to": "bob", "relationType": "knows"},
	}})
	if res.IsError {
		t.Fatalf("create_relations isError: %s", text(t, res))
	}

	res = call(ctx, t, cs, stderr, "read_graph", map[string]any{})
	g = graph{}
	if err := json.Unmarshal([]byte(text(t, res)), &g); err != nil {
		t.Fatalf("read_graph text is not a graph: %v", err)
	}
	if len(g.Entities) != 2 || g.Entities[0].Name != "alice" || !slices.Equal(g.Entities[0].Observations, []string{"likes reversi"}) {
		t.Errorf("entities = %+v", g.Entities)
	}
	if len(g.Relations) != 1 || g.Relations[0].From != "alice" || g.Relations[0].RelationType != "knows" {
		t.Errorf("relations = %+v", g.Relations)
	}
	// The structured result carries the same graph (the gateway resolves $result from it).
	sc, err := json.Marshal(res.StructuredContent)
	if err != nil || !strings.Contains(string(sc), `"alice"`) {
		t.Errorf("structuredContent = %s (%v)", sc, err)
	}

	// The graph lives in the file given, inside the test's temp dir.
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("memory file: %v\nstderr:\n%s", err, stderr)
	}
	if !strings.Contains(string(data), `"alice"`) {
		t.Errorf("memory file does not hold the graph:\n%s", data)
	}
}

func TestMemoryTempFile(t *testing.T) {
	t.Parallel()
	_, _, env := upstreams.Memory(t)
	if len(env) != 1 || !strings.HasPrefix(env[0], "MEMORY_FILE_PATH=") {
		t.Fatalf("env = %q", env)
	}
	path := strings.TrimPrefix(env[0], "MEMORY_FILE_PATH=")
	if !filepath.IsAbs(path) || !strings.HasPrefix(path, os.TempDir()) && !strings.HasPrefix(path, filepath.Dir(t.TempDir())) {
		t.Errorf("MEMORY_FILE_PATH %q is not in the test's temp dir", path)
	}
}

func TestFilesystem(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "hello.txt"), []byte("hello, reversi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret.txt"), []byte("no"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd, args, env := upstreams.Filesystem(t, root)
	ctx, cs, stderr := connect(t, cmd, args, env)

	requireTools(t, toolNames(ctx, t, cs),
		"read_text_file", "write_file", "edit_file", "list_directory", "move_file", "create_directory",
		"list_allowed_directories")

	res := call(ctx, t, cs, stderr, "read_text_file", map[string]any{"path": filepath.Join(root, "hello.txt")})
	if res.IsError || text(t, res) != "hello, reversi\n" {
		t.Errorf("read_text_file = %q (isError %v)", text(t, res), res.IsError)
	}
	res = call(ctx, t, cs, stderr, "write_file", map[string]any{"path": filepath.Join(root, "new.txt"), "content": "written"})
	if res.IsError {
		t.Fatalf("write_file isError: %s", text(t, res))
	}
	if data, err := os.ReadFile(filepath.Join(root, "new.txt")); err != nil || string(data) != "written" {
		t.Errorf("new.txt = %q, %v", data, err)
	}
	// Outside the allowed root the server refuses (with isError, not a protocol error).
	res = call(ctx, t, cs, stderr, "read_text_file", map[string]any{"path": filepath.Join(outside, "secret.txt")})
	if !res.IsError {
		t.Errorf("read outside the root succeeded: %q", text(t, res))
	}
}

func TestEverything(t *testing.T) {
	t.Parallel()
	cmd, args, env := upstreams.Everything(t)
	ctx, cs, stderr := connect(t, cmd, args, env)

	requireTools(t, toolNames(ctx, t, cs), "echo", "get-sum", "get-structured-content", "get-tiny-image")

	res := call(ctx, t, cs, stderr, "echo", map[string]any{"message": "hi from go"})
	if got := text(t, res); res.IsError || !strings.Contains(got, "hi from go") {
		t.Errorf("echo = %q (isError %v)", got, res.IsError)
	}
	res = call(ctx, t, cs, stderr, "get-sum", map[string]any{"a": 2, "b": 40})
	if got := text(t, res); res.IsError || !strings.Contains(got, "42") {
		t.Errorf("get-sum = %q (isError %v)", got, res.IsError)
	}
	// A schema violation is the server's own error (the gateway's checks come before it).
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get-sum", Arguments: map[string]any{"a": "two"}})
	if err == nil && !res.IsError {
		t.Errorf("get-sum with a string argument succeeded: %+v", res)
	}
}

// TestTSClient runs the client of the other implementation (the TypeScript SDK) against
// server-memory, the way later tests run it against the gateway.
func TestTSClient(t *testing.T) {
	t.Parallel()
	node, clientArgs := upstreams.TSClient(t)
	cmd, args, env := upstreams.Memory(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	argv := append(append(clientArgs, "--call", "create_entities", "--args",
		`{"entities":[{"name":"carol","entityType":"person","observations":["uses the TS SDK"]}]}`, "--"), cmd)
	argv = append(argv, args...)
	c := exec.CommandContext(ctx, node, argv...)
	c.Env = env
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		t.Fatalf("ts-client: %v\nstderr:\n%s", err, stderr.String())
	}
	var out struct {
		Tools  []string `json:"tools"`
		Result struct {
			IsError bool `json:"isError"`
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
		} `json:"result"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("ts-client output %q: %v", stdout.String(), err)
	}
	requireTools(t, out.Tools, "read_graph", "create_entities", "delete_entities", "create_relations", "delete_relations")
	if out.Result.IsError || len(out.Result.Content) == 0 || !strings.Contains(out.Result.Content[0].Text, "carol") {
		t.Errorf("create_entities through ts-client = %+v", out.Result)
	}
	file := strings.TrimPrefix(env[0], "MEMORY_FILE_PATH=")
	if data, err := os.ReadFile(file); err != nil || !strings.Contains(string(data), "carol") {
		t.Errorf("memory file after ts-client call = %q, %v", data, err)
	}

	// Bad usage is refused with exit status 2, not a hang or a silent success.
	bad := exec.CommandContext(ctx, node, clientArgs...)
	bad.Env = []string{}
	if err := bad.Run(); err == nil {
		t.Errorf("ts-client without a server succeeded")
	} else if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Errorf("ts-client without a server: %v, want exit status 2", err)
	}
}

// TestPinned checks that the installed packages are the versions pinned in package.json, so a
// stale node_modules (installed from another lock) cannot pass for the pinned servers.
func TestPinned(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("package.json")
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	if err := json.Unmarshal(raw, &pkg); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{upstreams.MemoryPackage, upstreams.FilesystemPackage, upstreams.EverythingPackage, upstreams.SDKPackage, upstreams.InspectorPackage, upstreams.MCPProxyPackage, upstreams.SupergatewayPackage} {
		want, ok := pkg.Dependencies[name]
		if !ok {
			t.Errorf("package.json does not pin %s", name)
			continue
		}
		if strings.ContainsAny(want, "^~<>=*x ") {
			t.Errorf("%s is pinned to %q, want an exact version", name, want)
		}
		raw, err := os.ReadFile(filepath.Join(upstreams.Dir(t), filepath.FromSlash(name), "package.json"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var meta struct {
			Version string `json:"version"`
		}
		if err := json.Unmarshal(raw, &meta); err != nil {
			t.Fatal(err)
		}
		if meta.Version != want {
			t.Errorf("installed %s@%s, package.json pins %s (run hack/upstreams.sh)", name, meta.Version, want)
		}
	}
	lock, err := os.ReadFile("package-lock.json")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(lock, []byte(`"resolved"`)) {
		t.Errorf("package-lock.json records registry URLs (\"resolved\"); test/upstreams/.npmrc must keep omit-lockfile-registry-resolved=true")
	}
}
