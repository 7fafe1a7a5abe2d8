package store

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// queuedFixture is a SQLite store in dir with one run, and an intent maker for it.
func queuedFixture(t *testing.T, dir string) (*SQLite, func() int64) {
	t.Helper()
	s := openPeer(t, dir)
	ctx := context.Background()
	must[Run](t)(s.CreateRun(ctx, Run{ID: "run-q", Actor: "alice"}))
	intent := func() int64 {
		t.Helper()
		return must[int64](t)(s.RecordIntent(ctx, Intent{Run: "run-q", Tool: "mem.read_graph", Reason: "r",
			Mode: "enforce", Decision: "allow"}))
	}
	return s, intent
}

// openPeer opens a second store on dir, as another gateway process would, closed at the
// test's end.
func openPeer(t *testing.T, dir string) *SQLite {
	t.Helper()
	s, err := OpenSQLite(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// outcomes returns how many outcome records run-q has, as s reads them.
func outcomes(t *testing.T, s Store) int {
	t.Helper()
	recs := must[[]Record](t)(s.Records(context.Background(), "run-q", 0, 0))
	n := 0
	for _, r := range recs {
		if r.Kind == KindOutcome {
			n++
		}
	}
	return n
}

// A queued outcome rides in the next intent's transaction: two calls are two commits, not
// three, and the outcome is in the journal with the right step.
func TestQueuedOutcomeJoinsTheNextIntent(t *testing.T) {
	s, intent := queuedFixture(t, t.TempDir())
	ctx := context.Background()
	w := s.w.(*sqliteWriter)
	first := intent()
	before := w.wal.ctr.commits.Load()
	got := make(chan error, 1)
	s.QueueOutcome(ctx, "run-q", first, StepOutcome{Status: Succeeded}, func(seq int64, err error) {
		if err == nil && seq <= first {
			err = errors.New("the outcome's seq does not follow its intent's")
		}
		got <- err
	})
	intent()
	if c := w.wal.ctr.commits.Load() - before; c != 1 {
		t.Fatalf("the outcome and the next intent took %d commits, want 1", c)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatal("done was not called by the time the intent that carried the outcome returned")
	}
	pending := must[[]Record](t)(s.PendingSteps(ctx, "run-q"))
	if len(pending) != 1 || pending[0].Seq == first {
		t.Fatalf("pending steps %+v: want only the second intent", pending)
	}
}

// Reads of the store that queued an outcome see it at once; another process (store) sees it
// within queuedDelay though no write follows; a queued outcome of a completed step gets
// ErrCompleted through done, and leaves the journal as it was.
func TestQueuedOutcomeIsReadAndCommittedAlone(t *testing.T) {
	dir := t.TempDir()
	s, intent := queuedFixture(t, dir)
	checkQueuedReadAndAlone(t, s, openPeer(t, dir), intent)
}

// checkQueuedReadAndAlone is TestQueuedOutcomeIsReadAndCommittedAlone on s, whose run-q
// intent makes steps, and peer, another process or replica on the same data.
func checkQueuedReadAndAlone(t *testing.T, s, peer Store, intent func() int64) {
	t.Helper()
	ctx := context.Background()
	step := intent()
	s.QueueOutcome(ctx, "run-q", step, StepOutcome{Status: Succeeded}, nil)
	if n := outcomes(t, s); n != 1 {
		t.Fatalf("the store that queued the outcome reads %d outcomes, want 1", n)
	}

	step = intent()
	s.QueueOutcome(ctx, "run-q", step, StepOutcome{Status: Failed}, nil)
	deadline := time.Now().Add(2 * time.Second) // queuedDelay, with room for a loaded machine
	for outcomes(t, peer) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("a queued outcome with no write after it was not committed")
		}
		time.Sleep(time.Millisecond)
	}

	got := make(chan error, 1)
	s.QueueOutcome(ctx, "run-q", step, StepOutcome{Status: Succeeded}, func(_ int64, err error) { got <- err })
	select {
	case err := <-got:
		if !errors.Is(err, ErrCompleted) {
			t.Fatalf("second outcome of a step: %v, want ErrCompleted", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("done was never called")
	}
	if n := outcomes(t, s); n != 2 {
		t.Fatalf("%d outcomes after a refused one, want 2", n)
	}
}

// Close commits what is queued; after it QueueOutcome answers ErrClosed.
func TestQueuedOutcomeSurvivesClose(t *testing.T) {
	dir := t.TempDir()
	s, intent := queuedFixture(t, dir)
	checkQueuedSurvivesClose(t, s, func() Store { return openPeer(t, dir) }, intent)
}

// checkQueuedSurvivesClose is TestQueuedOutcomeSurvivesClose on s, whose run-q intent makes
// steps; reopen opens s's data again.
func checkQueuedSurvivesClose(t *testing.T, s Store, reopen func() Store, intent func() int64) {
	t.Helper()
	ctx := context.Background()
	step := intent()
	s.QueueOutcome(ctx, "run-q", step, StepOutcome{Status: Succeeded}, nil)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	s.QueueOutcome(ctx, "run-q", step, StepOutcome{Status: Succeeded}, func(_ int64, err error) { got <- err })
	if err := <-got; !errors.Is(err, ErrClosed) {
		t.Fatalf("QueueOutcome after Close: %v, want ErrClosed", err)
	}
	if n := outcomes(t, reopen()); n != 1 {
		t.Fatalf("after Close and open: %d outcomes, want 1", n)
	}
}

// More queued outcomes than one batch holds ahead of a durable write: the write returns only
// once it is committed (a peer reads it), and every outcome is committed.
func TestQueuedOutcomesAheadOfAWrite(t *testing.T) {
	dir := t.TempDir()
	s, intent := queuedFixture(t, dir)
	ctx := context.Background()
	steps := make([]int64, maxWriteBatch+44)
	for i := range steps {
		steps[i] = intent()
	}
	w := s.w.(*sqliteWriter)
	w.mu.Lock() // hold the writer so that no batch starts while the queue fills
	var answered sync.WaitGroup
	for _, st := range steps {
		answered.Add(1)
		req := &writeReq{ctx: ctx, how: lazy | single, done: func(err error) {
			if err != nil {
				t.Error(err)
			}
			answered.Done()
		}}
		req.fn = func(ctx context.Context, tx querier) error {
			_, err := s.outcomeTx(ctx, tx, "run-q", st, StepOutcome{Status: Succeeded}, "")
			return err
		}
		w.queue = append(w.queue, req)
		w.queuedN.Add(1)
	}
	w.mu.Unlock()
	var last int64
	wrote := make(chan error, 1)
	go func() { // leads: its own request is in the second batch
		var err error
		last, err = s.RecordIntent(ctx, Intent{Run: "run-q", Tool: "mem.read_graph", Reason: "r", Mode: "enforce", Decision: "allow"})
		wrote <- err
	}()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("RecordIntent behind a full batch of queued outcomes never returned")
	}
	peer := openPeer(t, dir)
	recs := must[[]Record](t)(peer.Records(ctx, "run-q", last-1, 0))
	if len(recs) == 0 || recs[0].Seq != last || recs[0].Kind != KindIntent {
		t.Fatalf("RecordIntent returned before its commit: a peer reads %+v after seq %d", recs, last-1)
	}
	answered.Wait()
	if n := outcomes(t, peer); n != len(steps) {
		t.Fatalf("%d outcomes committed, want %d", n, len(steps))
	}
}

// Sessions at once: every queued outcome is committed and read back, intents and outcomes
// interleaved from many goroutines (run with -race).
func TestQueuedOutcomesConcurrent(t *testing.T) {
	s, _ := queuedFixture(t, t.TempDir())
	ctx := context.Background()
	const sessions, calls = 8, 25
	var wg sync.WaitGroup
	for range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				step, err := s.RecordIntent(ctx, Intent{Run: "run-q", Tool: "mem.read_graph", Reason: "r", Mode: "enforce", Decision: "allow"})
				if err != nil {
					t.Error(err)
					return
				}
				s.QueueOutcome(ctx, "run-q", step, StepOutcome{Status: Succeeded}, func(_ int64, err error) {
					if err != nil {
						t.Error(err)
					}
				})
			}
		}()
	}
	wg.Wait()
	if n := outcomes(t, s); n != sessions*calls {
		t.Fatalf("%d outcomes, want %d", n, sessions*calls)
	}
	if p := must[[]Record](t)(s.PendingSteps(ctx, "run-q")); len(p) != 0 {
		t.Fatalf("%d steps still open", len(p))
	}
}
