package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// pgXmin is the id of the transaction that inserted record seq of run, read on s's pool.
func pgXmin(t *testing.T, s *Postgres, run string, seq int64) string {
	t.Helper()
	var x string
	if err := s.pool.QueryRow(context.Background(), `SELECT xmin::text FROM records WHERE run = $1 AND seq = $2`, run, seq).Scan(&x); err != nil {
		t.Fatalf("xmin of record %d of %s: %v", seq, run, err)
	}
	return x
}

// pgQueuedFixture is a Postgres store with run-q and an intent maker for it.
func pgQueuedFixture(t *testing.T) (*Postgres, func() int64) {
	t.Helper()
	s := openPG(t, pgURL(""), nil)
	ctx := context.Background()
	must[Run](t)(s.CreateRun(ctx, Run{ID: "run-q", Actor: "alice"}))
	return s, func() int64 {
		t.Helper()
		return must[int64](t)(s.RecordIntent(ctx, Intent{Run: "run-q", Tool: "mem.read_graph", Reason: "r", Mode: "enforce", Decision: "allow"}))
	}
}

// A queued outcome rides in the next intent's batch: both rows are inserted by one
// transaction (one xmin), done is answered by the time the intent returns, and the journal
// reads intent, outcome, intent. Source: issue 20 (Postgres at 64 sessions; one commit per
// call instead of two).
func TestPostgresQueuedOutcomeJoinsTheNextIntent(t *testing.T) {
	s, intent := pgQueuedFixture(t)
	ctx := context.Background()
	first := intent()
	got := make(chan error, 1)
	var seq int64
	s.QueueOutcome(ctx, "run-q", first, StepOutcome{Status: Succeeded}, func(n int64, err error) { seq = n; got <- err })
	second := intent()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatal("done was not called by the time the intent that carried the outcome returned")
	}
	if seq != first+1 || second != first+2 {
		t.Fatalf("intent %d, outcome %d, intent %d: want consecutive", first, seq, second)
	}
	if a, b := pgXmin(t, s, "run-q", seq), pgXmin(t, s, "run-q", second); a != b {
		t.Fatalf("the outcome (xmin %s) and the next intent (xmin %s) were committed apart, want one transaction", a, b)
	}
	replica := openPG(t, pgURL(s.Schema()), nil)
	if p := must[[]Record](t)(replica.PendingSteps(ctx, "run-q")); len(p) != 1 || p[0].Seq != second {
		t.Fatalf("a replica reads pending steps %+v, want only step %d", p, second)
	}
}

// Reads of the store that queued an outcome see it at once; a replica sees it within
// queuedDelay though no write follows; a queued outcome of a completed step gets ErrCompleted
// through done (checkQueuedReadAndAlone); a write of the run after QueueOutcome is numbered
// after the outcome.
func TestPostgresQueuedOutcomeIsReadAndCommittedAlone(t *testing.T) {
	s, intent := pgQueuedFixture(t)
	ctx := context.Background()
	checkQueuedReadAndAlone(t, s, openPG(t, pgURL(s.Schema()), nil), intent)
	step := intent()
	s.QueueOutcome(ctx, "run-q", step, StepOutcome{Status: Succeeded}, nil)
	note := must[int64](t)(s.AppendEvent(ctx, Event{Run: "run-q", Kind: KindNote, Note: "after the call"}))
	if note != step+2 {
		t.Fatalf("a note written after the outcome was queued has seq %d, want %d (after the outcome)", note, step+2)
	}
}

// Close commits what is queued; after it QueueOutcome answers ErrClosed.
func TestPostgresQueuedOutcomeSurvivesClose(t *testing.T) {
	s, intent := pgQueuedFixture(t)
	checkQueuedSurvivesClose(t, s, func() Store { return openPG(t, pgURL(s.Schema()), nil) }, intent)
}

// The server rejects a batch (a trigger raises for one queued outcome, a fault a healthy
// database does not make on demand): nothing of the batch is committed by it, and each write
// runs again by itself and gets its own answer: the intent and the good outcome commit, the
// rejected outcome's done gets the server's error, and its step stays open.
func TestPostgresQueuedBatchRejected(t *testing.T) {
	s, intent := pgQueuedFixture(t)
	ctx := context.Background()
	for _, q := range []string{
		`CREATE FUNCTION reject_note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'rejected by the test'; END $$`,
		`CREATE TRIGGER reject_note BEFORE INSERT ON records FOR EACH ROW WHEN (NEW.note = 'reject') EXECUTE FUNCTION reject_note()`,
	} {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	must[Run](t)(s.CreateRun(ctx, Run{ID: "run-r", Actor: "bob"}))
	good := intent()
	bad := must[int64](t)(s.RecordIntent(ctx, Intent{Run: "run-r", Tool: "mem.read_graph", Reason: "r", Mode: "enforce", Decision: "allow"}))
	answers := make(chan error, 2)
	s.w.(*pgRunner).delay = time.Hour // both wait for the next intent, whatever the machine's load
	var goodSeq int64
	s.QueueOutcome(ctx, "run-q", good, StepOutcome{Status: Succeeded}, func(n int64, err error) { goodSeq = n; answers <- err })
	s.QueueOutcome(ctx, "run-r", bad, StepOutcome{Status: Succeeded, Note: "reject"}, func(_ int64, err error) {
		if err == nil {
			err = errors.New("the rejected outcome was answered nil")
		} else if !strings.Contains(err.Error(), "rejected by the test") {
			err = fmt.Errorf("the rejected outcome's answer %q does not carry the server's error", err)
		} else {
			err = nil
		}
		answers <- err
	})
	next := intent()
	for range 2 {
		select {
		case err := <-answers:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a queued outcome was never answered")
		}
	}
	if a, b := pgXmin(t, s, "run-q", goodSeq), pgXmin(t, s, "run-q", next); a == b {
		t.Fatalf("the good outcome and the intent share transaction %s: the rejected batch was not run again write by write", a)
	}
	if p := must[[]Record](t)(s.PendingSteps(ctx, "run-q")); len(p) != 1 || p[0].Seq != next {
		t.Fatalf("run-q pending %+v, want only %d (the good outcome committed)", p, next)
	}
	if p := must[[]Record](t)(s.PendingSteps(ctx, "run-r")); len(p) != 1 || p[0].Seq != bad {
		t.Fatalf("run-r pending %+v, want step %d still open", p, bad)
	}
}

// Two replicas queue outcomes of one step at the same moment, each carried by an intent of
// its own: exactly one outcome commits (the other is told ErrCompleted, however its batch
// fared), and every carrying intent commits. Source: issue 16's replicas; issue 20.
func TestPostgresQueuedOutcomeRaceAcrossReplicas(t *testing.T) {
	url := pgURL("")
	a, b := openPG(t, url, nil), openPG(t, url, nil)
	ctx := context.Background()
	must[Run](t)(a.CreateRun(ctx, Run{ID: "race", Actor: "alice"}))
	must[Run](t)(a.CreateRun(ctx, Run{ID: "carry", Actor: "alice"}))
	const rounds = 20
	for round := range rounds {
		step := must[int64](t)(a.RecordIntent(ctx, Intent{Run: "race", Tool: "crm.create", ArgsDigest: fmt.Sprint(round)}))
		errs := make([]error, 2)
		var carried sync.WaitGroup
		var wg sync.WaitGroup
		for i, s := range []*Postgres{a, b} {
			carried.Add(1)
			wg.Go(func() {
				s.QueueOutcome(ctx, "race", step, StepOutcome{Status: Succeeded, Note: fmt.Sprint(i)}, func(_ int64, err error) {
					errs[i] = err
					carried.Done()
				})
				if _, err := s.RecordIntent(ctx, Intent{Run: "carry", Tool: "crm.create"}); err != nil {
					t.Errorf("round %d: the carrying intent: %v", round, err)
				}
			})
		}
		wg.Wait()
		carried.Wait()
		oneOutcomeWon(t, round, errs)
	}
	if n := len(must[[]Record](t)(b.Records(ctx, "carry", 0, 0))); n != 2*rounds {
		t.Fatalf("%d carrying intents, want %d", n, 2*rounds)
	}
}

// Sessions of two replicas on the same runs, each outcome queued: batches holding several
// runs meet in the runs' row locks from both sides (in one order, so no deadlock), every
// outcome commits, and each run reads intent, outcome, ... in its session's order.
func TestPostgresQueuedOutcomesConcurrent(t *testing.T) {
	url := pgURL("")
	a, b := openPG(t, url, nil), openPG(t, url, nil)
	ctx := context.Background()
	const runs, calls = 6, 20
	for i := range runs {
		must[Run](t)(a.CreateRun(ctx, Run{ID: fmt.Sprintf("run-%d", i), Actor: "alice"}))
	}
	var wg sync.WaitGroup
	for r := range runs {
		for side, s := range []*Postgres{a, b} {
			run := fmt.Sprintf("run-%d", (r+side*runs/2)%runs)
			wg.Go(func() {
				for range calls {
					step, err := s.RecordIntent(ctx, Intent{Run: run, Tool: "mem.read_graph", Reason: "r", Mode: "enforce", Decision: "allow"})
					if err != nil {
						t.Error(err)
						return
					}
					s.QueueOutcome(ctx, run, step, StepOutcome{Status: Succeeded}, func(_ int64, err error) {
						if err != nil {
							t.Error(err)
						}
					})
				}
			})
		}
	}
	wg.Wait()
	for _, s := range []*Postgres{a, b} {
		if err := s.w.flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := range runs {
		run := fmt.Sprintf("run-%d", i)
		recs := must[[]Record](t)(b.Records(ctx, run, 0, 0))
		if len(recs) != 4*calls {
			t.Fatalf("%s: %d records, want %d", run, len(recs), 4*calls)
		}
		if p := must[[]Record](t)(b.PendingSteps(ctx, run)); len(p) != 0 {
			t.Fatalf("%s: %d steps still open", run, len(p))
		}
	}
}
