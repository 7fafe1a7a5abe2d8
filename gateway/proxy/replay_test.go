package proxy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// staleApprovals shows every approval as unused, as a stale cache or an edited mirror would
// (a removed reversi.dev/consumedAt annotation): the engine then picks an approval that was
// already used, and only the store's consumption can stop the replay.
type staleApprovals struct{ store.Store }

func (s staleApprovals) ListApprovals(ctx context.Context, f store.ApprovalFilter) ([]store.Approval, error) {
	list, err := s.Store.ListApprovals(ctx, f)
	for i := range list {
		list[i].Consumed = time.Time{}
	}
	return list, err
}

func startOpts(t *testing.T, o Options) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errw := &syncBuffer{}
	o.Stderr = errw
	gw, err := New(ctx, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	return &fixture{gw: gw, store: o.Store, stderr: errw}
}

func sqliteStore(t *testing.T) *store.SQLite {
	st, err := store.OpenSQLite(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// TestReplayIsRefused: one approval lets one call through. A retry that the engine lets pass
// on a view that says the approval is unused (stale, or with its mirror removed) is refused
// by the store in the intent's transaction: the upstream does not see it, the call is
// journaled blocked with "approval <id> was already used", and the run gets a replay_refused
// decision record. Source: issue 16 ("One approval, many executions").
func TestReplayIsRefused(t *testing.T) {
	sq := sqliteStore(t)
	f := startOpts(t, Options{Config: memoryConfig(t, config.ModeEnforce), Manifests: loadManifests(t), Store: staleApprovals{sq}})
	cs := f.client(t)
	ctx := context.Background()
	for _, name := range []string{"alice", "bob"} {
		if res := call(t, cs, "memory.create_entities", map[string]any{"entities": []any{
			map[string]any{"name": name, "entityType": "person", "observations": []any{}}}}); res.IsError {
			t.Fatalf("create %s: %v", name, texts(res))
		}
	}
	del := map[string]any{"entityNames": []any{"alice"}}
	if res := call(t, cs, "memory.delete_entities", del); !res.IsError {
		t.Fatalf("the first delete was not held: %v", texts(res))
	}
	pending, err := sq.ListApprovals(ctx, store.ApprovalFilter{State: store.ApprovalPending})
	if err != nil || len(pending) != 1 {
		t.Fatalf("pending %+v %v", pending, err)
	}
	id := pending[0].ID
	if _, err := sq.Decide(ctx, id, store.Decision{By: "ops", Approve: true}); err != nil {
		t.Fatal(err)
	}
	if res := call(t, cs, "memory.delete_entities", del); res.IsError {
		t.Fatalf("the approved retry: %v", texts(res))
	}
	// recreate alice, so that a second delete would be observable
	if res := call(t, cs, "memory.create_entities", map[string]any{"entities": []any{
		map[string]any{"name": "alice", "entityType": "person", "observations": []any{}}}}); res.IsError {
		t.Fatalf("create alice again: %v", texts(res))
	}
	res := call(t, cs, "memory.delete_entities", del)
	want := "Blocked by Reversi: approval " + id + " was already used: "
	if text := strings.Join(texts(res), ""); !res.IsError || !strings.HasPrefix(text, want) {
		t.Fatalf("the replay: isError %v %q, want %q...", res.IsError, text, want)
	}
	if res := call(t, cs, "memory.read_graph", map[string]any{}); !strings.Contains(strings.Join(texts(res), ""), "alice") {
		t.Fatalf("the replay reached the upstream: alice is gone: %v", texts(res))
	}
	_, recs := onlyRun(t, sq)
	de := stepsOf(recs, "memory.delete_entities")
	if len(de) != 3 || de[1][0].Approval != id || de[2][0].Approval != "" || de[2][0].Decision != "block" ||
		de[2][1].Status != store.Blocked || !strings.HasPrefix(de[2][1].Note, "approval "+id+" was already used") {
		t.Fatalf("delete steps %+v", de)
	}
	var evs []string
	for _, r := range recs {
		if r.Kind == store.KindApproval && r.Approval == id {
			evs = append(evs, string(r.Event))
		}
	}
	if got := strings.Join(evs, ","); got != "counted,approved,consumed,replay_refused" {
		t.Fatalf("decision records %s", got)
	}
}

// TestRunOfAnotherGateway: a run id this gateway's store holds for another gateway (a store
// shared by name) is refused with the same text a ReversiRun of another gateway gets, and the
// refusal is journaled in the gateway journal. Source: issue 16 ("Runs belong to a gateway").
func TestRunOfAnotherGateway(t *testing.T) {
	sq := sqliteStore(t)
	ctx := context.Background()
	if _, err := sq.CreateRun(ctx, store.Run{ID: "run-a", Actor: "dev-laptop", Gateway: "gateway-a"}); err != nil {
		t.Fatal(err)
	}
	f := startOpts(t, Options{Config: memoryConfig(t, config.ModeEnforce), Manifests: loadManifests(t), Store: sq,
		Name: "gateway-b", RunID: "run-a"})
	res := call(t, f.client(t), "memory.read_graph", map[string]any{})
	want := "the run run-a belongs to another gateway"
	if text := strings.Join(texts(res), ""); !res.IsError || !strings.Contains(text, want) {
		t.Fatalf("isError %v %q, want %q", res.IsError, text, want)
	}
	if recs, _ := sq.Records(ctx, "run-a", 0, 0); len(recs) != 0 {
		t.Fatalf("the other gateway's run got records: %+v", recs)
	}
	recs, err := sq.Records(ctx, store.GatewayJournal, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range recs {
		found = found || (r.Kind == store.KindNote && strings.Contains(r.Note, want) && strings.Contains(r.Note, "dev-laptop"))
	}
	if !found {
		t.Fatalf("not journaled in the gateway journal: %+v", recs)
	}
}
