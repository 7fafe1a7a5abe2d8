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
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresSchema is the schema OpenPostgres keeps its tables in when the URL names none
// (search_path). Several gateways (replicas) of one deployment share one schema; unrelated
// deployments can share a database by using different schemas.
const PostgresSchema = "reversi_gateway"

// postgresPoolConns is the pool size when the URL sets no pool_max_conns: enough for 16
// concurrent sessions without queueing for a connection.
const postgresPoolConns = 16

// postgresWriteTimeout bounds a write once it has started (see Postgres.tx).
const postgresWriteTimeout = 30 * time.Second

// Postgres is a Store in a PostgreSQL database (jackc/pgx/v5, pgxpool), for gateways with
// several replicas: they share runs, ledger, duplicate-call keys and approvals.
//
// Durability: a write returns after its transaction commits; with the server's defaults
// (fsync on, synchronous_commit on) the commit is flushed to the server's WAL first. Outcomes
// and events are the exception: they commit asynchronously (see txLazy).
//
// Concurrency across replicas comes from the database, never from a read then a write in Go:
// a duplicate-call key is one INSERT ... ON CONFLICT DO NOTHING against its primary key; a
// record's Seq comes from UPDATE runs SET next_seq = next_seq + 1 ... RETURNING, which holds the
// run's row lock until the record is committed (so Seq is gapless per run whatever the number of
// writers); approvals are read FOR UPDATE and written back in one transaction; a high-water
// mark advances by one INSERT ... ON CONFLICT DO UPDATE ... WHERE the new sequence is higher.
// Transactions lock a run's row before the run's pending rows, and high-water rows in Source
// order, so they cannot deadlock each other.
//
// Instances: each open store is an instance that holds a session advisory lock (on a hash of
// its schema and instance id) on a dedicated connection for its lifetime; every intent records
// its instance. Recover completes only the intents of instances whose lock it can take (their
// session is gone: the process stopped, crashed or lost its connection), never those of a live
// replica. A watchdog pings the lock connection every postgresWatchdog; if the connection is
// lost the store refuses new intents (a peer may now recover them) until it has reconnected
// and retaken its lock.
type Postgres struct {
	pool     *pgxpool.Pool
	schema   string
	now      Clock
	closed   atomic.Bool
	instance string

	lockMu   sync.Mutex // serialises use of lockConn (Recover, watchdog, Close)
	lockConn *pgx.Conn  // holds this instance's advisory lock; nil while lost
	lockCfg  *pgx.ConnConfig
	lost     atomic.Bool // the lock connection failed: no new intents until it is back
	stop     chan struct{}
	dogEnd   chan struct{}
}

var _ Store = (*Postgres)(nil)

// postgresWatchdog is how often the instance lock connection is checked.
const postgresWatchdog = 2 * time.Second

// postgresSchemaSQL creates the tables in the current search_path (the store's schema). Text
// columns use the "C" collation so that ordering and equality are byte-wise, as in SQLite.
// Duplicate-call keys are BYTEA: they are opaque and contain NUL separators
// (manifest.DuplicateKey), which a TEXT value cannot hold.
const postgresSchemaSQL = `
CREATE TABLE IF NOT EXISTS runs (
	id            TEXT COLLATE "C" PRIMARY KEY,
	actor         TEXT COLLATE "C" NOT NULL,
	gateway       TEXT COLLATE "C" NOT NULL,
	started       BIGINT NOT NULL,
	last_activity BIGINT NOT NULL,
	status        TEXT COLLATE "C" NOT NULL,
	next_seq      BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_started ON runs (started DESC, id);
CREATE TABLE IF NOT EXISTS records (
	run               TEXT COLLATE "C" NOT NULL REFERENCES runs (id),
	seq               BIGINT NOT NULL,
	kind              TEXT COLLATE "C" NOT NULL,
	time              BIGINT NOT NULL,
	step              BIGINT NOT NULL,
	tool              TEXT COLLATE "C" NOT NULL DEFAULT '',
	args_digest       TEXT COLLATE "C" NOT NULL DEFAULT '',
	reason            TEXT COLLATE "C" NOT NULL DEFAULT '',
	idempotency_key   BYTEA NOT NULL DEFAULT '',
	manifest_version  TEXT COLLATE "C" NOT NULL DEFAULT '',
	manifest_checksum TEXT COLLATE "C" NOT NULL DEFAULT '',
	mode              TEXT COLLATE "C" NOT NULL DEFAULT '',
	decision          TEXT COLLATE "C" NOT NULL DEFAULT '',
	status            TEXT COLLATE "C" NOT NULL DEFAULT '',
	compensation_tool TEXT COLLATE "C" NOT NULL DEFAULT '',
	handle            TEXT COLLATE "C" NOT NULL DEFAULT '',
	note              TEXT COLLATE "C" NOT NULL DEFAULT '',
	PRIMARY KEY (run, seq)
);
-- issue 16: decision records (added to the tables of an older schema)
ALTER TABLE records ADD COLUMN IF NOT EXISTS approval TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE records ADD COLUMN IF NOT EXISTS event TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE records ADD COLUMN IF NOT EXISTS approver TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE records ADD COLUMN IF NOT EXISTS groups TEXT NOT NULL DEFAULT '';
-- a decision record with a Once key is in its run at most once (ApprovalRecord.Once)
CREATE UNIQUE INDEX IF NOT EXISTS records_approval_once ON records (run, approval, idempotency_key)
	WHERE kind = 'approval' AND idempotency_key <> '';
CREATE UNIQUE INDEX IF NOT EXISTS records_one_outcome ON records (run, step) WHERE kind = 'outcome';
CREATE INDEX IF NOT EXISTS records_time ON records (time DESC, run, seq DESC);
CREATE TABLE IF NOT EXISTS pending (
	run      TEXT COLLATE "C" NOT NULL,
	step     BIGINT NOT NULL,
	tool     TEXT COLLATE "C" NOT NULL,
	instance TEXT COLLATE "C" NOT NULL,
	PRIMARY KEY (run, step)
);
CREATE INDEX IF NOT EXISTS pending_instance ON pending (instance);
CREATE TABLE IF NOT EXISTS dup_keys (
	key     BYTEA PRIMARY KEY,
	run     TEXT COLLATE "C" NOT NULL,
	step    BIGINT NOT NULL,
	claimed BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS approvals (
	id          TEXT COLLATE "C" PRIMARY KEY,
	run         TEXT COLLATE "C" NOT NULL,
	tool        TEXT COLLATE "C" NOT NULL,
	args_digest TEXT COLLATE "C" NOT NULL,
	actor       TEXT COLLATE "C" NOT NULL,
	roles       TEXT NOT NULL,
	quorum      INTEGER NOT NULL,
	created     BIGINT NOT NULL,
	expires     BIGINT NOT NULL,
	on_timeout  TEXT NOT NULL,
	escalate_to TEXT NOT NULL,
	reason      TEXT NOT NULL,
	state       TEXT COLLATE "C" NOT NULL,
	decisions   TEXT NOT NULL,
	escalated   BOOLEAN NOT NULL,
	decided     BIGINT NOT NULL,
	consumed    BIGINT NOT NULL
);
-- issue 16: the actor's identity and requests kept in Kubernetes
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS actor_uid TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS actor_email TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS uid TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS spec_digest TEXT COLLATE "C" NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS approvals_run ON approvals (run, created);
CREATE INDEX IF NOT EXISTS approvals_created ON approvals (created, id);
CREATE TABLE IF NOT EXISTS high_water (
	source   TEXT COLLATE "C" PRIMARY KEY,
	sequence BIGINT NOT NULL CHECK (sequence >= 0),
	revision TEXT COLLATE "C" NOT NULL,
	digest   TEXT COLLATE "C" NOT NULL,
	updated  BIGINT NOT NULL
);
INSERT INTO runs (id, actor, gateway, started, last_activity, status) VALUES ('', '', '', 0, 0, 'active') ON CONFLICT DO NOTHING;
`

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
// pgx's keywords, e.g. pool_max_conns, default 16) and creates the store's tables if missing,
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
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(postgresSchemaLock)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, postgresSchemaSQL)
		return err
	})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: postgres %s: create the tables: %w", where, err)
	}
	s := &Postgres{pool: pool, schema: schema, now: clock, instance: newID("gw-"), lockCfg: cfg.ConnConfig.Copy(),
		stop: make(chan struct{}), dogEnd: make(chan struct{})}
	if err := s.lockInstance(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: postgres %s: %w", where, err)
	}
	go s.watchdog()
	return s, nil
}

// lockKey is the advisory lock key of an instance of this schema.
func (s *Postgres) lockKey(instance string) int64 {
	h := fnv.New64a()
	h.Write([]byte(s.schema))
	h.Write([]byte{0})
	h.Write([]byte(instance))
	return int64(h.Sum64())
}

// lockInstance opens the dedicated connection and takes this instance's lock. Called with
// lockMu held (or before the store is shared).
func (s *Postgres) lockInstance(ctx context.Context) error {
	c, err := pgx.ConnectConfig(ctx, s.lockCfg)
	if err != nil {
		return fmt.Errorf("instance lock connection: %w", err)
	}
	var ok bool
	if err := c.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, s.lockKey(s.instance)).Scan(&ok); err != nil || !ok {
		c.Close(ctx)
		return fmt.Errorf("lock instance %s: taken %v, %v", s.instance, !ok, err)
	}
	s.lockConn = c
	return nil
}

// watchdog checks the lock connection until Close and reconnects when it is lost.
func (s *Postgres) watchdog() {
	defer close(s.dogEnd)
	t := time.NewTicker(postgresWatchdog)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.lockMu.Lock()
		ctx, cancel := context.WithTimeout(context.Background(), postgresWatchdog)
		if s.lockConn != nil {
			if err := s.lockConn.Ping(ctx); err != nil {
				s.lost.Store(true)
				s.lockConn.Close(ctx)
				s.lockConn = nil
			}
		}
		if s.lockConn == nil && s.lockInstance(ctx) == nil {
			s.lost.Store(false)
		}
		cancel()
		s.lockMu.Unlock()
	}
}

// Instance returns this store's instance id (recorded with every intent it writes).
func (s *Postgres) Instance() string { return s.instance }

// Schema returns the schema the store's tables are in.
func (s *Postgres) Schema() string { return s.schema }

// Close implements Store. It releases the instance lock, so that a peer's Recover completes
// the intents this store left without an outcome.
func (s *Postgres) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.stop)
	<-s.dogEnd
	s.lockMu.Lock()
	var err error
	if s.lockConn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		// Unlock explicitly: the server releases a closed session's locks only once its
		// backend has noticed, which a peer's immediate Recover could race.
		_, err = s.lockConn.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
		err = errors.Join(err, s.lockConn.Close(ctx))
		cancel()
		s.lockConn = nil
	}
	s.lockMu.Unlock()
	s.pool.Close()
	return err
}

func (s *Postgres) check() error {
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

func (s *Postgres) stamp() time.Time { return nt(s.now().UnixNano()) }

// writeCtx is the context of a write that has started: not cancelled by the caller (so the
// answer matches what was committed) but bounded.
func writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), postgresWriteTimeout)
}

// tx runs fn in a transaction and commits it. A caller whose ctx is done before it starts
// writes nothing; once started, fn and the commit run to the end (bounded by
// postgresWriteTimeout) whatever ctx does.
func (s *Postgres) tx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	wctx, cancel := writeCtx(ctx)
	defer cancel()
	return pgx.BeginFunc(wctx, s.pool, func(tx pgx.Tx) error { return fn(wctx, tx) })
}

// txLazy is tx for records of what already happened (outcomes, events): the transaction
// commits with synchronous_commit off, so it returns without waiting for the server's WAL flush.
// It survives a crash of the gateway; a crash of the server inside the WAL writer's delay can
// lose it, and Recover then completes the step as uncertain (the safe reading). A later
// synchronous commit (the next intent) flushes it too.
func (s *Postgres) txLazy(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return s.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return err
		}
		return fn(ctx, tx)
	})
}

// exec runs one statement (its own transaction) under the same rules as tx.
func (s *Postgres) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := s.check(); err != nil {
		return pgconn.CommandTag{}, err
	}
	if err := ctx.Err(); err != nil {
		return pgconn.CommandTag{}, err
	}
	wctx, cancel := writeCtx(ctx)
	defer cancel()
	return s.pool.Exec(wctx, sql, args...)
}

const pgRunCols = `id, actor, gateway, started, last_activity, status`

// CreateRun implements Store.
func (s *Postgres) CreateRun(ctx context.Context, r Run) (Run, error) {
	if r.Actor == "" {
		return Run{}, fmt.Errorf("%w: a run needs an actor", ErrInvalid)
	}
	if r.ID == "" {
		r.ID = newID("run-")
	}
	now := s.stamp()
	r.Started, r.LastActivity, r.Status = now, now, RunActive
	tag, err := s.exec(ctx, `INSERT INTO runs (`+pgRunCols+`) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`,
		r.ID, r.Actor, r.Gateway, tn(now), tn(now), string(r.Status))
	if err != nil {
		return Run{}, fmt.Errorf("store: create run: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return Run{}, fmt.Errorf("%w: run %s", ErrExists, r.ID)
	}
	return r, nil
}

// GetRun implements Store.
func (s *Postgres) GetRun(ctx context.Context, id string) (Run, error) {
	if err := s.check(); err != nil {
		return Run{}, err
	}
	if id == GatewayJournal {
		return Run{}, fmt.Errorf("%w: run %q", ErrNotFound, id)
	}
	r, err := scanRun(s.pool.QueryRow(ctx, `SELECT `+pgRunCols+` FROM runs WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Run{}, fmt.Errorf("%w: run %q", ErrNotFound, id)
	}
	if err != nil {
		return Run{}, fmt.Errorf("store: get run: %w", err)
	}
	return r, nil
}

func (s *Postgres) queryRuns(ctx context.Context, what, q string, args ...any) ([]Run, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: %s: %w", what, err)
	}
	defer rows.Close()
	var out []Run
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("store: %s: %w", what, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: %s: %w", what, err)
	}
	return out, nil
}

// pgLimit is a LIMIT parameter: NULL (no limit) for n <= 0.
func pgLimit(n int) *int64 {
	if n <= 0 {
		return nil
	}
	v := int64(n)
	return &v
}

// ListRuns implements Store.
func (s *Postgres) ListRuns(ctx context.Context, f RunFilter) ([]Run, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.queryRuns(ctx, "list runs", `SELECT `+pgRunCols+` FROM runs WHERE id != ''
		AND ($1 = '' OR actor = $1) AND ($2 = '' OR gateway = $2) AND ($3 = '' OR status = $3)
		ORDER BY started DESC, id LIMIT $4`, f.Actor, f.Gateway, string(f.Status), pgLimit(f.Limit))
}

// ContinueRun implements Store.
func (s *Postgres) ContinueRun(ctx context.Context, id, actor string) (Run, error) {
	var r Run
	err := s.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		r, err = scanRun(tx.QueryRow(ctx, `SELECT `+pgRunCols+` FROM runs WHERE id = $1 AND id != '' FOR UPDATE`, id))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: run %q", ErrNotFound, id)
		}
		if err != nil {
			return fmt.Errorf("store: continue run: %w", err)
		}
		if r.Actor != actor {
			return fmt.Errorf("%w: run %s was opened by another principal", ErrNotOwner, id)
		}
		r.LastActivity, r.Status = s.stamp(), RunActive
		if _, err := tx.Exec(ctx, `UPDATE runs SET last_activity = $1, status = $2 WHERE id = $3`, tn(r.LastActivity), string(r.Status), id); err != nil {
			return fmt.Errorf("store: continue run: %w", err)
		}
		return nil
	})
	return r, err
}

// SetRunStatus implements Store.
func (s *Postgres) SetRunStatus(ctx context.Context, id string, status RunStatus) error {
	if !validRunStatus(status) {
		return fmt.Errorf("%w: run status %q", ErrInvalid, status)
	}
	tag, err := s.exec(ctx, `UPDATE runs SET status = $1 WHERE id = $2 AND id != ''`, string(status), id)
	if err != nil {
		return fmt.Errorf("store: set run status: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: run %q", ErrNotFound, id)
	}
	return nil
}

// pgNextSeq numbers a record of run $2 at time $1 and takes the run's row lock until commit.
const pgNextSeq = `UPDATE runs SET next_seq = next_seq + 1,
	last_activity = CASE WHEN id = '' THEN last_activity ELSE $1 END WHERE id = $2 RETURNING next_seq`

const pgInsertRecord = `INSERT INTO records (run, seq, kind, time, step, tool, args_digest, reason,
	idempotency_key, manifest_version, manifest_checksum, mode, decision, status, compensation_tool, handle, note,
	approval, event, approver, groups)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)`

// appendTx numbers rec in its run (locking the run's row) and inserts it.
func (s *Postgres) appendTx(ctx context.Context, tx pgx.Tx, rec *Record, handle string) error {
	rec.Time = s.stamp()
	err := tx.QueryRow(ctx, pgNextSeq, tn(rec.Time), rec.Run).Scan(&rec.Seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: run %q", ErrNotFound, rec.Run)
	}
	if err != nil {
		return fmt.Errorf("store: append: %w", err)
	}
	if rec.Kind == KindIntent {
		rec.Step = rec.Seq
	}
	_, err = tx.Exec(ctx, pgInsertRecord, rec.Run, rec.Seq, string(rec.Kind), tn(rec.Time), rec.Step, rec.Tool,
		rec.ArgsDigest, rec.Reason, []byte(rec.IdempotencyKey), rec.ManifestVersion, rec.ManifestChecksum, rec.Mode,
		rec.Decision, string(rec.Status), rec.CompensationTool, handle, rec.Note, rec.Approval, string(rec.Event),
		rec.Approver, encodeGroups(rec.Groups))
	if err != nil {
		return fmt.Errorf("store: append: %w", err)
	}
	return nil
}

// pgIntent appends an intent in one statement (one round trip, one implicit transaction):
// number it under the run's row lock, insert the record and its pending row, and bind the
// claimed key to the step.
const pgIntent = `WITH s AS (` + pgNextSeq + `),
r AS (INSERT INTO records (run, seq, kind, time, step, tool, args_digest, reason,
	idempotency_key, manifest_version, manifest_checksum, mode, decision)
	SELECT $2, s.next_seq, 'intent', $1, s.next_seq, $3, $4, $5, $6, $7, $8, $9, $10 FROM s RETURNING seq),
p AS (INSERT INTO pending (run, step, tool, instance) SELECT $2, seq, $3, $11 FROM r),
k AS (UPDATE dup_keys SET step = (SELECT seq FROM r) WHERE $12 AND key = $6 AND run = $2 AND step = 0)
SELECT seq FROM r`

// pgIntentApproval is pgIntent for an intent that consumes approval $13: the record carries it.
const pgIntentApproval = `WITH s AS (` + pgNextSeq + `),
r AS (INSERT INTO records (run, seq, kind, time, step, tool, args_digest, reason,
	idempotency_key, manifest_version, manifest_checksum, mode, decision, approval)
	SELECT $2, s.next_seq, 'intent', $1, s.next_seq, $3, $4, $5, $6, $7, $8, $9, $10, $13 FROM s RETURNING seq),
p AS (INSERT INTO pending (run, step, tool, instance) SELECT $2, seq, $3, $11 FROM r),
k AS (UPDATE dup_keys SET step = (SELECT seq FROM r) WHERE $12 AND key = $6 AND run = $2 AND step = 0)
SELECT seq FROM r`

// RecordIntent implements Store. It fails while this store has lost its instance lock (a
// peer could complete the intent as uncertain under it).
func (s *Postgres) RecordIntent(ctx context.Context, in Intent) (int64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	if err := validIntent(in); err != nil {
		return 0, err
	}
	if s.lost.Load() {
		return 0, fmt.Errorf("store: postgres: the connection holding instance %s's lock was lost; no call is journaled until it is back (check the database)", s.instance)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if in.Approval != "" {
		return s.recordIntentApproval(ctx, in)
	}
	wctx, cancel := writeCtx(ctx)
	defer cancel()
	var step int64
	err := s.pool.QueryRow(wctx, pgIntent, tn(s.stamp()), in.Run, in.Tool, in.ArgsDigest, in.Reason, []byte(in.IdempotencyKey),
		in.ManifestVersion, in.ManifestChecksum, in.Mode, in.Decision, s.instance, in.HoldsKey && in.IdempotencyKey != "").Scan(&step)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("%w: run %q", ErrNotFound, in.Run)
	}
	if err != nil {
		return 0, fmt.Errorf("store: record intent: %w", err)
	}
	return step, nil
}

// recordIntentApproval is RecordIntent with in.Approval: one transaction consumes the
// approval (the request's row first, then the run's: every writer of both takes them in that
// order), appends the intent and the consumed record. The consumption is a conditional UPDATE
// (consumed = 0) whose rows affected decide, so of concurrent intents of any number of
// replicas exactly one commits.
func (s *Postgres) recordIntentApproval(ctx context.Context, in Intent) (int64, error) {
	var step int64
	err := s.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		a, err := s.consumeTx(ctx, tx, in.Approval, in.Run, in.Tool, in.ArgsDigest, false)
		if err != nil {
			return err
		}
		err = tx.QueryRow(ctx, pgIntentApproval, tn(s.stamp()), in.Run, in.Tool, in.ArgsDigest, in.Reason, []byte(in.IdempotencyKey),
			in.ManifestVersion, in.ManifestChecksum, in.Mode, in.Decision, s.instance, in.HoldsKey && in.IdempotencyKey != "", in.Approval).Scan(&step)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: run %q", ErrNotFound, in.Run)
		}
		if err != nil {
			return fmt.Errorf("store: record intent: %w", err)
		}
		c, _, _ := approvalRecord(consumedRecord(a, step))
		return s.appendTx(ctx, tx, &c, "")
	})
	if err != nil {
		return 0, err
	}
	return step, nil
}

// consumeTx is consumeRow in tx: the request's row is read FOR UPDATE and consumed with a
// conditional UPDATE.
func (s *Postgres) consumeTx(ctx context.Context, tx pgx.Tx, id, run, tool, argsDigest string, rollback bool) (*Approval, error) {
	return consumeRow(id, run, tool, argsDigest, s.stamp(), rollback,
		func() (Approval, error) { return s.readApprovalTx(ctx, tx, id) },
		func(at int64) (int64, error) {
			tag, err := tx.Exec(ctx, `UPDATE approvals SET consumed = $1 WHERE id = $2 AND consumed = 0`, at, id)
			return tag.RowsAffected(), err
		})
}

// readApprovalTx reads request id FOR UPDATE in tx. Errors: ErrNotFound.
func (s *Postgres) readApprovalTx(ctx context.Context, tx pgx.Tx, id string) (Approval, error) {
	a, err := scanApproval(tx.QueryRow(ctx, `SELECT `+approvalCols+` FROM approvals WHERE id = $1 FOR UPDATE`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Approval{}, fmt.Errorf("%w: approval %s", ErrNotFound, id)
	}
	if err != nil {
		return Approval{}, fmt.Errorf("store: approval %s: %w", id, err)
	}
	return a, nil
}

// AppendApproval implements Store.
func (s *Postgres) AppendApproval(ctx context.Context, ar ApprovalRecord) (int64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	rec, _, err := approvalRecord(ar)
	if err != nil {
		return 0, err
	}
	err = s.txLazy(ctx, func(ctx context.Context, tx pgx.Tx) error { return s.appendApprovalTx(ctx, tx, &rec) })
	return rec.Seq, err
}

// appendApprovalTx appends a decision record unless its Once key is already in the run: the
// run's row is locked first (as pgNextSeq would), so two replicas checking at once are
// serialised and the second finds the first's record; the unique index records_approval_once
// is the backstop.
func (s *Postgres) appendApprovalTx(ctx context.Context, tx pgx.Tx, rec *Record) error {
	if rec.IdempotencyKey != "" {
		var exists bool
		err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM runs WHERE id = $1 FOR UPDATE)`, rec.Run).Scan(&exists)
		if err != nil {
			return fmt.Errorf("store: decision record: %w", err)
		}
		if !exists {
			return fmt.Errorf("%w: run %q", ErrNotFound, rec.Run)
		}
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM records WHERE run = $1 AND approval = $2 AND idempotency_key = $3 AND kind = 'approval')`,
			rec.Run, rec.Approval, []byte(rec.IdempotencyKey)).Scan(&exists); err != nil {
			return fmt.Errorf("store: decision record: %w", err)
		}
		if exists {
			return onceExists(rec)
		}
	}
	return s.appendTx(ctx, tx, rec, "")
}

// outcomeTx completes step: it numbers the outcome (locking the run first, as every writer
// does), removes the pending row and appends the outcome record.
func (s *Postgres) outcomeTx(ctx context.Context, tx pgx.Tx, run string, step int64, o StepOutcome, handle string) (Record, error) {
	rec := Record{Run: run, Kind: KindOutcome, Step: step, Status: o.Status, CompensationTool: o.CompensationTool, Note: o.Note,
		Time: s.stamp()}
	err := tx.QueryRow(ctx, pgNextSeq, tn(rec.Time), run).Scan(&rec.Seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return Record{}, fmt.Errorf("%w: step %d in run %q", ErrNotFound, step, run)
	}
	if err != nil {
		return Record{}, fmt.Errorf("store: outcome: %w", err)
	}
	err = tx.QueryRow(ctx, `WITH d AS (DELETE FROM pending WHERE run = $1 AND step = $2 RETURNING tool)
		INSERT INTO records (run, seq, kind, time, step, tool, status, compensation_tool, handle, note)
		SELECT $1, $3, 'outcome', $4, $2, d.tool, $5, $6, $7, $8 FROM d RETURNING tool`,
		run, step, rec.Seq, tn(rec.Time), string(rec.Status), rec.CompensationTool, handle, rec.Note).Scan(&rec.Tool)
	if errors.Is(err, pgx.ErrNoRows) {
		var kind string
		err := tx.QueryRow(ctx, `SELECT kind FROM records WHERE run = $1 AND seq = $2`, run, step).Scan(&kind)
		if err == nil && kind == string(KindIntent) {
			return Record{}, fmt.Errorf("%w: step %d in run %s", ErrCompleted, step, run)
		}
		return Record{}, fmt.Errorf("%w: step %d in run %q", ErrNotFound, step, run)
	}
	if err != nil {
		return Record{}, fmt.Errorf("store: outcome: %w", err)
	}
	rec.Handle, _ = decodeHandle(handle)
	return rec, nil
}

// RecordOutcome implements Store.
func (s *Postgres) RecordOutcome(ctx context.Context, run string, step int64, o StepOutcome) (int64, error) {
	enc, err := encodeHandle(o)
	if err != nil {
		return 0, err
	}
	var rec Record
	err = s.txLazy(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		rec, err = s.outcomeTx(ctx, tx, run, step, o, enc)
		return err
	})
	return rec.Seq, err
}

// AppendEvent implements Store.
func (s *Postgres) AppendEvent(ctx context.Context, e Event) (int64, error) {
	if err := checkEvent(e); err != nil {
		return 0, err
	}
	rec := e.record()
	err := s.txLazy(ctx, func(ctx context.Context, tx pgx.Tx) error { return s.appendTx(ctx, tx, &rec, "") })
	return rec.Seq, err
}

func (s *Postgres) queryRecords(ctx context.Context, what, q string, args ...any) ([]Record, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: %s: %w", what, err)
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var r Record
		var kind, status, handle, event, groups string
		var key []byte
		var t int64
		if err := rows.Scan(&r.Run, &r.Seq, &kind, &t, &r.Step, &r.Tool, &r.ArgsDigest, &r.Reason, &key,
			&r.ManifestVersion, &r.ManifestChecksum, &r.Mode, &r.Decision, &status, &r.CompensationTool, &handle, &r.Note,
			&r.Approval, &event, &r.Approver, &groups); err != nil {
			return nil, fmt.Errorf("store: %s: %w", what, err)
		}
		r.Kind, r.Status, r.Time, r.IdempotencyKey, r.Event = Kind(kind), Status(status), nt(t), string(key), ApprovalEvent(event)
		if r.Handle, err = decodeHandle(handle); err != nil {
			return nil, err
		}
		if r.Groups, err = decodeGroups(groups); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: %s: %w", what, err)
	}
	return out, nil
}

// Records implements Store.
func (s *Postgres) Records(ctx context.Context, run string, after int64, limit int) ([]Record, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.queryRecords(ctx, "read records", `SELECT `+recordCols+` FROM records WHERE run = $1 AND seq > $2 ORDER BY seq LIMIT $3`,
		run, after, pgLimit(limit))
}

// PendingSteps implements Store.
func (s *Postgres) PendingSteps(ctx context.Context, run string) ([]Record, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.queryRecords(ctx, "pending steps", `SELECT `+recordCols+` FROM records WHERE run = $1 AND seq IN
		(SELECT step FROM pending WHERE run = $1) ORDER BY seq`, run)
}

// Recover implements Store: it completes the intents of every instance whose advisory lock it
// can take (the instance's session is gone), holding those locks until its transaction has
// committed, so that two replicas recovering at once never both complete one intent.
func (s *Postgres) Recover(ctx context.Context) ([]Record, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT instance FROM pending WHERE instance != $1`, s.instance)
	if err != nil {
		return nil, fmt.Errorf("store: recover: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("store: recover: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	s.lockMu.Lock()
	defer s.lockMu.Unlock()
	if s.lockConn == nil {
		return nil, fmt.Errorf("store: recover: instance %s has lost its lock connection; retry once the database is reachable", s.instance)
	}
	var dead []string
	var keys []int64
	defer func() {
		if len(keys) > 0 {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			for _, k := range keys {
				_, _ = s.lockConn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, k)
			}
		}
	}()
	for _, id := range ids {
		var ok bool
		k := s.lockKey(id)
		if err := s.lockConn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, k).Scan(&ok); err != nil {
			return nil, fmt.Errorf("store: recover: %w", err)
		}
		if ok {
			dead = append(dead, id)
			keys = append(keys, k)
		}
	}
	if len(dead) == 0 {
		return nil, nil
	}
	var out []Record
	err = s.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		out = nil
		rows, err := tx.Query(ctx, `SELECT run, step FROM pending WHERE instance = ANY($1) ORDER BY run, step`, dead)
		if err != nil {
			return fmt.Errorf("store: recover: %w", err)
		}
		type key struct {
			run  string
			step int64
		}
		todo, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (key, error) {
			var k key
			return k, r.Scan(&k.run, &k.step)
		})
		if err != nil {
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

// ClaimKey implements Store. The claim is one INSERT ... ON CONFLICT DO NOTHING against the
// key's PRIMARY KEY, so of concurrent claims from any number of replicas exactly one wins.
func (s *Postgres) ClaimKey(ctx context.Context, key, run string, step int64) (bool, KeyHolder, error) {
	if key == "" {
		return false, KeyHolder{}, fmt.Errorf("%w: empty duplicate-call key", ErrInvalid)
	}
	for attempt := 0; ; attempt++ {
		now := s.stamp()
		tag, err := s.exec(ctx, `INSERT INTO dup_keys (key, run, step, claimed) VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING`,
			[]byte(key), run, step, tn(now))
		if err != nil {
			return false, KeyHolder{}, fmt.Errorf("store: claim key: %w", err)
		}
		if tag.RowsAffected() == 1 {
			return true, KeyHolder{Key: key, Run: run, Step: step, Claimed: now}, nil
		}
		h, ok, err := s.HeldKey(ctx, key)
		if err != nil {
			return false, KeyHolder{}, fmt.Errorf("store: claim key: %w", err)
		}
		if ok {
			return false, h, nil
		}
		// released between the INSERT and the read: claim again
		if attempt == 10 {
			return false, KeyHolder{}, fmt.Errorf("store: claim key %q: claimed and released 10 times while claiming; try again", key)
		}
	}
}

// ReleaseKey implements Store.
func (s *Postgres) ReleaseKey(ctx context.Context, key string) error {
	if _, err := s.exec(ctx, `DELETE FROM dup_keys WHERE key = $1`, []byte(key)); err != nil {
		return fmt.Errorf("store: release key: %w", err)
	}
	return nil
}

// CreateApproval implements Store.
func (s *Postgres) CreateApproval(ctx context.Context, req ApprovalRequest) (Approval, error) {
	a, err := prepareApproval(req, s.stamp())
	if err != nil {
		return Approval{}, err
	}
	tag, err := s.exec(ctx, `INSERT INTO approvals (`+approvalCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)
		ON CONFLICT DO NOTHING`, approvalArgs(&a)...)
	if err != nil {
		return Approval{}, fmt.Errorf("store: create approval: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return Approval{}, fmt.Errorf("%w: approval %s", ErrExists, a.ID)
	}
	return a, nil
}

// GetApproval implements Store.
func (s *Postgres) GetApproval(ctx context.Context, id string) (Approval, error) {
	if err := s.check(); err != nil {
		return Approval{}, err
	}
	a, err := scanApproval(s.pool.QueryRow(ctx, `SELECT `+approvalCols+` FROM approvals WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Approval{}, fmt.Errorf("%w: approval %s", ErrNotFound, id)
	}
	if err != nil {
		return Approval{}, fmt.Errorf("store: get approval: %w", err)
	}
	a.settle(s.now())
	return a, nil
}

// ListApprovals implements Store. The state filter applies after expiry, so it is evaluated
// in Go.
func (s *Postgres) ListApprovals(ctx context.Context, f ApprovalFilter) ([]Approval, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT `+approvalCols+` FROM approvals WHERE ($1 = '' OR run = $1) ORDER BY created, id`, f.Run)
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
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list approvals: %w", err)
	}
	return out, nil
}

// Decide implements Store: the request is read FOR UPDATE, decided and written back, and the
// decision records appended, in one transaction (decideRow), so decisions from several
// replicas at once are applied one after another.
func (s *Postgres) Decide(ctx context.Context, id string, d Decision) (Approval, error) {
	var out Approval
	var ruleErr error
	err := s.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		out, ruleErr, err = decideRow(id, d, s.stamp(),
			func() (Approval, error) { return s.readApprovalTx(ctx, tx, id) },
			func(a *Approval) error {
				args := approvalArgs(a)
				_, err := tx.Exec(ctx, `UPDATE approvals SET roles = $1, expires = $2, state = $3, decisions = $4,
					escalated = $5, decided = $6 WHERE id = $7`, args[5], args[8], args[12], args[13], args[14], args[15], id)
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
		AND table_name IN ('runs', 'records', 'pending', 'dup_keys', 'approvals')`, schema).Scan(&n)
	if err != nil {
		return schema, false, fmt.Errorf("store: postgres: %w", err)
	}
	return schema, n == 5, nil
}
