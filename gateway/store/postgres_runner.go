package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// postgresWriteTimeout bounds a write once it has started (see pgRunner).
const postgresWriteTimeout = 30 * time.Second

// pgRunner is Postgres's runner: each write is a transaction of its own on the pool, and
// concurrent writes meet in the database's row locks. A write that has started runs to its end
// (bounded by postgresWriteTimeout) whatever the caller's ctx does; one stopped by that bound
// is cancelled on the server too, so that nothing of it commits (postgresConfig). A lazy
// write commits with synchronous_commit off, so it returns without waiting for the server's
// WAL flush: it survives a crash of the gateway; a crash of the server inside the WAL
// writer's delay can lose it, and Recover then completes the step as uncertain (the safe
// reading). A later synchronous commit (the next intent) flushes it too. A single statement
// runs without BEGIN and COMMIT of its own (one round trip).
//
// Lazy writes go to a pool of their own (half as many connections as the pool's
// pool_max_conns, at least 1) whose sessions run with synchronous_commit off, so that a lazy
// single statement (an outcome) is one round trip too, and a lazy transaction needs no SET
// LOCAL.
//
// Queued writes (QueueOutcome: the outcome of a call) wait for the next batchable write (the
// next intent, usually of the same session): it sends them and itself as one pgx batch, which
// the server runs as one implicit transaction: one round trip and one commit instead of two
// (BenchmarkPostgresPairForms: a third less CPU of the machine per call at 16 sessions). The
// statements go in the order of their runs, so that batches of two replicas take the runs'
// row locks in one order. When the server rejects the batch (nothing of it is committed),
// each write runs again by itself and gets its own answer. A queued write that no batch took
// within queuedDelay commits by itself (lazy); every other write, and every read
// (flushedReads), first waits for what is queued, so that a run's records are numbered in the
// order their methods were called. A crash of the gateway loses what is queued (Store's
// QueueOutcome).
type pgRunner struct {
	pool, lazy *pgxpool.Pool

	mu    sync.Mutex
	queue []*pgQueued
	sent  []*pgBatch // batches being sent
	timer *time.Timer
	delay time.Duration // how long a queued write waits for a batch; 0: queuedDelay
	// timeout bounds a write from its call (its wait for the writes before it included), and a
	// batch from when it was taken: 0 is postgresWriteTimeout.
	timeout time.Duration
	closed  bool
	// active counts the calls of run and runBatchable under way (close waits for them).
	active sync.WaitGroup
	// pending counts the queued writes not yet answered (flush's fast path reads it).
	pending atomic.Int64
}

// pgQueued is a queued write and the function that gets its answer.
type pgQueued struct {
	w    batchable
	done func(error)
}

// pgBatch is a batch of queued writes taken from the queue; done is closed once each is
// answered. after are the batches taken before it that hold a write of the same run: it is
// sent once they are answered, so that a run's records are numbered in call order whichever
// batch reaches the server first. deadline (its take's time plus the runner's timeout) bounds
// all of it, the wait for after too: batches stuck one behind the other are answered within
// one timeout of their takes, not one timeout each in turn.
type pgBatch struct {
	items    []*pgQueued
	after    []*pgBatch
	deadline time.Time
	done     chan struct{}
}

// holds reports whether b has a write of run.
func (b *pgBatch) holds(run string) bool {
	return slices.ContainsFunc(b.items, func(q *pgQueued) bool { return q.w.run == run })
}

// enter registers a call of run or runBatchable (done: p.active.Done). Errors: ErrClosed.
func (p *pgRunner) enter() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.active.Add(1)
	return nil
}

// run implements runner, after the queued writes (flush).
func (p *pgRunner) run(ctx context.Context, h how, fn txFunc) error {
	if err := p.enter(); err != nil {
		return err
	}
	defer p.active.Done()
	deadline := time.Now().Add(p.writeTimeout())
	if err := p.waitBy(ctx, deadline, func(ctx context.Context) error { return p.flush(ctx) }); err != nil {
		return err
	}
	return p.execBy(ctx, h, fn, deadline)
}

// exec runs fn as a transaction of its own (single: as its one statement), within
// postgresWriteTimeout whatever ctx does.
func (p *pgRunner) exec(ctx context.Context, h how, fn txFunc) error {
	return p.execBy(ctx, h, fn, time.Now().Add(p.writeTimeout()))
}

// execBy is exec within deadline (a write's bound counts from its call, its wait for the
// writes before it included).
func (p *pgRunner) execBy(ctx context.Context, h how, fn txFunc, deadline time.Time) error {
	wctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	return p.do(wctx, h, fn)
}

// waitBy runs wait (a wait for the writes before a write) within ctx and deadline; when
// deadline ends it first, the error says so (wrapping context.DeadlineExceeded).
func (p *pgRunner) waitBy(ctx context.Context, deadline time.Time, wait func(context.Context) error) error {
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err := wait(dctx)
	if err != nil && ctx.Err() == nil && dctx.Err() != nil {
		err = p.waitedTooLong(err)
	}
	return err
}

// pgEntry is a write of a batch being sent and the function that gets its answer (nil: the
// write of send's caller, whose answer send returns).
type pgEntry struct {
	w    *batchable
	done func(error)
}

// sendBatch sends the statements of es as one pgx batch on pool and sets errs[i] to the answer
// of es[i]'s statement. again: the server rejected the batch as a whole (an error, not a
// fatal one that ends the session), so nothing of it is committed; err is the batch's error.
func sendBatch(ctx context.Context, pool *pgxpool.Pool, es []pgEntry, errs []error) (again bool, err error) {
	stmts := make([]stmt, len(es))
	var batch pgx.Batch
	for i, e := range es {
		stmts[i] = e.w.stmt()
		batch.Queue(stmts[i].query, stmts[i].args...)
	}
	br := pool.SendBatch(ctx, &batch)
	for i, st := range stmts {
		r, err := br.Query()
		errs[i] = st.read(pgxRows{r, ctx}, pgErr(ctx, err))
	}
	err = pgErr(ctx, br.Close())
	var rejected *pgconn.PgError
	again = errors.As(err, &rejected) && rejected.Severity != "FATAL" && rejected.Severity != "PANIC"
	if err != nil && !again {
		err = fmt.Errorf("store: postgres: batch of %d writes: %w", len(es), err)
	}
	return again, err
}

// waitedTooLong is err (a wait for the writes before a write that its bound ended) saying so.
func (p *pgRunner) waitedTooLong(err error) error {
	return fmt.Errorf("store: postgres: the writes queued before it were not answered within %s: %w", p.writeTimeout(), err)
}

// writeTimeout is p.timeout, or postgresWriteTimeout when it is 0.
func (p *pgRunner) writeTimeout() time.Duration {
	if p.timeout > 0 {
		return p.timeout
	}
	return postgresWriteTimeout
}

// do runs fn as exec does, within ctx.
func (p *pgRunner) do(wctx context.Context, h how, fn txFunc) error {
	pool := p.pool
	if h.isLazy() {
		pool = p.lazy
	}
	once := func() error {
		if h.isSingle() {
			return fn(wctx, pgxQuerier{pool})
		}
		return pgErr(wctx, pgx.BeginFunc(wctx, pool, func(tx pgx.Tx) error { return fn(wctx, pgxQuerier{tx}) }))
	}
	err := once()
	if strayCancel(wctx, err) {
		err = once() // nothing of it committed (the server stopped it): its answer is the next run's
	}
	return err
}

// strayCancel reports whether err is the server's answer to a cancel request that ctx did
// not cause: pgx's cancel request is racy (a statement that ended by itself before its cancel
// arrived leaves the cancel to the next statement on its connection), so a write whose ctx is
// live may be stopped by another write's cancel. The server rolled it back (57014 is an
// ERROR), so it may run again.
func strayCancel(ctx context.Context, err error) bool {
	return ctx.Err() == nil && queryCanceled(err)
}

// runBatchable implements runner: w takes the queued writes into its batch, sent once the
// batches before it that hold one of its runs are answered. With nothing queued it runs
// alone, once the batches being sent that hold a write of its run (its session's outcome,
// taken by another session's intent) are answered, so that it is numbered after them. If
// ctx ends while it waits, w writes nothing and gets ctx's error; the batch it took is sent
// without it.
func (p *pgRunner) runBatchable(ctx context.Context, h how, w batchable) error {
	if err := p.enter(); err != nil {
		return err
	}
	defer p.active.Done()
	if p.pending.Load() == 0 {
		return p.exec(ctx, h, w.fn)
	}
	deadline := time.Now().Add(p.writeTimeout())
	p.mu.Lock()
	b := p.takeLocked(w.run)
	var wait []*pgBatch
	if b == nil {
		wait = p.holdingLocked(w.run)
	} else {
		wait = b.after
	}
	p.mu.Unlock()
	if err := p.waitBy(ctx, deadline, func(ctx context.Context) error { return waitBatches(ctx, wait) }); err != nil {
		if b != nil {
			go p.send(b, nil, lazy)
		}
		return err
	}
	if b != nil {
		return p.send(b, &w, h)
	}
	return p.execBy(ctx, h, w.fn, deadline)
}

// enqueue implements runner. A full queue (maxWriteBatch) is sent at once, and enqueue waits
// for it (the queue's bound) or for ctx's end.
func (p *pgRunner) enqueue(ctx context.Context, w batchable, done func(error)) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.queue = append(p.queue, &pgQueued{w: w, done: done})
	p.pending.Add(1)
	var b *pgBatch
	switch {
	case len(p.queue) >= maxWriteBatch:
		b = p.takeLocked("")
	case len(p.queue) == 1: // queuedDelay counts from the oldest queued write
		d := p.delay
		if d == 0 {
			d = queuedDelay
		}
		if p.timer == nil {
			p.timer = time.AfterFunc(d, p.kick)
		} else {
			p.timer.Reset(d)
		}
	}
	p.mu.Unlock()
	if b != nil {
		go p.send(b, nil, lazy)
		waitBatches(ctx, []*pgBatch{b})
	}
	return nil
}

// kick commits the queued writes that no batch took within queuedDelay.
func (p *pgRunner) kick() {
	p.mu.Lock()
	b := p.takeLocked("")
	p.mu.Unlock()
	if b != nil {
		p.send(b, nil, lazy)
	}
}

// flush implements runner: it commits what is queued and waits for the batches being sent.
// The batch it takes is sent on a goroutine of its own, so that a read gives up at its ctx's
// end (the batch may wait for a row lock) and leaves the writes to the batch.
func (p *pgRunner) flush(ctx context.Context) error {
	if p.pending.Load() == 0 {
		return nil
	}
	p.mu.Lock()
	wait := slices.Clone(p.sent)
	b := p.takeLocked("")
	p.mu.Unlock()
	if b != nil {
		go p.send(b, nil, lazy)
		wait = append(wait, b)
	}
	return waitBatches(ctx, wait)
}

// close implements runner: what is queued is committed first, and the calls under way end
// before the pools are closed (Store.Close closes them next).
func (p *pgRunner) close() error {
	p.mu.Lock()
	p.closed = true
	if p.timer != nil {
		p.timer.Stop()
	}
	p.mu.Unlock()
	err := p.flush(context.Background())
	p.active.Wait()
	return err
}

// takeLocked takes the queue as a batch being sent (nil when it is empty), to be sent after
// the batches being sent that hold a write of one of its runs or of also (after). p.mu is
// held.
func (p *pgRunner) takeLocked(also string) *pgBatch {
	if len(p.queue) == 0 {
		return nil
	}
	runs := []string{also}
	for _, q := range p.queue {
		runs = append(runs, q.w.run)
	}
	b := &pgBatch{items: p.queue, after: p.holdingLocked(runs...), deadline: time.Now().Add(p.writeTimeout()),
		done: make(chan struct{})}
	p.queue = nil
	p.sent = append(p.sent, b)
	return b
}

// holdingLocked returns the batches being sent that hold a write of one of runs. p.mu is
// held.
func (p *pgRunner) holdingLocked(runs ...string) []*pgBatch {
	var out []*pgBatch
	for _, s := range p.sent {
		if slices.ContainsFunc(runs, s.holds) {
			out = append(out, s)
		}
	}
	return out
}

// waitBatches waits until each of bs is answered, or ctx is done.
func waitBatches(ctx context.Context, bs []*pgBatch) error {
	for _, b := range bs {
		select {
		case <-b.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// send commits b's writes, and w (of how h) if not nil, in one pgx batch, once the batches
// before it are answered (b.after); it answers each queued write and returns w's answer. A
// write whose statement gave no answer of its own in the batch (no row: the error is the
// write's to tell) runs again by itself. When the server rejects the batch (an error, not a
// fatal one that ends the session: the batch may have committed before it), each write runs
// again by itself. All of it, the wait for b.after and the runs again too, by b.deadline:
// when the batches before it are not answered by then, nothing of b is sent and each write
// gets context.DeadlineExceeded (wrapped).
func (p *pgRunner) send(b *pgBatch, w *batchable, h how) error {
	defer func() {
		p.mu.Lock()
		p.sent = slices.DeleteFunc(p.sent, func(s *pgBatch) bool { return s == b })
		p.mu.Unlock()
		p.pending.Add(-int64(len(b.items)))
		close(b.done)
	}()
	ctx, cancel := context.WithDeadline(context.Background(), b.deadline)
	defer cancel()
	entries := make([]pgEntry, 0, len(b.items)+1)
	for _, q := range b.items {
		entries = append(entries, pgEntry{&q.w, q.done})
	}
	pool := p.lazy
	if w != nil {
		entries = append(entries, pgEntry{w, nil})
		if !h.isLazy() {
			pool = p.pool
		}
	}
	errs := make([]error, len(entries))
	var again bool
	err := waitBatches(ctx, b.after)
	if err != nil {
		err = p.waitedTooLong(err) // nothing of b is sent: each write gets err
	} else {
		slices.SortStableFunc(entries, func(a, b pgEntry) int { return strings.Compare(a.w.run, b.w.run) })
		again, err = sendBatch(ctx, pool, entries, errs)
	}
	var answer error
	for i, e := range entries {
		ans := errs[i]
		switch {
		case again && e.done == nil:
			ans = p.do(ctx, h, e.w.fn)
		case again || (err == nil && ans != nil && e.done != nil):
			ans = p.do(ctx, lazy|single, e.w.fn)
		case err != nil:
			ans = err
		}
		if e.done == nil {
			answer = ans
		} else {
			e.done(ans)
		}
	}
	return answer
}
