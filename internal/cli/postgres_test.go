package cli

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/pgtest"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// pgServer is started by the first test that needs PostgreSQL and stopped by TestMain.
var pgServer pgtest.Lazy

// TestGatewayPostgresStore: `reversi gateway --store postgres --database-url URL` fronts
// server-memory and journals into Postgres; `reversi approvals --store postgres` (separate
// processes, URL from $REVERSI_DATABASE_URL) decides its blocked call, and the retry passes.
// The CLI refuses a missing URL and a schema that holds no gateway store. Source: issue 9
// (store.postgres), seed "MCP gateway" (flags --store, --database-url).
func TestGatewayPostgresStore(t *testing.T) {
	pg := pgServer.Get(t)
	dir := t.TempDir()
	url := pg.URL("postgres", "search_path", "cli_gateway")
	node, args, _ := upstreams.Memory(t)
	cfg := "mode: enforce\nactor: alice\nupstreams:\n  - name: mem\n    command: " + node +
		"\n    args: [" + args[0] + "]\n    env: { MEMORY_FILE_PATH: " + filepath.Join(dir, "graph.jsonl") + " }\n"
	for name, body := range map[string]string{"gateway.yaml": cfg, "m.yaml": approvalManifests} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	stderr := &lockedBuffer{}
	done := make(chan error, 1)
	go func() {
		root := NewRoot()
		root.SetArgs([]string{"gateway", "--config", filepath.Join(dir, "gateway.yaml"), "--manifests", filepath.Join(dir, "m.yaml"),
			"--store", "postgres", "--database-url", url, "--data", filepath.Join(dir, "unused"), "--run-id", "run-pg"})
		root.SetIn(inR)
		root.SetOut(outW)
		root.SetErr(stderr)
		err := root.Execute()
		_ = outW.Close()
		done <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "pg-test", Version: "1"}, nil).Connect(ctx,
		&mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr.String())
	}
	call := func(tool string, args map[string]any) (string, bool) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v\n%s", tool, err, stderr.String())
		}
		var texts []string
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				texts = append(texts, tc.Text)
			}
		}
		return strings.Join(texts, "\n"), res.IsError
	}
	if text, isErr := call("mem.create_entities", map[string]any{"entities": []any{
		map[string]any{"name": "invoice-1", "entityType": "invoice", "observations": []any{"unpaid"}}}}); isErr {
		t.Fatalf("create refused: %s", text)
	}
	del := map[string]any{"entityNames": []any{"invoice-1"}}
	text, isErr := call("mem.delete_entities", del)
	m := approvalIDPattern.FindStringSubmatch(text)
	if !isErr || m == nil {
		t.Fatalf("delete: want blocked pending approval, got isError=%v %q", isErr, text)
	}
	id := m[1]

	// the CLI: URL from the environment, separate processes
	t.Setenv(DatabaseURLEnv, url)
	if out, errb, code := reversiProcess(t, "approvals", "list", "--store", "postgres"); code != 0 || !strings.Contains(out, id+" ") {
		t.Fatalf("list: exit %d, stdout %q, stderr %q", code, out, errb)
	}
	if out, errb, code := reversiProcess(t, "approvals", "approve", id, "--store", "postgres", "--by", "bob", "--role", "finance"); code != 0 || out != id+" approved (1/1)\n" {
		t.Fatalf("approve: exit %d, stdout %q, stderr %q", code, out, errb)
	}
	if text, isErr := call("mem.delete_entities", del); isErr {
		t.Fatalf("the approved retry was refused: %s", text)
	}

	// refusals: no URL at all, and a schema without a store (never an empty queue)
	t.Setenv(DatabaseURLEnv, "")
	if _, errb, code := reversiProcess(t, "approvals", "list", "--store", "postgres"); code != 1 || !strings.Contains(errb, "--store postgres needs --database-url or $"+DatabaseURLEnv) {
		t.Fatalf("list without a URL: exit %d, stderr %q", code, errb)
	}
	if _, errb, code := reversiProcess(t, "approvals", "list", "--store", "postgres", "--database-url", pg.URL("postgres", "search_path", "elsewhere")); code != 1 || !strings.Contains(errb, "no gateway store in schema elsewhere") {
		t.Fatalf("list in an empty schema: exit %d, stderr %q", code, errb)
	}

	_ = inW.Close()
	if err := <-done; err != nil {
		t.Fatalf("gateway: %v\n%s", err, stderr.String())
	}
	// the ledger is in Postgres: intent and outcome of each call, the decision records of the
	// approval (counted, approved, consumed by the retry's intent), the approved delete succeeded
	st, err := store.OpenPostgres(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.Records(context.Background(), "run-pg", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, string(r.Kind)+":"+r.Tool+":"+string(r.Status)+string(r.Event))
	}
	want := "intent:mem.create_entities: outcome:mem.create_entities:succeeded intent:mem.delete_entities: outcome:mem.delete_entities:blocked " +
		"approval:mem.delete_entities:counted approval:mem.delete_entities:approved " +
		"intent:mem.delete_entities: approval:mem.delete_entities:consumed outcome:mem.delete_entities:succeeded"
	if strings.Join(got, " ") != want {
		t.Fatalf("ledger in postgres:\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
}
