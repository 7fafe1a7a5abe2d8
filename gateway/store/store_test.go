package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a settable Clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Microsecond) // strictly increasing, so orderings are observable
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type impl struct {
	name string
	open func(t testing.TB, clock Clock) Store
}

var impls = []impl{
	{"memory", func(t testing.TB, clock Clock) Store {
		s := NewMemory(clock)
		t.Cleanup(func() { s.Close() })
		return s
	}},
	{"sqlite", func(t testing.TB, clock Clock) Store {
		s, err := OpenSQLite(t.TempDir(), clock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}},
}

// forEach runs fn against every implementation with a fresh store and a fake clock.
func forEach(t *testing.T, fn func(t *testing.T, s Store, clock *fakeClock)) {
	for _, im := range impls {
		t.Run(im.name, func(t *testing.T) {
			t.Parallel()
			clock := newFakeClock()
			fn(t, im.open(t, clock.Now), clock)
		})
	}
}

// restart stands for the gateway process stopping and starting again: a SQLite store is
// closed and opened on the same file (a new instance), a Postgres store on the same schema; a
// Memory store is kept.
func restart(t *testing.T, s Store) Store {
	t.Helper()
	if pg, ok := s.(*Postgres); ok {
		return restartPostgres(t, pg)
	}
	sq, ok := s.(*SQLite)
	if !ok {
		return s
	}
	if err := sq.Close(); err != nil {
		t.Fatal(err)
	}
	n, err := OpenSQLite(filepath.Dir(sq.Path()), sq.now)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v, want %v", err, target)
	}
}

func must[T any](t *testing.T) func(v T, err error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func TestRuns(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, clock *fakeClock) {
		ctx := context.Background()
		_, err := s.CreateRun(ctx, Run{Gateway: "gw"})
		wantErr(t, err, ErrInvalid)

		a := must[Run](t)(s.CreateRun(ctx, Run{ID: "run-a", Actor: "alice", Gateway: "gw"}))
		if a.Status != RunActive || a.Started.IsZero() || !a.Started.Equal(a.LastActivity) {
			t.Fatalf("new run %+v", a)
		}
		_, err = s.CreateRun(ctx, Run{ID: "run-a", Actor: "bob"})
		wantErr(t, err, ErrExists)
		b := must[Run](t)(s.CreateRun(ctx, Run{Actor: "bob", Gateway: "other"}))
		if len(b.ID) < 8 || b.ID[:4] != "run-" {
			t.Fatalf("generated id %q", b.ID)
		}

		got := must[Run](t)(s.GetRun(ctx, "run-a"))
		if !reflect.DeepEqual(got, a) {
			t.Fatalf("GetRun %+v, want %+v", got, a)
		}
		_, err = s.GetRun(ctx, "nope")
		wantErr(t, err, ErrNotFound)
		_, err = s.GetRun(ctx, GatewayJournal)
		wantErr(t, err, ErrNotFound)

		all := must[[]Run](t)(s.ListRuns(ctx, RunFilter{}))
		if len(all) != 2 || all[0].ID != b.ID || all[1].ID != "run-a" {
			t.Fatalf("ListRuns newest first: %+v", all)
		}
		if l := must[[]Run](t)(s.ListRuns(ctx, RunFilter{Actor: "alice"})); len(l) != 1 || l[0].ID != "run-a" {
			t.Fatalf("by actor: %+v", l)
		}
		if l := must[[]Run](t)(s.ListRuns(ctx, RunFilter{Gateway: "other"})); len(l) != 1 || l[0].ID != b.ID {
			t.Fatalf("by gateway: %+v", l)
		}
		if l := must[[]Run](t)(s.ListRuns(ctx, RunFilter{Limit: 1})); len(l) != 1 {
			t.Fatalf("limit: %+v", l)
		}

		must[struct{}](t)(struct{}{}, s.SetRunStatus(ctx, "run-a", RunIdle))
		wantErr(t, s.SetRunStatus(ctx, "run-a", "bogus"), ErrInvalid)
		wantErr(t, s.SetRunStatus(ctx, "nope", RunIdle), ErrNotFound)
		if l := must[[]Run](t)(s.ListRuns(ctx, RunFilter{Status: RunIdle})); len(l) != 1 || l[0].ID != "run-a" {
			t.Fatalf("by status: %+v", l)
		}

		clock.Advance(time.Minute)
		_, err = s.ContinueRun(ctx, "run-a", "bob")
		wantErr(t, err, ErrNotOwner)
		_, err = s.ContinueRun(ctx, "nope", "alice")
		wantErr(t, err, ErrNotFound)
		c := must[Run](t)(s.ContinueRun(ctx, "run-a", "alice"))
		if c.Status != RunActive || c.LastActivity.Sub(a.LastActivity) < time.Minute || !c.Started.Equal(a.Started) {
			t.Fatalf("continued run %+v (was %+v)", c, a)
		}
		if got := must[Run](t)(s.GetRun(ctx, "run-a")); !reflect.DeepEqual(got, c) {
			t.Fatalf("after continue GetRun %+v, want %+v", got, c)
		}

		clock.Advance(time.Minute)
		must[int64](t)(s.RecordIntent(ctx, Intent{Run: "run-a", Tool: "t"}))
		if got := must[Run](t)(s.GetRun(ctx, "run-a")); got.LastActivity.Sub(c.LastActivity) < time.Minute {
			t.Fatalf("a record did not touch last activity: %v then %v", c.LastActivity, got.LastActivity)
		}
	})
}

func TestLedger(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, clock *fakeClock) {
		ctx := context.Background()
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "alice"}))
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r2", Actor: "alice"}))

		_, err := s.RecordIntent(ctx, Intent{Run: "nope", Tool: "t"})
		wantErr(t, err, ErrNotFound)
		_, err = s.RecordIntent(ctx, Intent{Run: "r1"})
		wantErr(t, err, ErrInvalid)
		_, err = s.RecordIntent(ctx, Intent{Run: GatewayJournal, Tool: "t"})
		wantErr(t, err, ErrInvalid)

		in := Intent{Run: "r1", Tool: "crm.create", ArgsDigest: "sha256:abc", Reason: "MCP tools/call crm.create",
			IdempotencyKey: "crm.create\x00run:r1\x00k", ManifestVersion: "v3", ManifestChecksum: "sha256:m",
			Mode: "enforce", Decision: "allow"}
		s1 := must[int64](t)(s.RecordIntent(ctx, in))
		s2 := must[int64](t)(s.RecordIntent(ctx, Intent{Run: "r1", Tool: "crm.read"}))
		if o := must[int64](t)(s.RecordIntent(ctx, Intent{Run: "r2", Tool: "x"})); o != 1 {
			t.Fatalf("sequences are per run: first step of r2 is %d", o)
		}
		if s1 != 1 || s2 != 2 {
			t.Fatalf("steps %d, %d", s1, s2)
		}
		pend := must[[]Record](t)(s.PendingSteps(ctx, "r1"))
		if len(pend) != 2 || pend[0].Step != 1 || pend[1].Step != 2 {
			t.Fatalf("pending %+v", pend)
		}

		handle := map[string]any{"charge_id": "ch_1", "amount": 12.5, "nested": map[string]any{"a": []any{"x"}}}
		o1 := must[int64](t)(s.RecordOutcome(ctx, "r1", s1, StepOutcome{Status: Succeeded, CompensationTool: "crm.delete", Handle: handle, Note: "n"}))
		if o1 != 3 {
			t.Fatalf("outcome seq %d", o1)
		}
		handle["charge_id"] = "changed after the call" // the store keeps its own copy
		_, err = s.RecordOutcome(ctx, "r1", s1, StepOutcome{Status: Failed})
		wantErr(t, err, ErrCompleted)
		_, err = s.RecordOutcome(ctx, "r1", o1, StepOutcome{Status: Failed})
		wantErr(t, err, ErrNotFound) // an outcome record is not a step
		_, err = s.RecordOutcome(ctx, "r1", 99, StepOutcome{Status: Failed})
		wantErr(t, err, ErrNotFound)
		_, err = s.RecordOutcome(ctx, "nope", 1, StepOutcome{Status: Failed})
		wantErr(t, err, ErrNotFound)
		_, err = s.RecordOutcome(ctx, "r1", s2, StepOutcome{Status: "maybe"})
		wantErr(t, err, ErrInvalid)
		_, err = s.RecordOutcome(ctx, "r1", s2, StepOutcome{Status: Succeeded, Handle: map[string]any{"f": func() {}}})
		wantErr(t, err, ErrInvalid)

		if _, err := s.AppendEvent(ctx, Event{Run: "r1", Kind: KindIntent}); !errors.Is(err, ErrInvalid) {
			t.Fatalf("AppendEvent(intent): %v", err)
		}
		e := must[int64](t)(s.AppendEvent(ctx, Event{Run: "r1", Kind: KindNote, Note: "unclassified read"}))
		if e != 4 {
			t.Fatalf("note seq %d", e)
		}
		must[int64](t)(s.AppendEvent(ctx, Event{Run: GatewayJournal, Kind: KindReloaded, ManifestVersion: "rev2", ManifestChecksum: "c2"}))
		must[int64](t)(s.AppendEvent(ctx, Event{Run: GatewayJournal, Kind: KindReloadFailed, Note: "manifests/x.yaml: bad effect"}))
		_, err = s.AppendEvent(ctx, Event{Run: "nope", Kind: KindNote})
		wantErr(t, err, ErrNotFound)

		recs := must[[]Record](t)(s.Records(ctx, "r1", 0, 0))
		if len(recs) != 4 {
			t.Fatalf("records %+v", recs)
		}
		for i, r := range recs {
			if r.Seq != int64(i+1) || r.Run != "r1" || r.Time.IsZero() || (i > 0 && r.Time.Before(recs[i-1].Time)) {
				t.Fatalf("record %d: %+v", i, r)
			}
		}
		want0 := Record{Run: "r1", Seq: 1, Kind: KindIntent, Time: recs[0].Time, Step: 1, Tool: in.Tool, ArgsDigest: in.ArgsDigest,
			Reason: in.Reason, IdempotencyKey: in.IdempotencyKey, ManifestVersion: "v3", ManifestChecksum: "sha256:m",
			Mode: "enforce", Decision: "allow"}
		if !reflect.DeepEqual(recs[0], want0) {
			t.Fatalf("intent record\n got %+v\nwant %+v", recs[0], want0)
		}
		want2 := Record{Run: "r1", Seq: 3, Kind: KindOutcome, Time: recs[2].Time, Step: 1, Tool: "crm.create", Status: Succeeded,
			CompensationTool: "crm.delete", Note: "n",
			Handle: map[string]any{"charge_id": "ch_1", "amount": 12.5, "nested": map[string]any{"a": []any{"x"}}}}
		if !reflect.DeepEqual(recs[2], want2) {
			t.Fatalf("outcome record\n got %+v\nwant %+v", recs[2], want2)
		}
		if recs[3].Kind != KindNote || recs[3].Note != "unclassified read" || recs[3].Step != 0 {
			t.Fatalf("note record %+v", recs[3])
		}
		if page := must[[]Record](t)(s.Records(ctx, "r1", 1, 2)); len(page) != 2 || page[0].Seq != 2 || page[1].Seq != 3 {
			t.Fatalf("page after 1, limit 2: %+v", page)
		}
		gw := must[[]Record](t)(s.Records(ctx, GatewayJournal, 0, 0))
		if len(gw) != 2 || gw[0].Kind != KindReloaded || gw[0].ManifestVersion != "rev2" || gw[1].Kind != KindReloadFailed ||
			gw[1].Note != "manifests/x.yaml: bad effect" {
			t.Fatalf("gateway journal %+v", gw)
		}
		if l := must[[]Run](t)(s.ListRuns(ctx, RunFilter{})); len(l) != 2 {
			t.Fatalf("the gateway journal is not a listed run: %+v", l)
		}

		pend = must[[]Record](t)(s.PendingSteps(ctx, "r1"))
		if len(pend) != 1 || pend[0].Seq != s2 || pend[0].Tool != "crm.read" {
			t.Fatalf("pending after one outcome %+v", pend)
		}
		s = restart(t, s)
		rec := must[[]Record](t)(s.Recover(ctx))
		if len(rec) != 2 || rec[0].Run != "r1" || rec[0].Step != s2 || rec[1].Run != "r2" || rec[1].Step != 1 {
			t.Fatalf("recovered %+v", rec)
		}
		for _, r := range rec {
			if r.Kind != KindOutcome || r.Status != Uncertain || r.Note != RecoveryNote {
				t.Fatalf("recovered record %+v", r)
			}
		}
		if p := must[[]Record](t)(s.PendingSteps(ctx, "r1")); len(p) != 0 {
			t.Fatalf("pending after recovery %+v", p)
		}
		if again := must[[]Record](t)(s.Recover(ctx)); len(again) != 0 {
			t.Fatalf("second recovery %+v", again)
		}
		last := must[[]Record](t)(s.Records(ctx, "r1", 4, 0))
		if len(last) != 1 || last[0].Status != Uncertain || last[0].Step != s2 || last[0].Tool != "crm.read" {
			t.Fatalf("r1 after recovery %+v", last)
		}
		_, err = s.RecordOutcome(ctx, "r1", s2, StepOutcome{Status: Succeeded})
		wantErr(t, err, ErrCompleted)
	})
}

func TestEveryStatus(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r", Actor: "a"}))
		for _, st := range Statuses {
			step := must[int64](t)(s.RecordIntent(ctx, Intent{Run: "r", Tool: "t", Decision: string(st)}))
			seq := must[int64](t)(s.RecordOutcome(ctx, "r", step, StepOutcome{Status: st}))
			got := must[[]Record](t)(s.Records(ctx, "r", seq-1, 0))
			if len(got) != 1 || got[0].Status != st {
				t.Fatalf("%s: %+v", st, got)
			}
		}
	})
}

func TestKeys(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		_, _, err := s.ClaimKey(ctx, "", "r", 1)
		wantErr(t, err, ErrInvalid)
		ok, h, err := s.ClaimKey(ctx, "k", "r1", 3)
		if err != nil || !ok || h.Run != "r1" || h.Step != 3 || h.Key != "k" || h.Claimed.IsZero() {
			t.Fatalf("first claim: %v %+v %v", ok, h, err)
		}
		ok, h2, err := s.ClaimKey(ctx, "k", "r2", 1)
		if err != nil || ok || !reflect.DeepEqual(h2, h) {
			t.Fatalf("second claim: %v %+v %v (holder %+v)", ok, h2, err, h)
		}
		if ok, _, _ := s.ClaimKey(ctx, "other", "r2", 1); !ok {
			t.Fatal("another key is free")
		}
		if err := s.ReleaseKey(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if err := s.ReleaseKey(ctx, "never-held"); err != nil {
			t.Fatal(err)
		}
		ok, h, err = s.ClaimKey(ctx, "k", "r2", 1)
		if err != nil || !ok || h.Run != "r2" {
			t.Fatalf("claim after release: %v %+v %v", ok, h, err)
		}
	})
}

// TestKeyHolderStep: an intent that holds its key (claimed with step 0) becomes the holder's
// step in the same write; an intent that does not hold it (a refused duplicate) changes nothing.
func TestKeyHolderStep(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		for _, id := range []string{"r1", "r2"} {
			if _, err := s.CreateRun(ctx, Run{ID: id, Actor: "a"}); err != nil {
				t.Fatal(err)
			}
		}
		if ok, _, err := s.ClaimKey(ctx, "k", "r1", 0); !ok || err != nil {
			t.Fatalf("claim: %v %v", ok, err)
		}
		// A refused duplicate in the same run journals the key without holding it.
		if _, err := s.RecordIntent(ctx, Intent{Run: "r1", Tool: "t", IdempotencyKey: "k"}); err != nil {
			t.Fatal(err)
		}
		step, err := s.RecordIntent(ctx, Intent{Run: "r1", Tool: "t", IdempotencyKey: "k", HoldsKey: true})
		if err != nil {
			t.Fatal(err)
		}
		_, h, _ := s.ClaimKey(ctx, "k", "r2", 0)
		if h.Run != "r1" || h.Step != step || step != 2 {
			t.Fatalf("holder %+v, want run r1 step %d (= 2)", h, step)
		}
		// Holding it again (another run's intent naming the key) does not move it.
		if _, err := s.RecordIntent(ctx, Intent{Run: "r2", Tool: "t", IdempotencyKey: "k", HoldsKey: true}); err != nil {
			t.Fatal(err)
		}
		if _, h2, _ := s.ClaimKey(ctx, "k", "r2", 0); h2 != h {
			t.Fatalf("holder moved to %+v", h2)
		}
	})
}

func TestKeyRace(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		const n = 32
		for round := range 5 {
			key := fmt.Sprintf("charge-%d", round)
			var wins atomic.Int32
			holders := make([]KeyHolder, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					ok, h, err := s.ClaimKey(ctx, key, fmt.Sprintf("run-%d", i), int64(i+1))
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						wins.Add(1)
					}
					holders[i] = h
				})
			}
			close(start)
			wg.Wait()
			if wins.Load() != 1 {
				t.Fatalf("round %d: %d winners", round, wins.Load())
			}
			for i := range holders {
				if !reflect.DeepEqual(holders[i], holders[0]) {
					t.Fatalf("round %d: holders differ: %+v vs %+v", round, holders[i], holders[0])
				}
			}
		}
	})
}

func TestClosed(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		_, err := s.CreateRun(ctx, Run{Actor: "a"})
		wantErr(t, err, ErrClosed)
		_, err = s.RecordIntent(ctx, Intent{Run: "r", Tool: "t"})
		wantErr(t, err, ErrClosed)
		_, err = s.Records(ctx, "r", 0, 0)
		wantErr(t, err, ErrClosed)
		wantErr(t, s.AdvanceHighWater(ctx, []HighWater{{Source: "s", Sequence: 1}}), ErrClosed)
		_, err = s.HighWaters(ctx)
		wantErr(t, err, ErrClosed)
	})
}

// TestReadAndServerRequestRecords (issue 19): read and server_request records keep their
// fields in every store, survive a restart, and are not steps (no outcome counts, no
// "succeeded" record for a manifest's requires).
func TestReadAndServerRequestRecords(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		run := must[Run](t)(s.CreateRun(ctx, Run{Actor: "alice"}))
		step := must[int64](t)(s.RecordIntent(ctx, Intent{Run: run.ID, Tool: "up.work", Mode: "enforce", Decision: "allow"}))
		read := Event{Run: run.ID, Kind: KindRead, Tool: "up.greet", Reason: "prompts/get", ArgsDigest: "sha256:ab", Decision: "allow"}
		sreq := Event{Run: run.ID, Kind: KindServerRequest, Step: step, Tool: "up", Reason: "sampling/createMessage", ArgsDigest: "sha256:cd", Note: "answered"}
		for _, e := range []Event{read, sreq} {
			must[int64](t)(s.AppendEvent(ctx, e))
		}
		_, err := s.AppendEvent(ctx, Event{Run: run.ID, Kind: KindIntent})
		wantErr(t, err, ErrInvalid)
		s = restart(t, s)
		recs := must[[]Record](t)(s.Records(ctx, run.ID, step, 0))
		if len(recs) != 2 {
			t.Fatalf("records %+v", recs)
		}
		for i, e := range []Event{read, sreq} {
			r := recs[i]
			if r.Kind != e.Kind || r.Tool != e.Tool || r.Reason != e.Reason || r.ArgsDigest != e.ArgsDigest || r.Decision != e.Decision ||
				r.Note != e.Note || r.Step != e.Step || r.Status != "" {
				t.Errorf("record %+v, want the fields of %+v", r, e)
			}
		}
		if c := must[map[string]OutcomeCounts](t)(s.CountOutcomes(ctx, []string{run.ID})); len(c[run.ID]) != 0 {
			t.Errorf("a read counted as an outcome: %v", c)
		}
		if got := must[[]Record](t)(s.SearchRecords(ctx, RecordSearch{Run: run.ID, Tool: "up.greet", Status: Succeeded})); len(got) != 0 {
			t.Errorf("a read found as a succeeded step: %+v", got)
		}
	})
}
