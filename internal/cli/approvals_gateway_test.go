package cli

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/test/syncbuf"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// approvalManifests cover server-memory's tools (namespaced mem.): the deletes are
// irreversible and need approval with different rules.
const approvalManifests = `
- tool: mem.read_graph
  description: Read the whole knowledge graph.
  effect: read_only
  permission: mem:read
- tool: mem.create_entities
  description: Create entities.
  effect: compensable
  permission: mem:write
  compensation:
    tool: mem.delete_entities
    kind: compensation
    argument_map:
      name: $args.entities.0.name
- tool: mem.create_relations
  description: Create relations.
  effect: compensable
  permission: mem:write
  compensation:
    tool: mem.delete_relations
    kind: compensation
    argument_map:
      from: $args.relations.0.from
- tool: mem.delete_entities
  description: Delete entities and their relations.
  effect: irreversible
  permission: mem:write
  approval: { roles: [finance], quorum: 1, timeout: 1h, on_timeout: deny }
- tool: mem.delete_relations
  description: Delete relations.
  effect: irreversible
  permission: mem:write
  approval: { roles: [ops], quorum: 2, timeout: 1h }
- tool: mem.delete_observations
  description: Delete observations.
  effect: irreversible
  permission: mem:write
  approval: { roles: [finance] }
`

// lockedBuffer is a syncbuf.Buffer (kept as a name for the tests here).
type lockedBuffer = syncbuf.Buffer

var approvalIDPattern = regexp.MustCompile(`request (apr-[0-9a-f]+) is waiting for an approver`)

// TestApprovalsAgainstRunningGateway is issue 5's acceptance for standalone approvals: a
// `reversi gateway` (in this process, MCP over stdio pipes, enforce mode, actor alice) fronts
// server-memory with an SQLite store; `reversi approvals` runs as separate processes on the
// same --data folder while the gateway runs. The agent's blocked call carries the approval id,
// the CLI lists and decides it, and the retry of the same call passes (or stays blocked).
func TestApprovalsAgainstRunningGateway(t *testing.T) {
	dir := t.TempDir()
	node, args, _ := upstreams.Memory(t)
	cfg := "mode: enforce\nactor: alice\nupstreams:\n  - name: mem\n    command: " + node +
		"\n    args: [" + args[0] + "]\n    env: { MEMORY_FILE_PATH: " + filepath.Join(dir, "graph.jsonl") + " }\n"
	for name, body := range map[string]string{"gateway.yaml": cfg, "m.yaml": approvalManifests} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "data")
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	stderr := &lockedBuffer{}
	done := make(chan error, 1)
	go func() {
		root := NewRoot()
		root.SetArgs([]string{"gateway", "--config", filepath.Join(dir, "gateway.yaml"), "--manifests", filepath.Join(dir, "m.yaml"),
			"--data", data, "--run-id", "run-agent"})
		root.SetIn(inR)
		root.SetOut(outW)
		root.SetErr(stderr)
		err := root.Execute()
		_ = outW.Close()
		done <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "approvals-test", Version: "1"}, nil).Connect(ctx,
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
	mustPass := func(tool string, args map[string]any) string {
		t.Helper()
		text, isErr := call(tool, args)
		if isErr {
			t.Fatalf("%s refused: %s", tool, text)
		}
		return text
	}
	// blocked calls tool, expects it blocked pending approval and returns the approval id.
	blocked := func(tool string, args map[string]any) string {
		t.Helper()
		text, isErr := call(tool, args)
		m := approvalIDPattern.FindStringSubmatch(text)
		if !isErr || !strings.HasPrefix(text, "Blocked by Reversi: "+tool+" requires approval: ") || m == nil {
			t.Fatalf("%s: want blocked pending approval, got isError=%v %q", tool, isErr, text)
		}
		return m[1]
	}
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		return reversiProcess(t, append(args, "--data", data)...)
	}
	cliOK := func(want string, args ...string) {
		t.Helper()
		out, errb, code := cli(args...)
		if code != 0 || out != want {
			t.Fatalf("reversi %v: exit %d, stdout %q, stderr %q; want %q", args, code, out, errb, want)
		}
	}
	cliRefused := func(want string, args ...string) {
		t.Helper()
		out, errb, code := cli(args...)
		if code != 1 || !strings.Contains(errb, want) {
			t.Fatalf("reversi %v: exit %d, stdout %q, stderr %q; want exit 1 with %q", args, code, out, errb, want)
		}
	}

	mustPass("mem.create_entities", map[string]any{"entities": []any{
		map[string]any{"name": "invoice-1", "entityType": "invoice", "observations": []any{"unpaid"}},
		map[string]any{"name": "invoice-2", "entityType": "invoice", "observations": []any{"paid"}},
		map[string]any{"name": "acme", "entityType": "customer", "observations": []any{"since 2020"}},
	}})
	rel := map[string]any{"relations": []any{map[string]any{"from": "acme", "to": "invoice-2", "relationType": "owes"}}}
	mustPass("mem.create_relations", rel)

	// 1. delete_entities (finance, quorum 1): blocked, listed, approved from the CLI, retried.
	delInvoice := map[string]any{"entityNames": []any{"invoice-1"}}
	id := blocked("mem.delete_entities", delInvoice)
	out, errb, code := cli("approvals", "list")
	if code != 0 {
		t.Fatalf("list: exit %d %s", code, errb)
	}
	_, rows := tableRows(t, out)
	if got := strings.Join(rows[id][:8], " "); got != id+" mem.delete_entities run-agent alice pending 0/1 finance in" {
		t.Fatalf("list row %q\n%s", got, out)
	}
	if again := blocked("mem.delete_entities", delInvoice); again != id {
		t.Errorf("a second try while pending queued %s, want the same request %s", again, id)
	}
	cliRefused("alice opened run run-agent and may not approve its own call", "approvals", "approve", id, "--by", "alice", "--role", "finance")
	cliRefused("needs an approver holding one of the roles finance, and no --role was given for bob", "approvals", "approve", id, "--by", "bob")
	cliRefused("--by is required", "approvals", "approve", id, "--role", "finance")
	if _, isErr := call("mem.delete_entities", delInvoice); !isErr {
		t.Fatal("delete_entities ran after refused decisions")
	}
	cliOK(id+" approved (1/1)\n", "approvals", "approve", id, "--by", "bob", "--role", "finance", "--reason", "FIN-12")
	mustPass("mem.delete_entities", delInvoice)
	graph := mustPass("mem.read_graph", map[string]any{})
	if strings.Contains(graph, "invoice-1") || !strings.Contains(graph, "invoice-2") {
		t.Fatalf("after the approved delete the graph should hold invoice-2 and not invoice-1:\n%s", graph)
	}
	// The approval let one call through: the same call again needs a new approval.
	if again := blocked("mem.delete_entities", delInvoice); again == id {
		t.Errorf("the used approval %s let a second call through", id)
	}

	// 2. delete_relations (ops, quorum 2): one approver is not enough, nor the same one twice.
	id2 := blocked("mem.delete_relations", rel)
	cliOK(id2+" pending (1/2 approvals)\n", "approvals", "approve", id2, "--by", "bob", "--role", "ops")
	if again := blocked("mem.delete_relations", rel); again != id2 {
		t.Errorf("retry with 1/2 approvals: queued %s, want still waiting for %s", again, id2)
	}
	cliRefused("bob has already decided it", "approvals", "approve", id2, "--by", "bob", "--role", "ops")
	cliOK(id2+" approved (2/2)\n", "approvals", "approve", id2, "--by", "carol", "--role", "ops")
	mustPass("mem.delete_relations", rel)
	if graph := mustPass("mem.read_graph", map[string]any{}); strings.Contains(graph, `"owes"`) {
		t.Fatalf("the relation survived its approved delete:\n%s", graph)
	}

	// 3. delete_observations: denied, so the retry stays blocked and the upstream is untouched.
	delObs := map[string]any{"deletions": []any{map[string]any{"entityName": "acme", "observations": []any{"since 2020"}}}}
	id3 := blocked("mem.delete_observations", delObs)
	cliOK(id3+" denied by dave\n", "approvals", "deny", id3, "--by", "dave", "--role", "finance", "--reason", "keep the history")
	text, isErr := call("mem.delete_observations", delObs)
	if want := "Blocked by Reversi: approval " + id3 + " for this call was denied"; !isErr || text != want {
		t.Errorf("retry after deny: isError=%v %q, want %q", isErr, text, want)
	}
	cliRefused("cannot approve "+id3+": it is already denied", "approvals", "approve", id3, "--by", "erin", "--role", "finance")
	if graph := mustPass("mem.read_graph", map[string]any{}); !strings.Contains(graph, "since 2020") {
		t.Fatalf("a denied delete reached the upstream:\n%s", graph)
	}

	// The whole queue, as JSON, from another process while the gateway still runs.
	out, errb, code = cli("approvals", "list", "--state", "all", "--json")
	var js []struct {
		ID, State, Run, Actor string
		Approvals             int
		ConsumedAt            *time.Time
		Decisions             []struct{ By, Decision, Reason string }
	}
	if err := json.Unmarshal([]byte(out), &js); code != 0 || err != nil {
		t.Fatalf("list --json: exit %d %v %s\n%s", code, err, errb, out)
	}
	var got []string
	for _, a := range js {
		var by []string
		for _, d := range a.Decisions {
			by = append(by, d.By+":"+d.Decision)
		}
		got = append(got, a.State+" "+strings.Join(by, ",")+" consumed="+boolStr(a.ConsumedAt != nil))
	}
	want := []string{"approved bob:Approve consumed=true", "pending  consumed=false", "approved bob:Approve,carol:Approve consumed=true", "denied dave:Deny consumed=false"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("queue %q\nwant  %q", got, want)
	}

	_ = cs.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("gateway: %v\n%s", err, stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("the gateway did not stop when its stdin closed")
	}
}

func boolStr(b bool) string {
	if b {
		return "true"
	}
	return "false"
}
