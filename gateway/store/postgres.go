package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"
)

// PostgresSchema is the schema OpenPostgres keeps its tables in when the URL names none
// (search_path). Several gateways (replicas) of one deployment share one schema; unrelated
// deployments can share a database by using different schemas.
const PostgresSchema = "reversi_gateway"

// postgresPoolConns is the pool size when the URL sets no pool_max_conns: enough for 16
// concurrent sessions without queueing for a connection.
const postgresPoolConns = 16

// Postgres is a Store in a PostgreSQL database (jackc/pgx/v5, pgxpool), for
// gateways with several replicas: they share runs, ledger, duplicate-call keys and approvals.
//
// Durability: a write returns after its transaction commits; with the server's defaults
// (fsync on, synchronous_commit on) the commit is flushed to the server's WAL first. Outcomes
// and events are the exception: they commit asynchronously, and a queued outcome
// (QueueOutcome) commits with the next intent, in its transaction (see pgRunner).
//
// Concurrency across replicas comes from the database, never from a read then a write in Go:
// a duplicate-call key is one INSERT ... ON CONFLICT DO NOTHING against its primary key; a
// record's Seq comes from UPDATE runs SET next_seq = next_seq + 1 ... RETURNING, which holds the
// run's row lock until the record is committed (so Seq is gapless per run whatever the number of
// writers); approvals are read FOR UPDATE and written back in one transaction; a high-water
// mark advances by one INSERT ... ON CONFLICT DO UPDATE ... WHERE the new sequence is higher.
// Transactions lock a run's row before the run's records (an outcome closes its intent after
// it is numbered), an approval's row before its run's, high-water rows in Source order, and
// a batch of queued outcomes and an intent its runs' rows in the order of their IDs, so they
// cannot deadlock each other.
//
// Instances: each open store is an instance that holds a session advisory lock (on a hash of
// its schema and instance id) on a dedicated connection for its lifetime; every intent records
// its instance. Recover completes only the intents of instances whose lock it can take (their
// session is gone: the process stopped, crashed or lost its connection), never those of a live
// replica. A watchdog pings the lock connection every postgresWatchdog; if the connection is
// lost the store refuses new intents (a peer may now recover them) until it has reconnected
// and retaken its lock.
type Postgres struct {
	sqlStore
	pool   *pgxpool.Pool
	schema string
	lock   *pgLock
}

var _ Store = (*Postgres)(nil)

// postgresWatchdog is how often the instance lock connection is checked.
const postgresWatchdog = 2 * time.Second

// pgUniqueViolation is the SQLSTATE of unique_violation.
const pgUniqueViolation = "23505"

// postgresDialect is Postgres's: replicas write concurrently, so rows read to be written are
// locked; text columns use the "C" collation so that ordering and equality are byte-wise, as
// in SQLite; duplicate-call keys are BYTEA (they contain NUL separators, which TEXT cannot
// hold).
var postgresDialect = (&dialect{
	types: strings.NewReplacer("{text}", `TEXT COLLATE "C"`, "{int}", "BIGINT", "{key}", "BYTEA", "{bool}", "BOOLEAN",
		"{norowid}", ""),
	forUpdate:  " FOR UPDATE",
	skipLocked: " FOR UPDATE SKIP LOCKED",
	rowOrder:   "id",
	key:        func(k string) any { return []byte(k) },
	// translate() lowers ASCII letters only, as asciiLower and SQLite's lower() do, whatever
	// the database's locale; strpos takes the needle literally (no LIKE wildcards).
	textMatch: func(c, p string) string {
		return "strpos(translate(" + c + ", 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz'), " + p + ") > 0"
	},
	columns: `SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1`,
	unique: func(err error) bool {
		var e *pgconn.PgError
		return errors.As(err, &e) && e.Code == pgUniqueViolation
	},
	// the run's row lock, held until the transaction ends, orders the writers of a run
	seqWith: `WITH s AS (UPDATE runs SET next_seq = next_seq + 1 WHERE id = $1 RETURNING next_seq AS n) `,
	seqFrom: `s`,
	extraDDL: []string{
		`CREATE INDEX IF NOT EXISTS records_time ON records (time DESC, run, seq DESC)`,
		pgOutcomeFunction,
	},
	// an outcome is one call of pgOutcomeFunction: one round trip, committed by itself
	outcomeCall: `SELECT o_seq, o_tool, o_kind FROM reversi_outcome($1, $2, $3, $4, $5, $6, $7)`,
	outcomeRace: func(err error) bool {
		var e *pgconn.PgError
		return errors.As(err, &e) && e.Code == pgOutcomeRace
	},
}).withStatements()

// pgOutcomeFunction completes a step in one statement (the dialect's insertOutcome; the
// parameters are insertOutcome's: run, time, step, status, compensation_tool, handle, note).
// It returns no row when the step is not an open intent (RecordOutcome then tells
// ErrCompleted from ErrNotFound). Otherwise it takes the run's row lock first, as every
// writer does (numbering the outcome), then closes the intent only if it is still open: of
// concurrent outcomes of a step (replicas) the second waits for the first's run lock and then
// finds the intent closed. It raises pgOutcomeRace then, which rolls the numbering back (Seq
// stays gapless) and reads as ErrCompleted.
const pgOutcomeFunction = `CREATE OR REPLACE FUNCTION reversi_outcome(p_run TEXT, p_time BIGINT, p_step BIGINT,
	p_status TEXT, p_compensation TEXT, p_handle TEXT, p_note TEXT)
RETURNS TABLE (o_seq BIGINT, o_tool TEXT, o_kind TEXT) LANGUAGE plpgsql AS $fn$
DECLARE n BIGINT; t TEXT;
BEGIN
	PERFORM 1 FROM records r WHERE r.run = p_run AND r.seq = p_step AND r.kind = 'intent' AND r.open = 1;
	IF NOT FOUND THEN
		RETURN;
	END IF;
	UPDATE runs SET next_seq = next_seq + 1 WHERE id = p_run RETURNING next_seq INTO n;
	UPDATE records r SET open = 0 WHERE r.run = p_run AND r.seq = p_step AND r.kind = 'intent' AND r.open = 1
		RETURNING r.tool INTO t;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'step % of run % was completed meanwhile', p_step, p_run USING ERRCODE = 'RV001';
	END IF;
	INSERT INTO records (run, seq, kind, time, step, tool, status, compensation_tool, handle, note)
		VALUES (p_run, n, 'outcome', p_time, p_step, t, p_status, p_compensation, p_handle, p_note);
	RETURN QUERY SELECT n, t, 'outcome'::TEXT;
END
$fn$`

// pgOutcomeRace is the SQLSTATE pgOutcomeFunction raises when a concurrent outcome closed
// the intent between its check and its lock.
const pgOutcomeRace = "RV001"

// postgresCancelWait is how long a statement whose ctx ended waits for the server's answer to
// its cancel request before the connection is dropped.
const postgresCancelWait = time.Second

// postgresSchemaLock is the advisory lock key (pg_advisory_xact_lock) that serialises schema
// creation: concurrent CREATE TABLE IF NOT EXISTS of one table can otherwise fail.
const postgresSchemaLock = 0x7265766572736901 // "reversi\x01"

// postgresConfig parses databaseURL and pins the search_path to the store's schema.
func postgresConfig(databaseURL string) (*pgxpool.Config, string, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, "", fmt.Errorf("store: database URL: %w (expected postgres://user:password@host:5432/database?sslmode=...)", redact(err, databaseURL))
	}
	schema := PostgresSchema
	if sp := cfg.ConnConfig.RuntimeParams["search_path"]; sp != "" {
		first, _, _ := strings.Cut(sp, ",")
		if first = strings.Trim(strings.TrimSpace(first), `"`); first != "" {
			schema = first
		}
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize()
	if !strings.Contains(databaseURL, "pool_max_conns") {
		cfg.MaxConns = postgresPoolConns
	}
	// A statement whose ctx ends is cancelled on the server too (a cancel request), so that
	// the caller's error matches what is committed: with pgx's default (the socket's deadline
	// only) a batch stuck on a row lock went on once the lock was free, and committed after its
	// writers had been told that it failed (TestPostgresQueuedChainBoundedByOneTimeout). What
	// no client deadline closes stays: a cancel request that does not reach the server within
	// postgresCancelWait, or a commit answered after the deadline; Recover completes such an
	// intent as uncertain.
	cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: postgresCancelWait}
	}
	return cfg, schema, nil
}

// redact keeps a password in the URL out of an error message.
func redact(err error, databaseURL string) error {
	msg := err.Error()
	if i := strings.Index(databaseURL, "://"); i >= 0 {
		if at := strings.LastIndex(databaseURL, "@"); at > i {
			if c := strings.Index(databaseURL[i+3:at], ":"); c >= 0 {
				if pw := databaseURL[i+3+c+1 : at]; pw != "" {
					msg = strings.ReplaceAll(msg, pw, "xxxxx")
				}
			}
		}
	}
	return errors.New(msg)
}

// OpenPostgres connects to databaseURL (postgres://user:password@host:port/db?sslmode=...;
// pgx's keywords, e.g. pool_max_conns, default 16; the store opens at most pool_max_conns +
// pool_max_conns/2 + 1 connections: the pool, the lazy writes' pool, the instance lock) and creates the store's tables if missing,
// in the schema named by the URL's search_path parameter (default PostgresSchema). A nil clock
// means time.Now. Call Recover after opening to complete the steps that stopped replicas left
// without an outcome. Errors: a bad URL, an unreachable server, or missing privileges (the
// user needs CREATE on the database the first time, then read and write on the schema).
// Source: issue 9 (Multi-replica: store.postgres).
func OpenPostgres(ctx context.Context, databaseURL string, clock Clock) (*Postgres, error) {
	if clock == nil {
		clock = time.Now
	}
	cfg, schema, err := postgresConfig(databaseURL)
	if err != nil {
		return nil, err
	}
	where := fmt.Sprintf("%s:%d/%s schema %s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, schema)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: postgres %s: %w", where, err)
	}
	lazyCfg := cfg.Copy()
	lazyCfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	lazyCfg.MaxConns = max(1, cfg.MaxConns/2)
	lazyCfg.MinConns = min(lazyCfg.MinConns, lazyCfg.MaxConns)
	lazy, err := pgxpool.NewWithConfig(ctx, lazyCfg)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: postgres %s: %w", where, err)
	}
	fail := func(err error) (*Postgres, error) {
		lazy.Close()
		pool.Close()
		return nil, fmt.Errorf("store: postgres %s: %w", where, err)
	}
	if err := createPostgresSchema(ctx, pool, schema); err != nil {
		return fail(fmt.Errorf("create the tables: %w", err))
	}
	lock := &pgLock{schema: schema, id: newID("gw-"), cfg: cfg.ConnConfig.Copy(), stop: make(chan struct{}), dogEnd: make(chan struct{})}
	if err := lock.lockInstance(ctx); err != nil {
		return fail(err)
	}
	go lock.watchdog()
	w := &pgRunner{pool: pool, lazy: lazy}
	s := &Postgres{pool: pool, schema: schema, lock: lock,
		sqlStore: sqlStore{d: postgresDialect, r: flushedReads{w, pgxQuerier{pool}}, w: w, inst: lock, instance: lock.id, now: clock}}
	s.release = func() error {
		lazy.Close()
		pool.Close()
		return nil
	}
	return s, nil
}

// createPostgresSchema creates schema and the store's tables in it, under postgresSchemaLock.
func createPostgresSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(postgresSchemaLock)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
			return err
		}
		return postgresDialect.migrate(ctx, pgxQuerier{tx})
	})
}

// pgxQuerier is a querier of pgx: a pool or a transaction.
type pgxQuerier struct {
	q interface {
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	}
}

func (p pgxQuerier) exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := p.q.Exec(ctx, query, args...)
	return tag.RowsAffected(), pgErr(ctx, err)
}

func (p pgxQuerier) query(ctx context.Context, query string, args ...any) (rows, error) {
	r, err := p.q.Query(ctx, query, args...)
	if err != nil {
		return nil, pgErr(ctx, err)
	}
	return pgxRows{r, ctx}, nil
}

// pgxRows are pgx.Rows as rows (pgx's Close returns nothing: its error is Err's), read
// within ctx (Err: pgErr).
type pgxRows struct {
	pgx.Rows
	ctx context.Context
}

func (r pgxRows) Err() error { return pgErr(r.ctx, r.Rows.Err()) }

func (r pgxRows) Close() error {
	r.Rows.Close()
	return r.Err()
}

// pgQueryCanceled is the SQLSTATE of a statement that a cancel request stopped.
const pgQueryCanceled = "57014"

// pgErr is err as the other stores say it: wrapping ctx's error too when the server stopped
// the statement because ctx ended (the cancel request of postgresConfig's handler), so that a
// caller reads context.DeadlineExceeded or context.Canceled; wrapping ErrClosed when the pool
// was closed (a read racing Close).
func pgErr(ctx context.Context, err error) error {
	if errors.Is(err, puddle.ErrClosedPool) {
		return fmt.Errorf("%w (%w)", ErrClosed, err)
	}
	if ctx.Err() == nil || !queryCanceled(err) {
		return err
	}
	return fmt.Errorf("%w (%w)", ctx.Err(), err)
}

// queryCanceled reports whether err is the server's answer to a cancel request (SQLSTATE
// pgQueryCanceled).
func queryCanceled(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == pgQueryCanceled
}

// Instance returns this store's instance id (recorded with every intent it writes).
func (s *Postgres) Instance() string { return s.instance }

// Schema returns the schema the store's tables are in.
func (s *Postgres) Schema() string { return s.schema }

// errLockLost: the connection holding this instance's advisory lock was lost, so a peer may
// be completing its intents; no intent is journaled until the lock is back.
var errLockLost = errors.New("store: postgres: the connection holding the instance lock was lost")

// pgLock is the instances of a schema: each holds a session advisory lock on a dedicated
// connection while it lives.
type pgLock struct {
	schema string
	id     string // this instance
	cfg    *pgx.ConnConfig

	mu     sync.Mutex // serialises use of conn (Recover, watchdog, close)
	conn   *pgx.Conn  // holds this instance's advisory lock; nil while lost
	lost   atomic.Bool
	stop   chan struct{}
	dogEnd chan struct{}
}

// key is the advisory lock key of an instance of this schema.
func (l *pgLock) key(instance string) int64 {
	h := fnv.New64a()
	h.Write([]byte(l.schema))
	h.Write([]byte{0})
	h.Write([]byte(instance))
	return int64(h.Sum64())
}

// lockInstance opens the dedicated connection and takes this instance's lock. Called with mu
// held (or before the store is shared).
func (l *pgLock) lockInstance(ctx context.Context) error {
	c, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return fmt.Errorf("instance lock connection: %w", err)
	}
	var ok bool
	if err := c.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, l.key(l.id)).Scan(&ok); err != nil || !ok {
		c.Close(ctx)
		return fmt.Errorf("lock instance %s: taken %v, %v", l.id, !ok, err)
	}
	l.conn = c
	return nil
}

// watchdog checks the lock connection until close and reconnects when it is lost.
func (l *pgLock) watchdog() {
	defer close(l.dogEnd)
	t := time.NewTicker(postgresWatchdog)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		l.mu.Lock()
		ctx, cancel := context.WithTimeout(context.Background(), postgresWatchdog)
		if l.conn != nil {
			if err := l.conn.Ping(ctx); err != nil {
				l.lost.Store(true)
				l.conn.Close(ctx)
				l.conn = nil
			}
		}
		if l.conn == nil && l.lockInstance(ctx) == nil {
			l.lost.Store(false)
		}
		cancel()
		l.mu.Unlock()
	}
}

func (l *pgLock) usable() error {
	if l.lost.Load() {
		return fmt.Errorf("%w (instance %s): no call is journaled until it is back (check the database)", errLockLost, l.id)
	}
	return nil
}

// lockDead takes the advisory locks of the instances among ids (other than this one) that it
// can: their session is gone. It holds them, and mu, until release.
func (l *pgLock) lockDead(ctx context.Context, ids []string) (map[string]bool, func(), error) {
	dead := map[string]bool{}
	others := make([]string, 0, len(ids))
	for _, id := range ids {
		if id != l.id {
			others = append(others, id)
		}
	}
	if len(others) == 0 {
		return dead, func() {}, nil
	}
	l.mu.Lock()
	if l.conn == nil {
		l.mu.Unlock()
		return nil, nil, fmt.Errorf("instance %s has lost its lock connection; retry once the database is reachable", l.id)
	}
	var keys []int64
	release := func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, k := range keys {
			_, _ = l.conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, k)
		}
		l.mu.Unlock()
	}
	for _, id := range others {
		var ok bool
		k := l.key(id)
		if err := l.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, k).Scan(&ok); err != nil {
			release()
			return nil, nil, err
		}
		if ok {
			dead[id] = true
			keys = append(keys, k)
		}
	}
	return dead, release, nil
}

// close stops the watchdog and releases the instance lock, so that a peer's Recover completes
// the intents this store left without an outcome.
func (l *pgLock) close() error {
	close(l.stop)
	<-l.dogEnd
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Unlock explicitly: the server releases a closed session's locks only once its backend
	// has noticed, which a peer's immediate Recover could race.
	_, err := l.conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	err = errors.Join(err, l.conn.Close(ctx))
	l.conn = nil
	return err
}

// PostgresExists reports whether databaseURL's schema (see OpenPostgres) holds a store,
// without creating anything, and returns the schema's name. Tools that operate an existing
// gateway's store (`reversi approvals`) use it so that a wrong URL or schema is an error, not
// an empty queue. Errors: a bad URL or an unreachable server.
func PostgresExists(ctx context.Context, databaseURL string) (schema string, ok bool, err error) {
	cfg, schema, err := postgresConfig(databaseURL)
	if err != nil {
		return "", false, err
	}
	c, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return schema, false, fmt.Errorf("store: postgres %s:%d/%s: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, err)
	}
	defer c.Close(ctx)
	var n int
	err = c.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = $1
		AND table_name IN ('runs', 'records', 'dup_keys', 'approvals')`, schema).Scan(&n)
	if err != nil {
		return schema, false, fmt.Errorf("store: postgres: %w", err)
	}
	return schema, n == 4, nil
}
