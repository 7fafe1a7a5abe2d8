package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gofrs/flock"
	_ "modernc.org/sqlite" // registers the "sqlite" driver (pure Go, no cgo)
)

// SQLiteFile is the name of the database file OpenSQLite uses inside the data folder. SQLite
// keeps SQLiteFile+"-wal" and SQLiteFile+"-shm" beside it while the store is open.
const SQLiteFile = "reversi-gateway.db"

// SQLite is a Store in one SQLite file (modernc.org/sqlite, no cgo).
//
// Durability: the database is in WAL mode. Writes that must be on disk before the gateway goes
// on (intents, rollback entries, runs, keys claimed, approvals, high-water marks) commit with
// synchronous=FULL: the WAL is fsynced before the call returns, so they survive a crash of the
// process and a power loss alike. Writes that only record what already happened (outcomes, events, run status,
// keys released: see Lazy) commit with synchronous=NORMAL: they are in the WAL when the call
// returns, so they survive a crash of the process, and they reach the disk with the next fsync:
// the next FULL commit (an fsync of the WAL covers every frame before it) or, when none comes,
// a flush by the writer within lazyFlushInterval. A power loss inside that window can lose an
// outcome; Recover then completes its step as uncertain, which is the safe reading. Writes go through a single connection, so
// they are serialised in the process and never meet SQLITE_BUSY from each other; reads use a
// separate pool of read-only connections and do not wait for writers (WAL readers see the last
// committed state).
//
// Group commit: every write is a request to one writer goroutine, which owns the write
// connection. It takes the request and every other request already waiting (up to
// maxWriteBatch), runs each in its own SAVEPOINT inside ONE transaction (a request that fails
// rolls back only itself and gets its own error), commits once (one fsync for the batch) and
// only then answers each caller. No call returns success before its write is committed, so the
// durability above is unchanged; concurrent sessions share the fsync instead of queueing for it.
//
// Several processes may share one data folder (stdio gateways of one project, the approvals
// CLI). Each open store is an instance holding an advisory lock on instances/<id>.lock for its
// lifetime, and every intent records its instance; Recover completes only the intents of
// instances whose lock is free (the process is gone), never those of a live gateway.
type SQLite struct {
	w, r     *sql.DB
	path     string
	now      Clock
	closed   atomic.Bool
	instance string        // this store's instance id
	lock     *instanceLock // held while open: the instance is alive

	queue     chan *writeReq       // unbuffered: a request is handed over only when the writer takes it
	sync      string               // the write connection's synchronous setting (writer goroutine only)
	stmts     map[string]*sql.Stmt // prepared on the write connection (see prep)
	stop      chan struct{}        // closed by Close
	writerEnd chan struct{}        // closed when the writer goroutine has returned
}

// writeReq is one write waiting for the writer goroutine.
type writeReq struct {
	ctx  context.Context
	fn   func(ctx context.Context, tx *sql.Tx) error
	lazy bool       // may commit without an fsync (see SQLite's durability)
	done chan error // buffered (1): the writer never blocks on an answer
}

// lazyFlushInterval bounds how long a lazy commit may wait for an fsync when no durable write
// follows it.
const lazyFlushInterval = 500 * time.Millisecond

// maxWriteBatch bounds how many requests share one transaction.
const maxWriteBatch = 256

var _ Store = (*SQLite)(nil)

const sqliteSchema = `
CREATE TABLE IF NOT EXISTS flush_mark (
	id INTEGER PRIMARY KEY CHECK (id = 1),
	at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
	id            TEXT PRIMARY KEY,
	actor         TEXT NOT NULL,
	gateway       TEXT NOT NULL,
	started       INTEGER NOT NULL,
	last_activity INTEGER NOT NULL,
	status        TEXT NOT NULL,
	next_seq      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_started ON runs (started DESC, id);
CREATE TABLE IF NOT EXISTS records (
	run               TEXT NOT NULL REFERENCES runs (id),
	seq               INTEGER NOT NULL,
	kind              TEXT NOT NULL,
	time              INTEGER NOT NULL,
	step              INTEGER NOT NULL,
	tool              TEXT NOT NULL DEFAULT '',
	args_digest       TEXT NOT NULL DEFAULT '',
	reason            TEXT NOT NULL DEFAULT '',
	idempotency_key   TEXT NOT NULL DEFAULT '',
	manifest_version  TEXT NOT NULL DEFAULT '',
	manifest_checksum TEXT NOT NULL DEFAULT '',
	mode              TEXT NOT NULL DEFAULT '',
	decision          TEXT NOT NULL DEFAULT '',
	status            TEXT NOT NULL DEFAULT '',
	compensation_tool TEXT NOT NULL DEFAULT '',
	handle            TEXT NOT NULL DEFAULT '',
	note              TEXT NOT NULL DEFAULT '',
	approval          TEXT NOT NULL DEFAULT '',
	event             TEXT NOT NULL DEFAULT '',
	approver          TEXT NOT NULL DEFAULT '',
	groups            TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (run, seq)
) WITHOUT ROWID;
-- a step is completed at most once, whatever the code above does
CREATE UNIQUE INDEX IF NOT EXISTS records_one_outcome ON records (run, step) WHERE kind = 'outcome';
-- intents without an outcome: inserted with the intent, deleted with the outcome
-- instance: the store instance (process) that wrote the intent; '' before instances existed
CREATE TABLE IF NOT EXISTS pending (
	run      TEXT NOT NULL,
	step     INTEGER NOT NULL,
	tool     TEXT NOT NULL,
	instance TEXT NOT NULL DEFAULT '',
	PRIMARY KEY (run, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dup_keys (
	key     TEXT PRIMARY KEY,
	run     TEXT NOT NULL,
	step    INTEGER NOT NULL,
	claimed INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS approvals (
	id          TEXT PRIMARY KEY,
	run         TEXT NOT NULL,
	tool        TEXT NOT NULL,
	args_digest TEXT NOT NULL,
	actor       TEXT NOT NULL,
	roles       TEXT NOT NULL,
	quorum      INTEGER NOT NULL,
	created     INTEGER NOT NULL,
	expires     INTEGER NOT NULL,
	on_timeout  TEXT NOT NULL,
	escalate_to TEXT NOT NULL,
	reason      TEXT NOT NULL,
	state       TEXT NOT NULL,
	decisions   TEXT NOT NULL,
	escalated   INTEGER NOT NULL,
	decided     INTEGER NOT NULL,
	consumed    INTEGER NOT NULL,
	actor_uid   TEXT NOT NULL DEFAULT '',
	actor_email TEXT NOT NULL DEFAULT '',
	uid         TEXT NOT NULL DEFAULT '',
	spec_digest TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS approvals_run ON approvals (run, created);
CREATE INDEX IF NOT EXISTS approvals_created ON approvals (created, id);
-- the newest snapshot of each manifest source this gateway served (AdvanceHighWater)
CREATE TABLE IF NOT EXISTS high_water (
	source   TEXT PRIMARY KEY,
	sequence INTEGER NOT NULL CHECK (sequence >= 0),
	revision TEXT NOT NULL,
	digest   TEXT NOT NULL,
	updated  INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO runs (id, actor, gateway, started, last_activity, status) VALUES ('', '', '', 0, 0, 'active');
`

// sqliteMigrations add the columns of later versions to the tables of an older file (CREATE
// TABLE IF NOT EXISTS leaves an existing table as it is); "duplicate column" means done.
var sqliteMigrations = []string{
	// instances
	`ALTER TABLE pending ADD COLUMN instance TEXT NOT NULL DEFAULT ''`,
	// 3: decision records and requests kept in Kubernetes (issue 16)
	`ALTER TABLE records ADD COLUMN approval TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE records ADD COLUMN event TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE records ADD COLUMN approver TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE records ADD COLUMN groups TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE approvals ADD COLUMN actor_uid TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE approvals ADD COLUMN actor_email TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE approvals ADD COLUMN uid TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE approvals ADD COLUMN spec_digest TEXT NOT NULL DEFAULT ''`,
}

// sqliteSchemaLast runs after the migrations: what needs the migrated columns.
const sqliteSchemaLast = `
-- a decision record with a Once key is in its run at most once (ApprovalRecord.Once)
CREATE UNIQUE INDEX IF NOT EXISTS records_approval_once ON records (run, approval, idempotency_key)
	WHERE kind = 'approval' AND idempotency_key != '';
-- 2: high_water (created by CREATE TABLE IF NOT EXISTS in files of version 1)
-- 3: decision records (records.approval, event, approver, groups), approvals.actor_uid,
--    actor_email, uid, spec_digest
PRAGMA user_version = 3;
`

// OpenSQLite opens (creating if needed) the store in dir/SQLiteFile. dir is created with mode
// 0700 if missing. A nil clock means time.Now. Call Recover after opening to complete the steps
// a previous process left without an outcome.
func OpenSQLite(dir string, clock Clock) (*SQLite, error) {
	if clock == nil {
		clock = time.Now
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: data folder: %w", err)
	}
	path := filepath.Join(dir, SQLiteFile)
	base := "file:" + (&url.URL{Path: path}).EscapedPath() + "?_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)"
	w, err := sql.Open("sqlite", base+"&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	var mode string
	if err := w.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || !strings.EqualFold(mode, "wal") {
		w.Close()
		return nil, fmt.Errorf("store: %s: cannot use WAL (journal_mode %q): %v", path, mode, err)
	}
	if _, err := w.Exec(sqliteSchema); err != nil {
		w.Close()
		return nil, fmt.Errorf("store: %s: schema: %w", path, err)
	}
	// A file of an older version: add the columns (its intents recover as before; its
	// records and requests read back with the new fields empty).
	for _, m := range sqliteMigrations {
		if _, err := w.Exec(m); err != nil && !strings.Contains(err.Error(), "duplicate column") {
			w.Close()
			return nil, fmt.Errorf("store: %s: schema: %w", path, err)
		}
	}
	if _, err := w.Exec(sqliteSchemaLast); err != nil {
		w.Close()
		return nil, fmt.Errorf("store: %s: schema: %w", path, err)
	}
	instance := newID("gw-")
	lock, err := lockInstance(filepath.Join(dir, instancesDir), instance)
	if err != nil {
		w.Close()
		return nil, err
	}
	r, err := sql.Open("sqlite", base+"&_pragma=query_only(1)")
	if err != nil {
		w.Close()
		releaseInstance(lock)
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	r.SetMaxOpenConns(4)
	r.SetMaxIdleConns(4)
	stmts, err := prepareHot(w)
	if err != nil {
		r.Close()
		w.Close()
		releaseInstance(lock)
		return nil, fmt.Errorf("store: %s: prepare: %w", path, err)
	}
	s := &SQLite{w: w, r: r, path: path, now: clock, instance: instance, lock: lock, sync: "FULL", stmts: stmts,
		queue: make(chan *writeReq), stop: make(chan struct{}), writerEnd: make(chan struct{})}
	go s.writer()
	return s, nil
}

// Path returns the database file's path.
func (s *SQLite) Path() string { return s.path }

// Close implements Store. It checkpoints nothing by hand: SQLite folds the WAL into the
// database on the last connection's close.
func (s *SQLite) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.stop)
	<-s.writerEnd // the batch in hand is committed (or rolled back) and answered, lazy commits flushed
	var errs []error
	for _, st := range s.stmts {
		errs = append(errs, st.Close())
	}
	err := errors.Join(append(errs, s.r.Close(), s.w.Close())...)
	releaseInstance(s.lock)
	return err
}

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

// deadInstances returns the instances among ids whose lock is free (their process is gone),
// locked by this store until done is called; "" (intents from before instances) is always dead.
func (s *SQLite) deadInstances(ids []string) (dead map[string]bool, done func()) {
	dead = map[string]bool{}
	var held []*instanceLock
	dir := filepath.Join(filepath.Dir(s.path), instancesDir)
	for _, id := range ids {
		switch {
		case id == s.instance:
		case id == "":
			dead[id] = true
		default:
			path := filepath.Join(dir, id+".lock")
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
	}
}

func (s *SQLite) check() error {
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

// write hands fn to the writer goroutine and waits for the answer. fn runs in its own
// SAVEPOINT inside the writer's current transaction; write returns nil only after that
// transaction is committed. fn gets a context without ctx's cancellation (so a caller giving up
// cannot interrupt a statement on the shared connection); a request whose ctx is done before
// the writer reaches it is not run and returns ctx's error. Once the writer has taken a request,
// write waits for the commit whatever ctx does, so its answer always matches what is on disk.
func (s *SQLite) write(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return s.submit(ctx, fn, false)
}

// writeLazy is write for records of what already happened: the commit is in the WAL when it
// returns (it survives a crash of the process) and is fsynced with the next durable commit or
// within lazyFlushInterval.
func (s *SQLite) writeLazy(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return s.submit(ctx, fn, true)
}

func (s *SQLite) submit(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error, lazy bool) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	req := &writeReq{ctx: ctx, fn: fn, lazy: lazy, done: make(chan error, 1)}
	select {
	case s.queue <- req:
	case <-s.stop:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	return <-req.done
}

// writer owns the write connection: it runs waiting requests in batches until Close. After a
// lazy commit it flushes (one durable commit) if no durable write comes within lazyFlushInterval.
func (s *SQLite) writer() {
	defer close(s.writerEnd)
	batch := make([]*writeReq, 0, maxWriteBatch)
	flush := time.NewTimer(lazyFlushInterval)
	flush.Stop()
	unsynced := false
	defer func() {
		if unsynced {
			s.flushLazy()
		}
	}()
	for {
		select {
		case <-s.stop:
			return
		case <-flush.C:
			if unsynced && s.flushLazy() == nil {
				unsynced = false
			}
			continue
		case req := <-s.queue:
			batch = append(batch[:0], req)
		}
	gather:
		for len(batch) < maxWriteBatch {
			select {
			case req := <-s.queue:
				batch = append(batch, req)
			default:
				break gather
			}
		}
		lazy := true
		for _, req := range batch {
			lazy = lazy && req.lazy
		}
		if s.commitBatch(batch, lazy) {
			if lazy && !unsynced {
				unsynced = true
				flush.Reset(lazyFlushInterval)
			} else if !lazy {
				unsynced = false
			}
		}
		clear(batch)
	}
}

// The hot path's statements, prepared once when the store opens instead of at every call
// (parsing SQL was a fifth of the writer's CPU).
const (
	sqlSavepoint     = `SAVEPOINT req`
	sqlRelease       = `RELEASE req`
	sqlNextSeq       = `UPDATE runs SET next_seq = next_seq + 1, last_activity = CASE WHEN id = '' THEN last_activity ELSE ? END WHERE id = ? RETURNING next_seq`
	sqlInsertRecord  = `INSERT INTO records (run, seq, kind, time, step, tool, args_digest, reason, idempotency_key, manifest_version, manifest_checksum, mode, decision, status, compensation_tool, handle, note, approval, event, approver, groups) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	sqlInsertPending = `INSERT INTO pending (run, step, tool, instance) VALUES (?, ?, ?, ?)`
	sqlDeletePending = `DELETE FROM pending WHERE run = ? AND step = ? RETURNING tool`
)

// prepareHot prepares the hot statements on the write connection (before the writer holds it).
func prepareHot(w *sql.DB) (map[string]*sql.Stmt, error) {
	stmts := map[string]*sql.Stmt{}
	for _, q := range []string{sqlSavepoint, sqlRelease, sqlNextSeq, sqlInsertRecord, sqlInsertPending, sqlDeletePending} {
		st, err := w.Prepare(q)
		if err != nil {
			for _, st := range stmts {
				st.Close()
			}
			return nil, err
		}
		stmts[q] = st
	}
	return stmts, nil
}

// prep returns the hot statement query for tx (database/sql reuses the one prepared on the
// write connection).
func (s *SQLite) prep(ctx context.Context, tx *sql.Tx, query string) (*sql.Stmt, error) {
	st, ok := s.stmts[query]
	if !ok {
		return nil, fmt.Errorf("store: statement not prepared: %s", query)
	}
	return tx.StmtContext(ctx, st), nil
}

// execPrep runs a prepared statement in tx.
func (s *SQLite) execPrep(ctx context.Context, tx *sql.Tx, query string, args ...any) (sql.Result, error) {
	st, err := s.prep(ctx, tx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// queryRowPrep runs a prepared one-row query in tx; the error comes from Scan.
func (s *SQLite) queryRowPrep(ctx context.Context, tx *sql.Tx, query string, args ...any) *sql.Row {
	st, err := s.prep(ctx, tx, query)
	if err != nil {
		return tx.QueryRowContext(ctx, query, args...) // unprepared: the same result, slower
	}
	return st.QueryRowContext(ctx, args...)
}

// setSync sets the write connection's synchronous mode (FULL or NORMAL) if it differs.
func (s *SQLite) setSync(mode string) error {
	if s.sync == mode {
		return nil
	}
	// Not a prepared statement: SQLite applies PRAGMA synchronous when it compiles it.
	if _, err := s.w.ExecContext(context.Background(), "PRAGMA synchronous = "+mode); err != nil {
		s.sync = "" // unknown: set it again next time
		return fmt.Errorf("store: synchronous=%s: %w", mode, err)
	}
	s.sync = mode
	return nil
}

// flushLazy makes every lazy commit durable: a durable commit fsyncs the WAL, which holds them.
func (s *SQLite) flushLazy() error {
	if err := s.setSync("FULL"); err != nil {
		return err
	}
	_, err := s.w.ExecContext(context.Background(), `INSERT INTO flush_mark (id, at) VALUES (1, ?)
		ON CONFLICT (id) DO UPDATE SET at = excluded.at`, time.Now().UnixNano())
	return err
}

// commitBatch runs batch in one IMMEDIATE transaction, each request in a SAVEPOINT, commits
// (with an fsync unless lazy) and answers every request. If the transaction itself fails
// (begin, savepoint bookkeeping or commit), nothing in it is committed and every request that
// had succeeded gets that error. It reports whether it committed.
func (s *SQLite) commitBatch(batch []*writeReq, lazy bool) (committed bool) {
	bg := context.Background()
	errs := make([]error, len(batch))
	answer := func() {
		for i, req := range batch {
			req.done <- errs[i]
		}
	}
	fail := func(err error) {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		answer()
	}
	mode := "FULL"
	if lazy {
		mode = "NORMAL"
	}
	if err := s.setSync(mode); err != nil {
		fail(err)
		return
	}
	tx, err := s.w.BeginTx(bg, nil)
	if err != nil {
		fail(fmt.Errorf("store: begin: %w", err))
		return
	}
	if len(batch) == 1 {
		// alone in its transaction: no savepoint needed, a failure rolls back the transaction
		req := batch[0]
		if errs[0] = req.ctx.Err(); errs[0] == nil {
			errs[0] = req.fn(context.WithoutCancel(req.ctx), tx)
		}
		if errs[0] != nil {
			tx.Rollback()
			answer()
			return
		}
		if err := tx.Commit(); err != nil {
			errs[0] = fmt.Errorf("store: commit: %w", err)
		} else {
			committed = true
		}
		answer()
		return
	}
	for i, req := range batch {
		if err := req.ctx.Err(); err != nil {
			errs[i] = err // not run: nothing of it is written
			continue
		}
		if _, err := s.execPrep(bg, tx, sqlSavepoint); err != nil {
			tx.Rollback()
			fail(fmt.Errorf("store: savepoint: %w", err))
			return
		}
		if errs[i] = req.fn(context.WithoutCancel(req.ctx), tx); errs[i] != nil {
			if _, err := tx.ExecContext(bg, `ROLLBACK TO req`); err != nil {
				// SQLite may have rolled the whole transaction back (e.g. disk full):
				// nothing of the batch stands.
				tx.Rollback()
				fail(fmt.Errorf("store: rollback to savepoint: %w", err))
				return
			}
		}
		if _, err := s.execPrep(bg, tx, sqlRelease); err != nil {
			tx.Rollback()
			fail(fmt.Errorf("store: release savepoint: %w", err))
			return
		}
	}
	if err := tx.Commit(); err != nil {
		fail(fmt.Errorf("store: commit: %w", err))
		return
	}
	answer()
	return true
}

func tn(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func nt(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func (s *SQLite) stamp() time.Time {
	// nanosecond UTC, as read back from the database
	return nt(s.now().UnixNano())
}

const runCols = `id, actor, gateway, started, last_activity, status`

func scanRun(sc interface{ Scan(...any) error }) (Run, error) {
	var r Run
	var started, last int64
	var status string
	if err := sc.Scan(&r.ID, &r.Actor, &r.Gateway, &started, &last, &status); err != nil {
		return Run{}, err
	}
	r.Started, r.LastActivity, r.Status = nt(started), nt(last), RunStatus(status)
	return r, nil
}

// CreateRun implements Store.
func (s *SQLite) CreateRun(ctx context.Context, r Run) (Run, error) {
	if r.Actor == "" {
		return Run{}, fmt.Errorf("%w: a run needs an actor", ErrInvalid)
	}
	if r.ID == "" {
		r.ID = newID("run-")
	}
	now := s.stamp()
	r.Started, r.LastActivity, r.Status = now, now, RunActive
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO runs (`+runCols+`) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
			r.ID, r.Actor, r.Gateway, tn(now), tn(now), string(r.Status))
		if err != nil {
			return fmt.Errorf("store: create run: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("%w: run %s", ErrExists, r.ID)
		}
		return nil
	})
	if err != nil {
		return Run{}, err
	}
	return r, nil
}

// GetRun implements Store.
func (s *SQLite) GetRun(ctx context.Context, id string) (Run, error) {
	if err := s.check(); err != nil {
		return Run{}, err
	}
	if id == GatewayJournal {
		return Run{}, fmt.Errorf("%w: run %q", ErrNotFound, id)
	}
	r, err := scanRun(s.r.QueryRowContext(ctx, `SELECT `+runCols+` FROM runs WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Run{}, fmt.Errorf("%w: run %q", ErrNotFound, id)
	}
	if err != nil {
		return Run{}, fmt.Errorf("store: get run: %w", err)
	}
	return r, nil
}

// ListRuns implements Store.
func (s *SQLite) ListRuns(ctx context.Context, f RunFilter) ([]Run, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	q := `SELECT ` + runCols + ` FROM runs WHERE id != '' AND (? = '' OR actor = ?) AND (? = '' OR gateway = ?) AND (? = '' OR status = ?) ORDER BY started DESC, id`
	args := []any{f.Actor, f.Actor, f.Gateway, f.Gateway, string(f.Status), string(f.Status)}
	if f.Limit > 0 {
		q += ` LIMIT ?`
		args = append(args, f.Limit)
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list runs: %w", err)
	}
	defer rows.Close()
	var out []Run
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list runs: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// ContinueRun implements Store.
func (s *SQLite) ContinueRun(ctx context.Context, id, actor string) (Run, error) {
	var r Run
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		r, err = scanRun(tx.QueryRowContext(ctx, `SELECT `+runCols+` FROM runs WHERE id = ? AND id != ''`, id))
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: run %q", ErrNotFound, id)
		}
		if err != nil {
			return fmt.Errorf("store: continue run: %w", err)
		}
		if r.Actor != actor {
			return fmt.Errorf("%w: run %q; continue a run you opened, or start a new one (no run id)", ErrNotOwner, id)
		}
		r.LastActivity, r.Status = s.stamp(), RunActive
		_, err = tx.ExecContext(ctx, `UPDATE runs SET last_activity = ?, status = ? WHERE id = ?`, tn(r.LastActivity), string(r.Status), id)
		return err
	})
	return r, err
}

// SetRunStatus implements Store.
func (s *SQLite) SetRunStatus(ctx context.Context, id string, status RunStatus) error {
	if !validRunStatus(status) {
		return fmt.Errorf("%w: run status %q", ErrInvalid, status)
	}
	return s.writeLazy(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE runs SET status = ? WHERE id = ? AND id != ''`, string(status), id)
		if err != nil {
			return fmt.Errorf("store: set run status: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("%w: run %q", ErrNotFound, id)
		}
		return nil
	})
}

// appendTx numbers rec in its run (touching the run's last activity) and inserts it.
func (s *SQLite) appendTx(ctx context.Context, tx *sql.Tx, rec *Record, handle string) error {
	rec.Time = s.stamp()
	err := s.queryRowPrep(ctx, tx, sqlNextSeq, tn(rec.Time), rec.Run).Scan(&rec.Seq)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: run %q", ErrNotFound, rec.Run)
	}
	if err != nil {
		return fmt.Errorf("store: append: %w", err)
	}
	if rec.Kind == KindIntent {
		rec.Step = rec.Seq
	}
	_, err = s.execPrep(ctx, tx, sqlInsertRecord,
		rec.Run, rec.Seq, string(rec.Kind), tn(rec.Time), rec.Step, rec.Tool, rec.ArgsDigest, rec.Reason,
		rec.IdempotencyKey, rec.ManifestVersion, rec.ManifestChecksum, rec.Mode, rec.Decision,
		string(rec.Status), rec.CompensationTool, handle, rec.Note, rec.Approval, string(rec.Event), rec.Approver, encodeGroups(rec.Groups))
	if err != nil {
		return fmt.Errorf("store: append: %w", err)
	}
	return nil
}

// RecordIntent implements Store. With in.Approval, the approval is consumed in the intent's
// transaction (consumeTx).
func (s *SQLite) RecordIntent(ctx context.Context, in Intent) (int64, error) {
	if err := validIntent(in); err != nil {
		return 0, err
	}
	var step int64
	rec := intentRecord(in)
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		rec := rec
		var a *Approval
		if in.Approval != "" {
			var err error
			if a, err = s.consumeTx(ctx, tx, in.Approval, in.Run, in.Tool, in.ArgsDigest, false); err != nil {
				return err
			}
		}
		if err := s.appendTx(ctx, tx, &rec, ""); err != nil {
			return err
		}
		if _, err := s.execPrep(ctx, tx, sqlInsertPending, rec.Run, rec.Step, rec.Tool, s.instance); err != nil {
			return err
		}
		if in.HoldsKey && in.IdempotencyKey != "" {
			if _, err := tx.ExecContext(ctx, `UPDATE dup_keys SET step = ? WHERE key = ? AND run = ? AND step = 0`, rec.Step, in.IdempotencyKey, in.Run); err != nil {
				return err
			}
		}
		step = rec.Step
		if a != nil {
			c, _, _ := approvalRecord(consumedRecord(a, rec.Step))
			return s.appendTx(ctx, tx, &c, "")
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return step, nil
}

// consumeTx marks approval id consumed by an intent (or a rollback record: rollback) of run,
// tool and argsDigest, in tx: the checks are Approval.consume's, and the mark is a
// conditional UPDATE (consumed = 0) whose rows affected decide (consumeRow).
func (s *SQLite) consumeTx(ctx context.Context, tx *sql.Tx, id, run, tool, argsDigest string, rollback bool) (*Approval, error) {
	return consumeRow(id, run, tool, argsDigest, s.stamp(), rollback,
		func() (Approval, error) { return s.readApprovalTx(ctx, tx, id) },
		func(at int64) (int64, error) {
			res, err := tx.ExecContext(ctx, `UPDATE approvals SET consumed = ? WHERE id = ? AND consumed = 0`, at, id)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		})
}

// readApprovalTx reads request id in tx. Errors: ErrNotFound.
func (s *SQLite) readApprovalTx(ctx context.Context, tx *sql.Tx, id string) (Approval, error) {
	a, err := scanApproval(tx.QueryRowContext(ctx, `SELECT `+approvalCols+` FROM approvals WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Approval{}, fmt.Errorf("%w: approval %s", ErrNotFound, id)
	}
	if err != nil {
		return Approval{}, fmt.Errorf("store: approval %s: %w", id, err)
	}
	return a, nil
}

// AppendApproval implements Store.
func (s *SQLite) AppendApproval(ctx context.Context, ar ApprovalRecord) (int64, error) {
	rec, _, err := approvalRecord(ar)
	if err != nil {
		return 0, err
	}
	err = s.writeLazy(ctx, func(ctx context.Context, tx *sql.Tx) error { return s.appendApprovalTx(ctx, tx, &rec) })
	return rec.Seq, err
}

// appendApprovalTx appends a decision record unless its Once key is already in the run (the
// writer is the only one: the check and the insert cannot interleave with another's).
func (s *SQLite) appendApprovalTx(ctx context.Context, tx *sql.Tx, rec *Record) error {
	if rec.IdempotencyKey != "" {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM records WHERE run = ? AND approval = ? AND idempotency_key = ? AND kind = 'approval'`,
			rec.Run, rec.Approval, rec.IdempotencyKey).Scan(&n); err != nil {
			return fmt.Errorf("store: decision record: %w", err)
		}
		if n > 0 {
			return onceExists(rec)
		}
	}
	return s.appendTx(ctx, tx, rec, "")
}

// outcomeTx completes step: it removes the pending row and appends the outcome record.
func (s *SQLite) outcomeTx(ctx context.Context, tx *sql.Tx, run string, step int64, o StepOutcome, handle string) (Record, error) {
	rec := Record{Run: run, Kind: KindOutcome, Step: step, Status: o.Status, CompensationTool: o.CompensationTool, Note: o.Note}
	err := s.queryRowPrep(ctx, tx, sqlDeletePending, run, step).Scan(&rec.Tool)
	if errors.Is(err, sql.ErrNoRows) {
		var kind string
		err := tx.QueryRowContext(ctx, `SELECT kind FROM records WHERE run = ? AND seq = ?`, run, step).Scan(&kind)
		if err == nil && kind == string(KindIntent) {
			return Record{}, fmt.Errorf("%w: step %d in run %s", ErrCompleted, step, run)
		}
		return Record{}, fmt.Errorf("%w: step %d in run %q", ErrNotFound, step, run)
	}
	if err != nil {
		return Record{}, fmt.Errorf("store: outcome: %w", err)
	}
	if err := s.appendTx(ctx, tx, &rec, handle); err != nil {
		return Record{}, err
	}
	rec.Handle, _ = decodeHandle(handle)
	return rec, nil
}

// RecordOutcome implements Store.
func (s *SQLite) RecordOutcome(ctx context.Context, run string, step int64, o StepOutcome) (int64, error) {
	enc, err := encodeHandle(o)
	if err != nil {
		return 0, err
	}
	var rec Record
	err = s.writeLazy(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		rec, err = s.outcomeTx(ctx, tx, run, step, o, enc)
		return err
	})
	return rec.Seq, err
}

// AppendEvent implements Store.
func (s *SQLite) AppendEvent(ctx context.Context, e Event) (int64, error) {
	if err := checkEvent(e); err != nil {
		return 0, err
	}
	rec := e.record()
	err := s.writeLazy(ctx, func(ctx context.Context, tx *sql.Tx) error { return s.appendTx(ctx, tx, &rec, "") })
	return rec.Seq, err
}

const recordCols = `run, seq, kind, time, step, tool, args_digest, reason, idempotency_key, manifest_version,
	manifest_checksum, mode, decision, status, compensation_tool, handle, note, approval, event, approver, groups`

func scanRecords(rows *sql.Rows) ([]Record, error) {
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var r Record
		var kind, status, handle, event, groups string
		var t int64
		if err := rows.Scan(&r.Run, &r.Seq, &kind, &t, &r.Step, &r.Tool, &r.ArgsDigest, &r.Reason, &r.IdempotencyKey,
			&r.ManifestVersion, &r.ManifestChecksum, &r.Mode, &r.Decision, &status, &r.CompensationTool, &handle, &r.Note,
			&r.Approval, &event, &r.Approver, &groups); err != nil {
			return nil, fmt.Errorf("store: read records: %w", err)
		}
		r.Kind, r.Status, r.Time, r.Event = Kind(kind), Status(status), nt(t), ApprovalEvent(event)
		h, err := decodeHandle(handle)
		if err != nil {
			return nil, err
		}
		r.Handle = h
		if r.Groups, err = decodeGroups(groups); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: read records: %w", err)
	}
	return out, nil
}

// Records implements Store.
func (s *SQLite) Records(ctx context.Context, run string, after int64, limit int) ([]Record, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	rows, err := s.r.QueryContext(ctx, `SELECT `+recordCols+` FROM records WHERE run = ? AND seq > ? ORDER BY seq LIMIT ?`, run, after, limit)
	if err != nil {
		return nil, fmt.Errorf("store: read records: %w", err)
	}
	return scanRecords(rows)
}

// PendingSteps implements Store.
func (s *SQLite) PendingSteps(ctx context.Context, run string) ([]Record, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rows, err := s.r.QueryContext(ctx, `SELECT `+recordCols+` FROM records WHERE run = ? AND seq IN
		(SELECT step FROM pending WHERE run = ?) ORDER BY seq`, run, run)
	if err != nil {
		return nil, fmt.Errorf("store: pending steps: %w", err)
	}
	return scanRecords(rows)
}

// Recover implements Store.
func (s *SQLite) Recover(ctx context.Context) ([]Record, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	var ids []string
	rows, err := s.r.QueryContext(ctx, `SELECT DISTINCT instance FROM pending`)
	if err != nil {
		return nil, fmt.Errorf("store: recover: %w", err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("store: recover: %w", err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: recover: %w", err)
	}
	ids = append(ids, s.staleInstances()...)
	dead, done := s.deadInstances(ids)
	defer done() // after the write: a dead instance stays locked until its intents are completed
	var out []Record
	err = s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		out = nil
		rows, err := tx.QueryContext(ctx, `SELECT run, step, instance FROM pending ORDER BY run, step`)
		if err != nil {
			return fmt.Errorf("store: recover: %w", err)
		}
		type key struct {
			run  string
			step int64
		}
		var todo []key
		for rows.Next() {
			var k key
			var instance string
			if err := rows.Scan(&k.run, &k.step, &instance); err != nil {
				rows.Close()
				return fmt.Errorf("store: recover: %w", err)
			}
			if dead[instance] {
				todo = append(todo, k)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("store: recover: %w", err)
		}
		for _, k := range todo {
			rec, err := s.outcomeTx(ctx, tx, k.run, k.step, StepOutcome{Status: Uncertain, Note: RecoveryNote}, "")
			if err != nil {
				return err
			}
			out = append(out, rec)
		}
		return nil
	})
	return out, err
}

// staleInstances lists the instance lock files in the data folder (other than this store's),
// so that Recover also removes those of processes that died with nothing pending.
func (s *SQLite) staleInstances() []string {
	entries, _ := os.ReadDir(filepath.Join(filepath.Dir(s.path), instancesDir))
	var ids []string
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), ".lock"); ok && id != s.instance {
			ids = append(ids, id)
		}
	}
	return ids
}

// ClaimKey implements Store. The claim is one INSERT against the key's PRIMARY KEY.
func (s *SQLite) ClaimKey(ctx context.Context, key, run string, step int64) (bool, KeyHolder, error) {
	if key == "" {
		return false, KeyHolder{}, fmt.Errorf("%w: empty duplicate-call key", ErrInvalid)
	}
	var ok bool
	var h KeyHolder
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		now := s.stamp()
		res, err := tx.ExecContext(ctx, `INSERT INTO dup_keys (key, run, step, claimed) VALUES (?, ?, ?, ?) ON CONFLICT (key) DO NOTHING`,
			key, run, step, tn(now))
		if err != nil {
			return fmt.Errorf("store: claim key: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			ok, h = true, KeyHolder{Key: key, Run: run, Step: step, Claimed: now}
			return nil
		}
		var claimed int64
		h.Key = key
		if err := tx.QueryRowContext(ctx, `SELECT run, step, claimed FROM dup_keys WHERE key = ?`, key).Scan(&h.Run, &h.Step, &claimed); err != nil {
			return fmt.Errorf("store: claim key: %w", err)
		}
		h.Claimed = nt(claimed)
		return nil
	})
	if err != nil {
		return false, KeyHolder{}, err
	}
	return ok, h, nil
}

// ReleaseKey implements Store.
func (s *SQLite) ReleaseKey(ctx context.Context, key string) error {
	return s.writeLazy(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM dup_keys WHERE key = ?`, key); err != nil {
			return fmt.Errorf("store: release key: %w", err)
		}
		return nil
	})
}

// CreateApproval implements Store.
func (s *SQLite) CreateApproval(ctx context.Context, req ApprovalRequest) (Approval, error) {
	a, err := prepareApproval(req, s.stamp())
	if err != nil {
		return Approval{}, err
	}
	err = s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO approvals (`+approvalCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT DO NOTHING`, approvalArgs(&a)...)
		if err != nil {
			return fmt.Errorf("store: create approval: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("%w: approval %s", ErrExists, a.ID)
		}
		return nil
	})
	if err != nil {
		return Approval{}, err
	}
	return a, nil
}

// GetApproval implements Store.
func (s *SQLite) GetApproval(ctx context.Context, id string) (Approval, error) {
	if err := s.check(); err != nil {
		return Approval{}, err
	}
	a, err := scanApproval(s.r.QueryRowContext(ctx, `SELECT `+approvalCols+` FROM approvals WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Approval{}, fmt.Errorf("%w: approval %s", ErrNotFound, id)
	}
	if err != nil {
		return Approval{}, fmt.Errorf("store: get approval: %w", err)
	}
	a.settle(s.now())
	return a, nil
}

// ListApprovals implements Store. The state filter applies after expiry, so it is evaluated
// in Go over the run's (or all) requests.
func (s *SQLite) ListApprovals(ctx context.Context, f ApprovalFilter) ([]Approval, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rows, err := s.r.QueryContext(ctx, `SELECT `+approvalCols+` FROM approvals WHERE (? = '' OR run = ?) ORDER BY created, id`, f.Run, f.Run)
	if err != nil {
		return nil, fmt.Errorf("store: list approvals: %w", err)
	}
	defer rows.Close()
	now := s.now()
	var out []Approval
	for rows.Next() {
		a, err := scanApproval(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list approvals: %w", err)
		}
		a.settle(now)
		if !f.match(&a) {
			continue
		}
		out = append(out, a)
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
	}
	return out, rows.Err()
}

// Decide implements Store: the request is read, decided and written back, and the decision
// records appended, in one transaction (decideRow).
func (s *SQLite) Decide(ctx context.Context, id string, d Decision) (Approval, error) {
	var out Approval
	var ruleErr error
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		out, ruleErr, err = decideRow(id, d, s.stamp(),
			func() (Approval, error) { return s.readApprovalTx(ctx, tx, id) },
			func(a *Approval) error {
				args := approvalArgs(a)
				_, err := tx.ExecContext(ctx, `UPDATE approvals SET roles = ?, expires = ?, state = ?, decisions = ?,
					escalated = ?, decided = ? WHERE id = ?`, args[5], args[8], args[12], args[13], args[14], args[15], id)
				return err
			},
			func(rec *Record) error { return s.appendApprovalTx(ctx, tx, rec) })
		return err
	})
	if err != nil {
		return Approval{}, err
	}
	return out, ruleErr
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
