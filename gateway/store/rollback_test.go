package store

import (
	"context"
	"reflect"
	"testing"
)

// TestRollbackRecords: rollback records are appended after the steps they undo (the ledger
// stays append-only), keep the compensation's key and arguments, survive a restart, and are
// refused for unknown runs, steps that are not intents and unknown statuses.
func TestRollbackRecords(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, clock *fakeClock) {
		ctx := context.Background()
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "alice"}))
		step := must[int64](t)(s.RecordIntent(ctx, Intent{Run: "r1", Tool: "mem.create_entities"}))
		must[int64](t)(s.RecordOutcome(ctx, "r1", step, StepOutcome{Status: Succeeded, CompensationTool: "mem.delete_entities",
			Handle: map[string]any{"entityNames": []any{"a"}}}))

		args := map[string]any{"entityNames": []any{"a"}}
		e := RollbackEntry{Run: "r1", Step: step, Tool: "mem.delete_entities", IdempotencyKey: "rb-1", Status: RollbackStarted, Arguments: args}
		seq := must[int64](t)(s.AppendRollback(ctx, e))
		args["entityNames"] = "changed after the call" // the store keeps its own copy
		e.Status, e.Note, e.Arguments = RollbackVerificationFailed, "entities: expected [], got [1]", nil
		must[int64](t)(s.AppendRollback(ctx, e))
		if seq != 3 {
			t.Fatalf("first rollback record seq %d, want 3", seq)
		}

		for _, bad := range []struct {
			e    RollbackEntry
			want error
		}{
			{RollbackEntry{Run: "nope", Step: 1, Status: RollbackStarted}, ErrNotFound},
			{RollbackEntry{Run: "r1", Step: 2, Status: RollbackStarted}, ErrNotFound}, // an outcome, not an intent
			{RollbackEntry{Run: "r1", Step: 9, Status: RollbackStarted}, ErrNotFound},
			{RollbackEntry{Run: "r1", Step: 1, Status: Succeeded}, ErrInvalid},
			{RollbackEntry{Run: "r1", Step: 0, Status: RollbackStarted}, ErrInvalid},
			{RollbackEntry{Run: GatewayJournal, Step: 1, Status: RollbackStarted}, ErrInvalid},
			{RollbackEntry{Run: "r1", Step: 1, Status: RollbackStarted, Arguments: map[string]any{"f": func() {}}}, ErrInvalid},
		} {
			_, err := s.AppendRollback(ctx, bad.e)
			wantErr(t, err, bad.want)
		}

		s = restart(t, s)
		recs := must[[]Record](t)(s.Records(ctx, "r1", 2, 0))
		if len(recs) != 2 {
			t.Fatalf("records after the outcome: %+v", recs)
		}
		first, second := recs[0], recs[1]
		if first.Kind != KindRollback || first.Step != step || first.Tool != "mem.delete_entities" || first.CompensationTool != "mem.delete_entities" ||
			first.IdempotencyKey != "rb-1" || first.Status != RollbackStarted || !reflect.DeepEqual(first.Handle, map[string]any{"entityNames": []any{"a"}}) {
			t.Errorf("started record %+v", first)
		}
		if second.Seq != 4 || second.Status != RollbackVerificationFailed || second.Note != "entities: expected [], got [1]" || second.Handle != nil {
			t.Errorf("verification_failed record %+v", second)
		}
		// Rollback records are not outcomes: the step's outcome count is unchanged.
		counts := must[map[string]OutcomeCounts](t)(s.CountOutcomes(ctx, []string{"r1"}))
		if got := counts["r1"]; got[Succeeded] != 1 || len(got) != 1 {
			t.Errorf("outcome counts %+v", got)
		}
	})
}
