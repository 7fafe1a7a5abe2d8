package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/flock"
	"modernc.org/sqlite" // registers the "sqlite" driver (pure Go, no cgo)
	sqlite3 "modernc.org/sqlite/lib"
)

// SQLiteFile is the name of the database file OpenSQLite uses inside the data folder. SQLite
// keeps SQLiteFile+"-wal" and SQLiteFile+"-shm" beside it while the store is open.
const SQLiteFile = "reversi-gateway.db"

// writerLockFile, in the data folder, is where the writers of every process on the folder
// queue for the database (see SQLite).
const writerLockFile = "writer.lock"

// SQLite is a Store in one SQLite file (modernc.org/sqlite, no cgo).
//
// Durability: the database is in WAL mode and its connections run with synchronous=NORMAL: a
// commit appends its frames to the WAL file without syncing it, so it survives a crash of the
// process as soon as it returns. A write that must be on disk before the gateway goes on
// (intents, rollback entries, runs, keys claimed, approvals, high-water marks) returns only
// after the writer has synced the WAL file itself (fdatasync) after its commit (walSync). That
// is as durable as synchronous=FULL, which syncs the same file at the same point (after the
// commit's frames, before the call returns); the one difference, that other connections may
// read the commit before the sync, matters only to a power loss during the sync, when the call
// has not returned and nothing outside the store (no upstream) relied on it. The sync covers
// every frame written before it, of this process or another: the WAL is one file, appended to
// until SQLite restarts it from its start, and a restart comes only after a checkpoint has
// copied every frame into the database file and synced the WAL and then the database file (a
// checkpoint syncs at synchronous=NORMAL). Frames a restart overwrites before our sync are thus
// already durable in the database file. This holds as long as every connection that checkpoints
// the file syncs at checkpoints, i.e. runs with synchronous NORMAL or FULL (every store of this
// package does; sqlite3's shell defaults to FULL). The file synced is the one SQLite writes: a
// WAL is deleted only when its last connection closes, the writer holds its connection, and
// walSync reopens the WAL by name should it find its descriptor's file deleted.
//
// Writes that only record what already happened (outcomes, events, run status, keys
// released) are not synced: they reach the disk with the next sync, a durable write's or the
// writer's own within lazyFlushInterval. A power loss inside that window can lose an outcome;
// Recover then completes its step as uncertain, which is the safe reading.
//
// Group commit (sqliteWriter): writes go through a single connection, so they are serialised
// in the process and never meet SQLITE_BUSY from each other; the writes waiting while one
// batch commits form the next batch, committed in one transaction with one sync. No call
// returns success before its write is committed (and synced, when durable). Reads use a
// separate pool of read-only connections and do not wait for writers (WAL readers see the last
// committed state).
//
// Several processes: a batch's transaction runs under an exclusive flock(2) of writerLockFile,
// taken blocking, so the writers of every process on the folder wait in the kernel's queue and
// go on as soon as the lock is free, instead of polling SQLite's write lock with the sleeps of
// its busy handler (1, 2, 5, ... 100 ms: the unlucky waited longest). The lock is released
// before the WAL sync, so one process's sync overlaps the next one's commit, and the processes
// share syncs as they share commit numbers (walSync, syncCountersFile): a writer whose commit
// another process's sync has covered does not sync again. busy_timeout stays as the backstop
// for writers that do not take the lock (the sqlite3 shell, older gateways).
//
// Several processes may share one data folder (stdio gateways of one project, the approvals
// CLI). Each open store is an instance holding an advisory lock on instances/<id>.lock for its
// lifetime, and every intent records its instance; Recover completes only the intents of
// instances whose lock is free (the process is gone), never those of a live gateway.
type SQLite struct {
	sqlStore
	path string
}

var _ Store = (*SQLite)(nil)

// sqliteDialect is SQLite's: one writer at a time holds the whole file (the writer's IMMEDIATE
// transactions), so nothing is locked row by row and the next Seq of a run is max(seq) + 1
// (an index seek); text compares byte-wise by default.
var sqliteDialect = (&dialect{
	types: strings.NewReplacer("{text}", "TEXT", "{int}", "INTEGER", "{key}", "TEXT", "{bool}", "INTEGER",
		"{norowid}", " WITHOUT ROWID"),
	rowOrder:  "rowid",
	key:       func(k string) any { return k },
	textMatch: func(c, p string) string { return "instr(lower(" + c + "), " + p + ") > 0" },
	columns:   `SELECT name FROM pragma_table_info($1)`,
	unique:    sqliteUnique,
	seqFrom:   `(SELECT coalesce((SELECT max(seq) FROM records WHERE run = $1), 0) + 1 AS n FROM runs WHERE id = $1) s`,
	extraDDL: []string{
		`DROP TABLE IF EXISTS flush_mark`, // version 3's lazy flush wrote a row there
		// 2: high_water; 3: decision records (records.approval, event, approver, groups),
		// approvals.actor_uid, actor_email, uid, spec_digest; 4: open intents on the records
		// (records.instance, open; no pending table), Seq from max(seq); 5: the notification
		// outbox (notifications), approvals.args_preview, risk; 6: notification_receivers.namespaces
		`PRAGMA user_version = 6`,
	},
}).withStatements()

// sqliteUnique reports a UNIQUE or PRIMARY KEY constraint violation (extended result codes).
func sqliteUnique(err error) bool {
	var e *sqlite.Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || e.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
}

// OpenSQLite opens (creating if needed) the store in dir/SQLiteFile. dir is created with mode
// 0700 if missing. A nil clock means time.Now. Call Recover after opening to complete the steps
// a previous process left without an outcome.
func OpenSQLite(dir string, clock Clock) (_ *SQLite, err error) {
	if clock == nil {
		clock = time.Now
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: data folder: %w", err)
	}
	var undo []func() error // on failure, in reverse
	defer func() {
		for i := len(undo) - 1; err != nil && i >= 0; i-- {
			_ = undo[i]()
		}
	}()
	path := filepath.Join(dir, SQLiteFile)
	wlock, err := os.OpenFile(filepath.Join(dir, writerLockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: data folder: %w", err)
	}
	undo = append(undo, wlock.Close)
	base := "file:" + (&url.URL{Path: path}).EscapedPath() + "?_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)"
	w, err := sql.Open("sqlite", base+"&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	undo = append(undo, w.Close)
	oneConnection(w)
	wal, err := openLocked(wlock, w, dir, path)
	if err != nil {
		return nil, err
	}
	undo = append(undo, wal.close)
	instance := newID("gw-")
	lock, err := lockInstance(filepath.Join(dir, instancesDir), instance)
	if err != nil {
		return nil, err
	}
	undo = append(undo, func() error { releaseInstance(lock); return nil })
	r, err := sql.Open("sqlite", base+"&_pragma=query_only(1)")
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	undo = append(undo, r.Close)
	r.SetMaxOpenConns(4)
	r.SetMaxIdleConns(4)
	wr, err := newWriter(w, wal, wlock)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	s := &SQLite{path: path, sqlStore: sqlStore{d: sqliteDialect, r: flushedReads{wr, sqlQuerier{r}}, w: wr, now: clock, instance: instance,
		inst: &fileInstances{dir: filepath.Join(dir, instancesDir), id: instance, own: lock}}}
	s.release = func() error { return errors.Join(r.Close(), w.Close()) }
	return s, nil
}

// openLocked opens the write connection w, its schema and the WAL's syncer, holding the
// folder's writer lock: the first opener of a new folder turns WAL on, which needs the file
// alone (openers racing there can meet in SQLite's locks and get SQLITE_BUSY at once,
// without the busy handler), and a reset of the shared counters must not interleave with
// another opener.
func openLocked(wlock *os.File, w *sql.DB, dir, path string) (*walSync, error) {
	if err := lockFile(wlock); err != nil {
		return nil, fmt.Errorf("store: %s: writer lock: %w", path, err)
	}
	defer unlockFile(wlock)
	var mode string
	if err := w.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || !strings.EqualFold(mode, "wal") {
		return nil, fmt.Errorf("store: %s: cannot use WAL (journal_mode %q): %v", path, mode, err)
	}
	if err := createSchema(w, sqliteDialect); err != nil {
		return nil, fmt.Errorf("store: %s: schema: %w", path, err)
	}
	return newWALSync(dir, path+"-wal")
}

// oneConnection keeps db to a single connection that is never closed (the writer's).
func oneConnection(db *sql.DB) {
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
}

// createSchema creates or upgrades the schema in one IMMEDIATE transaction on db.
func createSchema(db *sql.DB, d *dialect) error {
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := d.migrate(ctx, sqlQuerier{tx}); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// Path returns the database file's path.
func (s *SQLite) Path() string { return s.path }

// instancesDir holds one lock file per open store instance.
const instancesDir = "instances"

// instanceLock is a held instance lock and the name its file is published under.
type instanceLock struct {
	*flock.Flock
	path string // <dir>/<instance>.lock
}

// lockInstance creates the instance's lock file already locked: it is locked under a temporary
// name and then renamed to <instance>.lock, so a peer listing the folder never finds (and takes
// for dead) the file of an instance that is still starting.
func lockInstance(dir, instance string) (*instanceLock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: data folder: %w", err)
	}
	tmp := filepath.Join(dir, instance+".starting")
	l := flock.New(tmp)
	if ok, err := l.TryLock(); !ok || err != nil {
		return nil, fmt.Errorf("store: lock instance %s: %v", instance, err)
	}
	path := filepath.Join(dir, instance+".lock")
	if err := os.Rename(tmp, path); err != nil {
		_ = l.Unlock()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("store: publish the lock of instance %s: %w", instance, err)
	}
	return &instanceLock{Flock: l, path: path}, nil
}

// releaseInstance unlocks and removes an instance's lock file.
func releaseInstance(l *instanceLock) {
	_ = os.Remove(l.path) // first: a recovering peer that locks it then finds nothing to do
	_ = l.Unlock()
}

// fileInstances are the instances of a data folder: one lock file each in dir, locked by its
// process while it lives.
type fileInstances struct {
	dir string
	id  string        // this store's instance
	own *instanceLock // held while open
}

func (*fileInstances) usable() error { return nil }

// lockDead locks the instances among ids, and those of the folder's other lock files (so that
// Recover also removes the files of processes that died with nothing pending), whose lock is
// free: their process is gone. "" (intents from before instances) is always dead.
func (f *fileInstances) lockDead(_ context.Context, ids []string) (map[string]bool, func(), error) {
	entries, _ := os.ReadDir(f.dir)
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), ".lock"); ok {
			ids = append(ids, id)
		}
	}
	dead := map[string]bool{}
	var held []*instanceLock
	for _, id := range ids {
		switch {
		case id == f.id || dead[id]:
		case id == "":
			dead[id] = true
		default:
			path := filepath.Join(f.dir, id+".lock")
			l := flock.New(path)
			if ok, err := l.TryLock(); ok && err == nil {
				dead[id] = true
				held = append(held, &instanceLock{Flock: l, path: path})
			}
		}
	}
	return dead, func() {
		for _, l := range held {
			releaseInstance(l)
		}
	}, nil
}

func (f *fileInstances) close() error {
	releaseInstance(f.own)
	return nil
}

// lazyFlushInterval bounds how long a lazy commit may wait for an fsync when no durable write
// follows it.
const lazyFlushInterval = 500 * time.Millisecond

// queuedDelay bounds how long a queued write (QueueOutcome) waits for a batch to join before
// it is committed by itself: a session's next call usually comes well within it (the agent's
// round trip), so its intent's transaction carries the outcome of the call before.
const queuedDelay = 5 * time.Millisecond

// maxWriteBatch bounds how many requests share one transaction.
const maxWriteBatch = 256

// writeReq is one write waiting for a batch.
type writeReq struct {
	ctx context.Context
	fn  txFunc
	how how
	// err is the answer, set before signal receives false.
	err error
	// lead (guarded by sqliteWriter.mu) marks the request whose goroutine leads the next
	// batch: signal receives true.
	lead   bool
	signal chan bool // buffered (1): nobody ever blocks on sending
	// done, for a queued request (nobody waits on signal), gets the answer instead.
	done func(error)
}

// sqliteWriter is SQLite's runner: group commit without a goroutine of its own. A write joins
// the queue; if no batch is running its caller's goroutine leads one: it takes every waiting
// request (up to maxWriteBatch), commits them together (one transaction, one fsync), answers
// each, and hands the lead to the oldest request that arrived meanwhile. A lone caller thus
// runs its write itself, with no hand-over between goroutines; concurrent callers share the
// transaction and the fsync.
type sqliteWriter struct {
	// A file's writer holds its connection (conn) and runs its own BEGIN and COMMIT on it,
	// every statement prepared once; in memory the one connection of db serves the reads too,
	// so a batch holds it for its transaction only (database/sql's Tx) and conn is nil.
	db    *sql.DB
	conn  *sql.Conn
	wal   *walSync // nil in memory: nothing to sync
	wlock *os.File // writerLockFile; nil in memory (no other process)

	mu      sync.Mutex
	idle    *sync.Cond // broadcast when leading becomes false
	queue   []*writeReq
	leading bool
	closed  bool
	// timer commits queued requests that no batch took within queuedDelay (armed: pending).
	timer *time.Timer
	armed bool
	// queuedN counts the queued requests not yet answered (flush's fast path reads it).
	queuedN atomic.Int64

	// The leader's alone (one leader at a time).
	batch   []*writeReq
	stmts   map[string]*sql.Stmt // prepared on conn, or on db so that a Tx can use them
	missing map[string]bool      // in memory: statements a Tx ran unprepared, prepared after it
}

// newWriter returns the runner of db's one connection, which owns wlock from then on. wal and
// wlock are nil for a database without a file (memory), whose connection the reads share.
func newWriter(db *sql.DB, wal *walSync, wlock *os.File) (*sqliteWriter, error) {
	w := &sqliteWriter{db: db, wal: wal, wlock: wlock, stmts: map[string]*sql.Stmt{}, missing: map[string]bool{}}
	w.idle = sync.NewCond(&w.mu)
	if wal != nil {
		c, err := db.Conn(context.Background())
		if err != nil {
			return nil, err
		}
		w.conn = c
	}
	return w, nil
}

// run implements runner. fn runs inside the batch's transaction (see transact; alone and
// single: as one statement in autocommit); run returns nil only after that transaction is
// committed, and for a durable write after the WAL is synced. A request whose ctx is done
// before a batch takes it is not run and returns ctx's error. Once taken, run waits for the
// commit whatever ctx does, so its answer always matches what is on disk.
func (w *sqliteWriter) run(ctx context.Context, h how, fn txFunc) error {
	req := &writeReq{ctx: ctx, fn: fn, how: h, signal: make(chan bool, 1)}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	w.queue = append(w.queue, req)
	lead := !w.leading
	w.leading = true
	w.mu.Unlock()
	if !lead {
		if lead = w.wait(req); !lead {
			return req.err
		}
	}
	for { // the batch may not hold req (queued requests before it): then it leads the next
		w.lead()
		if !<-req.signal {
			return req.err
		}
	}
}

// runBatchable implements runner: w joins the batch as any write does.
func (w *sqliteWriter) runBatchable(ctx context.Context, h how, b batchable) error {
	return w.run(ctx, h, b.fn)
}

// enqueue implements runner: the next batch takes b.fn (another caller's write, usually the
// next intent), or the timer after queuedDelay; done runs on the goroutine leading the
// batch. In memory (nothing to sync, and a database/sql Tx costs more than two statements in
// autocommit) b is committed before enqueue returns.
func (w *sqliteWriter) enqueue(ctx context.Context, b batchable, done func(error)) error {
	ctx = context.WithoutCancel(ctx)
	if w.wal == nil {
		done(w.run(ctx, lazy|single, b.fn))
		return nil
	}
	req := &writeReq{ctx: ctx, fn: b.fn, how: lazy | single, done: done}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	w.queue = append(w.queue, req)
	w.queuedN.Add(1)
	if !w.leading {
		w.armLocked()
	}
	return nil
}

// armLocked starts the timer of the queued requests unless it runs. w.mu is held.
func (w *sqliteWriter) armLocked() {
	if w.armed {
		return
	}
	w.armed = true
	if w.timer == nil {
		w.timer = time.AfterFunc(queuedDelay, w.kick)
	} else {
		w.timer.Reset(queuedDelay)
	}
}

// kick leads a batch of the queued requests that no write took within queuedDelay.
func (w *sqliteWriter) kick() {
	w.mu.Lock()
	w.armed = false
	if w.leading || len(w.queue) == 0 {
		w.mu.Unlock()
		return
	}
	w.leading = true
	w.mu.Unlock()
	w.lead()
}

// flush returns once every request queued before it is committed (or answered with its
// error): the reads of the store see what its writes queued.
func (w *sqliteWriter) flush(ctx context.Context) error {
	if w.queuedN.Load() == 0 {
		return nil
	}
	// A taken request waits for its batch whatever ctx does (run); a read has nothing on disk
	// to match, so it gives up at ctx's end (the batch may wait for another process's writer
	// lock) and leaves the empty request to the batch.
	noop := func(context.Context, querier) error { return nil }
	if ctx.Done() == nil { // it never ends: no goroutine to wait beside the batch
		return w.run(ctx, lazy|single, noop)
	}
	errc := make(chan error, 1)
	go func() { errc <- w.run(ctx, lazy|single, noop) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait waits for req's signal: true when its goroutine is to lead the next batch, false when
// req was answered (or withdrawn: its ctx ended before a batch took it).
func (w *sqliteWriter) wait(req *writeReq) bool {
	done := req.ctx.Done()
	for {
		select {
		case lead := <-req.signal:
			return lead
		case <-done:
			done = nil // taken or leading: wait for the signal
			w.mu.Lock()
			if i := slices.Index(w.queue, req); i >= 0 && !req.lead {
				w.queue = slices.Delete(w.queue, i, i+1)
				w.mu.Unlock()
				req.err = req.ctx.Err()
				return false
			}
			w.mu.Unlock()
		}
	}
}

// lead runs one batch, then passes the lead on to the oldest waiting request, if any. Queued
// requests nobody waits for are left to the next write or the timer, except once the writer
// is closed: then lead commits them too.
func (w *sqliteWriter) lead() {
	for {
		w.mu.Lock()
		n := min(len(w.queue), maxWriteBatch)
		w.batch = append(w.batch[:0], w.queue[:n]...)
		rest := copy(w.queue, w.queue[n:])
		clear(w.queue[rest:])
		w.queue = w.queue[:rest]
		w.mu.Unlock()

		w.commitBatch(w.batch)
		clear(w.batch)
		w.prepareMissing()

		w.mu.Lock()
		if i := slices.IndexFunc(w.queue, func(r *writeReq) bool { return r.done == nil }); i >= 0 {
			next := w.queue[i]
			next.lead = true
			next.signal <- true
			w.mu.Unlock()
			return
		}
		switch {
		case len(w.queue) > 0 && w.closed:
			w.mu.Unlock()
			continue
		case len(w.queue) > 0:
			w.armLocked()
		case w.armed: // the batch took what the timer was for: no wake-up in vain
			w.armed = !w.timer.Stop()
		}
		w.leading = false
		w.idle.Broadcast()
		w.mu.Unlock()
		return
	}
}

// close waits for the running batches, syncs the lazy commits and stops: later runs return
// ErrClosed.
func (w *sqliteWriter) close() error {
	w.mu.Lock()
	w.closed = true
	if !w.leading && len(w.queue) > 0 { // queued requests only: commit them now
		w.leading = true
		w.mu.Unlock()
		w.lead()
		w.mu.Lock()
	}
	for w.leading {
		w.idle.Wait()
	}
	if w.timer != nil {
		w.timer.Stop()
	}
	w.mu.Unlock()
	var errs []error
	if w.wal != nil {
		errs = append(errs, w.wal.close())
	}
	for _, st := range w.stmts {
		errs = append(errs, st.Close())
	}
	if w.conn != nil {
		errs = append(errs, w.conn.Close())
	}
	if w.wlock != nil {
		errs = append(errs, w.wlock.Close())
	}
	return errors.Join(errs...)
}

// prepareMissing prepares the statements the last batch's transaction ran unprepared (the
// connection is free again; parsing SQL was a fifth of the writer's CPU).
func (w *sqliteWriter) prepareMissing() {
	for q := range w.missing {
		if st, err := w.db.Prepare(q); err == nil {
			w.stmts[q] = st
		}
		delete(w.missing, q)
	}
}

// stmt returns the prepared statement of query, preparing it on the writer's connection, or
// on db when it is free (memory, outside a Tx: tx false).
func (w *sqliteWriter) stmt(query string, tx bool) *sql.Stmt {
	if st, ok := w.stmts[query]; ok {
		return st
	}
	if w.conn != nil {
		st, err := w.conn.PrepareContext(context.Background(), query)
		if err != nil {
			return nil // run unprepared: the same error comes back from the statement
		}
		w.stmts[query] = st
		return st
	}
	if tx {
		w.missing[query] = true
		return nil
	}
	st, err := w.db.Prepare(query)
	if err != nil {
		return nil // run unprepared: the same error comes back from the statement
	}
	w.stmts[query] = st
	return st
}

// writerTx is the querier of a batch, through the writer's prepared statements: on the
// writer's connection, or in memory in the batch's Tx (nil: a lone single statement in
// autocommit).
type writerTx struct {
	w  *sqliteWriter
	tx *sql.Tx
}

func (t writerTx) prep(ctx context.Context, query string) *sql.Stmt {
	st := t.w.stmt(query, t.tx != nil)
	if st != nil && t.tx != nil {
		return t.tx.StmtContext(ctx, st)
	}
	return st
}

func (t writerTx) exec(ctx context.Context, query string, args ...any) (int64, error) {
	return sqlQuerier{t.target(ctx, query)}.exec(ctx, query, args...)
}

func (t writerTx) query(ctx context.Context, query string, args ...any) (rows, error) {
	return sqlQuerier{t.target(ctx, query)}.query(ctx, query, args...)
}

// target is what runs query: its prepared statement (bound to the Tx), else the Tx, the
// writer's connection or db, unprepared.
func (t writerTx) target(ctx context.Context, query string) stmtOrConn {
	if st := t.prep(ctx, query); st != nil {
		return boundStmt{st}
	}
	switch {
	case t.tx != nil:
		return t.tx
	case t.w.conn != nil:
		return t.w.conn
	}
	return t.w.db
}

// stmtOrConn runs statements (sqlQuerier's q).
type stmtOrConn = interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// boundStmt runs its prepared statement whatever the query text (the same).
type boundStmt struct{ st *sql.Stmt }

func (b boundStmt) ExecContext(ctx context.Context, _ string, args ...any) (sql.Result, error) {
	return b.st.ExecContext(ctx, args...)
}

func (b boundStmt) QueryContext(ctx context.Context, _ string, args ...any) (*sql.Rows, error) {
	return b.st.QueryContext(ctx, args...)
}

// commitBatch runs batch under the folder's writer lock (transact) and answers every request.
// After a commit holding a durable request the WAL is synced, out of the lock, before anyone
// is answered; a lazy commit is synced by the next durable one (of any process) or within
// lazyFlushInterval.
func (w *sqliteWriter) commitBatch(batch []*writeReq) {
	errs := make([]error, len(batch))
	committed := false
	if err := w.lockWriters(); err != nil {
		for i := range errs {
			errs[i] = err
		}
	} else {
		committed = w.transact(batch, errs)
		var c uint64
		if committed && w.wal != nil {
			c = w.wal.committed()
		}
		w.unlockWriters()
		if c > 0 && slices.ContainsFunc(batch, func(r *writeReq) bool { return !r.how.isLazy() }) {
			if err := w.wal.syncThrough(c); err != nil {
				for i, req := range batch { // a lazy write stands: it is committed
					if errs[i] == nil && !req.how.isLazy() {
						errs[i] = err
					}
				}
				w.wal.committedLazy(c) // the timer tries the sync again
			}
		} else if c > 0 {
			w.wal.committedLazy(c)
		}
	}
	for i, req := range batch {
		req.err = errs[i]
		if req.done != nil {
			req.done(errs[i])
			w.queuedN.Add(-1)
			continue
		}
		req.signal <- false
	}
}

// lockWriters takes the writer lock of the data folder (see SQLite), waiting for the writers
// of other processes.
func (w *sqliteWriter) lockWriters() error {
	if w.wlock == nil {
		return nil
	}
	if err := lockFile(w.wlock); err != nil {
		return fmt.Errorf("store: writer lock: %w", err)
	}
	return nil
}

func (w *sqliteWriter) unlockWriters() {
	if w.wlock != nil {
		_ = unlockFile(w.wlock) // only fails for a bad descriptor; closing it releases the lock
	}
}

// transact runs batch (see commitBatch), setting each request's error in errs, and reports
// whether anything was committed. A batch of several requests runs first without savepoints
// (two statements less per request): when every request succeeds, as nearly always, that is
// the commit; when one fails, the transaction is rolled back and the batch runs again with a
// SAVEPOINT per request.
func (w *sqliteWriter) transact(batch []*writeReq, errs []error) bool {
	if len(batch) == 1 && batch[0].how.isSingle() {
		req := batch[0]
		if errs[0] = req.ctx.Err(); errs[0] == nil {
			errs[0] = req.fn(context.WithoutCancel(req.ctx), writerTx{w: w})
		}
		return errs[0] == nil
	}
	committed, retry := w.pass(batch, errs, false)
	if retry {
		clear(errs)
		committed, _ = w.pass(batch, errs, true)
	}
	return committed
}

// pass runs batch in one IMMEDIATE transaction and commits it. With savepoints each request
// runs in its own, and a request that fails rolls back only itself; without, the first failure
// rolls the transaction back and pass returns retry (if other requests were in it). If the
// transaction itself fails (begin, savepoint bookkeeping or commit), nothing in it is
// committed and every request that had succeeded gets that error.
func (w *sqliteWriter) pass(batch []*writeReq, errs []error, savepoints bool) (committed, retry bool) {
	bg := context.Background()
	fail := func(err error) (bool, bool) {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return false, false
	}
	t, err := w.begin()
	if err != nil {
		return fail(fmt.Errorf("store: begin: %w", err))
	}
	ran := false
	for i, req := range batch {
		if errs[i] = req.ctx.Err(); errs[i] != nil {
			continue // not run: nothing of it is written
		}
		if savepoints {
			if _, err := t.exec(bg, `SAVEPOINT req`); err != nil {
				t.rollback()
				return fail(fmt.Errorf("store: savepoint: %w", err))
			}
		}
		errs[i] = req.fn(context.WithoutCancel(req.ctx), t)
		switch {
		case errs[i] == nil:
			ran = true
		case !savepoints:
			t.rollback()
			return false, len(batch) > 1
		default:
			if _, err := t.exec(bg, `ROLLBACK TO req`); err != nil {
				// SQLite may have rolled the whole transaction back (e.g. disk full):
				// nothing of the batch stands.
				t.rollback()
				return fail(fmt.Errorf("store: rollback to savepoint: %w", err))
			}
		}
		if savepoints {
			if _, err := t.exec(bg, `RELEASE req`); err != nil {
				t.rollback()
				return fail(fmt.Errorf("store: release savepoint: %w", err))
			}
		}
	}
	if !ran {
		t.rollback()
		return false, false
	}
	if err := t.commit(); err != nil {
		return fail(fmt.Errorf("store: commit: %w", err))
	}
	return true, false
}

// begin starts a batch's IMMEDIATE transaction (the file's write lock, waiting for another
// process's up to busy_timeout).
func (w *sqliteWriter) begin() (writerTx, error) {
	if w.conn == nil {
		tx, err := w.db.BeginTx(context.Background(), nil) // _txlock=immediate
		return writerTx{w: w, tx: tx}, err
	}
	t := writerTx{w: w}
	_, err := t.exec(context.Background(), `BEGIN IMMEDIATE`)
	return t, err
}

// commit commits the batch's transaction; if that fails, the transaction is rolled back.
func (t writerTx) commit() error {
	if t.tx != nil {
		return t.tx.Commit()
	}
	if _, err := t.exec(context.Background(), `COMMIT`); err != nil {
		t.rollback()
		return err
	}
	return nil
}

// rollback ends the batch's transaction without committing anything of it.
func (t writerTx) rollback() {
	if t.tx != nil {
		t.tx.Rollback()
		return
	}
	_, _ = t.exec(context.Background(), `ROLLBACK`) // an error: SQLite rolled it back already
}

// CheckSQLiteIntegrity runs `PRAGMA integrity_check` on the SQLite store in dir, read-only.
// Errors: the file cannot be opened, or the check reports anything but "ok" (its first line).
func CheckSQLiteIntegrity(dir string) error {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, SQLiteFile)+"?mode=ro")
	if err != nil {
		return err
	}
	defer db.Close()
	var res string
	if err := db.QueryRow("PRAGMA integrity_check").Scan(&res); err != nil {
		return fmt.Errorf("PRAGMA integrity_check on %s: %w", filepath.Join(dir, SQLiteFile), err)
	}
	if res != "ok" {
		return fmt.Errorf("PRAGMA integrity_check on %s: %s", filepath.Join(dir, SQLiteFile), res)
	}
	return nil
}
