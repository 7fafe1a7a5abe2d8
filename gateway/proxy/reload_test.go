package proxy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// searchManifest adds server-memory's search_nodes as a read-only tool.
const searchManifest = `
- tool: memory.search_nodes
  description: Search the graph.
  effect: read_only
  permission: memory:read
`

// dirLoader reads and validates every manifest file in dir, as the CLI's loader does.
func dirLoader(dir string) LoadFunc {
	return func(context.Context) (Loaded, error) {
		docs, errs := manifest.ReadPaths(dir)
		ms, verrs := manifest.ValidateDocuments(docs)
		if errs = append(errs, verrs...); len(errs) > 0 {
			return Loaded{}, errors.Join(errs...)
		}
		return Loaded{Manifests: ms}, nil
	}
}

func write(t *testing.T, p, body string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// startWith is start with more options (Load, PageSize).
func startWith(t *testing.T, cfg *config.Gateway, o Options) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := store.OpenSQLite(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	errw := &syncBuffer{}
	o.Config, o.Store, o.Stderr = cfg, st, errw
	gw, err := New(ctx, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	return &fixture{gw: gw, store: st, stderr: errw}
}

// gatewayRecords returns the gateway journal's records of kind k.
func gatewayRecords(t *testing.T, st store.Store, k store.Kind) []store.Record {
	t.Helper()
	recs, err := st.Records(context.Background(), store.GatewayJournal, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []store.Record
	for _, r := range recs {
		if r.Kind == k {
			out = append(out, r)
		}
	}
	return out
}

// TestHotReloadFromFileWatch: a manifest added to the watched folder changes enforcement for an
// open session; a broken file is refused (reload_failed, naming the file) and the rules in use
// keep serving; both outcomes are journaled.
func TestHotReloadFromFileWatch(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "memory.yaml"), memoryManifests)
	load := dirLoader(dir)
	ms, err := load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f := startWith(t, memoryConfig(t, config.ModeEnforce), Options{Manifests: ms.Manifests, Load: load})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go f.gw.Watch(ctx, 100*time.Millisecond, dir)
	cs := f.client(t)

	search := map[string]any{"query": "alice"}
	if res := call(t, cs, "memory.search_nodes", search); !res.IsError {
		t.Fatalf("search_nodes without a manifest passed: %v", texts(res))
	}
	before := f.gw.Engine()
	write(t, filepath.Join(dir, "search.yaml"), searchManifest)
	began := time.Now()
	for {
		res := call(t, cs, "memory.search_nodes", search)
		if !res.IsError {
			break
		}
		if time.Since(began) > 15*time.Second {
			t.Fatalf("enforcement did not change after the manifest was added: %v", texts(res))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("manifest added -> enforced in %v (watch interval 100ms)", time.Since(began).Round(time.Millisecond))
	if f.gw.Engine() == before {
		t.Fatal("the engine was not swapped")
	}
	rel := gatewayRecords(t, f.store, store.KindReloaded)
	if len(rel) != 1 || !strings.HasPrefix(rel[0].ManifestChecksum, "sha256:") || rel[0].Note != "5 manifests" {
		t.Fatalf("reloaded records: %+v, want one with the set checksum and 5 manifests", rel)
	}

	// A broken file: refused, journaled with the file's name, the old rules keep serving.
	write(t, filepath.Join(dir, "broken.yaml"), "- tool: memory.add_observations\n  effect: maybe\n")
	began = time.Now()
	var failed []store.Record
	for len(failed) == 0 {
		if time.Since(began) > 15*time.Second {
			t.Fatal("no reload_failed record after a broken file was written")
		}
		time.Sleep(20 * time.Millisecond)
		failed = gatewayRecords(t, f.store, store.KindReloadFailed)
	}
	if !strings.Contains(failed[0].Note, "broken.yaml") || !strings.Contains(failed[0].Note, "effect") {
		t.Errorf("reload_failed note %q does not name the file and the field", failed[0].Note)
	}
	if res := call(t, cs, "memory.search_nodes", search); res.IsError {
		t.Errorf("after a refused reload search_nodes is blocked: %v", texts(res))
	}
	if res := call(t, cs, "memory.add_observations", map[string]any{"observations": []any{}}); !res.IsError {
		t.Errorf("the broken manifest's tool passed")
	}
	if got := gatewayRecords(t, f.store, store.KindReloaded); len(got) != 1 {
		t.Errorf("reloaded records after the refused reload: %d, want still 1", len(got))
	}
	if !strings.Contains(f.stderr.String(), "reload refused, the previous manifests keep serving") {
		t.Errorf("stderr does not report the refused reload:\n%s", f.stderr.String())
	}
	// One session, one run: the reloads did not drop it.
	run, _ := onlyRun(t, f.store)
	if run.Status != store.RunActive {
		t.Errorf("run status %s, want active", run.Status)
	}
}

// TestReloadUnchangedIsNotJournaled: a reload that finds the same manifests changes nothing.
func TestReloadUnchangedIsNotJournaled(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "memory.yaml"), memoryManifests)
	load := dirLoader(dir)
	ms, _ := load(context.Background())
	f := startWith(t, memoryConfig(t, config.ModeEnforce), Options{Manifests: ms.Manifests, Load: load})
	e := f.gw.Engine()
	res := f.gw.Reload(context.Background())
	if res.Changed || res.Err != nil || res.Tools != 4 || !strings.HasPrefix(res.Checksum, "sha256:") {
		t.Fatalf("Reload = %+v, want unchanged, 4 tools", res)
	}
	if f.gw.Engine() != e || len(gatewayRecords(t, f.store, store.KindReloaded)) != 0 {
		t.Fatal("an unchanged reload swapped the engine or was journaled")
	}
	// Reformatting the file does not change the set checksum either.
	write(t, filepath.Join(dir, "memory.yaml"), "\n# reordered comment\n"+memoryManifests)
	if res := f.gw.Reload(context.Background()); res.Changed {
		t.Fatal("a comment-only change counted as a change")
	}
	// Without a source, a reload is refused and journaled.
	g := startWith(t, memoryConfig(t, config.ModeEnforce), Options{Manifests: ms.Manifests})
	if res := g.gw.Reload(context.Background()); res.Err == nil || len(gatewayRecords(t, g.store, store.KindReloadFailed)) != 1 {
		t.Fatalf("Reload without a source = %+v", res)
	}
}

// TestReloadKeepsTheStartMode: the automatic observe mode survives a reload that brings
// manifests (seed: "After you add manifests, restart to leave the automatic observe mode").
func TestReloadKeepsTheStartMode(t *testing.T) {
	dir := t.TempDir()
	cfg := memoryConfig(t, "")
	f := startWith(t, cfg, Options{Load: dirLoader(dir)})
	write(t, filepath.Join(dir, "memory.yaml"), memoryManifests)
	if res := f.gw.Reload(context.Background()); !res.Changed {
		t.Fatalf("Reload = %+v", res)
	}
	cs := f.client(t)
	if res := call(t, cs, "memory.search_nodes", map[string]any{"query": "x"}); res.IsError {
		t.Fatalf("after reload in automatic observe mode an unmanifested tool was blocked: %v", texts(res))
	}
	if m := f.gw.Engine().Mode(); m != "observe" {
		t.Fatalf("mode after reload %s, want observe", m)
	}
}

// TestReloadDoesNotDisturbCalls: calls keep flowing, none fails, while the manifests are
// swapped back and forth many times.
func TestReloadDoesNotDisturbCalls(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "memory.yaml")
	write(t, p, memoryManifests)
	load := dirLoader(dir)
	ms, _ := load(context.Background())
	f := startWith(t, memoryConfig(t, config.ModeEnforce), Options{Manifests: ms.Manifests, Load: load})
	const sessions, calls = 4, 40
	var wg sync.WaitGroup
	errs := make(chan string, sessions*calls)
	for i := 0; i < sessions; i++ {
		cs := f.client(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < calls; j++ {
				res, err := cs.CallTool(context.Background(), mcpCall("memory.read_graph"))
				if err != nil {
					errs <- err.Error()
				} else if res.IsError {
					errs <- strings.Join(texts(res), " ")
				}
			}
		}()
	}
	reloads := 0
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
loop:
	for i := 0; ; i++ {
		select {
		case <-done:
			break loop
		default:
		}
		body := memoryManifests
		if i%2 == 0 {
			body += searchManifest
		}
		write(t, p, body)
		if res := f.gw.Reload(context.Background()); res.Err != nil || !res.Changed {
			t.Fatalf("reload %d: %+v", i, res)
		}
		reloads++
	}
	close(errs)
	for e := range errs {
		t.Errorf("a call failed during reloads: %s", e)
	}
	if reloads < 2 {
		t.Fatalf("only %d reloads happened during the calls", reloads)
	}
	t.Logf("%d calls in %d sessions during %d reloads", sessions*calls, sessions, reloads)
	runs, _ := f.store.ListRuns(context.Background(), store.RunFilter{})
	for _, r := range runs {
		recs, _ := f.store.Records(context.Background(), r.ID, 0, 0)
		checkIntentBeforeOutcome(t, recs)
		if len(stepsOf(recs, "memory.read_graph")) != calls {
			t.Errorf("run %s journaled %d read_graph steps, want %d", r.ID, len(stepsOf(recs, "memory.read_graph")), calls)
		}
	}
}

// TestFingerprint: content, new files, removals and a swapped ConfigMap-style link change it.
func TestFingerprint(t *testing.T) {
	dir := t.TempDir()
	data1, data2 := filepath.Join(dir, "..2026_1"), filepath.Join(dir, "..2026_2")
	for _, d := range []string{data1, data2} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(data1, "m.yaml"), "a")
	write(t, filepath.Join(data2, "m.yaml"), "bb")
	vol := filepath.Join(dir, "vol")
	if err := os.Mkdir(vol, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(data1, filepath.Join(vol, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "m.yaml"), filepath.Join(vol, "m.yaml")); err != nil {
		t.Fatal(err)
	}
	a := Fingerprint(vol)
	if a != Fingerprint(vol) {
		t.Fatal("fingerprint is not stable")
	}
	// The kubelet's atomic swap: ..data points at the new folder.
	tmp := filepath.Join(vol, "..data_tmp")
	if err := os.Symlink(data2, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(vol, "..data")); err != nil {
		t.Fatal(err)
	}
	b := Fingerprint(vol)
	if a == b {
		t.Fatal("swapping ..data did not change the fingerprint")
	}
	write(t, filepath.Join(vol, "n.yaml"), "x")
	c := Fingerprint(vol)
	if c == b {
		t.Fatal("a new file did not change the fingerprint")
	}
	if err := os.Remove(filepath.Join(vol, "n.yaml")); err != nil {
		t.Fatal(err)
	}
	if Fingerprint(vol) != b {
		t.Fatal("removing the new file did not restore the fingerprint")
	}
	if Fingerprint(filepath.Join(dir, "missing")) == Fingerprint(filepath.Join(dir, "other-missing")) {
		t.Fatal("errors are not folded into the fingerprint")
	}
}

func mcpCall(tool string) *mcp.CallToolParams {
	return &mcp.CallToolParams{Name: tool, Arguments: map[string]any{}}
}

// TestRequiresThroughTheGateway: a tool whose manifest requires another is blocked until that
// one succeeded earlier in the same run, and only in that run.
func TestRequiresThroughTheGateway(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "m.yaml"), memoryManifests+`
- tool: memory.search_nodes
  description: Search.
  effect: read_only
  permission: memory:read
  requires: [memory.read_graph]
`)
	ms, err := dirLoader(dir)(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	f := startWith(t, memoryConfig(t, config.ModeEnforce), Options{Manifests: ms.Manifests, Name: "agents"})
	cs := f.client(t)
	q := map[string]any{"query": "x"}
	if res := call(t, cs, "memory.search_nodes", q); !res.IsError || !strings.Contains(strings.Join(texts(res), ""), "memory.read_graph") {
		t.Fatalf("search_nodes before read_graph: %v", texts(res))
	}
	call(t, cs, "memory.read_graph", map[string]any{})
	if res := call(t, cs, "memory.search_nodes", q); res.IsError {
		t.Fatalf("search_nodes after read_graph: %v", texts(res))
	}
	other := f.client(t) // another session is another run
	if res := call(t, other, "memory.search_nodes", q); !res.IsError {
		t.Fatalf("search_nodes in another run passed: %v", texts(res))
	}
	runs, _ := f.store.ListRuns(context.Background(), store.RunFilter{})
	if len(runs) != 2 || runs[0].Gateway != "agents" || runs[1].Gateway != "agents" {
		t.Errorf("runs %+v, want two of gateway agents (Options.Name)", runs)
	}
}

// TestReloadRefusesAnOlderSnapshot: the gateway keeps a high-water mark per source in its
// store; a load whose snapshot is older than one it served is refused (the newer rules keep
// serving, reload_failed is journaled) and so is a start on it with the same store.
func TestReloadRefusesAnOlderSnapshot(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "memory.yaml"), memoryManifests)
	v1, err := dirLoader(dir)(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "search.yaml"), searchManifest)
	v2, err := dirLoader(dir)(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	mark := func(seq int64, l Loaded, rev string) Loaded {
		d, _, _ := digest(l.Manifests)
		l.Marks = []store.HighWater{{Source: "ManifestRegistry agents/memory", Sequence: seq, Revision: rev, Digest: d}}
		l.Revision = "ManifestRegistry agents/memory " + rev
		return l
	}
	var next atomic.Pointer[Loaded]
	first := mark(5, v1, "main@sha1:1111")
	next.Store(&first)
	load := func(context.Context) (Loaded, error) { return *next.Load(), nil }
	f := startWith(t, memoryConfig(t, config.ModeEnforce), Options{Manifests: first.Manifests, Marks: first.Marks, Revision: first.Revision, Load: load})
	if f.gw.Revision() != first.Revision {
		t.Fatalf("revision at start %q", f.gw.Revision())
	}
	newer := mark(6, v2, "main@sha1:2222")
	next.Store(&newer)
	if res := f.gw.Reload(context.Background()); res.Err != nil || !res.Changed || f.gw.Revision() != newer.Revision {
		t.Fatalf("newer snapshot: %+v, revision %q", res, f.gw.Revision())
	}
	served := f.gw.Digest()
	replay := mark(5, v1, "main@sha1:1111")
	next.Store(&replay)
	res := f.gw.Reload(context.Background())
	if !errors.Is(res.Err, store.ErrDowngrade) || !strings.Contains(res.Err.Error(), "older than 6") {
		t.Fatalf("replayed older snapshot: %+v", res)
	}
	if f.gw.Digest() != served || f.gw.Revision() != newer.Revision {
		t.Fatalf("after the refusal the gateway serves %s (%s)", f.gw.Digest(), f.gw.Revision())
	}
	if failed := gatewayRecords(t, f.store, store.KindReloadFailed); len(failed) != 1 || !strings.Contains(failed[0].Note, "older than 6") {
		t.Fatalf("reload_failed records %+v", failed)
	}
	// A restart on the older snapshot, with the same store: refused.
	_, err = New(context.Background(), Options{Config: memoryConfig(t, config.ModeEnforce), Store: f.store, Manifests: replay.Manifests, Marks: replay.Marks})
	if !errors.Is(err, store.ErrDowngrade) {
		t.Fatalf("start on an older snapshot: %v", err)
	}
}
