package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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

// Three batches, each behind the one before it (they hold outcomes of one run, b-x) and each
// stuck on a peer's lock (each carries an intent of a-y): every write is answered within one
// write timeout of its batch's take, not one timeout per batch in turn (a chain of n stuck
// batches took n timeouts). Once the peer lets go, the same calls go through.
func TestPostgresQueuedChainBoundedByOneTimeout(t *testing.T) {
	const timeout = time.Second
	s := openPG(t, pgURL(""), nil)
	pgaRuns(t, s, "a-y", "b-x")
	steps := []int64{pgaIntent(t, s, "b-x"), pgaIntent(t, s, "b-x"), pgaIntent(t, s, "b-x")}
	p := s.w.(*pgRunner)
	p.mu.Lock()
	p.timeout = timeout
	p.mu.Unlock()
	h := pgaHoldRun(t, s, "a-y")
	pgaSetDelay(s, time.Hour) // only the intents take the outcomes
	type answer struct {
		err  error
		took time.Duration // from the intent's call
	}
	outcomes := make([]<-chan pgaAnswer, len(steps))
	intents := make(chan answer, len(steps))
	for i, step := range steps {
		outcomes[i] = pgaQueue(s, "b-x", step, StepOutcome{Status: Succeeded, Note: fmt.Sprint("outcome ", i)})
		go func() {
			start := time.Now()
			_, err := s.RecordIntent(context.Background(), Intent{Run: "a-y", Tool: fmt.Sprint("carrier ", i)})
			intents <- answer{err, time.Since(start)}
		}()
		deadline := time.Now().Add(10 * time.Second)
		for { // the intent has taken the outcome as its batch
			p.mu.Lock()
			n := len(p.queue)
			p.mu.Unlock()
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("intent %d never took the queued outcome", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	for i := range steps {
		if a := pgaWait(t, outcomes[i], fmt.Sprint("outcome ", i)); !errors.Is(a.err, context.DeadlineExceeded) {
			t.Fatalf("outcome %d, its batch stuck on a lock: %v, want DeadlineExceeded", i, a.err)
		}
	}
	for i := range steps {
		select {
		case a := <-intents:
			if !errors.Is(a.err, context.DeadlineExceeded) {
				t.Fatalf("an intent stuck on a lock: %v, want DeadlineExceeded", a.err)
			}
			// one timeout each, not one per batch before it in turn (2 and 3 timeouts)
			if a.took > timeout+timeout/2 {
				t.Fatalf("an intent whose batch is stuck behind others answered after %v, want within one write timeout (%v) of its call", a.took, timeout)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("intent %d never answered", i)
		}
	}
	h.release()
	pgbIdle(t, s)
	// A statement that still waited for the lock would hold it next: once a peer gets it
	// again, the server is done with every such statement.
	pgaHoldRun(t, s, "a-y").release()
	if n := len(must[[]Record](t)(s.Records(context.Background(), "a-y", 0, 0))); n != 0 {
		t.Fatalf("a-y has %d records after its intents failed (a statement whose ctx ended went on on the server)", n)
	}
	for i, step := range steps {
		if n := pgaCount(t, s, "b-x", KindOutcome, step); n != 0 {
			t.Fatalf("b-x has %d outcomes of step %d after outcome %d failed", n, step, i)
		}
	}
	for _, step := range steps { // the honest path, once the lock is free
		if _, err := s.RecordOutcome(context.Background(), "b-x", step, StepOutcome{Status: Succeeded}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(must[[]Record](t)(s.Records(context.Background(), "b-x", 0, 0))); n != 6 {
		t.Fatalf("b-x has %d records, want 3 intents and 3 outcomes", n)
	}
}

// An intent stuck on a peer's row lock past the write timeout: the caller reads
// context.DeadlineExceeded, as from the other stores, and the server stopped the statement
// (its cancel request), so nothing of it is committed once the peer lets go.
func TestPostgresWriteTimeoutCommitsNothing(t *testing.T) {
	s := openPG(t, pgURL(""), nil)
	pgaRuns(t, s, "a-y")
	p := s.w.(*pgRunner)
	p.mu.Lock()
	p.timeout = 300 * time.Millisecond
	p.mu.Unlock()
	h := pgaHoldRun(t, s, "a-y")
	_, err := s.RecordIntent(context.Background(), Intent{Run: "a-y", Tool: "stuck"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("intent stuck on a lock past the write timeout: %v, want DeadlineExceeded", err)
	}
	h.release()
	pgaHoldRun(t, s, "a-y").release() // the server is done with what waited for the lock
	if n := len(must[[]Record](t)(s.Records(context.Background(), "a-y", 0, 0))); n != 0 {
		t.Fatalf("a-y has %d records after its intent failed", n)
	}
	if _, err := s.RecordIntent(context.Background(), Intent{Run: "a-y", Tool: "free"}); err != nil {
		t.Fatal(err) // the honest path, once the lock is free
	}
}

// A read that passed the store's closed check when Close closes the pool under it reads as
// ErrClosed, as from the other stores, not as pgx's text.
func TestPostgresReadAfterPoolClosedIsErrClosed(t *testing.T) {
	s := openPG(t, pgURL(""), nil)
	pgaRuns(t, s, "run-c")
	if _, err := s.Records(context.Background(), "run-c", 0, 0); err != nil {
		t.Fatal(err) // the honest path
	}
	s.r.(flushedReads).q.(pgxQuerier).q.(*pgxpool.Pool).Close() // as Close does, after the read's check
	if _, err := s.Records(context.Background(), "run-c", 0, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("a read on the closed pool: %v, want ErrClosed", err)
	}
}
