package store

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// holdLead makes the test the leader of s's writer, which it returns: requests queue up
// behind it until it calls w.lead() (which hands the lead on or gives it up).
func holdLead(t *testing.T, s *SQLite) *sqliteWriter {
	t.Helper()
	w := s.w.(*sqliteWriter)
	w.mu.Lock()
	for w.leading {
		w.idle.Wait()
	}
	w.leading = true
	w.mu.Unlock()
	return w
}

// waitQueued waits until the writer's queue holds n requests.
func waitQueued(t *testing.T, w *sqliteWriter, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		l := len(w.queue)
		w.mu.Unlock()
		if l >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue holds %d requests, want %d", l, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A queued outcome that fails (its step completed by a peer) in the same batch as an intent:
// the intent commits, durable; the outcome gets ErrCompleted, once.
func TestAttackQueuedFailsBesideIntent(t *testing.T) {
	dir := t.TempDir()
	s, intent := queuedFixture(t, dir)
	ctx := context.Background()
	peer := openPeer(t, dir)
	step := intent()
	must[int64](t)(peer.RecordOutcome(ctx, "run-q", step, StepOutcome{Status: Failed}))
	w := holdLead(t, s)
	var calls atomic.Int32
	got := make(chan error, 4)
	s.QueueOutcome(ctx, "run-q", step, StepOutcome{Status: Succeeded}, func(_ int64, err error) { calls.Add(1); got <- err })
	type res struct {
		step int64
		err  error
	}
	wrote := make(chan res, 1)
	go func() {
		st, err := s.RecordIntent(ctx, Intent{Run: "run-q", Tool: "mem.read_graph", Reason: "r", Mode: "enforce", Decision: "allow"})
		wrote <- res{st, err}
	}()
	waitQueued(t, w, 2)
	w.lead()
	r := <-wrote
	if r.err != nil {
		t.Fatalf("intent beside a failing queued outcome: %v", r.err)
	}
	if err := <-got; !errors.Is(err, ErrCompleted) {
		t.Fatalf("queued outcome of a completed step: %v", err)
	}
	if c := calls.Load(); c != 1 {
		t.Fatalf("done called %d times", c)
	}
	recs := must[[]Record](t)(peer.Records(ctx, "run-q", r.step-1, 1))
	if len(recs) != 1 || recs[0].Seq != r.step {
		t.Fatalf("the intent is not committed: %+v", recs)
	}
}

// An intent that fails (no such run) beside a queued outcome: the outcome commits.
func TestAttackIntentFailsBesideQueued(t *testing.T) {
	dir := t.TempDir()
	s, intent := queuedFixture(t, dir)
	ctx := context.Background()
	step := intent()
	w := holdLead(t, s)
	got := make(chan error, 1)
	s.QueueOutcome(ctx, "run-q", step, StepOutcome{Status: Succeeded}, func(_ int64, err error) { got <- err })
	wrote := make(chan error, 1)
	go func() {
		_, err := s.RecordIntent(ctx, Intent{Run: "run-none", Tool: "mem.read_graph", Reason: "r", Mode: "enforce", Decision: "allow"})
		wrote <- err
	}()
	waitQueued(t, w, 2)
	w.lead()
	if err := <-wrote; !errors.Is(err, ErrNotFound) {
		t.Fatalf("intent of no run: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("queued outcome beside a failing intent: %v", err)
	}
	if n := outcomes(t, s); n != 1 {
		t.Fatalf("%d outcomes", n)
	}
}

// A write whose ctx ends while queued outcomes are ahead of it: it returns ctx's error, is
// not written, and the queued outcomes still commit (timer).
func TestAttackCancelledBehindQueued(t *testing.T) {
	dir := t.TempDir()
	s, intent := queuedFixture(t, dir)
	steps := []int64{intent(), intent(), intent()}
	w := holdLead(t, s)
	var wg sync.WaitGroup
	for _, st := range steps {
		wg.Add(1)
		s.QueueOutcome(context.Background(), "run-q", st, StepOutcome{Status: Succeeded}, func(_ int64, err error) {
			if err != nil {
				t.Error(err)
			}
			wg.Done()
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	wrote := make(chan error, 1)
	go func() {
		_, err := s.RecordIntent(ctx, Intent{Run: "run-q", Tool: "mem.read_graph", Reason: "r", Mode: "enforce", Decision: "allow"})
		wrote <- err
	}()
	waitQueued(t, w, 4)
	cancel()
	if err := <-wrote; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled intent: %v", err)
	}
	// Give up the lead with only queued requests left: the timer must commit them.
	w.mu.Lock()
	w.leading = false
	w.armLocked()
	w.idle.Broadcast()
	w.mu.Unlock()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("queued outcomes never committed")
	}
	if p := must[[]Record](t)(s.PendingSteps(context.Background(), "run-q")); len(p) != 0 {
		t.Fatalf("%d open steps (the cancelled intent written?)", len(p))
	}
}

// Many goroutines queue, write and read while Close runs: every done is called exactly once,
// every outcome answered nil is on disk after reopening, and no answer is ErrClosed for an
// outcome that is on disk.
func TestAttackQueueWhileClosing(t *testing.T) {
	for round := range 10 {
		dir := t.TempDir()
		s, err := OpenSQLite(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		must[Run](t)(s.CreateRun(ctx, Run{ID: "run-q", Actor: "alice"}))
		var mu sync.Mutex
		answers := map[int64]int{}
		okSteps := map[int64]bool{}
		var wg, doneWG sync.WaitGroup
		stop := make(chan struct{})
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if g%4 == 3 {
						_, _ = s.Records(ctx, "run-q", 0, 0)
						continue
					}
					step, err := s.RecordIntent(ctx, Intent{Run: "run-q", Tool: "mem.read_graph", Reason: "r", Mode: "enforce", Decision: "allow"})
					if err != nil {
						return
					}
					doneWG.Add(1)
					s.QueueOutcome(ctx, "run-q", step, StepOutcome{Status: Succeeded}, func(_ int64, err error) {
						mu.Lock()
						answers[step]++
						if err == nil {
							okSteps[step] = true
						}
						mu.Unlock()
						doneWG.Done()
					})
				}
			}()
		}
		time.Sleep(time.Duration(5+round*3) * time.Millisecond)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		close(stop)
		wg.Wait()
		doneWG.Wait()
		for st, n := range answers {
			if n != 1 {
				t.Fatalf("step %d answered %d times", st, n)
			}
		}
		again, err := OpenSQLite(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		recs := must[[]Record](t)(again.Records(ctx, "run-q", 0, 0))
		onDisk := map[int64]bool{}
		for _, r := range recs {
			if r.Kind == KindOutcome {
				onDisk[r.Step] = true
			}
		}
		again.Close()
		for st := range okSteps {
			if !onDisk[st] {
				t.Fatalf("round %d: outcome of step %d answered nil but not on disk", round, st)
			}
		}
		for st := range onDisk {
			if !okSteps[st] && answers[st] > 0 {
				t.Fatalf("round %d: outcome of step %d on disk but answered with an error", round, st)
			}
		}
	}
}

// Reads racing the timer: each read after QueueOutcome returned sees the outcome.
func TestAttackReadsWhileTimerFires(t *testing.T) {
	s, intent := queuedFixture(t, t.TempDir())
	ctx := context.Background()
	for i := range 60 {
		step := intent()
		s.QueueOutcome(ctx, "run-q", step, StepOutcome{Status: Succeeded}, nil)
		time.Sleep(time.Duration(i%8) * time.Millisecond)
		if p := must[[]Record](t)(s.PendingSteps(ctx, "run-q")); len(p) != 0 {
			t.Fatalf("call %d: step %d still open to a read after QueueOutcome", i, step)
		}
	}
}

// A peer's Recover while an outcome is queued (not committed) in a live store leaves the
// step to it: the queued outcome commits, not ErrCompleted.
func TestAttackPeerRecoverWhileQueued(t *testing.T) {
	dir := t.TempDir()
	s, intent := queuedFixture(t, dir)
	ctx := context.Background()
	step := intent()
	w := holdLead(t, s)
	got := make(chan error, 1)
	s.QueueOutcome(ctx, "run-q", step, StepOutcome{Status: Succeeded}, func(_ int64, err error) { got <- err })
	peer := openPeer(t, dir)
	if _, err := peer.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	w.lead()
	if err := <-got; err != nil {
		t.Fatalf("queued outcome after a peer's Recover: %v", err)
	}
	recs := must[[]Record](t)(peer.Records(ctx, "run-q", 0, 0))
	for _, r := range recs {
		if r.Kind == KindOutcome && r.Status != Succeeded {
			t.Fatalf("peer recorded %+v", r)
		}
	}
}

// Stress: intents with random cancellation, queued outcomes, reads, all at once; every request
// answered once, reads see every outcome queued before them, nothing hangs; after Close no
// goroutine of the writer is left.
func TestAttackQueuedStress(t *testing.T) {
	before := runtime.NumGoroutine()
	dir := t.TempDir()
	s, err := OpenSQLite(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	must[Run](t)(s.CreateRun(ctx, Run{ID: "run-q", Actor: "alice"}))
	var wg sync.WaitGroup
	var answered, queued atomic.Int64
	for g := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				cctx, cancel := context.WithCancel(ctx)
				if (g+i)%5 == 0 {
					go cancel()
				}
				step, err := s.RecordIntent(cctx, Intent{Run: "run-q", Tool: "mem.read_graph", Reason: "r", Mode: "enforce", Decision: "allow"})
				cancel()
				if err != nil {
					if !errors.Is(err, context.Canceled) {
						t.Error(err)
					}
					continue
				}
				queued.Add(1)
				var once atomic.Int32
				s.QueueOutcome(ctx, "run-q", step, StepOutcome{Status: Succeeded}, func(_ int64, err error) {
					if once.Add(1) != 1 {
						t.Errorf("step %d answered twice", step)
					}
					if err != nil {
						t.Error(err)
					}
					answered.Add(1)
				})
				if i%3 == 0 {
					recs, err := s.Records(ctx, "run-q", step, 0)
					if err != nil {
						t.Error(err)
						continue
					}
					found := false
					for _, r := range recs {
						if r.Kind == KindOutcome && r.Step == step {
							found = true
						}
					}
					if !found {
						t.Errorf("a read after QueueOutcome misses the outcome of step %d", step)
					}
				}
			}
		}()
	}
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(60 * time.Second):
		t.Fatal("hang")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if a, q := answered.Load(), queued.Load(); a != q {
		t.Fatalf("%d of %d queued outcomes answered after Close", a, q)
	}
	time.Sleep(50 * time.Millisecond)
	if n := runtime.NumGoroutine(); n > before+2 {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines after Close, %d before\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// More than a batch of queued outcomes, some refused (a peer completed their steps), ahead of
// an intent: each gets its own answer, the intent commits, the others commit.
func TestAttackFullQueueWithFailures(t *testing.T) {
	dir := t.TempDir()
	s, intent := queuedFixture(t, dir)
	ctx := context.Background()
	peer := openPeer(t, dir)
	steps := make([]int64, maxWriteBatch+60)
	for i := range steps {
		steps[i] = intent()
		if i%7 == 0 {
			must[int64](t)(peer.RecordOutcome(ctx, "run-q", steps[i], StepOutcome{Status: Failed}))
		}
	}
	w := holdLead(t, s)
	var wg sync.WaitGroup
	for i, st := range steps {
		wg.Add(1)
		s.QueueOutcome(ctx, "run-q", st, StepOutcome{Status: Succeeded}, func(_ int64, err error) {
			defer wg.Done()
			if want := i%7 == 0; want != errors.Is(err, ErrCompleted) || (!want && err != nil) {
				t.Errorf("step %d (%d): %v", st, i, err)
			}
		})
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := s.RecordIntent(ctx, Intent{Run: "run-q", Tool: "mem.read_graph", Reason: "r", Mode: "enforce", Decision: "allow"})
		wrote <- err
	}()
	waitQueued(t, w, len(steps)+1)
	w.lead()
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if n := outcomes(t, peer); n != len(steps) {
		t.Fatalf("%d outcomes, want %d", n, len(steps))
	}
}

// Approvals consumed in a batch that re-runs with savepoints (a queued outcome in it fails):
// the approval is consumed once, by one intent.
func TestAttackConsumeBesideFailingQueued(t *testing.T) {
	dir := t.TempDir()
	s, intent := queuedFixture(t, dir)
	ctx := context.Background()
	req := newRequest("apr-1")
	req.Quorum = 1
	req.Expires = time.Now().Add(time.Hour)
	must[Approval](t)(s.CreateApproval(ctx, req))
	must[Approval](t)(s.Decide(ctx, "apr-1", Decision{By: "carol", Roles: []string{"finance"}, Approve: true}))
	must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "agent-alice"}))
	step := intent()
	must[int64](t)(s.RecordOutcome(ctx, "run-q", step, StepOutcome{Status: Failed}))
	w := holdLead(t, s)
	errs := make(chan error, 4)
	consumeOne := func() {
		_, err := s.RecordIntent(ctx, Intent{Run: "r1", Tool: "stripe.charge", ArgsDigest: "sha256:d", Approval: "apr-1"})
		errs <- err
	}
	go consumeOne()
	waitQueued(t, w, 1)
	got := make(chan error, 1)
	s.QueueOutcome(ctx, "run-q", step, StepOutcome{Status: Succeeded}, func(_ int64, err error) { got <- err })
	go consumeOne()
	waitQueued(t, w, 3)
	w.lead()
	passed := 0
	for range 2 {
		if err := <-errs; err == nil {
			passed++
		} else if !errors.Is(err, ErrConsumed) {
			t.Fatalf("losing retry: %v", err)
		}
	}
	if passed != 1 {
		t.Fatalf("%d consumptions passed", passed)
	}
	if err := <-got; !errors.Is(err, ErrCompleted) {
		t.Fatalf("queued outcome: %v", err)
	}
	recs := must[[]Record](t)(s.Records(ctx, "r1", 0, 0))
	if len(recs) != 2 || recs[1].Event != EventConsumed {
		t.Fatalf("records %+v", recs)
	}
}

// A read with a deadline, while an outcome is queued and another process holds the folder's
// writer lock, returns at its deadline (reads never waited for writers before QueueOutcome);
// once the lock is free the outcome commits and is read.
func TestAttackReadDeadlineBehindPeerLock(t *testing.T) {
	dir := t.TempDir()
	s, intent := queuedFixture(t, dir)
	peer := openPeer(t, dir)
	step := intent()
	pw := peer.w.(*sqliteWriter)
	if err := pw.lockWriters(); err != nil {
		t.Fatal(err)
	}
	s.QueueOutcome(context.Background(), "run-q", step, StepOutcome{Status: Succeeded}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	read := make(chan error, 1)
	go func() { _, err := s.Records(ctx, "run-q", 0, 0); read <- err }()
	select {
	case err := <-read:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("read behind a held writer lock: %v, want its deadline", err)
		}
	case <-time.After(5 * time.Second):
		pw.unlockWriters()
		t.Fatal("a read with a 200 ms deadline still waits for another process's writer lock after 5 s")
	}
	pw.unlockWriters()
	if n := outcomes(t, s); n != 1 {
		t.Fatalf("%d outcomes after the lock is free, want 1", n)
	}
}
