package proxy

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/syncbuf"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// memoryManifests are manifests for @modelcontextprotocol/server-memory's tools, exposed as
// memory.<tool>.
const memoryManifests = `
- tool: memory.read_graph
  description: Read the whole knowledge graph.
  effect: read_only
  permission: memory:read
- tool: memory.open_nodes
  description: Read some nodes.
  effect: read_only
  permission: memory:read
- tool: memory.create_entities
  description: Create entities.
  effect: compensable
  permission: memory:write
  compensation:
    tool: memory.delete_entities
    kind: compensation
    argument_map:
      name: $args.entities.0.name
      type: $args.entities.0.entityType
      created: $result.entities.0.name
- tool: memory.delete_entities
  description: Delete entities.
  effect: irreversible
  permission: memory:write
`

func loadManifests(t *testing.T) []*manifest.Manifest {
	t.Helper()
	p := filepath.Join(t.TempDir(), "memory.yaml")
	if err := os.WriteFile(p, []byte(memoryManifests), 0o600); err != nil {
		t.Fatal(err)
	}
	docs, errs := manifest.ReadPaths(p)
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Fatalf("manifests: %v", errs)
	}
	return ms
}

// syncBuffer is a syncbuf.Buffer (kept as a name for the tests here).
type syncBuffer = syncbuf.Buffer

type fixture struct {
	gw     *Gateway
	store  store.Store
	stderr *syncBuffer
}

// memoryConfig is a gateway config with server-memory as the namespaced upstream "memory".
func memoryConfig(t *testing.T, mode config.Mode) *config.Gateway {
	cmd, args, env := upstreams.Memory(t)
	u := config.Upstream{Name: "memory", Command: cmd, Args: args, Env: map[string]string{}, Namespace: true}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		u.Env[k] = v
	}
	return &config.Gateway{Mode: mode, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
		Actor: "dev-laptop", Upstreams: []config.Upstream{u}, Deny: []string{"memory.open_nodes"}}
}

func start(t *testing.T, cfg *config.Gateway, ms []*manifest.Manifest) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := store.OpenSQLite(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	errw := &syncBuffer{}
	gw, err := New(ctx, Options{Config: cfg, Manifests: ms, Store: st, Stderr: errw})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	return &fixture{gw: gw, store: st, stderr: errw}
}

// client connects a go-sdk client to the gateway over an in-process transport.
func (f *fixture) client(t *testing.T) *mcp.ClientSession {
	t.Helper()
	ct, stt := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := f.gw.Server().Connect(ctx, stt, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, tool string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	return res
}

func texts(res *mcp.CallToolResult) []string {
	var out []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			out = append(out, tc.Text)
		}
	}
	return out
}

// onlyRun returns the records of the single run in the store.
func onlyRun(t *testing.T, st store.Store) (store.Run, []store.Record) {
	t.Helper()
	ctx := context.Background()
	runs, err := st.ListRuns(ctx, store.RunFilter{})
	if err != nil || len(runs) != 1 {
		t.Fatalf("runs: %v %v, want exactly one", runs, err)
	}
	recs, err := st.Records(ctx, runs[0].ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	checkIntentBeforeOutcome(t, recs)
	return runs[0], recs
}

// checkIntentBeforeOutcome checks that every intent has exactly one outcome, written after it.
func checkIntentBeforeOutcome(t *testing.T, recs []store.Record) {
	t.Helper()
	intents := map[int64]bool{}
	outcomes := map[int64]int{}
	for _, r := range recs {
		switch r.Kind {
		case store.KindIntent:
			intents[r.Seq] = true
		case store.KindOutcome:
			if !intents[r.Step] {
				t.Errorf("outcome %d of step %d comes before (or without) its intent", r.Seq, r.Step)
			}
			outcomes[r.Step]++
		}
	}
	for s := range intents {
		if outcomes[s] != 1 {
			t.Errorf("step %d has %d outcomes, want 1", s, outcomes[s])
		}
	}
}

// stepsOf pairs each intent with its outcome, in order, for one tool.
func stepsOf(recs []store.Record, tool string) [][2]store.Record {
	var out [][2]store.Record
	for _, in := range recs {
		if in.Kind != store.KindIntent || in.Tool != tool {
			continue
		}
		for _, o := range recs {
			if o.Kind == store.KindOutcome && o.Step == in.Seq {
				out = append(out, [2]store.Record{in, o})
			}
		}
	}
	return out
}

func TestEnforceAgainstServerMemory(t *testing.T) {
	f := start(t, memoryConfig(t, config.ModeAuto), loadManifests(t))
	if got := f.gw.Engine().Mode(); got != engine.Enforce {
		t.Fatalf("mode %s, want enforce (manifests loaded, no mode named)", got)
	}
	banner := f.stderr.String()
	for _, want := range []string{"OK memory.read_graph", "OK memory.create_entities",
		"NOTE memory.search_nodes", "BLOCK memory.delete_relations", "WARN memory.create_relations"} {
		if !strings.Contains(banner, want) {
			t.Errorf("banner lacks %q:\n%s", want, banner)
		}
	}
	if strings.Contains(banner, engine.AutoObserveMessage) {
		t.Errorf("auto-observe message printed with manifests loaded")
	}
	cs := f.client(t)

	// tools/list: namespaced, open_nodes filtered out by deny.
	var names []string
	for tool, err := range cs.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tool.Name)
		if tool.InputSchema == nil {
			t.Errorf("%s has no input schema", tool.Name)
		}
	}
	for _, want := range []string{"memory.read_graph", "memory.create_entities", "memory.delete_entities", "memory.search_nodes"} {
		if !slices.Contains(names, want) {
			t.Errorf("tools/list lacks %s: %v", want, names)
		}
	}
	if slices.Contains(names, "memory.open_nodes") || slices.Contains(names, "read_graph") {
		t.Errorf("tools/list %v: want open_nodes denied and every name namespaced", names)
	}

	// read_graph passes.
	if res := call(t, cs, "memory.read_graph", map[string]any{}); res.IsError {
		t.Fatalf("read_graph: %v", texts(res))
	}
	// create_entities passes; the compensation handle names only the mapped values.
	res := call(t, cs, "memory.create_entities", map[string]any{"entities": []any{
		map[string]any{"name": "alice", "entityType": "person", "observations": []any{"likes tea"}}}})
	if res.IsError {
		t.Fatalf("create_entities: %v", texts(res))
	}
	// read_graph now shows the entity: the call reached the upstream.
	res = call(t, cs, "memory.read_graph", map[string]any{})
	if !strings.Contains(strings.Join(texts(res), ""), "alice") {
		t.Errorf("read_graph after create: %v", texts(res))
	}
	// An unmanifested tool is blocked with the exact text.
	res = call(t, cs, "memory.search_nodes", map[string]any{"query": "alice"})
	if want := "Blocked by Reversi: " + engine.NoManifestText("memory.search_nodes"); !res.IsError || !slices.Equal(texts(res), []string{want}) {
		t.Errorf("search_nodes: isError %v %q, want %q", res.IsError, texts(res), want)
	}
	// A denied tool is blocked too (and journaled).
	res = call(t, cs, "memory.open_nodes", map[string]any{"names": []any{"alice"}})
	if !res.IsError || !strings.HasPrefix(strings.Join(texts(res), ""), engine.BlockedPrefix) {
		t.Errorf("open_nodes (denied): %v", texts(res))
	}
	// delete_entities is irreversible: blocked pending approval.
	del := map[string]any{"entityNames": []any{"alice"}}
	res = call(t, cs, "memory.delete_entities", del)
	text := strings.Join(texts(res), "")
	if !res.IsError || !strings.HasPrefix(text, "Blocked by Reversi: memory.delete_entities requires approval: request ") {
		t.Fatalf("delete_entities: isError %v %q", res.IsError, text)
	}
	ctx := context.Background()
	pending, err := f.store.ListApprovals(ctx, store.ApprovalFilter{State: store.ApprovalPending})
	if err != nil || len(pending) != 1 || pending[0].Tool != "memory.delete_entities" || !strings.Contains(text, pending[0].ID) {
		t.Fatalf("pending approvals %+v %v", pending, err)
	}
	// Once approved, the same call passes and reaches the upstream.
	if _, err := f.store.Decide(ctx, pending[0].ID, store.Decision{By: "ops", Approve: true}); err != nil {
		t.Fatal(err)
	}
	if res = call(t, cs, "memory.delete_entities", del); res.IsError {
		t.Fatalf("delete_entities after approval: %v", texts(res))
	}
	if res = call(t, cs, "memory.read_graph", map[string]any{}); strings.Contains(strings.Join(texts(res), ""), "alice") {
		t.Errorf("alice still in the graph after the approved delete: %v", texts(res))
	}

	run, recs := onlyRun(t, f.store)
	if run.Actor != "dev-laptop" || run.Gateway != Name {
		t.Errorf("run %+v", run)
	}
	rg := stepsOf(recs, "memory.read_graph")
	if len(rg) != 3 || rg[0][0].Decision != "allow" || rg[0][1].Status != store.Succeeded || rg[0][0].Reason != "MCP tools/call memory.read_graph" {
		t.Errorf("read_graph steps %+v", rg)
	}
	ce := stepsOf(recs, "memory.create_entities")
	if len(ce) != 1 || ce[0][1].Status != store.Succeeded || ce[0][1].CompensationTool != "memory.delete_entities" ||
		ce[0][1].Handle["name"] != "alice" || ce[0][1].Handle["type"] != "person" || ce[0][1].Handle["created"] != "alice" ||
		len(ce[0][1].Handle) != 3 {
		t.Errorf("create_entities steps %+v", ce)
	}
	if ce[0][0].ManifestChecksum == "" || ce[0][0].Mode != "enforce" {
		t.Errorf("create_entities intent %+v", ce[0][0])
	}
	sn := stepsOf(recs, "memory.search_nodes")
	if len(sn) != 1 || sn[0][0].Decision != "block" || sn[0][1].Status != store.Blocked || sn[0][1].Note != engine.NoManifestText("memory.search_nodes") {
		t.Errorf("search_nodes steps %+v", sn)
	}
	if on := stepsOf(recs, "memory.open_nodes"); len(on) != 1 || on[0][1].Status != store.Blocked {
		t.Errorf("open_nodes steps %+v", on)
	}
	de := stepsOf(recs, "memory.delete_entities")
	if len(de) != 2 || de[0][0].Decision != "needs_approval" || de[0][1].Status != store.Blocked ||
		de[1][0].Decision != "allow" || de[1][1].Status != store.Succeeded {
		t.Errorf("delete_entities steps %+v", de)
	}

	// A second session (here over Streamable HTTP on loopback) is a second run.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.gw.ServeListener(sctx, ln) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("ServeListener: %v", err)
		}
	}()
	hcs, err := mcp.NewClient(&mcp.Implementation{Name: "http-test", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: "http://" + ln.Addr().String() + "/mcp", DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res := call(t, hcs, "memory.read_graph", map[string]any{}); res.IsError {
		t.Errorf("read_graph over HTTP: %v", texts(res))
	}
	_ = hcs.Close()
	runs, err := f.store.ListRuns(ctx, store.RunFilter{})
	if err != nil || len(runs) != 2 || runs[0].ID == runs[1].ID {
		t.Errorf("runs after the HTTP session: %+v %v", runs, err)
	}
}

func TestObserveAndAdviseRunEverything(t *testing.T) {
	for _, mode := range []config.Mode{config.ModeObserve, config.ModeAdvise} {
		t.Run(string(mode), func(t *testing.T) {
			f := start(t, memoryConfig(t, mode), loadManifests(t))
			cs := f.client(t)
			// An unmanifested tool runs, journaled as unclassified (not a rule broken).
			res := call(t, cs, "memory.search_nodes", map[string]any{"query": "x"})
			if res.IsError || len(res.Content) != 1 {
				t.Fatalf("search_nodes: %v", texts(res))
			}
			// An irreversible tool needing approval runs, journaled would_block; advise adds
			// the advisory block, observe adds nothing.
			res = call(t, cs, "memory.delete_entities", map[string]any{"entityNames": []any{"nobody"}})
			if res.IsError {
				t.Fatalf("delete_entities: %v", texts(res))
			}
			tx := texts(res)
			advisory := engine.AdvisoryPrefix + "approval required: memory.delete_entities needs a person's approval"
			if mode == config.ModeAdvise && (len(tx) != 2 || tx[1] != advisory) || mode == config.ModeObserve && len(tx) != 1 {
				t.Errorf("%s: result texts %q", mode, tx)
			}
			// A denied tool runs too.
			if res = call(t, cs, "memory.open_nodes", map[string]any{"names": []any{"x"}}); res.IsError {
				t.Fatalf("open_nodes: %v", texts(res))
			}
			_, recs := onlyRun(t, f.store)
			sn := stepsOf(recs, "memory.search_nodes")
			if len(sn) != 1 || sn[0][0].Decision != "allow" || sn[0][1].Status != store.Succeeded || sn[0][1].Note != engine.UnclassifiedNote {
				t.Errorf("search_nodes steps %+v", sn)
			}
			for _, tool := range []string{"memory.delete_entities", "memory.open_nodes"} {
				s := stepsOf(recs, tool)
				if len(s) != 1 || s[0][0].Decision != "would_block" || s[0][0].Mode != string(mode) ||
					s[0][1].Status != store.Succeeded || !strings.Contains(s[0][1].Note, "would_block: ") {
					t.Errorf("%s steps %+v", tool, s)
				}
			}
			if a, _ := f.store.ListApprovals(context.Background(), store.ApprovalFilter{}); len(a) != 0 {
				t.Errorf("%s queued approvals: %+v", mode, a)
			}
		})
	}
}

func TestAutoObserveWithoutManifests(t *testing.T) {
	f := start(t, memoryConfig(t, config.ModeAuto), nil)
	if f.gw.Engine().Mode() != engine.Observe {
		t.Fatalf("mode %s", f.gw.Engine().Mode())
	}
	out := f.stderr.String()
	if !strings.Contains(out, engine.AutoObserveMessage) || !strings.Contains(out, "Reversi gateway running in observe mode.") {
		t.Errorf("stderr:\n%s", out)
	}
	cs := f.client(t)
	res := call(t, cs, "memory.read_graph", map[string]any{})
	if res.IsError || len(res.Content) != 1 {
		t.Fatalf("read_graph: %v (observe adds nothing to the result)", texts(res))
	}
	var graph map[string]any
	if err := json.Unmarshal([]byte(texts(res)[0]), &graph); err != nil {
		t.Errorf("read_graph result is not passed through unchanged: %v", err)
	}
}

func TestNameClashIsAStartError(t *testing.T) {
	cfg := memoryConfig(t, config.ModeAuto)
	second := cfg.Upstreams[0]
	second.Name = "memory2"
	cfg.Upstreams[0].Namespace, second.Namespace = false, false
	cfg.Upstreams = append(cfg.Upstreams, second)
	st := store.NewMemory(nil)
	_, err := New(context.Background(), Options{Config: cfg, Store: st})
	if err == nil || !strings.Contains(err.Error(), "tool name clash") || !strings.Contains(err.Error(), "memory2") {
		t.Fatalf("err %v, want a clash between memory and memory2", err)
	}
}

func TestEnvIsOnlyTheConfigured(t *testing.T) {
	t.Setenv("REVERSI_GATEWAY_TEST_SECRET", "leak")
	env := Env(config.Upstream{Env: map[string]string{"B": "2", "A": "1"}})
	if !slices.Equal(env, []string{"A=1", "B=2"}) {
		t.Errorf("env %q", env)
	}
	if env := Env(config.Upstream{}); env == nil || len(env) != 0 {
		t.Errorf("no env must be an empty, non-nil list (nil would inherit): %#v", env)
	}
	// The process really gets nothing else: a node upstream that prints its environment.
	cmd := transport(dialer{cfg: &config.Gateway{}}, config.Upstream{Command: upstreams.Node(t),
		Args: []string{"-e", "process.stdout.write(JSON.stringify(process.env))"}, Env: map[string]string{"ONLY": "this"}}).(passthroughTransport).Transport.(*stdioTransport).cmd
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if _, leaked := got["REVERSI_GATEWAY_TEST_SECRET"]; leaked || got["ONLY"] != "this" {
		t.Errorf("upstream environment %v", got)
	}
}
