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
	"time"

	"github.com/gofrs/flock"
	"modernc.org/sqlite" // registers the "sqlite" driver (pure Go, no cgo)
	sqlite3 "modernc.org/sqlite/lib"
)

// SQLiteFile is the name of the database file OpenSQLite uses inside the data folder. SQLite
// keeps SQLiteFile+"-wal" and SQLiteFile+"-shm" beside it while the store is open.
const SQLiteFile = "reversi-gateway.db"

// SQLite is a Store in one SQLite file (modernc.org/sqlite, no cgo).
//
// Durability: the database is in WAL mode. Writes that must be on disk before the gateway goes
// on (intents, rollback entries, runs, keys claimed, approvals, high-water marks) commit with
// synchronous=FULL: the WAL is fsynced before the call returns, so they survive a crash of the
// process and a power loss alike. Writes that only record what already happened (outcomes,
// events, run status, keys released) commit with synchronous=NORMAL: they are in the WAL when
// the call returns, so they survive a crash of the process, and they reach the disk with the
// next fsync: the next FULL commit (an fsync of the WAL covers every frame before it) or, when
// none comes, a flush by the writer within lazyFlushInterval. A power loss inside that window
// can lose an outcome; Recover then completes its step as uncertain, which is the safe
// reading. Writes go through a single connection, so they are serialised in the process and
// never meet SQLITE_BUSY from each other; reads use a separate pool of read-only connections
// and do not wait for writers (WAL readers see the last committed state).
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
	sqlStore
	path string
}

var _ Store = (*SQLite)(nil)

// sqliteDialect is SQLite's: one writer at a time holds the whole file, so nothing is locked
// row by row; text compares byte-wise by default.
var sqliteDialect = &dialect{
	types: strings.NewReplacer("{text}", "TEXT", "{int}", "INTEGER", "{key}", "TEXT", "{bool}", "INTEGER",
		"{norowid}", " WITHOUT ROWID"),
	rowOrder:  "rowid",
	key:       func(k string) any { return k },
	textMatch: func(c, p string) string { return "instr(lower(" + c + "), " + p + ") > 0" },
	columns:   `SELECT name FROM pragma_table_info($1)`,
	unique:    sqliteUnique,
	extraDDL: []string{
		// the lazy flush's durable write (flushLazy)
		`CREATE TABLE IF NOT EXISTS flush_mark (id INTEGER PRIMARY KEY CHECK (id = 1), at INTEGER NOT NULL)`,
		// 2: high_water; 3: decision records (records.approval, event, approver, groups),
		// approvals.actor_uid, actor_email, uid, spec_digest
		`PRAGMA user_version = 3`,
	},
}

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
	oneConnection(w)
	var mode string
	if err := w.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || !strings.EqualFold(mode, "wal") {
		w.Close()
		return nil, fmt.Errorf("store: %s: cannot use WAL (journal_mode %q): %v", path, mode, err)
	}
	if err := createSchema(w, sqliteDialect); err != nil {
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
	wr, err := startWriter(w, true)
	if err != nil {
		r.Close()
		w.Close()
		releaseInstance(lock)
		return nil, fmt.Errorf("store: %s: prepare: %w", path, err)
	}
	s := &SQLite{path: path, sqlStore: sqlStore{d: sqliteDialect, r: r, w: wr, now: clock, instance: instance,
		inst: &fileInstances{dir: filepath.Join(dir, instancesDir), id: instance, own: lock}}}
	s.release = func() error { return errors.Join(r.Close(), w.Close()) }
	return s, nil
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
	if err := d.migrate(ctx, tx); err != nil {
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

// writeReq is one write waiting for the writer goroutine.
type writeReq struct {
	ctx  context.Context
	fn   txFunc
	lazy bool       // may commit without an fsync (see SQLite's durability)
	done chan error // buffered (1): the writer never blocks on an answer
}

// lazyFlushInterval bounds how long a lazy commit may wait for an fsync when no durable write
// follows it.
const lazyFlushInterval = 500 * time.Millisecond

// maxWriteBatch bounds how many requests share one transaction.
const maxWriteBatch = 256

// sqliteWriter is SQLite's runner: one goroutine owns the write connection and commits the
// waiting writes in batches (see SQLite).
type sqliteWriter struct {
	db        *sql.DB
	fsync     bool                 // a file: durable batches commit with synchronous=FULL, lazy ones are flushed
	sync      string               // the connection's synchronous setting (writer goroutine only)
	stmts     map[string]*sql.Stmt // the hot statements, prepared on the write connection
	queue     chan *writeReq       // unbuffered: a request is handed over only when the writer takes it
	stop      chan struct{}        // closed by close
	writerEnd chan struct{}        // closed when the writer goroutine has returned
}

// hotStatements are prepared once on the write connection instead of at every call (parsing
// SQL was a fifth of the writer's CPU).
var hotStatements = []string{`SAVEPOINT req`, `RELEASE req`, sqlNextSeq, sqlInsertRecord,
	`INSERT INTO pending (run, step, tool, instance) VALUES ($1, $2, $3, $4)`,
	`DELETE FROM pending WHERE run = $1 AND step = $2 RETURNING tool`}

// startWriter prepares the hot statements on db's one connection and starts the writer.
// fsync: db is a file (not memory), whose durable commits are fsynced.
func startWriter(db *sql.DB, fsync bool) (*sqliteWriter, error) {
	w := &sqliteWriter{db: db, fsync: fsync, sync: "FULL", stmts: map[string]*sql.Stmt{},
		queue: make(chan *writeReq), stop: make(chan struct{}), writerEnd: make(chan struct{})}
	for _, q := range hotStatements {
		st, err := db.Prepare(q)
		if err != nil {
			w.closeStmts()
			return nil, err
		}
		w.stmts[q] = st
	}
	go w.writer()
	return w, nil
}

func (w *sqliteWriter) closeStmts() error {
	var errs []error
	for _, st := range w.stmts {
		errs = append(errs, st.Close())
	}
	return errors.Join(errs...)
}

// run implements runner. fn runs in its own SAVEPOINT inside the writer's current transaction;
// run returns nil only after that transaction is committed. A request whose ctx is done before
// the writer reaches it is not run and returns ctx's error. Once the writer has taken a
// request, run waits for the commit whatever ctx does, so its answer always matches what is on
// disk.
func (w *sqliteWriter) run(ctx context.Context, how durability, fn txFunc) error {
	req := &writeReq{ctx: ctx, fn: fn, lazy: how == lazy, done: make(chan error, 1)}
	select {
	case w.queue <- req:
	case <-w.stop:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	return <-req.done
}

// close stops the writer: the batch in hand is committed (or rolled back) and answered, lazy
// commits flushed.
func (w *sqliteWriter) close() error {
	close(w.stop)
	<-w.writerEnd
	return w.closeStmts()
}

// writer owns the write connection: it runs waiting requests in batches until close. After a
// lazy commit it flushes (one durable commit) if no durable write comes within lazyFlushInterval.
func (w *sqliteWriter) writer() {
	defer close(w.writerEnd)
	batch := make([]*writeReq, 0, maxWriteBatch)
	flush := time.NewTimer(lazyFlushInterval)
	flush.Stop()
	unsynced := false
	defer func() {
		if unsynced {
			w.flushLazy()
		}
	}()
	for {
		select {
		case <-w.stop:
			return
		case <-flush.C:
			if unsynced && w.flushLazy() == nil {
				unsynced = false
			}
			continue
		case req := <-w.queue:
			batch = append(batch[:0], req)
		}
	gather:
		for len(batch) < maxWriteBatch {
			select {
			case req := <-w.queue:
				batch = append(batch, req)
			default:
				break gather
			}
		}
		lazy := true
		for _, req := range batch {
			lazy = lazy && req.lazy
		}
		if w.commitBatch(batch, lazy) && w.fsync {
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

// setSync sets the write connection's synchronous mode (FULL or NORMAL) if it differs.
func (w *sqliteWriter) setSync(mode string) error {
	if !w.fsync || w.sync == mode {
		return nil
	}
	// Not a prepared statement: SQLite applies PRAGMA synchronous when it compiles it.
	if _, err := w.db.ExecContext(context.Background(), "PRAGMA synchronous = "+mode); err != nil {
		w.sync = "" // unknown: set it again next time
		return fmt.Errorf("store: synchronous=%s: %w", mode, err)
	}
	w.sync = mode
	return nil
}

// flushLazy makes every lazy commit durable: a durable commit fsyncs the WAL, which holds them.
func (w *sqliteWriter) flushLazy() error {
	if err := w.setSync("FULL"); err != nil {
		return err
	}
	_, err := w.db.ExecContext(context.Background(), `INSERT INTO flush_mark (id, at) VALUES (1, $1)
		ON CONFLICT (id) DO UPDATE SET at = excluded.at`, time.Now().UnixNano())
	return err
}

// writerTx is an execer over the writer's transaction that uses the prepared hot statements.
type writerTx struct {
	*sql.Tx
	stmts map[string]*sql.Stmt
}

func (t writerTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st, ok := t.stmts[query]; ok {
		return t.StmtContext(ctx, st).ExecContext(ctx, args...)
	}
	return t.Tx.ExecContext(ctx, query, args...)
}

func (t writerTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st, ok := t.stmts[query]; ok {
		return t.StmtContext(ctx, st).QueryContext(ctx, args...)
	}
	return t.Tx.QueryContext(ctx, query, args...)
}

func (t writerTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st, ok := t.stmts[query]; ok {
		return t.StmtContext(ctx, st).QueryRowContext(ctx, args...)
	}
	return t.Tx.QueryRowContext(ctx, query, args...)
}

// commitBatch runs batch in one IMMEDIATE transaction, each request in a SAVEPOINT, commits
// (with an fsync unless lazy) and answers every request. If the transaction itself fails
// (begin, savepoint bookkeeping or commit), nothing in it is committed and every request that
// had succeeded gets that error. It reports whether it committed.
func (w *sqliteWriter) commitBatch(batch []*writeReq, lazy bool) (committed bool) {
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
	if err := w.setSync(mode); err != nil {
		fail(err)
		return
	}
	sqlTx, err := w.db.BeginTx(bg, nil)
	if err != nil {
		fail(fmt.Errorf("store: begin: %w", err))
		return
	}
	tx := writerTx{Tx: sqlTx, stmts: w.stmts}
	if len(batch) == 1 {
		// alone in its transaction: no savepoint needed, a failure rolls back the transaction
		req := batch[0]
		if errs[0] = req.ctx.Err(); errs[0] == nil {
			errs[0] = req.fn(context.WithoutCancel(req.ctx), tx)
		}
		if errs[0] != nil {
			sqlTx.Rollback()
			answer()
			return
		}
		if err := sqlTx.Commit(); err != nil {
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
		if _, err := tx.ExecContext(bg, `SAVEPOINT req`); err != nil {
			sqlTx.Rollback()
			fail(fmt.Errorf("store: savepoint: %w", err))
			return
		}
		if errs[i] = req.fn(context.WithoutCancel(req.ctx), tx); errs[i] != nil {
			if _, err := tx.ExecContext(bg, `ROLLBACK TO req`); err != nil {
				// SQLite may have rolled the whole transaction back (e.g. disk full):
				// nothing of the batch stands.
				sqlTx.Rollback()
				fail(fmt.Errorf("store: rollback to savepoint: %w", err))
				return
			}
		}
		if _, err := tx.ExecContext(bg, `RELEASE req`); err != nil {
			sqlTx.Rollback()
			fail(fmt.Errorf("store: release savepoint: %w", err))
			return
		}
	}
	if err := sqlTx.Commit(); err != nil {
		fail(fmt.Errorf("store: commit: %w", err))
		return
	}
	answer()
	return true
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
