package store

// Attacks on the Postgres write bound made of one deadline per batch and a server-side
// cancel request per statement whose ctx ends (postgresConfig's
// CancelRequestContextWatcherHandler, pgRunner.send's deadline, pgErr). Each test states the
// guarantee it checks.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pgcCancelCode is the protocol code of a CancelRequest packet.
const pgcCancelCode = 80877102

// pgcProxy forwards TCP connections to the test server; a connection that opens with a
// CancelRequest (pgx's cancel of a statement whose ctx ended) is delivered late (delay): its
// bytes reach the server delay after the proxy got them, whether or not the client still
// waits — as on a slow network or a loaded server whose postmaster forks the cancel's child
// late.
type pgcProxy struct {
	ln      net.Listener
	delay   atomic.Int64 // nanoseconds
	cancels atomic.Int32 // cancel requests seen
	target  string
	wg      sync.WaitGroup
}

func pgcStartProxy(t *testing.T, target string) *pgcProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgcProxy{ln: ln, target: target}
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			p.wg.Go(func() { p.serve(c, track) })
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return p
}

func (p *pgcProxy) serve(c net.Conn, track func(net.Conn)) {
	head := make([]byte, 8)
	if _, err := io.ReadFull(c, head); err != nil {
		c.Close()
		return
	}
	if binary.BigEndian.Uint32(head[4:8]) == pgcCancelCode {
		p.cancels.Add(1)
		rest := make([]byte, int(binary.BigEndian.Uint32(head[0:4]))-8)
		if _, err := io.ReadFull(c, rest); err != nil {
			c.Close()
			return
		}
		got := time.Now()
		go func() { // the client may give up meanwhile: the packet is on its way all the same
			_, _ = io.Copy(io.Discard, c)
		}()
		time.Sleep(time.Until(got.Add(time.Duration(p.delay.Load()))))
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			return
		}
		_, _ = u.Write(append(head, rest...))
		_, _ = u.Read(make([]byte, 1)) // the server closes once it signalled the backend
		u.Close()
		c.Close()
		return
	}
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	track(u)
	if _, err := u.Write(head); err != nil {
		c.Close()
		u.Close()
		return
	}
	go func() { _, _ = io.Copy(u, c); u.Close() }()
	_, _ = io.Copy(c, u)
	c.Close()
}

// pgcOpenViaProxy opens a store in a fresh schema whose connections go through a pgcProxy;
// params are added to the URL.
func pgcOpenViaProxy(t *testing.T, params ...string) (*Postgres, *pgcProxy) {
	t.Helper()
	u, err := url.Parse(pgURL(""))
	if err != nil {
		t.Fatal(err)
	}
	p := pgcStartProxy(t, u.Host)
	u.Host = p.ln.Addr().String()
	q := u.Query()
	for i := 0; i+1 < len(params); i += 2 {
		q.Set(params[i], params[i+1])
	}
	u.RawQuery = q.Encode()
	return openPG(t, u.String(), nil), p
}

// pgcSetTimeout sets s's runner's write timeout.
func pgcSetTimeout(s *Postgres, d time.Duration) {
	p := s.w.(*pgRunner)
	p.mu.Lock()
	p.timeout = d
	p.mu.Unlock()
}

// pgcIntents counts run's intents with tool, read on a store of its own (not through any
// proxy), once the server is done with whatever waited for run's lock.
func pgcIntents(t *testing.T, s *Postgres, run, tool string) int {
	t.Helper()
	pgaHoldRun(t, s, run).release() // what waited for the lock has finished on the server
	n := 0
	for _, r := range must[[]Record](t)(openPG(t, pgURL(s.Schema()), nil).Records(context.Background(), run, 0, 0)) {
		if r.Kind == KindIntent && r.Tool == tool {
			n++
		}
	}
	return n
}

// pgcStrayCancel opens a store of one pooled connection behind a proxy that delivers cancel
// requests 500 ms late, with runs a-y and b-x, and calls prepare on it. Then intent w1 of a-y
// waits on a peer's lock past a 300 ms write timeout, its cancel request is sent, and the lock
// is freed so that w1 ends by itself before its cancel lands; the write timeout is 10 s from
// then on. It returns the store, a store of the same schema that bypasses the proxy (the one
// connection may be busy), and w1's answer.
func pgcStrayCancel(t *testing.T, prepare func(s *Postgres)) (s, direct *Postgres, err1 error) {
	t.Helper()
	s, proxy := pgcOpenViaProxy(t, "pool_max_conns", "1")
	pgaRuns(t, s, "a-y", "b-x")
	direct = openPG(t, pgURL(s.Schema()), nil)
	prepare(s)
	proxy.delay.Store(int64(500 * time.Millisecond))
	pgcSetTimeout(s, 300*time.Millisecond)
	h := pgaHoldRun(t, s, "a-y")
	w1 := make(chan error, 1)
	go func() {
		_, err := s.RecordIntent(context.Background(), Intent{Run: "a-y", Tool: "w1"})
		w1 <- err
	}()
	h.blocked(t, direct)
	pgcSetTimeout(s, 10*time.Second) // the next write has time enough
	deadline := time.Now().Add(10 * time.Second)
	for proxy.cancels.Load() == 0 { // w1's deadline has passed: its cancel is on its way
		if time.Now().After(deadline) {
			t.Fatal("w1's cancel request was never sent")
		}
		time.Sleep(time.Millisecond)
	}
	h.release() // w1 ends by itself before its cancel arrives
	select {
	case err1 = <-w1:
	case <-time.After(10 * time.Second):
		t.Fatal("w1 never returned")
	}
	return s, direct, err1
}

// Attack 2: pgx's cancel request is racy — when the cancelled statement ends by itself first
// (the lock is freed just after the deadline), pgx abandons its cancel request, waits 100 ms
// and returns the connection to the pool; a cancel already on its way (here delivered 500 ms
// late) then stops the NEXT statement on that connection: another caller's intent, whose ctx
// is live. Guarantees: (a) every caller is told the truth (an error means nothing committed,
// nil means committed); (b) a write whose own deadline is far off is not failed by another
// write's cancel (an intent that fails blocks its tool call).
func TestPGCancelStrayCancelKillsNextWrite(t *testing.T) {
	s, direct, err1 := pgcStrayCancel(t, func(*Postgres) {})
	h2 := pgaHoldRun(t, s, "a-y") // w2 is under way on the one connection when the cancel lands
	w2 := make(chan error, 1)
	go func() {
		_, err := s.RecordIntent(context.Background(), Intent{Run: "a-y", Tool: "w2"})
		w2 <- err
	}()
	h2.blocked(t, direct)
	time.AfterFunc(time.Second, h2.release)
	var err2 error
	select {
	case err2 = <-w2:
	case <-time.After(15 * time.Second):
		t.Fatal("w2 never returned")
	}
	n1, n2 := pgcIntents(t, s, "a-y", "w1"), pgcIntents(t, s, "a-y", "w2")
	if (err1 == nil) != (n1 == 1) || n1 > 1 {
		t.Errorf("w1 told %v, %d records: the caller was not told the truth", err1, n1)
	}
	if (err2 == nil) != (n2 == 1) || n2 > 1 {
		t.Errorf("w2 told %v, %d records: the caller was not told the truth", err2, n2)
	}
	if err2 != nil {
		t.Fatalf("w2, with a 10 s write timeout and its lock freed after 1 s, failed: %v (w1's late cancel request stopped the next statement on its pooled connection)", err2)
	}
}

// Attack 3: an intent that finds nothing queued but whose run is held by a batch in flight
// (its session's outcome, carried by another session's intent stuck on a peer's lock) waits
// for that batch, then runs with a full write timeout of its own, and gets stuck on a second
// peer's lock of its own run. Guarantee asked for (the change: "bounded by one write timeout
// ... waits for its predecessors included"): a write is answered within about one write
// timeout of its call, its wait for its predecessors included.
func TestPGCancelLoneIntentBehindStuckBatchBoundedByOneTimeout(t *testing.T) {
	const timeout = time.Second
	s := openPG(t, pgURL(""), nil)
	pgaRuns(t, s, "a-y", "b-x")
	s1 := pgaIntent(t, s, "b-x")
	pgcSetTimeout(s, timeout)
	h, first, carried := pgaBlockedBatch(t, s, s1) // B1: outcome of b-x + intent of a-y, stuck on a-y
	hb := pgaHoldRun(t, s, "b-x")                  // a second peer holds b-x
	start := time.Now()
	_, err := s.RecordIntent(context.Background(), Intent{Run: "b-x", Tool: "lone"})
	took := time.Since(start)
	h.release()
	hb.release()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the lone intent: %v, want DeadlineExceeded", err)
	}
	if a := pgaWait(t, first, "outcome"); !errors.Is(a.err, context.DeadlineExceeded) {
		t.Fatalf("B1's outcome: %v, want DeadlineExceeded", a.err)
	}
	if err := <-carried; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("B1's carrier: %v, want DeadlineExceeded", err)
	}
	pgbIdle(t, s)
	if n := pgcIntents(t, s, "b-x", "lone"); n != 0 {
		t.Fatalf("the lone intent failed yet committed (%d)", n)
	}
	if took > timeout+timeout/2 {
		t.Fatalf("the lone intent was answered after %v, want within one write timeout (%v): its wait for the batch before it is not counted in its bound", took.Round(time.Millisecond), timeout)
	}
}

// Attack 4: the same through run's flush (a non-batchable write: AppendEvent waits for the
// batches in flight, then runs with a full timeout of its own).
func TestPGCancelEventBehindStuckBatchBoundedByOneTimeout(t *testing.T) {
	const timeout = time.Second
	s := openPG(t, pgURL(""), nil)
	pgaRuns(t, s, "a-y", "b-x")
	s1 := pgaIntent(t, s, "b-x")
	pgcSetTimeout(s, timeout)
	h, first, carried := pgaBlockedBatch(t, s, s1)
	hb := pgaHoldRun(t, s, "b-x")
	start := time.Now()
	_, err := s.AppendEvent(context.Background(), Event{Run: "b-x", Kind: KindNote, Note: "lone"})
	took := time.Since(start)
	h.release()
	hb.release()
	pgaWait(t, first, "outcome")
	<-carried
	pgbIdle(t, s)
	if err == nil {
		t.Fatalf("an event stuck on a lock past the write timeout succeeded")
	}
	if took > timeout+timeout/2 {
		t.Fatalf("the event was answered (%v) after %v, want within one write timeout (%v): its flush's wait is not counted in its bound", err, took.Round(time.Millisecond), timeout)
	}
}

// Attack 5: a chain of batches, each queued outcome counted by pgbOnce, the runs' locks
// taken and let go by a flapping peer while the write timeout is short: every outcome is
// answered exactly once, within about one write timeout of its queueing (its batch's take
// comes after), and its answer matches the journal (nil: one outcome of its step; an error:
// none). Pending ends at 0.
func TestPGCancelFlappingChainAnswersOnceAndTruthfully(t *testing.T) {
	const timeout = 400 * time.Millisecond
	s := openPG(t, pgURL(""), nil)
	pgaRuns(t, s, "a-y", "b-x", "c-z")
	pgcSetTimeout(s, timeout)
	pgaSetDelay(s, time.Hour)
	stopA := pgbFlapLock(t, s, "a-y", 350*time.Millisecond, 30*time.Millisecond)
	stopB := pgbFlapLock(t, s, "b-x", 200*time.Millisecond, 60*time.Millisecond)
	type queued struct {
		run    string
		step   int64
		queued time.Time
		ch     <-chan pgaAnswer
		n      *atomic.Int32
	}
	var qs []queued
	var carriers sync.WaitGroup
	for i := range 12 {
		run := []string{"b-x", "c-z"}[i%2]
		step, err := s.RecordIntent(context.Background(), Intent{Run: run, Tool: fmt.Sprint("step ", i)})
		if err != nil { // a lock held past the timeout: a failed intent, nothing to complete
			continue
		}
		done, ch, n := pgbOnce(t, fmt.Sprint("outcome ", i))
		at := time.Now()
		s.QueueOutcome(context.Background(), run, step, StepOutcome{Status: Succeeded}, done)
		qs = append(qs, queued{run, step, at, ch, n})
		carriers.Go(func() { // another session's intent carries it, stuck or not
			_, _ = s.RecordIntent(context.Background(), Intent{Run: "a-y", Tool: fmt.Sprint("carrier ", i)})
		})
		time.Sleep(20 * time.Millisecond)
	}
	carriers.Wait()
	stopA()
	stopB()
	pgbIdle(t, s)
	if len(qs) == 0 {
		t.Fatal("no intent went through")
	}
	for _, q := range qs {
		a := pgaWait(t, q.ch, fmt.Sprintf("outcome of %s/%d", q.run, q.step))
		if q.n.Load() != 1 {
			t.Errorf("outcome of %s/%d answered %d times", q.run, q.step, q.n.Load())
		}
		pgaHoldRun(t, s, q.run).release()
		got := pgaCount(t, s, q.run, KindOutcome, q.step)
		if (a.err == nil) != (got == 1) || got > 1 {
			t.Errorf("outcome of %s/%d told %v, %d outcomes in the journal", q.run, q.step, a.err, got)
		}
	}
}

// Attack 6: an outsider makes many requests whose reads are cancelled while they run (here
// statements that sleep on the server, on the store's own pool, with deadlines of 30 ms).
// Each cancel opens a connection of its own to the server. Guarantees: every caller reads
// DeadlineExceeded promptly (within its deadline plus postgresCancelWait); the pool never
// holds more connections than its bound; the server has no more backends than before once
// they return (each cancelled statement really stopped: none still sleeps); no goroutine is left running.
func TestPGCancelManyCancelledReadsBounded(t *testing.T) {
	s := openPG(t, pgURL(""), nil)
	pgaRuns(t, s, "a-y")
	backends := func() int {
		var n int
		if err := s.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%' AND state <> 'idle' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before, goroutines := backends(), runtime.NumGoroutine()
	q := pgxQuerier{s.pool}
	const callers = 96
	var wg sync.WaitGroup
	var worst atomic.Int64
	var bad atomic.Int32
	var peak atomic.Int32
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				if n := s.pool.Stat().TotalConns(); n > peak.Load() {
					peak.Store(n)
				}
			}
		}
	}()
	for i := range callers {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := q.exec(ctx, `SELECT pg_sleep(5)`)
			if took := time.Since(start); int64(took) > worst.Load() {
				worst.Store(int64(took))
			}
			if !errors.Is(err, context.DeadlineExceeded) && bad.Add(1) == 1 {
				t.Errorf("caller %d: %v, want DeadlineExceeded", i, err)
			}
		})
	}
	wg.Wait()
	close(stop)
	if p := peak.Load(); p > s.pool.Config().MaxConns {
		t.Errorf("the pool held %d connections, above its bound %d", p, s.pool.Config().MaxConns)
	}
	if w := time.Duration(worst.Load()); w > 30*time.Millisecond+postgresCancelWait+time.Second {
		t.Errorf("a caller with a 30 ms deadline waited %v (it queues for a connection each cancelled statement keeps for its cancel)", w.Round(time.Millisecond))
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		n, g := backends(), runtime.NumGoroutine()
		if n <= before && g <= goroutines+5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the cancelled reads: %d backends (before %d), %d goroutines (before %d)", n, before, g, goroutines)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d cancelled reads: worst answer after %v, pool peak %d conns", callers, time.Duration(worst.Load()).Round(time.Millisecond), peak.Load())
}

// Attack 7: Close races intents stuck on a lock with a short write timeout, queued outcomes
// and reads with short deadlines. Guarantees: every answer is nil, ErrClosed or a ctx error
// (DeadlineExceeded), never pgx's text; each done is called once; Close returns; no goroutine
// of the store is left; pending ends at 0.
func TestPGCancelCloseRacesStuckWrites(t *testing.T) {
	s, closed := pgbOpenClosable(t)
	pgaRuns(t, s, "a-y", "b-x")
	steps := []int64{pgaIntent(t, s, "b-x"), pgaIntent(t, s, "b-x"), pgaIntent(t, s, "b-x")}
	goroutines := runtime.NumGoroutine()
	pgcSetTimeout(s, 300*time.Millisecond)
	pgaSetDelay(s, time.Hour)
	h := pgaHoldRun(t, s, "a-y")
	ok := func(err error) bool {
		return err == nil || errors.Is(err, ErrClosed) || errors.Is(err, context.DeadlineExceeded)
	}
	var wg sync.WaitGroup
	var ns []*atomic.Int32
	var chs []<-chan pgaAnswer
	for i, step := range steps {
		done, ch, n := pgbOnce(t, fmt.Sprint("outcome ", i))
		ns, chs = append(ns, n), append(chs, ch)
		s.QueueOutcome(context.Background(), "b-x", step, StepOutcome{Status: Succeeded}, done)
		wg.Go(func() {
			if _, err := s.RecordIntent(context.Background(), Intent{Run: "a-y", Tool: fmt.Sprint("carrier ", i)}); !ok(err) {
				t.Errorf("carrier %d: %v", i, err)
			}
		})
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if _, err := s.Records(ctx, "b-x", 0, 0); !ok(err) {
				t.Errorf("read %d: %v", i, err)
			}
		})
		time.Sleep(30 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	closeErr := make(chan error, 1)
	go func() { closeErr <- s.Close() }()
	for i := range 3 {
		wg.Go(func() {
			if _, err := s.RecordIntent(context.Background(), Intent{Run: "b-x", Tool: fmt.Sprint("late ", i)}); !ok(err) {
				t.Errorf("late intent %d: %v", i, err)
			}
			if _, err := s.GetRun(context.Background(), "b-x"); !ok(err) {
				t.Errorf("late read %d: %v", i, err)
			}
		})
	}
	select {
	case err := <-closeErr:
		*closed = true
		if err != nil && !ok(err) {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Close never returned")
	}
	wg.Wait()
	h.release()
	for i, ch := range chs {
		if a := pgaWait(t, ch, fmt.Sprint("outcome ", i)); !ok(a.err) {
			t.Errorf("outcome %d: %v", i, a.err)
		}
		if n := ns[i].Load(); n != 1 {
			t.Errorf("outcome %d answered %d times", i, n)
		}
	}
	if n := s.w.(*pgRunner).pending.Load(); n != 0 {
		t.Errorf("pending is %d after Close", n)
	}
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > goroutines+2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after Close, %d before the writes", runtime.NumGoroutine(), goroutines)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Attack 2b: as attack 2, but the write that the late cancel stops is a batch (an intent
// carrying a queued outcome of another run). Guarantee: the server rejected the batch as a
// whole (57014 is an ERROR), so each write runs again by itself (send's again path): both
// commit, each answered nil once.
func TestPGCancelStrayCancelOnBatchRunsEachAgain(t *testing.T) {
	var step int64
	s, direct, err1 := pgcStrayCancel(t, func(s *Postgres) { step = pgaIntent(t, s, "b-x") })
	h2 := pgaHoldRun(t, s, "a-y")
	pgaSetDelay(s, time.Hour)
	done, ch, n := pgbOnce(t, "outcome")
	s.QueueOutcome(context.Background(), "b-x", step, StepOutcome{Status: Succeeded}, done)
	w2 := make(chan error, 1)
	var seq2 int64
	go func() {
		var err error
		seq2, err = s.RecordIntent(context.Background(), Intent{Run: "a-y", Tool: "w2"})
		w2 <- err
	}()
	h2.blocked(t, direct)
	time.AfterFunc(time.Second, h2.release)
	var err2 error
	select {
	case err2 = <-w2:
	case <-time.After(15 * time.Second):
		t.Fatal("w2 never returned")
	}
	a := pgaWait(t, ch, "outcome")
	pgbIdle(t, s)
	n1, n2 := pgcIntents(t, s, "a-y", "w1"), pgcIntents(t, s, "a-y", "w2")
	if (err1 == nil) != (n1 == 1) || n1 > 1 {
		t.Errorf("w1 told %v, %d records", err1, n1)
	}
	if err2 != nil || n2 != 1 {
		t.Errorf("w2 (a batch, run again on a rejection) told %v, %d records; want nil, 1", err2, n2)
	}
	if got := pgaCount(t, s, "b-x", KindOutcome, step); a.err != nil || got != 1 || n.Load() != 1 {
		t.Errorf("the carried outcome told %v (%d answers), %d outcomes; want nil, 1, 1", a.err, n.Load(), got)
	}
	if err2 == nil && a.err == nil && pgXmin(t, direct, "a-y", seq2) == pgXmin(t, direct, "b-x", a.seq) {
		t.Fatal("the batch committed as one transaction: the late cancel did not reach it (the attack did not happen)")
	}
}
