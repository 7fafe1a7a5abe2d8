package store

// Attacks on the Postgres queue of outcomes (pgRunner: QueueOutcome rides in the next intent's
// pgx batch). Each test states the guarantee it checks; a failing one is a bug (see the
// report of the attack-pgqueue branch).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgaAnswer is what a queued outcome's done got.
type pgaAnswer struct {
	seq int64
	err error
}

// pgaQueue queues an outcome of step and returns the channel its answer arrives on.
func pgaQueue(s *Postgres, run string, step int64, o StepOutcome) <-chan pgaAnswer {
	ch := make(chan pgaAnswer, 1)
	s.QueueOutcome(context.Background(), run, step, o, func(n int64, err error) { ch <- pgaAnswer{n, err} })
	return ch
}

// pgaWait waits for a queued outcome's answer (bounded).
func pgaWait(t *testing.T, ch <-chan pgaAnswer, what string) pgaAnswer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: done was never called", what)
		return pgaAnswer{}
	}
}

func pgaIntent(t *testing.T, s *Postgres, run string) int64 {
	t.Helper()
	return must[int64](t)(s.RecordIntent(context.Background(), Intent{Run: run, Tool: "mem.read_graph", Reason: "r", Mode: "enforce", Decision: "allow"}))
}

// pgaSetDelay sets how long s's queued writes wait for a batch.
func pgaSetDelay(s *Postgres, d time.Duration) {
	p := s.w.(*pgRunner)
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// pgaHolder holds the row lock of a run on a connection of its own, as a peer's long
// transaction would.
type pgaHolder struct {
	conn    *pgx.Conn
	tx      pgx.Tx
	pid     uint32
	release func()
}

func pgaHoldRun(t *testing.T, s *Postgres, run string) *pgaHolder {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, pgURL(s.Schema()))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM runs WHERE id = $1 FOR UPDATE`, run); err != nil {
		t.Fatal(err)
	}
	h := &pgaHolder{conn: c, tx: tx, pid: c.PgConn().PID()}
	var once sync.Once
	h.release = func() {
		once.Do(func() {
			_ = tx.Commit(ctx)
			_ = c.Close(ctx)
		})
	}
	t.Cleanup(h.release)
	return h
}

// blocked waits until a backend waits for h's lock and returns its pid.
func (h *pgaHolder) blocked(t *testing.T, s *Postgres) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var pid int
		e := s.pool.QueryRow(context.Background(),
			`SELECT pid FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid)) LIMIT 1`, int(h.pid)).Scan(&pid)
		if e == nil {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("no backend waits for the held run lock: %v", e)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// pgaCount counts run's records of kind with step.
func pgaCount(t *testing.T, s Store, run string, kind Kind, step int64) int {
	t.Helper()
	n := 0
	for _, r := range must[[]Record](t)(s.Records(context.Background(), run, 0, 0)) {
		if r.Kind == kind && (kind == KindIntent && r.Seq == step || kind != KindIntent && r.Step == step) {
			n++
		}
	}
	return n
}

// pgaBlockedBatch makes a batch that is in flight and stuck: run "a-y" is held by a peer's
// transaction; an outcome of step s1 of run "b-x" is queued and an intent of "a-y" carries it
// (the batch, sorted by run, waits for a-y's lock before it takes b-x's). It returns the
// holder, the outcome's answer and the intent's.
func pgaBlockedBatch(t *testing.T, s *Postgres, s1 int64) (*pgaHolder, <-chan pgaAnswer, <-chan error) {
	t.Helper()
	h := pgaHoldRun(t, s, "a-y")
	pgaSetDelay(s, time.Hour) // only the intent takes the outcome
	first := pgaQueue(s, "b-x", s1, StepOutcome{Status: Succeeded, Note: "first"})
	carried := make(chan error, 1)
	go func() {
		_, err := s.RecordIntent(context.Background(), Intent{Run: "a-y", Tool: "carrier"})
		carried <- err
	}()
	h.blocked(t, s)
	return h, first, carried
}

func pgaRuns(t *testing.T, s *Postgres, ids ...string) {
	t.Helper()
	for _, id := range ids {
		must[Run](t)(s.CreateRun(context.Background(), Run{ID: id, Actor: "alice"}))
	}
}

// One session has two calls in flight on run b-x and queues their outcomes one after the
// other (QueueOutcome of s1 returns before QueueOutcome of s2 is called). The first rides in a
// batch that is slow (it waits for a lock of another run, a-y, which sorts first); the second
// is committed by the timer meanwhile. Guarantee (pgRunner's doc: "a run's records are
// numbered in the order their methods were called"): the outcome of s1 is numbered before the
// outcome of s2.
func TestAttackPGQueuedOutcomesKeepCallOrder(t *testing.T) {
	s := openPG(t, pgURL(""), nil)
	pgaRuns(t, s, "a-y", "b-x")
	s1, s2 := pgaIntent(t, s, "b-x"), pgaIntent(t, s, "b-x")
	h, first, carried := pgaBlockedBatch(t, s, s1)
	pgaSetDelay(s, time.Millisecond)
	second := pgaQueue(s, "b-x", s2, StepOutcome{Status: Succeeded, Note: "second"})
	time.Sleep(300 * time.Millisecond) // the timer's batch runs meanwhile
	h.release()
	a1, a2 := pgaWait(t, first, "first outcome"), pgaWait(t, second, "second outcome")
	if err := <-carried; err != nil {
		t.Fatal(err)
	}
	if a1.err != nil || a2.err != nil {
		t.Fatalf("answers %v, %v", a1.err, a2.err)
	}
	if a1.seq > a2.seq {
		t.Fatalf("outcome of step %d (queued first) has seq %d, outcome of step %d (queued second) has seq %d: the journal is out of call order",
			s1, a1.seq, s2, a2.seq)
	}
}

// A read with a 100 ms deadline while an outcome is queued and its run's row is held by a
// peer's transaction: the read must return by about its deadline (reads honour their ctx), and
// the queued outcome must still commit once the lock is free (no write lost).
func TestAttackPGReadDeadlineWhileQueuedBlocks(t *testing.T) {
	s, intent := pgQueuedFixture(t)
	step := intent()
	h := pgaHoldRun(t, s, "run-q")
	pgaSetDelay(s, time.Hour)
	ans := pgaQueue(s, "run-q", step, StepOutcome{Status: Succeeded})
	timer := time.AfterFunc(3*time.Second, h.release) // bounds the test if the read hangs
	defer timer.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.GetRun(ctx, "run-q")
	took := time.Since(start)
	h.release()
	if a := pgaWait(t, ans, "queued outcome"); a.err != nil {
		t.Fatalf("the queued outcome: %v", a.err)
	}
	if n := outcomes(t, s); n != 1 {
		t.Fatalf("%d outcomes, want 1", n)
	}
	if took > time.Second {
		t.Fatalf("a read with a 100 ms deadline returned after %v (err %v): flush sends the queued batch on the reader's goroutine, ignoring its ctx", took, err)
	}
}

// A read with a ctx that is already cancelled while an outcome is queued: it gets ctx's error
// (or its answer), and the queued outcome still commits (a reader's ctx does not drop it).
func TestAttackPGCancelledReadKeepsQueued(t *testing.T) {
	s, intent := pgQueuedFixture(t)
	step := intent()
	pgaSetDelay(s, time.Hour)
	ans := pgaQueue(s, "run-q", step, StepOutcome{Status: Succeeded})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Records(ctx, "run-q", 0, 0); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("read with a cancelled ctx: %v", err)
	}
	if a := pgaWait(t, ans, "queued outcome"); a.err != nil || a.seq != step+1 {
		t.Fatalf("the queued outcome: seq %d, %v; want %d", a.seq, a.err, step+1)
	}
	replica := openPG(t, pgURL(s.Schema()), nil)
	if n := outcomes(t, replica); n != 1 {
		t.Fatalf("a replica reads %d outcomes, want 1", n)
	}
}

// A session's intent on b-x whose outcome rides in another session's stuck batch waits for
// that batch; with a 100 ms deadline it must give up by about then with ctx's error and write
// nothing, and the stuck batch must then commit normally.
func TestAttackPGIntentDeadlineBehindOthersBatch(t *testing.T) {
	s := openPG(t, pgURL(""), nil)
	pgaRuns(t, s, "a-y", "b-x")
	s1 := pgaIntent(t, s, "b-x")
	h, first, carried := pgaBlockedBatch(t, s, s1)
	timer := time.AfterFunc(5*time.Second, h.release)
	defer timer.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.RecordIntent(ctx, Intent{Run: "b-x", Tool: "late"})
	took := time.Since(start)
	h.release()
	if !errors.Is(err, context.DeadlineExceeded) || took > 2*time.Second {
		t.Fatalf("intent behind another session's batch: %v after %v, want DeadlineExceeded by about 100 ms", err, took)
	}
	if a := pgaWait(t, first, "outcome"); a.err != nil {
		t.Fatal(a.err)
	}
	if err := <-carried; err != nil {
		t.Fatal(err)
	}
	recs := must[[]Record](t)(s.Records(context.Background(), "b-x", 0, 0))
	if len(recs) != 2 || recs[0].Kind != KindIntent || recs[1].Kind != KindOutcome {
		t.Fatalf("b-x reads %+v, want its intent and outcome only", recs)
	}
}

// Queued outcomes that cannot commit (no such run, no such step, a step already completed, a
// seq that is an outcome, not an intent) ride in one batch with a good one and the carrying
// intent: each gets its own typed error through done, the good one and the intent commit
// (in one transaction), and nothing else is written. Then an intent of a missing run carries
// a good outcome: the intent gets ErrNotFound, the outcome commits.
func TestAttackPGQueuedBadOutcomesInBatch(t *testing.T) {
	s, intent := pgQueuedFixture(t)
	ctx := context.Background()
	done := intent()
	doneOut := must[int64](t)(s.RecordOutcome(ctx, "run-q", done, StepOutcome{Status: Succeeded}))
	good := intent()
	pgaSetDelay(s, time.Hour)
	noRun := pgaQueue(s, "no-such-run", 1, StepOutcome{Status: Succeeded})
	noStep := pgaQueue(s, "run-q", 999, StepOutcome{Status: Succeeded})
	completed := pgaQueue(s, "run-q", done, StepOutcome{Status: Failed})
	notIntent := pgaQueue(s, "run-q", doneOut, StepOutcome{Status: Failed})
	ok := pgaQueue(s, "run-q", good, StepOutcome{Status: Succeeded})
	next := intent()
	for _, c := range []struct {
		name string
		ch   <-chan pgaAnswer
		want error
	}{{"missing run", noRun, ErrNotFound}, {"missing step", noStep, ErrNotFound}, {"completed step", completed, ErrCompleted},
		{"an outcome's seq", notIntent, ErrNotFound}} {
		if a := pgaWait(t, c.ch, c.name); !errors.Is(a.err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, a.err, c.want)
		}
	}
	a := pgaWait(t, ok, "good outcome")
	if a.err != nil || a.seq != good+1 || next != good+2 {
		t.Fatalf("good outcome seq %d %v, next intent %d; want %d, %d", a.seq, a.err, next, good+1, good+2)
	}
	if x, y := pgXmin(t, s, "run-q", a.seq), pgXmin(t, s, "run-q", next); x != y {
		t.Errorf("the good outcome and the carrying intent were committed apart (%s, %s)", x, y)
	}
	if n := len(must[[]Record](t)(s.Records(ctx, "run-q", 0, 0))); n != 5 {
		t.Fatalf("run-q has %d records, want 5", n)
	}

	again := pgaQueue(s, "run-q", next, StepOutcome{Status: Succeeded})
	if _, err := s.RecordIntent(ctx, Intent{Run: "no-such-run", Tool: "t"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("intent of a missing run: %v, want ErrNotFound", err)
	}
	if a := pgaWait(t, again, "outcome beside a failing intent"); a.err != nil || a.seq != next+1 {
		t.Fatalf("the outcome carried by a failing intent: seq %d %v, want %d", a.seq, a.err, next+1)
	}
	if p := must[[]Record](t)(s.PendingSteps(ctx, "run-q")); len(p) != 0 {
		t.Fatalf("pending %+v, want none", p)
	}
}

// More than maxWriteBatch outcomes queued by one goroutine over three runs: the queue is sent
// when full (on the queuing goroutine), the rest by the next intent; each is answered once,
// without error, and each run numbers its outcomes in the order they were queued.
func TestAttackPGMoreThanMaxWriteBatch(t *testing.T) {
	s := openPG(t, pgURL(""), nil)
	ctx := context.Background()
	runs := []string{"r0", "r1", "r2"}
	pgaRuns(t, s, runs...)
	n := 2*maxWriteBatch + 7
	steps := make([]int64, n)
	for i := range n {
		steps[i] = pgaIntent(t, s, runs[i%3])
	}
	pgaSetDelay(s, time.Hour)
	var calls atomic.Int64
	seqs := make([]int64, n)
	errs := make([]error, n)
	for i := range n {
		s.QueueOutcome(ctx, runs[i%3], steps[i], StepOutcome{Status: Succeeded}, func(seq int64, err error) {
			calls.Add(1)
			seqs[i], errs[i] = seq, err
		})
	}
	pgaIntent(t, s, "r0")
	if c := calls.Load(); c != int64(n) {
		t.Fatalf("%d of %d outcomes answered by the time the carrying intent returned", c, n)
	}
	last := map[string]int64{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("outcome %d: %v", i, errs[i])
		}
		run := runs[i%3]
		if seqs[i] <= last[run] {
			t.Fatalf("%s: outcome %d has seq %d after %d: out of queue order", run, i, seqs[i], last[run])
		}
		last[run] = seqs[i]
	}
	for _, run := range runs {
		want := 0
		if run == "r0" {
			want = 1
		}
		if p := must[[]Record](t)(s.PendingSteps(ctx, run)); len(p) != want {
			t.Fatalf("%s: %d pending, want %d", run, len(p), want)
		}
	}
}

// pgaCheckOnce checks what a write cut mid-batch left: recorded at most once, and recorded if
// its caller was told it succeeded.
func pgaCheckOnce(t *testing.T, r Store, s1 int64, carried error, first pgaAnswer) {
	t.Helper()
	intents := 0
	for _, rec := range must[[]Record](t)(r.Records(context.Background(), "a-y", 0, 0)) {
		if rec.Kind == KindIntent && rec.Tool == "carrier" {
			intents++
		}
	}
	outs := pgaCount(t, r, "b-x", KindOutcome, s1)
	t.Logf("carrying intent: %v (recorded %d times); queued outcome: %v (recorded %d times)", carried, intents, first.err, outs)
	if intents > 1 || outs > 1 {
		t.Fatalf("recorded twice: %d intents, %d outcomes", intents, outs)
	}
	if carried == nil && intents != 1 {
		t.Fatalf("the intent was answered nil but is recorded %d times", intents)
	}
	if first.err == nil && outs != 1 {
		t.Fatalf("the outcome was answered nil but is recorded %d times", outs)
	}
}

// The backend running a batch (an intent carrying a queued outcome) is terminated
// (pg_terminate_backend, as an operator or a failover would) while it waits for a lock. The
// intent and the outcome are each recorded at most once, and a nil answer means recorded.
func TestAttackPGTerminateBackendMidBatch(t *testing.T) {
	s := openPG(t, pgURL(""), nil)
	pgaRuns(t, s, "a-y", "b-x")
	s1 := pgaIntent(t, s, "b-x")
	h, first, carried := pgaBlockedBatch(t, s, s1)
	pid := h.blocked(t, s)
	if _, err := h.conn.Exec(context.Background(), `SELECT pg_terminate_backend($1::int, 5000)`, pid); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	h.release()
	a := pgaWait(t, first, "outcome")
	var err error
	select {
	case err = <-carried:
	case <-time.After(15 * time.Second):
		t.Fatal("the carrying intent never returned")
	}
	pgaCheckOnce(t, openPG(t, pgURL(s.Schema()), nil), s1, err, a)
}

// pgaProxy forwards TCP connections to the test server until cut closes them all.
type pgaProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func pgaStartProxy(t *testing.T, target string) *pgaProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgaProxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); p.cut() })
	return p
}

func (p *pgaProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// The network between the gateway and the server breaks while a batch waits for a lock (not
// a server error: the client sees EOF). The server still has the batch with its Sync and may
// commit it after the client has gone. Guarantee: nothing is recorded twice, and no write
// whose caller was told nil is missing; an error is returned for what the client could not
// confirm.
func TestAttackPGNetworkCutMidBatch(t *testing.T) {
	direct := pgURL("")
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	p := pgaStartProxy(t, u.Host)
	u.Host = p.ln.Addr().String()
	s := openPG(t, u.String(), nil)
	pgaRuns(t, s, "a-y", "b-x")
	s1 := pgaIntent(t, s, "b-x")
	h, first, carried := pgaBlockedBatch(t, s, s1)
	p.cut()
	time.Sleep(100 * time.Millisecond)
	h.release()
	a := pgaWait(t, first, "outcome")
	select {
	case err = <-carried:
	case <-time.After(15 * time.Second):
		t.Fatal("the carrying intent never returned")
	}
	time.Sleep(200 * time.Millisecond) // the orphaned backend finishes its batch
	pgaCheckOnce(t, openPG(t, pgURL(s.Schema()), nil), s1, err, a)
}

// Sessions record intents and queue outcomes while Close runs at some moment (kicks,
// carrying intents and Close's flush race). Guarantees (run with -race): no panic; each done
// is called exactly once; every intent answered with a step and every outcome answered nil is
// in the journal, once; no step has two outcomes.
func TestAttackPGCloseRacesQueue(t *testing.T) {
	for round := range 6 {
		url := pgURL("")
		s, err := OpenPostgres(context.Background(), url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if round%2 == 1 {
			pgaSetDelay(s, 200*time.Microsecond) // the timer fires during the race too
		}
		const sessions, calls = 8, 40
		ctx := context.Background()
		for i := range sessions {
			must[Run](t)(s.CreateRun(ctx, Run{ID: fmt.Sprintf("c%d", i), Actor: "alice"}))
		}
		var mu sync.Mutex
		okIntents := map[string][]int64{}
		okOutcomes := map[string][]int64{}
		var queued, answered atomic.Int64
		otherErrs := map[string]int{}
		var wg sync.WaitGroup
		for i := range sessions {
			run := fmt.Sprintf("c%d", i)
			wg.Go(func() {
				for range calls {
					step, err := s.RecordIntent(ctx, Intent{Run: run, Tool: "t"})
					if err != nil {
						mu.Lock()
						otherErrs["intent: "+err.Error()]++
						mu.Unlock()
						return
					}
					mu.Lock()
					okIntents[run] = append(okIntents[run], step)
					mu.Unlock()
					queued.Add(1)
					var once atomic.Bool
					s.QueueOutcome(ctx, run, step, StepOutcome{Status: Succeeded}, func(_ int64, err error) {
						if once.Swap(true) {
							t.Errorf("done of step %d of %s called twice", step, run)
						}
						answered.Add(1)
						mu.Lock()
						defer mu.Unlock()
						if err == nil {
							okOutcomes[run] = append(okOutcomes[run], step)
						} else if !errors.Is(err, ErrClosed) {
							otherErrs["outcome: "+err.Error()]++
						}
					})
				}
			})
		}
		time.Sleep(time.Duration(5+round*7) * time.Millisecond)
		if err := s.Close(); err != nil {
			t.Errorf("round %d: Close: %v", round, err)
		}
		wg.Wait()
		deadline := time.Now().Add(10 * time.Second)
		for answered.Load() != queued.Load() {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d of %d queued outcomes never answered", round, queued.Load()-answered.Load(), queued.Load())
			}
			time.Sleep(time.Millisecond)
		}
		if len(otherErrs) > 0 {
			t.Logf("round %d: errors other than ErrClosed: %v", round, otherErrs)
		}
		r := openPG(t, pgURL(s.Schema()), nil)
		for i := range sessions {
			run := fmt.Sprintf("c%d", i)
			intents, outs := map[int64]int{}, map[int64]int{}
			for _, rec := range must[[]Record](t)(r.Records(ctx, run, 0, 0)) {
				switch rec.Kind {
				case KindIntent:
					intents[rec.Seq]++
				case KindOutcome:
					outs[rec.Step]++
				}
			}
			mu.Lock()
			for _, st := range okIntents[run] {
				if intents[st] != 1 {
					t.Errorf("round %d %s: intent %d answered but recorded %d times", round, run, st, intents[st])
				}
			}
			for _, st := range okOutcomes[run] {
				if outs[st] != 1 {
					t.Errorf("round %d %s: outcome of %d answered nil but recorded %d times", round, run, st, outs[st])
				}
			}
			mu.Unlock()
			for st, n := range outs {
				if n > 1 {
					t.Errorf("round %d %s: step %d has %d outcomes", round, run, st, n)
				}
			}
		}
		r.Close()
	}
}

// A peer recovers this replica's open intent (its lock session was lost) while the step's
// outcome is queued here: the step gets exactly one outcome, the peer's uncertain one, and the
// queued outcome is told ErrCompleted once it is sent.
func TestAttackPGPeerRecoverWhileQueued(t *testing.T) {
	url := pgURL("")
	ctx := context.Background()
	a, b := openPG(t, url, nil), openPG(t, url, nil)
	must[Run](t)(a.CreateRun(ctx, Run{ID: "r", Actor: "alice"}))
	step := pgaIntent(t, a, "r")
	pgaSetDelay(a, time.Hour)
	ans := pgaQueue(a, "r", step, StepOutcome{Status: Succeeded})
	a.lock.mu.Lock() // a's watchdog may not retake the lock meanwhile
	pid := a.lock.conn.PgConn().PID()
	_, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend($1::int, 5000)`, pid)
	var rec []Record
	if err == nil {
		rec, err = b.Recover(ctx)
	}
	ferr := a.w.flush(ctx)
	a.lock.mu.Unlock()
	if err != nil || ferr != nil {
		t.Fatal(err, ferr)
	}
	if len(rec) != 1 || rec[0].Step != step || rec[0].Status != Uncertain {
		t.Fatalf("peer recovered %+v, want step %d uncertain", rec, step)
	}
	if a := pgaWait(t, ans, "queued outcome"); !errors.Is(a.err, ErrCompleted) {
		t.Fatalf("the queued outcome of a recovered step: %v, want ErrCompleted", a.err)
	}
	recs := must[[]Record](t)(b.Records(ctx, "r", 0, 0))
	if len(recs) != 2 || recs[1].Kind != KindOutcome || recs[1].Status != Uncertain {
		t.Fatalf("run r reads %+v, want the intent and one uncertain outcome", recs)
	}
}

// While the instance lock is lost intents are refused (usable); an outcome queued then is
// still committed (by the timer: no intent will carry it), not left in the queue.
func TestAttackPGLockLostWhileQueued(t *testing.T) {
	s, intent := pgQueuedFixture(t)
	ctx := context.Background()
	step := intent()
	s.lock.lost.Store(true)
	defer s.lock.lost.Store(false)
	ans := pgaQueue(s, "run-q", step, StepOutcome{Status: Succeeded})
	if _, err := s.RecordIntent(ctx, Intent{Run: "run-q", Tool: "t"}); !errors.Is(err, errLockLost) {
		t.Fatalf("intent while the lock is lost: %v, want errLockLost", err)
	}
	if a := pgaWait(t, ans, "queued outcome"); a.err != nil || a.seq != step+1 {
		t.Fatalf("queued outcome while the lock is lost: seq %d %v", a.seq, a.err)
	}
	replica := openPG(t, pgURL(s.Schema()), nil)
	if n := outcomes(t, replica); n != 1 {
		t.Fatalf("a replica reads %d outcomes, want 1", n)
	}
}

// Sessions of two replicas share four runs; each session's calls go intent, queued outcome,
// intent, ... Guarantees: each run's seqs are 1..n without gaps, each step has one outcome,
// and each session's records are in its call order (intent < its outcome < next intent).
func TestAttackPGJournalOrderConcurrent(t *testing.T) {
	url := pgURL("")
	a, b := openPG(t, url, nil), openPG(t, url, nil)
	ctx := context.Background()
	runs := []string{"o-a", "o-b", "o-c", "o-d"}
	pgaRuns(t, a, runs...)
	const sessions, calls = 12, 15
	type call struct{ intent, outcome int64 }
	got := make([][]call, sessions)
	var wg sync.WaitGroup
	for i := range sessions {
		s := []*Postgres{a, b}[i%2]
		run := runs[i%len(runs)]
		got[i] = make([]call, calls)
		wg.Go(func() {
			for k := range calls {
				step, err := s.RecordIntent(ctx, Intent{Run: run, Tool: "t"})
				if err != nil {
					t.Error(err)
					return
				}
				got[i][k].intent = step
				s.QueueOutcome(ctx, run, step, StepOutcome{Status: Succeeded}, func(seq int64, err error) {
					if err != nil {
						t.Error(err)
					}
					got[i][k].outcome = seq
				})
			}
		})
	}
	wg.Wait()
	for _, s := range []*Postgres{a, b} {
		if err := s.w.flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, run := range runs {
		recs := must[[]Record](t)(a.Records(ctx, run, 0, 0))
		outs := map[int64]int{}
		for i, r := range recs {
			if r.Seq != int64(i+1) {
				t.Fatalf("%s: record %d has seq %d (gap)", run, i, r.Seq)
			}
			if r.Kind == KindOutcome {
				outs[r.Step]++
			}
		}
		for st, n := range outs {
			if n != 1 {
				t.Fatalf("%s: step %d has %d outcomes", run, st, n)
			}
		}
	}
	for i := range sessions {
		for k, c := range got[i] {
			if c.outcome <= c.intent || k+1 < calls && got[i][k+1].intent <= c.outcome {
				t.Fatalf("session %d call %d: intent %d outcome %d next intent %d: out of call order", i, k, c.intent, c.outcome,
					func() int64 {
						if k+1 < calls {
							return got[i][k+1].intent
						}
						return 0
					}())
			}
		}
	}
}
