package store

// Second round of attacks on the Postgres queue of outcomes (pgRunner), after the fixes of
// "a batch is sent after the batches before it that hold one of its runs", "a read's flush
// honours its ctx" and "a fatal error is not read as a rejected batch". A failing test is a
// bug (see the report of the attack-pgqueue2 branch).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pgbIdle waits (bounded) until s's runner has nothing queued, nothing in flight, and checks
// that pending is exactly 0 (never negative).
func pgbIdle(t *testing.T, s *Postgres) {
	t.Helper()
	p := s.w.(*pgRunner)
	deadline := time.Now().Add(15 * time.Second)
	for {
		n := p.pending.Load()
		if n < 0 {
			t.Fatalf("pending is %d (negative)", n)
		}
		p.mu.Lock()
		q, sent := len(p.queue), len(p.sent)
		p.mu.Unlock()
		if n == 0 && q == 0 && sent == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("runner never idle: pending %d, queued %d, batches in flight %d", n, q, sent)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pgbOnce returns a done that records how often it is called.
func pgbOnce(t *testing.T, what string) (func(int64, error), <-chan pgaAnswer, *atomic.Int32) {
	ch := make(chan pgaAnswer, 4)
	var n atomic.Int32
	return func(seq int64, err error) {
		if n.Add(1) > 1 {
			t.Errorf("%s: done called more than once (seq %d, %v)", what, seq, err)
		}
		ch <- pgaAnswer{seq, err}
	}, ch, &n
}

// pgbOpenClosable opens a store in a fresh schema for a test that closes it itself (it sets
// *closed then); the store is closed at the test's end otherwise.
func pgbOpenClosable(t *testing.T) (*Postgres, *bool) {
	t.Helper()
	s, err := OpenPostgres(context.Background(), pgURL(""), nil)
	if err != nil {
		t.Fatal(err)
	}
	closed := new(bool)
	t.Cleanup(func() {
		if !*closed {
			s.Close()
		}
	})
	return s, closed
}

// pgbFlapLock takes and lets go of run's row lock on a goroutine of its own (held for hold,
// then free for gap, up to 40 times) until stop is called; stop returns once it ended.
func pgbFlapLock(t *testing.T, s *Postgres, run string, hold, gap time.Duration) (stop func()) {
	halt := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 40 {
			select {
			case <-halt:
				return
			default:
			}
			h := pgaHoldRun(t, s, run)
			time.Sleep(hold)
			h.release()
			time.Sleep(gap)
		}
	})
	return func() { close(halt); wg.Wait() }
}

// pgbCloseHeld closes s while h holds a row lock that a batch waits for: Close must not
// return within hold (why: what is still under way), and must return nil within 15 s once h
// lets go. *closed records that s was closed.
func pgbCloseHeld(t *testing.T, s *Postgres, h *pgaHolder, closed *bool, hold time.Duration, why string) {
	t.Helper()
	closeErr := make(chan error, 1)
	go func() { closeErr <- s.Close() }()
	select {
	case err := <-closeErr:
		*closed = true
		h.release()
		t.Fatalf("Close returned (%v) while %s", err, why)
	case <-time.After(hold):
	}
	h.release()
	select {
	case err := <-closeErr:
		*closed = true
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Close never returned")
	}
}

// The batch B1 (outcome of b-x, intent of a-y) is stuck on a peer's lock of a-y. The same
// session of b-x queues the outcome of its next step s2; an intent of c-z with a 100 ms
// deadline then takes the queue as its batch B2, which must wait for B1 (it holds b-x). The
// intent's caller must get ctx's error by about its deadline (it is left out of B2) — as an
// intent that finds nothing queued does (TestAttackPGIntentDeadlineBehindOthersBatch) — and
// must not stay blocked until the peer lets go. The outcome of s2 is answered exactly once,
// after s1's, and c-z has no record of the left-out intent.
func TestAttack2IntentDeadlineTakingBatchBehindStuckBatch(t *testing.T) {
	s := openPG(t, pgURL(""), nil)
	pgaRuns(t, s, "a-y", "b-x", "c-z")
	s1, s2 := pgaIntent(t, s, "b-x"), pgaIntent(t, s, "b-x")
	h, first, carried := pgaBlockedBatch(t, s, s1)
	timer := time.AfterFunc(4*time.Second, h.release)
	defer timer.Stop()
	done2, second, calls2 := pgbOnce(t, "outcome of s2")
	s.QueueOutcome(context.Background(), "b-x", s2, StepOutcome{Status: Succeeded, Note: "second"}, done2)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.RecordIntent(ctx, Intent{Run: "c-z", Tool: "late"})
	took := time.Since(start)
	h.release()
	if a := pgaWait(t, first, "outcome of s1"); a.err != nil {
		t.Fatal(a.err)
	}
	a2 := pgaWait(t, second, "outcome of s2")
	if a2.err != nil {
		t.Fatal(a2.err)
	}
	if err := <-carried; err != nil {
		t.Fatal(err)
	}
	pgbIdle(t, s)
	if c := calls2.Load(); c != 1 {
		t.Fatalf("outcome of s2 answered %d times", c)
	}
	recs := must[[]Record](t)(s.Records(context.Background(), "b-x", 0, 0))
	if len(recs) != 4 || recs[2].Kind != KindOutcome || recs[2].Step != s1 || recs[3].Kind != KindOutcome || recs[3].Step != s2 {
		t.Fatalf("b-x reads %+v, want intents, outcome of s1, outcome of s2", recs)
	}
	if err == nil {
		if n := len(must[[]Record](t)(s.Records(context.Background(), "c-z", 0, 0))); n != 1 {
			t.Fatalf("c-z has %d records after the intent succeeded", n)
		}
	} else if n := len(must[[]Record](t)(s.Records(context.Background(), "c-z", 0, 0))); n != 0 {
		t.Fatalf("c-z has %d records after the intent failed with %v", n, err)
	}
	if !errors.Is(err, context.DeadlineExceeded) || took > 2*time.Second {
		t.Fatalf("intent of c-z (100 ms deadline) whose batch waits for a stuck batch: %v after %v; want DeadlineExceeded by about 100 ms (send waits for b.after with context.Background after leaving the intent out, on the caller's goroutine)", err, took)
	}
}

// A read with a 100 ms deadline flushes an outcome whose batch is stuck on a peer's lock: the
// read gives up and the batch goes on, on flush's goroutine. Close, called then, must wait for
// that batch (and not close the pools under it): Close returns once the peer lets go, the
// outcome gets a nil answer, and a replica reads it.
func TestAttack2CloseWaitsForFlushGoroutine(t *testing.T) {
	s, closed := pgbOpenClosable(t)
	pgaRuns(t, s, "run-f")
	step := pgaIntent(t, s, "run-f")
	h := pgaHoldRun(t, s, "run-f")
	pgaSetDelay(s, time.Hour)
	done, ans, calls := pgbOnce(t, "queued outcome")
	s.QueueOutcome(context.Background(), "run-f", step, StepOutcome{Status: Succeeded}, done)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := s.Records(ctx, "run-f", 0, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read behind a stuck batch: %v, want DeadlineExceeded", err)
	}
	h.blocked(t, s)
	pgbCloseHeld(t, s, h, closed, 500*time.Millisecond, "the flushed batch is still waiting for the lock")
	a := pgaWait(t, ans, "queued outcome")
	if a.err != nil || calls.Load() != 1 {
		t.Fatalf("queued outcome: %v, %d answers", a.err, calls.Load())
	}
	if n := s.w.(*pgRunner).pending.Load(); n != 0 {
		t.Fatalf("pending %d after Close", n)
	}
	r := openPG(t, pgURL(s.Schema()), nil)
	if n := pgaCount(t, r, "run-f", KindOutcome, step); n != 1 {
		t.Fatalf("a replica reads %d outcomes of step %d, want 1", n, step)
	}
}

// As TestAttack2IntentDeadlineTakingBatchBehindStuckBatch, with Close called while the
// left-out intent's batch still waits: Close waits for it, every queued outcome is answered
// exactly once with nil, the runner ends idle.
func TestAttack2CloseWhileLeftOutBatchWaits(t *testing.T) {
	s, closed := pgbOpenClosable(t)
	pgaRuns(t, s, "a-y", "b-x", "c-z")
	s1, s2 := pgaIntent(t, s, "b-x"), pgaIntent(t, s, "b-x")
	h, first, carried := pgaBlockedBatch(t, s, s1)
	timer := time.AfterFunc(6*time.Second, h.release)
	defer timer.Stop()
	done2, second, calls2 := pgbOnce(t, "outcome of s2")
	s.QueueOutcome(context.Background(), "b-x", s2, StepOutcome{Status: Succeeded}, done2)
	intentErr := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := s.RecordIntent(ctx, Intent{Run: "c-z", Tool: "late"})
		intentErr <- err
	}()
	time.Sleep(200 * time.Millisecond)
	pgbCloseHeld(t, s, h, closed, 300*time.Millisecond, "batches are in flight")
	if a := pgaWait(t, first, "outcome of s1"); a.err != nil {
		t.Fatal(a.err)
	}
	if a := pgaWait(t, second, "outcome of s2"); a.err != nil || calls2.Load() != 1 {
		t.Fatalf("outcome of s2: %v, %d answers", a.err, calls2.Load())
	}
	if err := <-carried; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-intentErr:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("left-out intent: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("left-out intent never returned")
	}
	if n := s.w.(*pgRunner).pending.Load(); n != 0 {
		t.Fatalf("pending %d after Close", n)
	}
	r := openPG(t, pgURL(s.Schema()), nil)
	if n := pgaCount(t, r, "b-x", KindOutcome, s2); n != 1 {
		t.Fatalf("replica reads %d outcomes of s2", n)
	}
	if n := len(must[[]Record](t)(r.Records(context.Background(), "c-z", 0, 0))); n != 0 {
		t.Fatalf("c-z has %d records; the left-out intent wrote", n)
	}
}

// A chain of batches (each holds a run of the one before) behind a stuck one: every batch is
// answered once the peer lets go, within a bound (no wait between batches without end), and
// a read with no deadline returns after them.
func TestAttack2AfterChainDrains(t *testing.T) {
	s := openPG(t, pgURL(""), nil)
	const n = 6
	runs := []string{"a-y"}
	for i := range n {
		runs = append(runs, fmt.Sprintf("r%d", i))
	}
	pgaRuns(t, s, runs...)
	steps := make([]int64, n)
	for i := range n {
		steps[i] = pgaIntent(t, s, runs[i+1])
	}
	pgaSetDelay(s, time.Hour)
	h := pgaHoldRun(t, s, "a-y")
	var answers []<-chan pgaAnswer
	var intents []chan error
	// batch i: the outcome of r_i, carried by an intent of r_{i+1} (batch 0 by a-y's, which is stuck)
	for i := range n {
		answers = append(answers, pgaQueue(s, runs[i+1], steps[i], StepOutcome{Status: Succeeded}))
		carrier := "a-y"
		if i > 0 {
			carrier = runs[i]
		}
		ch := make(chan error, 1)
		intents = append(intents, ch)
		go func() {
			_, err := s.RecordIntent(context.Background(), Intent{Run: carrier, Tool: "chain"})
			ch <- err
		}()
		if i == 0 {
			h.blocked(t, s)
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	readErr := make(chan error, 1)
	go func() {
		_, err := s.Records(context.Background(), runs[n], 0, 0)
		readErr <- err
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	h.release()
	for i := range n {
		if a := pgaWait(t, answers[i], fmt.Sprintf("outcome %d", i)); a.err != nil {
			t.Fatalf("outcome %d: %v", i, a.err)
		}
		select {
		case err := <-intents[i]:
			if err != nil {
				t.Fatalf("carrier %d: %v", i, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("carrier %d never returned", i)
		}
	}
	select {
	case err := <-readErr:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("read never returned")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("chain took %v to drain", took)
	}
	pgbIdle(t, s)
}

// Sessions on runs of their own, with random deadlines on intents and reads (some cancelled
// while their batches wait), across two replicas sharing the schema. Guarantees: each queued
// outcome's done is called exactly once; each outcome whose done got nil is committed once;
// a run's records are its intents and outcomes in call order; the runners end idle with
// pending 0 (never negative).
func TestAttack2ConcurrentDeadlinesStress(t *testing.T) {
	s := openPG(t, pgURL(""), nil)
	r := openPG(t, pgURL(s.Schema()), nil)
	pgaSetDelay(s, 2*time.Millisecond)
	pgaSetDelay(r, 2*time.Millisecond)
	const sessions, calls = 10, 120
	for i := range sessions {
		must[Run](t)(s.CreateRun(context.Background(), Run{ID: fmt.Sprintf("st%d", i), Actor: "alice"}))
	}
	stop := time.Now().Add(60 * time.Second)
	type result struct {
		intents []int64        // committed intents (nil error)
		ok      map[int64]bool // outcomes answered nil
		answers map[int64]*atomic.Int32
	}
	results := make([]*result, sessions)
	var outstanding sync.WaitGroup
	var wg sync.WaitGroup
	for i := range sessions {
		res := &result{ok: map[int64]bool{}, answers: map[int64]*atomic.Int32{}}
		results[i] = res
		st := s
		if i%2 == 1 {
			st = r
		}
		run := fmt.Sprintf("st%d", i)
		var mu sync.Mutex
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for c := 0; c < calls && time.Now().Before(stop); c++ {
				d := time.Duration(rng.IntN(30000)) * time.Microsecond
				ctx, cancel := context.WithTimeout(context.Background(), d)
				step, err := st.RecordIntent(ctx, Intent{Run: run, Tool: "t"})
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
						t.Errorf("intent of %s: %v", run, err)
					}
					continue
				}
				res.intents = append(res.intents, step)
				n := &atomic.Int32{}
				mu.Lock()
				res.answers[step] = n
				mu.Unlock()
				outstanding.Add(1)
				st.QueueOutcome(context.Background(), run, step, StepOutcome{Status: Succeeded}, func(_ int64, err error) {
					if n.Add(1) == 1 {
						defer outstanding.Done()
					}
					if err != nil {
						t.Errorf("outcome of %s step %d: %v", run, step, err)
						return
					}
					mu.Lock()
					res.ok[step] = true
					mu.Unlock()
				})
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond)
				if rng.IntN(3) == 0 {
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(1000))*time.Microsecond)
					other := fmt.Sprintf("st%d", rng.IntN(sessions))
					if _, err := st.Records(ctx, other, 0, 0); err != nil && !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("read: %v", err)
					}
					cancel()
				}
			}
		})
	}
	// noise: intents of a run "a-noise" (sorts first) that a peer locks now and then, so that
	// the batches they carry are stuck for a while and later batches wait for them (after).
	must[Run](t)(s.CreateRun(context.Background(), Run{ID: "a-noise", Actor: "alice"}))
	noiseStop := make(chan struct{})
	var noise sync.WaitGroup
	var noiseOK, noiseErr atomic.Int32
	for k := range 3 {
		st := s
		if k == 1 {
			st = r
		}
		noise.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(k), 9))
			for range 400 {
				select {
				case <-noiseStop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rng.IntN(20))*time.Millisecond)
				if _, err := st.RecordIntent(ctx, Intent{Run: "a-noise", Tool: "noise"}); err != nil {
					noiseErr.Add(1)
				} else {
					noiseOK.Add(1)
				}
				cancel()
			}
		})
	}
	stopFlap := pgbFlapLock(t, s, "a-noise", 15*time.Millisecond, 10*time.Millisecond)
	wg.Wait()
	stopFlap()
	close(noiseStop)
	noise.Wait()
	t.Logf("noise intents: %d ok, %d failed", noiseOK.Load(), noiseErr.Load())
	waited := make(chan struct{})
	go func() { outstanding.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(20 * time.Second):
		t.Fatal("some queued outcomes were never answered")
	}
	pgbIdle(t, s)
	pgbIdle(t, r)
	var okI, okO int
	for _, res := range results {
		okI += len(res.intents)
		okO += len(res.ok)
	}
	t.Logf("%d intents and %d outcomes committed", okI, okO)
	for i, res := range results {
		run := fmt.Sprintf("st%d", i)
		for step, n := range res.answers {
			if c := n.Load(); c != 1 {
				t.Errorf("%s step %d answered %d times", run, step, c)
			}
		}
		recs := must[[]Record](t)(s.Records(context.Background(), run, 0, 0))
		var want []string
		for _, step := range res.intents {
			want = append(want, fmt.Sprintf("i%d", step))
			if res.ok[step] {
				want = append(want, fmt.Sprintf("o%d", step))
			}
		}
		var got []string
		for _, rec := range recs {
			switch rec.Kind {
			case KindIntent:
				got = append(got, fmt.Sprintf("i%d", rec.Seq))
			case KindOutcome:
				got = append(got, fmt.Sprintf("o%d", rec.Step))
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s reads %v, want %v (call order)", run, got, want)
		}
	}
}

// QueueOutcome is "RecordOutcome without waiting for the commit". The call that fills the
// queue (maxWriteBatch) sends the batch on the caller's goroutine; since batches wait for the
// batches before them that hold one of their runs, that call now also waits for another
// session's stuck batch (here: one that waits for a peer's lock of a-y), with no regard to its
// ctx. Guarantee checked: QueueOutcome returns within 2 s (its ctx: 100 ms) while the earlier
// batch is stuck; each queued outcome is answered exactly once.
func TestAttack2FullQueueBehindStuckBatch(t *testing.T) {
	s := openPG(t, pgURL(""), nil)
	pgaRuns(t, s, "a-y", "b-x")
	s1 := pgaIntent(t, s, "b-x")
	h, first, carried := pgaBlockedBatch(t, s, s1)
	timer := time.AfterFunc(5*time.Second, h.release)
	defer timer.Stop()
	var answered, twice atomic.Int32
	var all sync.WaitGroup
	queue := func(ctx context.Context, i int) {
		var n atomic.Int32
		all.Add(1)
		s.QueueOutcome(ctx, "b-x", int64(100000+i), StepOutcome{Status: Succeeded}, func(_ int64, err error) {
			if n.Add(1) > 1 {
				twice.Add(1)
				return
			}
			answered.Add(1)
			all.Done()
		})
	}
	for i := range maxWriteBatch - 1 {
		queue(context.Background(), i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	queue(ctx, maxWriteBatch)
	took := time.Since(start)
	h.release()
	if a := pgaWait(t, first, "outcome of s1"); a.err != nil {
		t.Fatal(a.err)
	}
	if err := <-carried; err != nil {
		t.Fatal(err)
	}
	w := make(chan struct{})
	go func() { all.Wait(); close(w) }()
	select {
	case <-w:
	case <-time.After(30 * time.Second):
		t.Fatalf("%d of %d queued outcomes answered", answered.Load(), maxWriteBatch)
	}
	pgbIdle(t, s)
	if twice.Load() != 0 {
		t.Fatalf("%d outcomes answered twice", twice.Load())
	}
	if took > 2*time.Second {
		t.Fatalf("QueueOutcome that fills the queue returned after %v: enqueue sends the full batch on the caller's goroutine, and the batch waits (b.after) for another session's stuck batch", took)
	}
}

// The timer commits a queued outcome whose batch is stuck on a peer's lock (kick, on the
// timer's goroutine); Close, called then, waits for it; the outcome gets nil; pending ends 0.
func TestAttack2CloseWaitsForStuckKick(t *testing.T) {
	s, closed := pgbOpenClosable(t)
	pgaRuns(t, s, "run-k")
	step := pgaIntent(t, s, "run-k")
	h := pgaHoldRun(t, s, "run-k")
	pgaSetDelay(s, time.Millisecond)
	done, ans, calls := pgbOnce(t, "queued outcome")
	s.QueueOutcome(context.Background(), "run-k", step, StepOutcome{Status: Succeeded}, done)
	h.blocked(t, s)
	pgbCloseHeld(t, s, h, closed, 300*time.Millisecond, "the timer's batch waits for the lock")
	if a := pgaWait(t, ans, "queued outcome"); a.err != nil || calls.Load() != 1 {
		t.Fatalf("queued outcome: %v, %d answers", a.err, calls.Load())
	}
	if n := s.w.(*pgRunner).pending.Load(); n != 0 {
		t.Fatalf("pending %d after Close", n)
	}
}

// An intent of b-x (no deadline) waits for another session's stuck batch that holds b-x's
// outcome (nothing is queued, so it waits in runBatchable, outside the batches being sent).
// Close is called meanwhile, and the peer then lets go. Close waits only for the batches
// being sent, so it may close the pools before the intent's exec: the intent must then
// answer ErrClosed (or succeed), not a pool's internal error.
func TestAttack2CloseWhileIntentWaitsOutsideBatch(t *testing.T) {
	s, closed := pgbOpenClosable(t)
	pgaRuns(t, s, "a-y", "b-x")
	s1 := pgaIntent(t, s, "b-x")
	h, first, carried := pgaBlockedBatch(t, s, s1)
	timer := time.AfterFunc(5*time.Second, h.release)
	defer timer.Stop()
	intentErr := make(chan error, 1)
	go func() {
		_, err := s.RecordIntent(context.Background(), Intent{Run: "b-x", Tool: "waiting"})
		intentErr <- err
	}()
	time.Sleep(200 * time.Millisecond)
	closeErr := make(chan error, 1)
	go func() { closeErr <- s.Close() }()
	time.Sleep(200 * time.Millisecond)
	h.release()
	select {
	case err := <-closeErr:
		*closed = true
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Close never returned")
	}
	if a := pgaWait(t, first, "outcome of s1"); a.err != nil {
		t.Fatal(a.err)
	}
	if err := <-carried; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-intentErr:
		if err != nil && !errors.Is(err, ErrClosed) {
			t.Fatalf("intent that waited through Close: %v, want nil or ErrClosed", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("intent never returned")
	}
}

// A batch that the server rejects (a trigger fails one outcome) and whose carrying intent was
// left out (its deadline ended while the batch waited for a stuck batch holding b-x): each
// queued outcome runs again by itself and is answered exactly once (the good one nil, the
// rejected one with the server's error); the left-out intent writes nothing.
func TestAttack2LeftOutIntentRejectedBatch(t *testing.T) {
	s := openPG(t, pgURL(""), nil)
	ctx := context.Background()
	for _, q := range []string{
		`CREATE FUNCTION reject_note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'rejected by the test'; END $$`,
		`CREATE TRIGGER reject_note BEFORE INSERT ON records FOR EACH ROW WHEN (NEW.note = 'reject') EXECUTE FUNCTION reject_note()`,
	} {
		if _, err := s.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	pgaRuns(t, s, "a-y", "b-x", "c-z")
	s1, s2 := pgaIntent(t, s, "b-x"), pgaIntent(t, s, "b-x")
	s3 := pgaIntent(t, s, "c-z")
	h, first, carried := pgaBlockedBatch(t, s, s1)
	timer := time.AfterFunc(1500*time.Millisecond, h.release)
	defer timer.Stop()
	goodDone, good, goodN := pgbOnce(t, "good outcome")
	badDone, bad, badN := pgbOnce(t, "rejected outcome")
	s.QueueOutcome(ctx, "b-x", s2, StepOutcome{Status: Succeeded}, goodDone)
	s.QueueOutcome(ctx, "c-z", s3, StepOutcome{Status: Succeeded, Note: "reject"}, badDone)
	ictx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err := s.RecordIntent(ictx, Intent{Run: "c-z", Tool: "late"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("left-out intent: %v", err)
	}
	h.release()
	if a := pgaWait(t, first, "outcome of s1"); a.err != nil {
		t.Fatal(a.err)
	}
	if err := <-carried; err != nil {
		t.Fatal(err)
	}
	if a := pgaWait(t, good, "good outcome"); a.err != nil {
		t.Fatalf("good outcome: %v", a.err)
	}
	if a := pgaWait(t, bad, "rejected outcome"); a.err == nil {
		t.Fatal("rejected outcome answered nil")
	}
	pgbIdle(t, s)
	if goodN.Load() != 1 || badN.Load() != 1 {
		t.Fatalf("answers: good %d, rejected %d", goodN.Load(), badN.Load())
	}
	if n := pgaCount(t, s, "b-x", KindOutcome, s2); n != 1 {
		t.Fatalf("%d outcomes of s2", n)
	}
	recs := must[[]Record](t)(s.Records(ctx, "c-z", 0, 0))
	if len(recs) != 1 {
		t.Fatalf("c-z reads %+v, want its one intent (no outcome, no left-out intent)", recs)
	}
}

// Sessions with random deadlines and a peer that locks a run now and then, and Close at a
// random moment. Guarantees: every queued outcome is answered exactly once, within a bound,
// with nil or ErrClosed (never a closed pool's error: Close waits for the batches); an
// outcome answered nil is read by a replica; pending is 0 after Close.
func TestAttack2CloseRacesDeadlines(t *testing.T) {
	for round := range 4 {
		s, err := OpenPostgres(context.Background(), pgURL(""), nil)
		if err != nil {
			t.Fatal(err)
		}
		pgaSetDelay(s, time.Duration(round+1)*time.Millisecond)
		const sessions, calls = 8, 60
		runs := []string{"a-lock"}
		for i := range sessions {
			runs = append(runs, fmt.Sprintf("cr%d", i))
		}
		pgaRuns(t, s, runs...)
		var mu sync.Mutex
		okOutcomes := map[string][]int64{}
		var outstanding sync.WaitGroup
		var wg sync.WaitGroup
		stopHold := pgbFlapLock(t, s, "a-lock", 10*time.Millisecond, 5*time.Millisecond)
		for i := range sessions {
			run := runs[i+1]
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(round), uint64(i)))
				for range calls {
					target := run
					if rng.IntN(4) == 0 {
						target = "a-lock" // carries the queue into a batch that may be stuck
					}
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rng.IntN(15))*time.Millisecond)
					step, err := s.RecordIntent(ctx, Intent{Run: target, Tool: "t"})
					cancel()
					if errors.Is(err, ErrClosed) {
						return
					}
					if err != nil || target != run {
						continue
					}
					var n atomic.Int32
					outstanding.Add(1)
					s.QueueOutcome(context.Background(), run, step, StepOutcome{Status: Succeeded}, func(_ int64, err error) {
						if n.Add(1) > 1 {
							t.Errorf("%s step %d answered twice (%v)", run, step, err)
							return
						}
						defer outstanding.Done()
						if err == nil {
							mu.Lock()
							okOutcomes[run] = append(okOutcomes[run], step)
							mu.Unlock()
						} else if !errors.Is(err, ErrClosed) {
							t.Errorf("%s step %d: %v", run, step, err)
						}
					})
				}
			})
		}
		time.Sleep(time.Duration(50+30*round) * time.Millisecond)
		closeErr := make(chan error, 1)
		go func() { closeErr <- s.Close() }()
		select {
		case err := <-closeErr:
			if err != nil {
				t.Errorf("round %d: Close: %v", round, err)
			}
		case <-time.After(40 * time.Second):
			t.Fatalf("round %d: Close never returned", round)
		}
		stopHold()
		wg.Wait()
		w := make(chan struct{})
		go func() { outstanding.Wait(); close(w) }()
		select {
		case <-w:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: queued outcomes never answered", round)
		}
		if n := s.w.(*pgRunner).pending.Load(); n != 0 {
			t.Fatalf("round %d: pending %d after Close", round, n)
		}
		r := openPG(t, pgURL(s.Schema()), nil)
		total := 0
		for run, steps := range okOutcomes {
			for _, step := range steps {
				total++
				if c := pgaCount(t, r, run, KindOutcome, step); c != 1 {
					t.Errorf("round %d: %s step %d answered nil, replica reads %d outcomes", round, run, step, c)
				}
			}
		}
		t.Logf("round %d: %d outcomes committed before Close", round, total)
	}
}

// The stuck batch B1 ends with a FATAL error (its backend is terminated while it waits for the
// lock); B2, which waits for it (both hold b-x), is then sent and commits: B1's writes are
// answered once each with an error, B2's outcome with nil, and the runner ends idle.
func TestAttack2FatalBatchReleasesItsFollowers(t *testing.T) {
	s := openPG(t, pgURL(""), nil)
	pgaRuns(t, s, "a-y", "b-x", "c-z")
	s1, s2 := pgaIntent(t, s, "b-x"), pgaIntent(t, s, "b-x")
	h, first, carried := pgaBlockedBatch(t, s, s1)
	defer h.release()
	done2, second, calls2 := pgbOnce(t, "outcome of s2")
	s.QueueOutcome(context.Background(), "b-x", s2, StepOutcome{Status: Succeeded}, done2)
	follower := make(chan error, 1)
	go func() {
		_, err := s.RecordIntent(context.Background(), Intent{Run: "c-z", Tool: "follower"})
		follower <- err
	}()
	time.Sleep(200 * time.Millisecond)
	pid := h.blocked(t, s)
	if _, err := s.pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	a1 := pgaWait(t, first, "outcome of s1")
	var cerr error
	select {
	case cerr = <-carried:
	case <-time.After(15 * time.Second):
		t.Fatal("carrier never returned")
	}
	if a1.err == nil || cerr == nil {
		t.Logf("stuck batch after FATAL: outcome %v, carrier %v", a1.err, cerr)
	}
	select {
	case err := <-follower:
		if err != nil {
			t.Fatalf("follower intent: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("follower never returned after the FATAL batch")
	}
	if a := pgaWait(t, second, "outcome of s2"); a.err != nil || calls2.Load() != 1 {
		t.Fatalf("outcome of s2: %v, %d answers", a.err, calls2.Load())
	}
	h.release()
	pgbIdle(t, s)
	if n := pgaCount(t, s, "b-x", KindOutcome, s2); n != 1 {
		t.Fatalf("%d outcomes of s2", n)
	}
	if n := pgaCount(t, s, "b-x", KindOutcome, s1); n > 1 {
		t.Fatalf("%d outcomes of s1", n)
	}
}
