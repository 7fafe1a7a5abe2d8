package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/proxy"
	"github.com/reversi-gitops/reversi/gateway/rollback"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// rollbackFixture is a folder with the manifests, the graph file of server-memory, the
// gateway's data folder and the file the upstream records its tools/call `_meta` in.
type rollbackFixture struct {
	dir, manifests, graph, data, metaLog string
}

func newRollbackFixture(t *testing.T, manifests string) rollbackFixture {
	t.Helper()
	dir := t.TempDir()
	f := rollbackFixture{dir: dir, manifests: filepath.Join(dir, "m.yaml"), graph: filepath.Join(dir, "graph.jsonl"),
		data: filepath.Join(dir, "data"), metaLog: filepath.Join(dir, "meta.jsonl")}
	if err := os.WriteFile(f.manifests, []byte(manifests), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// config writes a gateway config (enforce, the deletes denied to agents) whose upstream mem
// records every call's _meta, with fault ("" for none; see upstreams.RecordMetaEnv).
func (f rollbackFixture) config(t *testing.T, name, mode, fault string) string {
	t.Helper()
	node, args, _ := upstreams.MemoryAt(t, f.graph)
	env := upstreams.RecordMetaEnv(t, f.metaLog, fault)
	env["MEMORY_FILE_PATH"] = f.graph
	var envs []string
	for k, v := range env {
		envs = append(envs, k+": "+strconv.Quote(v))
	}
	cfg := "mode: " + mode + "\nactor: agent-7\ndeny: [\"mem.delete_*\"]\nupstreams:\n  - name: mem\n    command: " + strconv.Quote(node) +
		"\n    args: [" + strconv.Quote(args[0]) + "]\n    env: { " + strings.Join(envs, ", ") + " }\n"
	p := filepath.Join(f.dir, name)
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// agentRun runs calls through a gateway (proxy.New on cfg, SQLite store in f.data, run id
// run) with a go-sdk client, and returns each call's result.
func (f rollbackFixture) agentRun(t *testing.T, cfg, run string, calls ...mcp.CallToolParams) []*mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, errs := config.Load(cfg)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	ms, _, err := loadGatewayManifests(f.manifests)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenSQLite(f.data, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	gw, err := proxy.New(ctx, proxy.Options{Config: g, Manifests: ms.Manifests, Store: st, RunID: run})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	ct, stt := mcp.NewInMemoryTransports()
	ss, err := gw.Server().Connect(ctx, stt, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var out []*mcp.CallToolResult
	for _, c := range calls {
		res, err := cs.CallTool(ctx, &c)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		out = append(out, res)
	}
	return out
}

// direct calls server-memory on f.graph directly (a process of its own, no gateway) and
// returns the structured results.
func (f rollbackFixture) direct(t *testing.T, calls ...mcp.CallToolParams) []any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node, args, env := upstreams.MemoryAt(t, f.graph)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "direct", Version: "1"}, nil).Connect(ctx,
		&mcp.CommandTransport{Command: upstreams.Command(node, args, env)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var out []any
	for _, c := range calls {
		res, err := cs.CallTool(ctx, &c)
		if err != nil || res.IsError {
			t.Fatalf("direct %s: %v %+v", c.Name, err, res)
		}
		out = append(out, rollback.ResultValue(res))
	}
	return out
}

// graph reads the knowledge graph directly from server-memory, as canonical JSON.
func (f rollbackFixture) graphJSON(t *testing.T) string {
	t.Helper()
	b, err := json.Marshal(f.direct(t, mcp.CallToolParams{Name: "read_graph", Arguments: map[string]any{}})[0])
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// rollbackRecords returns the status of every rollback record of run, by step, in order.
func (f rollbackFixture) rollbackRecords(t *testing.T, run string) map[int64][]store.Record {
	t.Helper()
	st, err := store.OpenSQLite(f.data, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.Records(context.Background(), run, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64][]store.Record{}
	for _, r := range recs {
		if r.Kind == store.KindRollback {
			out[r.Step] = append(out[r.Step], r)
		}
	}
	return out
}

func statuses(recs []store.Record) string {
	var s []string
	for _, r := range recs {
		s = append(s, string(r.Status))
	}
	return strings.Join(s, ",")
}

// agentCalls is the run of the acceptance: entities (one of which, carol, exists already and
// is left alone by server-memory), a relation, a read, and a delete the gateway denies.
var agentCalls = []mcp.CallToolParams{
	{Name: "mem.create_entities", Arguments: map[string]any{"entities": []any{
		map[string]any{"name": "alice", "entityType": "person", "observations": []any{"likes tea"}},
		map[string]any{"name": "bob", "entityType": "person", "observations": []any{}},
		map[string]any{"name": "carol", "entityType": "person", "observations": []any{"was here first"}},
	}}},
	{Name: "mem.create_relations", Arguments: map[string]any{"relations": []any{
		map[string]any{"from": "alice", "to": "bob", "relationType": "knows"},
	}}},
	{Name: "mem.read_graph", Arguments: map[string]any{}},
	{Name: "mem.delete_entities", Arguments: map[string]any{"entityNames": []any{"carol"}}},
}

// seedGraph puts carol (with a relation to herself) in the graph before the run.
func (f rollbackFixture) seedGraph(t *testing.T) string {
	t.Helper()
	f.direct(t,
		mcp.CallToolParams{Name: "create_entities", Arguments: map[string]any{"entities": []any{
			map[string]any{"name": "carol", "entityType": "person", "observations": []any{"was here first"}}}}},
		mcp.CallToolParams{Name: "create_relations", Arguments: map[string]any{"relations": []any{
			map[string]any{"from": "carol", "to": "carol", "relationType": "trusts"}}}})
	before := f.graphJSON(t)
	if !strings.Contains(before, "carol") {
		t.Fatalf("graph before the run: %s", before)
	}
	return before
}

// TestRollbackRestoresTheGraph is issue 6's first acceptance: a run through the gateway
// creates entities and a relation in server-memory; `reversi rollback` (dry run, then
// --confirm) undoes it on the upstream, each step `verified` by an open_nodes read-back, and
// the graph read directly from the upstream equals the graph before the run. Each
// compensation reached the upstream with its idempotency key in _meta.
func TestRollbackRestoresTheGraph(t *testing.T) {
	f := newRollbackFixture(t, upstreams.MemoryRollbackManifests)
	before := f.seedGraph(t)
	cfg := f.config(t, "gateway.yaml", "enforce", "")
	res := f.agentRun(t, cfg, "run-agent", agentCalls...)
	for i, r := range res[:3] {
		if r.IsError {
			t.Fatalf("call %d: %+v", i, r.Content[0])
		}
	}
	if !res[3].IsError || !strings.Contains(res[3].Content[0].(*mcp.TextContent).Text, "Blocked by Reversi") {
		t.Fatalf("the agent's delete was not denied: %+v", res[3])
	}
	during := f.graphJSON(t)
	if during == before || !strings.Contains(during, "alice") || !strings.Contains(during, "knows") {
		t.Fatalf("the run changed nothing: %s", during)
	}

	out, errOut, code := reversiInProcess("rollback", "run-agent", "--config", cfg, "--data", f.data, "--manifests", f.manifests)
	if code != 0 {
		t.Fatalf("dry run: exit %d\n%s\n%s", code, out, errOut)
	}
	t.Logf("dry run:\n%s", out)
	for _, want := range []string{"dry run: nothing was executed; 2 compensation(s) would run",
		"mem.create_relations  compensate  mem.delete_relations  inverse", "mem.delete_entities   skip"} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %q", want)
		}
	}
	if got := f.graphJSON(t); got != during {
		t.Fatalf("the dry run changed the graph: %s", got)
	}

	out, errOut, code = reversiInProcess("rollback", "run-agent", "--confirm", "--config", cfg, "--data", f.data, "--manifests", f.manifests)
	t.Logf("rollback:\n%s%s", out, errOut)
	if code != 0 {
		t.Fatalf("rollback: exit %d", code)
	}
	for _, want := range []string{"step 3 mem.create_relations: verified (mem.delete_relations; 1 attempt(s)",
		"step 1 mem.create_entities: verified (mem.delete_entities; 1 attempt(s)", "read-back mem.open_nodes matched",
		"undone: 2 step(s)", "not undone: 0 step(s)", "RolledBack"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if after := f.graphJSON(t); after != before {
		t.Fatalf("graph after the rollback differs from before the run:\nbefore %s\nafter  %s", before, after)
	}
	recs := f.rollbackRecords(t, "run-agent")
	if got := statuses(recs[1]); got != "started,compensated,verified" {
		t.Errorf("create_entities rollback records %s", got)
	}
	if got := statuses(recs[3]); got != "started,compensated,verified" {
		t.Errorf("create_relations rollback records %s", got)
	}
	if got := recs[1][0].Handle["entityNames"]; !jsonEqual(got, []any{"alice", "bob"}) {
		t.Errorf("create_entities was undone with %v: only what the call created may be deleted", got)
	}
	// What the upstream received: each compensation once, with its key; the read-backs.
	keys := map[string][]string{}
	for _, c := range upstreams.ReadMetaCalls(t, f.metaLog) {
		k, _ := c.Meta[rollback.IdempotencyKeyMeta].(string)
		keys[c.Name] = append(keys[c.Name], k)
	}
	if got := keys["delete_relations"]; len(got) != 1 || got[0] != rollback.CompensationKey("run-agent", 3, "mem.delete_relations") {
		t.Errorf("delete_relations keys %q", got)
	}
	if got := keys["delete_entities"]; len(got) != 1 || got[0] != rollback.CompensationKey("run-agent", 1, "mem.delete_entities") {
		t.Errorf("delete_entities keys %q", got)
	}
	if len(keys["open_nodes"]) != 2 {
		t.Errorf("read-backs %v", keys["open_nodes"])
	}

	// Again: nothing is called twice; the steps are reported as undone earlier.
	n := len(upstreams.ReadMetaCalls(t, f.metaLog))
	out, _, code = reversiInProcess("rollback", "run-agent", "--confirm", "--config", cfg, "--data", f.data, "--manifests", f.manifests)
	if code != 0 || !strings.Contains(out, "step 1 mem.create_entities: verified (mem.delete_entities; key ") || !strings.Contains(out, "by an earlier rollback") {
		t.Errorf("second rollback: exit %d\n%s", code, out)
	}
	if m := len(upstreams.ReadMetaCalls(t, f.metaLog)); m != n {
		t.Errorf("a second rollback called the upstream %d more time(s)", m-n)
	}
}

func jsonEqual(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}
