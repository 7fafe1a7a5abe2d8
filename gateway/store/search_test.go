package store

import (
	"context"
	"fmt"
	"reflect"
	"testing"
)

// ids returns the runs' ids in order.
func ids(runs []Run) []string {
	out := []string{}
	for _, r := range runs {
		out = append(out, r.ID)
	}
	return out
}

// seqs returns "run/seq" of each record in order.
func seqs(recs []Record) []string {
	out := []string{}
	for _, r := range recs {
		out = append(out, fmt.Sprintf("%s/%d", r.Run, r.Seq))
	}
	return out
}

// searchFixture: alice has runs a1 (create ok, read ok) and a2 (create failed, blocked
// delete, an event); bob has b1 (create ok). The gateway journal has a reload note.
func searchFixture(t *testing.T, s Store) {
	ctx := context.Background()
	for _, r := range []Run{{ID: "a1", Actor: "alice"}, {ID: "b1", Actor: "bob"}, {ID: "a2", Actor: "alice"}} {
		must[Run](t)(s.CreateRun(ctx, r))
	}
	step := func(run, tool, reason string, o StepOutcome) {
		n := must[int64](t)(s.RecordIntent(ctx, Intent{Run: run, Tool: tool, Reason: reason}))
		must[int64](t)(s.RecordOutcome(ctx, run, n, o))
	}
	step("a1", "mem.create", "add Alice", StepOutcome{Status: Succeeded, CompensationTool: "mem.delete", Handle: map[string]any{"name": "alice"}})
	step("a1", "mem.read", "MCP tools/call mem.read", StepOutcome{Status: Succeeded})
	step("b1", "mem.create", "add Bob", StepOutcome{Status: Succeeded})
	step("a2", "mem.create", "again", StepOutcome{Status: Failed, Note: "Upstream said NO"})
	step("a2", "mem.delete", "cleanup", StepOutcome{Status: Blocked, Note: "there is no manifest"})
	must[int64](t)(s.AppendEvent(ctx, Event{Run: "a2", Kind: KindNote, Note: "a free note"}))
	must[int64](t)(s.AppendEvent(ctx, Event{Run: GatewayJournal, Kind: KindReloaded, Note: "mem.create changed"}))
}

func TestSearchRuns(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		searchFixture(t, s)
		ctx := context.Background()
		cases := []struct {
			f    RunSearch
			want []string
		}{
			{RunSearch{}, []string{"a2", "b1", "a1"}},
			{RunSearch{Actor: "alice"}, []string{"a2", "a1"}},
			{RunSearch{Actor: "alice", Limit: 1}, []string{"a2"}},
			{RunSearch{Actor: "alice", Tool: "mem.read"}, []string{"a1"}},
			{RunSearch{Actor: "alice", Tool: "mem.create", Outcome: Failed}, []string{"a2"}},
			{RunSearch{Actor: "alice", Tool: "mem.read", Outcome: Failed}, []string{}}, // one record must match both
			{RunSearch{Actor: "alice", Outcome: Blocked}, []string{"a2"}},
			{RunSearch{Text: "ADD"}, []string{"b1", "a1"}},                        // reason, case-insensitive
			{RunSearch{Actor: "alice", Text: "upstream said"}, []string{"a2"}},    // note
			{RunSearch{Actor: "alice", Text: "mem.delete"}, []string{"a2", "a1"}}, // tool or compensation tool
			{RunSearch{Text: "b1"}, []string{"b1"}},                               // run id
			{RunSearch{Actor: "bob", Text: "alice"}, []string{}},                  // handle values are not searched
			{RunSearch{Actor: "carol"}, []string{}},
		}
		for _, c := range cases {
			if got := ids(must[[]Run](t)(s.SearchRuns(ctx, c.f))); !reflect.DeepEqual(got, c.want) {
				t.Errorf("SearchRuns(%+v) = %v, want %v", c.f, got, c.want)
			}
		}
		must[struct{}](t)(struct{}{}, s.SetRunStatus(ctx, "a1", RunIdle))
		if got := ids(must[[]Run](t)(s.SearchRuns(ctx, RunSearch{Actor: "alice", Status: RunIdle}))); !reflect.DeepEqual(got, []string{"a1"}) {
			t.Errorf("by run status: %v", got)
		}
	})
}

func TestSearchRecords(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		searchFixture(t, s)
		ctx := context.Background()
		cases := []struct {
			f    RecordSearch
			want []string
		}{
			{RecordSearch{Actor: "alice"}, []string{"a2/5", "a2/4", "a2/3", "a2/2", "a2/1", "a1/4", "a1/3", "a1/2", "a1/1"}},
			{RecordSearch{Actor: "alice", Limit: 2}, []string{"a2/5", "a2/4"}},
			{RecordSearch{Actor: "alice", Tool: "mem.create"}, []string{"a2/2", "a2/1", "a1/2", "a1/1"}},
			{RecordSearch{Actor: "alice", Status: Succeeded}, []string{"a1/4", "a1/2"}},
			{RecordSearch{Actor: "alice", Run: "a1", Tool: "mem.read"}, []string{"a1/4", "a1/3"}},
			{RecordSearch{Actor: "alice", Run: "b1"}, []string{}}, // another actor's run
			{RecordSearch{Actor: "alice", Text: "NOTE"}, []string{"a2/5"}},
			{RecordSearch{Actor: "bob"}, []string{"b1/2", "b1/1"}},
			{RecordSearch{Text: "changed"}, []string{"/1"}}, // the gateway journal, only without an actor
			{RecordSearch{Actor: "alice", Text: "changed"}, []string{}},
		}
		for _, c := range cases {
			if got := seqs(must[[]Record](t)(s.SearchRecords(ctx, c.f))); !reflect.DeepEqual(got, c.want) {
				t.Errorf("SearchRecords(%+v) = %v, want %v", c.f, got, c.want)
			}
		}
		recs := must[[]Record](t)(s.SearchRecords(ctx, RecordSearch{Actor: "alice", Run: "a1", Tool: "mem.create", Status: Succeeded}))
		if len(recs) != 1 || recs[0].Kind != KindOutcome || recs[0].Step != 1 || recs[0].Handle["name"] != "alice" || recs[0].CompensationTool != "mem.delete" {
			t.Errorf("outcome record in full: %+v", recs)
		}
	})
}

func TestCountOutcomes(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		searchFixture(t, s)
		ctx := context.Background()
		must[Run](t)(s.CreateRun(ctx, Run{ID: "empty", Actor: "alice"}))
		must[int64](t)(s.RecordIntent(ctx, Intent{Run: "empty", Tool: "in.flight"})) // no outcome: not counted
		got := must[map[string]OutcomeCounts](t)(s.CountOutcomes(ctx, []string{"a1", "a2", "empty", "nope", GatewayJournal}))
		want := map[string]OutcomeCounts{"a1": {Succeeded: 2}, "a2": {Failed: 1, Blocked: 1}, "empty": {}}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("CountOutcomes = %v, want %v", got, want)
		}
		if got := must[map[string]OutcomeCounts](t)(s.CountOutcomes(ctx, nil)); len(got) != 0 {
			t.Errorf("no runs: %v", got)
		}
	})
}

func TestHeldKey(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		if _, ok, err := s.HeldKey(ctx, "k"); ok || err != nil {
			t.Fatalf("free key: %v %v", ok, err)
		}
		_, claimed, _ := s.ClaimKey(ctx, "k", "r1", 4)
		h, ok, err := s.HeldKey(ctx, "k")
		if err != nil || !ok || !reflect.DeepEqual(h, claimed) {
			t.Fatalf("held key: %+v %v %v, want %+v", h, ok, err, claimed)
		}
		// Looking does not claim: another key stays free, and the held one is still held.
		if ok, _, _ := s.ClaimKey(ctx, "k", "r2", 1); ok {
			t.Fatal("the key was released by HeldKey")
		}
		must[struct{}](t)(struct{}{}, s.ReleaseKey(ctx, "k"))
		if _, ok, _ := s.HeldKey(ctx, "k"); ok {
			t.Fatal("released key still held")
		}
	})
}
