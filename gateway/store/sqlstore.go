package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// sqlStore is the Store that SQLite, Memory and Postgres share: every statement, check and
// error of runs, the ledger, duplicate-call keys, approvals, high-water marks, search and
// Recover is written here once. What differs sits behind three seams:
//   - dialect: SQL that is not portable (types, row locks) and the driver's typed errors;
//   - runner: how a write transaction runs (SQLite: one writer with group commit; Postgres:
//     concurrent transactions under row locks) and what makes it durable;
//   - instances: how a store tells live peers from gone ones for Recover (SQLite: lock
//     files; Postgres: advisory locks; Memory: there are none).
type sqlStore struct {
	d        *dialect
	r        querier // reads
	w        runner  // writes
	inst     instances
	instance string // this store's instance id, recorded with every intent it writes
	now      Clock
	closed   atomic.Bool
	// ob is the notification outbox's router and wake channel (notifications.go).
	ob outbox
	// release frees what the implementation holds beyond the runner and the instances (its
	// connection pools); Close calls it last.
	release func() error
}

// txFunc is the body of a write transaction. ctx is not cancelled by the caller (a write that
// has started runs to its end, so its answer matches what is committed).
type txFunc func(ctx context.Context, tx querier) error

// how says how a write is committed: durable or lazy, and whether it is one statement.
type how uint8

const (
	// durable: on disk (fsynced, or flushed to the server's WAL) when the write returns.
	durable how = 0
	// lazy: committed when the write returns (it survives a crash of the process), on disk
	// with the next durable write or within a bound (see Store).
	lazy how = 1 << 0
	// single: fn writes by exactly one statement, which is atomic by itself: the runner may
	// run it outside a transaction of its own (one statement to the database instead of
	// three). A read that only explains the statement's failure may follow it.
	single how = 1 << 1
)

func (h how) isLazy() bool   { return h&lazy != 0 }
func (h how) isSingle() bool { return h&single != 0 }

// stmt is one statement of a write: query with its args, and read, which takes what running
// it gave (rows, or the error instead) and closes the rows.
type stmt struct {
	query string
	args  []any
	read  func(r rows, err error) error
}

// exec runs st on tx.
func (st stmt) exec(ctx context.Context, tx querier) error {
	return st.read(tx.query(ctx, st.query, st.args...))
}

// batchable is a write of one statement of run that a runner may send together with the
// writes it holds, in one round trip (Postgres: pgRunner): stmt makes the statement when it
// is sent (its time stamp is taken then), fn runs the write by itself (and tells its errors
// apart, which a statement's empty answer may not).
type batchable struct {
	run  string
	stmt func() stmt
	fn   txFunc
}

// runner runs write transactions.
type runner interface {
	// run runs fn in a transaction and commits it. A caller whose ctx is done before fn starts
	// writes nothing and gets ctx's error; fn's error rolls back fn's writes only and is
	// returned as it is.
	run(ctx context.Context, h how, fn txFunc) error
	// runBatchable is run(ctx, h|single, w.fn), except that a runner holding queued writes
	// may commit them and w in one transaction (the previous calls' outcomes with an intent).
	runBatchable(ctx context.Context, h how, w batchable) error
	// enqueue adds w as a queued write (lazy and single) and returns without waiting: w joins
	// the runner's next write, or commits by itself within queuedDelay. done gets w's answer
	// once committed; it runs on the goroutine that commits and must not call the store.
	// Errors: ErrClosed.
	enqueue(ctx context.Context, w batchable, done func(error)) error
	// flush returns once every write queued before it is answered (reads call it first), or
	// with ctx's error.
	flush(ctx context.Context) error
	// close stops the runner; later runs fail. Lazy commits are made durable first.
	close() error
}

// instances knows which store instances (processes) on the same data are alive.
type instances interface {
	// usable returns an error while this instance may not write intents (Postgres: its lock
	// is lost, so a peer may be recovering its steps).
	usable() error
	// lockDead returns, of ids (the instances that have intents without an outcome), those
	// whose process is gone, and holds them so that no other peer recovers them too until
	// release is called (after the recovering write committed).
	lockDead(ctx context.Context, ids []string) (dead map[string]bool, release func(), err error)
	// close releases this instance (its peers may then recover its intents).
	close() error
}

var _ Store = (*sqlStore)(nil)

func (s *sqlStore) check() error {
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}

// stamp is now at nanosecond precision in UTC, as read back from the database.
func (s *sqlStore) stamp() time.Time { return nt(s.now().UnixNano()) }

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

// write runs fn as one write transaction (see runner.run).
func (s *sqlStore) write(ctx context.Context, h how, fn txFunc) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.w.run(ctx, h, fn)
}

// writeBatchable runs w, a write of one statement (see runner.runBatchable).
func (s *sqlStore) writeBatchable(ctx context.Context, h how, w batchable) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.w.runBatchable(ctx, h|single, w)
}

// Close implements Store: the runner stops (lazy commits made durable), the instance is
// released, the connections close. Later calls return ErrClosed.
func (s *sqlStore) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	errs := []error{s.w.close()}
	if s.release != nil {
		errs = append(errs, s.release())
	}
	return errors.Join(append(errs, s.inst.close())...)
}

// query builds a statement with numbered parameters.
type query struct {
	sql  strings.Builder
	args []any
}

// arg adds a parameter and returns its placeholder ($n; it may be used more than once).
func (q *query) arg(v any) string {
	q.args = append(q.args, v)
	return "$" + strconv.Itoa(len(q.args))
}

func (q *query) add(parts ...string) *query {
	for _, p := range parts {
		q.sql.WriteString(p)
	}
	return q
}

// limit adds LIMIT n when n > 0 (no limit otherwise).
func (q *query) limit(n int) *query {
	if n > 0 {
		q.add(` LIMIT `, q.arg(int64(n)))
	}
	return q
}

// placeholders returns "$k, $k+1, ..." for vs, added as parameters.
func (q *query) placeholders(vs []string) string {
	ps := make([]string, len(vs))
	for i, v := range vs {
		ps[i] = q.arg(v)
	}
	return strings.Join(ps, ", ")
}

// Runs.

// runCols are the columns scanRun reads: the last one is the time of the run's last record,
// which is its last activity unless ContinueRun came later (appending a record does not write
// the run's row: one page less in every commit).
const runCols = `id, actor, gateway, started, last_activity, status, environment,
	coalesce((SELECT r.time FROM records r WHERE r.run = runs.id ORDER BY r.seq DESC LIMIT 1), 0)`

func scanRun(sc interface{ Scan(...any) error }) (Run, error) {
	var r Run
	var started, last, record int64
	var status string
	if err := sc.Scan(&r.ID, &r.Actor, &r.Gateway, &started, &last, &status, &r.Environment, &record); err != nil {
		return Run{}, err
	}
	r.Started, r.LastActivity, r.Status = nt(started), nt(max(last, record)), RunStatus(status)
	return r, nil
}

func (s *sqlStore) queryRuns(ctx context.Context, what string, q *query) ([]Run, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return collect(ctx, s.r, what, q.sql.String(), q.args, func(rows rows) (Run, error) { return scanRun(rows) })
}

func validRunStatus(s RunStatus) bool {
	return s == RunActive || s == RunIdle || s == RunClosed
}

// CreateRun implements Store.
func (s *sqlStore) CreateRun(ctx context.Context, r Run) (Run, error) {
	if r.Actor == "" {
		return Run{}, fmt.Errorf("%w: a run needs an actor", ErrInvalid)
	}
	if r.ID == "" {
		r.ID = newID("run-")
	}
	now := s.stamp()
	r.Started, r.LastActivity, r.Status = now, now, RunActive
	err := s.insertNew(ctx, "run "+r.ID, `INSERT INTO runs (id, actor, gateway, started, last_activity, status, environment)
		VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING`,
		r.ID, r.Actor, r.Gateway, tn(now), tn(now), string(r.Status), r.Environment)
	if err != nil {
		return Run{}, err
	}
	return r, nil
}

// insertNew runs one durable INSERT ... ON CONFLICT DO NOTHING of what: no row inserted means
// it exists (ErrExists).
func (s *sqlStore) insertNew(ctx context.Context, what, insert string, args ...any) error {
	return s.write(ctx, durable|single, func(ctx context.Context, tx querier) error {
		n, err := tx.exec(ctx, insert, args...)
		if err != nil {
			return fmt.Errorf("store: create %s: %w", what, err)
		}
		if n == 0 {
			return fmt.Errorf("%w: %s", ErrExists, what)
		}
		return nil
	})
}

// GetRun implements Store.
func (s *sqlStore) GetRun(ctx context.Context, id string) (Run, error) {
	if err := s.check(); err != nil {
		return Run{}, err
	}
	if id == GatewayJournal {
		return Run{}, fmt.Errorf("%w: run %q", ErrNotFound, id)
	}
	r, err := scanRun(queryRow(ctx, s.r, `SELECT `+runCols+` FROM runs WHERE id = $1`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Run{}, fmt.Errorf("%w: run %q", ErrNotFound, id)
	}
	if err != nil {
		return Run{}, fmt.Errorf("store: get run: %w", err)
	}
	return r, nil
}

// ListRuns implements Store.
func (s *sqlStore) ListRuns(ctx context.Context, f RunFilter) ([]Run, error) {
	q := &query{}
	actor, gateway, status := q.arg(f.Actor), q.arg(f.Gateway), q.arg(string(f.Status))
	q.add(`SELECT `+runCols+` FROM runs WHERE id <> '' AND (`, actor, ` = '' OR actor = `, actor, `) AND (`,
		gateway, ` = '' OR gateway = `, gateway, `) AND (`, status, ` = '' OR status = `, status, `) ORDER BY started DESC, id`)
	return s.queryRuns(ctx, "list runs", q.limit(f.Limit))
}

// ContinueRun implements Store.
func (s *sqlStore) ContinueRun(ctx context.Context, id, actor string) (Run, error) {
	var r Run
	err := s.write(ctx, durable, func(ctx context.Context, tx querier) error {
		var err error
		r, err = scanRun(queryRow(ctx, tx, `SELECT `+runCols+` FROM runs WHERE id = $1 AND id <> ''`+s.d.forUpdate, id))
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
		if _, err := tx.exec(ctx, `UPDATE runs SET last_activity = $1, status = $2 WHERE id = $3`, tn(r.LastActivity), string(r.Status), id); err != nil {
			return fmt.Errorf("store: continue run: %w", err)
		}
		return nil
	})
	if err != nil {
		return Run{}, err
	}
	return r, nil
}

// SetRunStatus implements Store.
func (s *sqlStore) SetRunStatus(ctx context.Context, id string, status RunStatus) error {
	if !validRunStatus(status) {
		return fmt.Errorf("%w: run status %q", ErrInvalid, status)
	}
	return s.write(ctx, lazy|single, func(ctx context.Context, tx querier) error {
		n, err := tx.exec(ctx, `UPDATE runs SET status = $1 WHERE id = $2 AND id <> ''`, string(status), id)
		if err != nil {
			return fmt.Errorf("store: set run status: %w", err)
		}
		if n == 0 {
			return fmt.Errorf("%w: run %q", ErrNotFound, id)
		}
		return nil
	})
}

// The ledger.

const recordCols = `run, seq, kind, time, step, tool, args_digest, reason, idempotency_key, manifest_version,
	manifest_checksum, mode, decision, status, compensation_tool, handle, note, approval, event, approver, groups`

// scanSeq reads the Seq a numbered insert returns: no row means no run (ErrNotFound). A
// unique violation is the backstop of a decision record whose Once key is in the run
// (ErrExists, see appendApprovalTx).
func (s *sqlStore) scanSeq(row *oneRow, rec *Record, dest ...any) error {
	err := row.Scan(append([]any{&rec.Seq}, dest...)...)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: run %q", ErrNotFound, rec.Run)
	case s.d.unique(err) && rec.Kind == KindApproval:
		return onceExists(rec)
	}
	return fmt.Errorf("store: append: %w", err)
}

// appendTx numbers rec in its run and inserts it (not an intent or an outcome: those have
// statements of their own); handle is its Handle as JSON. Errors: ErrNotFound (no run).
func (s *sqlStore) appendTx(ctx context.Context, tx querier, rec *Record, handle string) error {
	rec.Time = s.stamp()
	return s.scanSeq(queryRow(ctx, tx, s.d.insertRecord, rec.Run, string(rec.Kind), tn(rec.Time), rec.Step, rec.Tool,
		rec.ArgsDigest, rec.Reason, s.d.key(rec.IdempotencyKey), rec.ManifestVersion, rec.ManifestChecksum, rec.Mode,
		rec.Decision, string(rec.Status), rec.CompensationTool, handle, rec.Note, rec.Approval, string(rec.Event),
		rec.Approver, encodeGroups(rec.Groups)), rec)
}

// intentRecord is the record of in (Seq and Time are set when appended).
func intentRecord(in Intent) Record {
	return Record{Run: in.Run, Kind: KindIntent, Tool: in.Tool, ArgsDigest: in.ArgsDigest,
		Reason: in.Reason, IdempotencyKey: in.IdempotencyKey, ManifestVersion: in.ManifestVersion,
		ManifestChecksum: in.ManifestChecksum, Mode: in.Mode, Decision: in.Decision, Approval: in.Approval}
}

func validIntent(in Intent) error {
	if in.Run == GatewayJournal || in.Tool == "" {
		return fmt.Errorf("%w: an intent needs a run and a tool", ErrInvalid)
	}
	return nil
}

// RecordIntent implements Store: one statement (numbered insert of the open intent) unless
// the intent consumes an approval or binds a key. With in.Approval, the approval is consumed
// in the intent's transaction (consumeTx) before the run is numbered (every writer of both
// locks the request before the run). It fails while this instance may not write intents
// (instances.usable).
func (s *sqlStore) RecordIntent(ctx context.Context, in Intent) (int64, error) {
	if err := validIntent(in); err != nil {
		return 0, err
	}
	if err := s.check(); err != nil {
		return 0, err
	}
	if err := s.inst.usable(); err != nil {
		return 0, err
	}
	holds := in.HoldsKey && in.IdempotencyKey != ""
	var rec Record
	insert := func() stmt {
		rec = intentRecord(in)
		rec.Time = s.stamp()
		return stmt{query: s.d.insertIntent, args: []any{in.Run, tn(rec.Time), in.Tool, in.ArgsDigest, in.Reason,
			s.d.key(in.IdempotencyKey), in.ManifestVersion, in.ManifestChecksum, in.Mode, in.Decision, in.Approval, s.instance},
			read: func(r rows, err error) error { return s.scanSeq(&oneRow{rows: r, err: err}, &rec) }}
	}
	if in.Approval == "" && !holds {
		err := s.writeBatchable(ctx, durable, batchable{run: in.Run, stmt: insert,
			fn: func(ctx context.Context, tx querier) error { return insert().exec(ctx, tx) }})
		if err != nil {
			return 0, err
		}
		return rec.Seq, nil
	}
	err := s.write(ctx, durable, func(ctx context.Context, tx querier) error {
		var a *Approval
		if in.Approval != "" {
			var err error
			if a, err = s.consumeTx(ctx, tx, in.Approval, in.Run, in.Tool, in.ArgsDigest, false); err != nil {
				return err
			}
		}
		if err := insert().exec(ctx, tx); err != nil {
			return err
		}
		if holds {
			if _, err := tx.exec(ctx, `UPDATE dup_keys SET step = $1 WHERE key = $2 AND run = $3 AND step = 0`,
				rec.Seq, s.d.key(in.IdempotencyKey), in.Run); err != nil {
				return fmt.Errorf("store: record intent: %w", err)
			}
		}
		if a != nil {
			c, _, _ := approvalRecord(consumedRecord(a, rec.Seq))
			return s.appendTx(ctx, tx, &c, "")
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return rec.Seq, nil
}

// outcomeTx completes step: the outcome is numbered (taking the run first, as every writer
// does) and inserted only if the step is an open intent, and the intent is closed, by one
// statement (the dialect's insertOutcome): of concurrent outcomes of a step (Postgres
// replicas: the second waits for the first's run lock, then finds the intent closed) exactly
// one commits. Errors: ErrNotFound (no run or no such intent), ErrCompleted.
func (s *sqlStore) outcomeTx(ctx context.Context, tx querier, run string, step int64, o StepOutcome, handle string) (Record, error) {
	var rec Record
	err := s.outcomeStmt(run, step, o, handle, &rec).exec(ctx, tx)
	if s.d.outcomeRace != nil && s.d.outcomeRace(err) {
		return Record{}, fmt.Errorf("%w: step %d in run %s", ErrCompleted, step, run)
	}
	if errors.Is(err, sql.ErrNoRows) {
		var open int
		err := queryRow(ctx, tx, `SELECT open FROM records WHERE run = $1 AND seq = $2 AND kind = 'intent'`, run, step).Scan(&open)
		if err == nil {
			return Record{}, fmt.Errorf("%w: step %d in run %s", ErrCompleted, step, run)
		}
		return Record{}, fmt.Errorf("%w: step %d in run %q", ErrNotFound, step, run)
	}
	if err != nil {
		return Record{}, fmt.Errorf("store: outcome: %w", err)
	}
	return rec, nil // Handle unset: only Recover reads the record back, whose outcomes have none
}

// outcomeStmt is outcomeTx's statement (the dialect's insertOutcome), stamped now; its read
// sets rec to the outcome (Seq and Tool from the row of kind 'outcome': where the statement
// closes the intent too, it returns the intent's row as well), or returns sql.ErrNoRows when
// no outcome was inserted.
func (s *sqlStore) outcomeStmt(run string, step int64, o StepOutcome, handle string, rec *Record) stmt {
	*rec = Record{Run: run, Kind: KindOutcome, Step: step, Status: o.Status, CompensationTool: o.CompensationTool, Note: o.Note,
		Time: s.stamp()}
	return stmt{query: s.d.insertOutcome, args: []any{run, tn(rec.Time), step, string(o.Status), o.CompensationTool, handle, o.Note},
		read: func(r rows, err error) error { return readOutcome(r, err, rec) }}
}

// readOutcome is outcomeStmt's read.
func readOutcome(r rows, err error, rec *Record) error {
	if err != nil {
		return err
	}
	defer r.Close()
	found := false
	for r.Next() { // one or two rows
		var seq int64
		var tool, kind string
		if err := r.Scan(&seq, &tool, &kind); err != nil {
			return err
		}
		if Kind(kind) == KindOutcome {
			rec.Seq, rec.Tool, found = seq, tool, true
		}
	}
	if err := r.Err(); err != nil {
		return err
	}
	if err := r.Close(); err != nil {
		return err
	}
	if !found {
		return sql.ErrNoRows
	}
	return nil
}

// RecordOutcome implements Store.
func (s *sqlStore) RecordOutcome(ctx context.Context, run string, step int64, o StepOutcome) (int64, error) {
	enc, err := encodeHandle(o)
	if err != nil {
		return 0, err
	}
	var rec Record
	err = s.write(ctx, lazy|single, func(ctx context.Context, tx querier) error {
		var err error
		rec, err = s.outcomeTx(ctx, tx, run, step, o, enc)
		return err
	})
	return rec.Seq, err
}

// QueueOutcome implements Store: the runner holds the outcome for its next write (enqueue).
func (s *sqlStore) QueueOutcome(ctx context.Context, run string, step int64, o StepOutcome, done func(seq int64, err error)) {
	if done == nil {
		done = func(int64, error) {}
	}
	enc, err := encodeHandle(o)
	if err == nil {
		err = s.check()
	}
	if err != nil {
		done(0, err)
		return
	}
	var rec Record
	w := batchable{run: run,
		stmt: func() stmt { return s.outcomeStmt(run, step, o, enc, &rec) },
		fn: func(ctx context.Context, tx querier) error {
			var err error
			rec, err = s.outcomeTx(ctx, tx, run, step, o, enc)
			return err
		}}
	if err := s.w.enqueue(ctx, w, func(err error) { done(rec.Seq, err) }); err != nil {
		done(0, err)
	}
}

// AppendEvent implements Store.
func (s *sqlStore) AppendEvent(ctx context.Context, e Event) (int64, error) {
	if err := checkEvent(e); err != nil {
		return 0, err
	}
	if e.Alert == nil {
		var seq int64
		err := s.write(ctx, lazy|single, func(ctx context.Context, tx querier) error {
			rec := e.record()
			err := s.appendTx(ctx, tx, &rec, "")
			seq = rec.Seq
			return err
		})
		return seq, err
	}
	if !IsAlert(e.Alert.Type) {
		return 0, fmt.Errorf("%w: alert type %q", ErrInvalid, e.Alert.Type)
	}
	// The record and its alert's notifications commit together (issue 24).
	var seq int64
	var wrote bool
	err := s.write(ctx, lazy, func(ctx context.Context, tx querier) error {
		rec := e.record()
		if err := s.appendTx(ctx, tx, &rec, ""); err != nil {
			return err
		}
		seq = rec.Seq
		var err error
		wrote, err = s.alertTx(ctx, tx, *e.Alert, &rec)
		return err
	})
	if err != nil {
		return 0, err
	}
	if wrote {
		s.ob.signal()
	}
	return seq, nil
}

// encodeHandle checks that o is storable and returns the handle as JSON ("" for none).
func encodeHandle(o StepOutcome) (string, error) {
	if !validStatus(o.Status) {
		return "", fmt.Errorf("%w: outcome %q", ErrInvalid, o.Status)
	}
	return jsonColumn(o.Handle, "the compensation handle")
}

// jsonColumn is m as JSON ("" for nil). Errors: ErrInvalid naming what, when m does not encode.
func jsonColumn(m map[string]any, what string) (string, error) {
	if m == nil {
		return "", nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("%w: %s is not JSON: %v", ErrInvalid, what, err)
	}
	return string(b), nil
}

func decodeHandle(s string) (map[string]any, error) {
	if s == "" {
		return nil, nil
	}
	var h map[string]any
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil, fmt.Errorf("store: a stored compensation handle is not JSON: %w", err)
	}
	return h, nil
}

// queryRecords runs q, whose columns are recordCols.
func (s *sqlStore) queryRecords(ctx context.Context, what string, q *query) ([]Record, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return collect(ctx, s.r, what, q.sql.String(), q.args, scanRecord)
}

// scanRecord reads a row of recordCols.
func scanRecord(rows rows) (Record, error) {
	var r Record
	var kind, status, handle, event, groups string
	var key []byte
	var t int64
	if err := rows.Scan(&r.Run, &r.Seq, &kind, &t, &r.Step, &r.Tool, &r.ArgsDigest, &r.Reason, &key,
		&r.ManifestVersion, &r.ManifestChecksum, &r.Mode, &r.Decision, &status, &r.CompensationTool, &handle, &r.Note,
		&r.Approval, &event, &r.Approver, &groups); err != nil {
		return Record{}, err
	}
	r.Kind, r.Status, r.Time, r.IdempotencyKey, r.Event = Kind(kind), Status(status), nt(t), string(key), ApprovalEvent(event)
	var err error
	if r.Handle, err = decodeHandle(handle); err != nil {
		return Record{}, err
	}
	if r.Groups, err = decodeGroups(groups); err != nil {
		return Record{}, err
	}
	return r, nil
}

// Records implements Store.
func (s *sqlStore) Records(ctx context.Context, run string, after int64, limit int) ([]Record, error) {
	q := &query{}
	q.add(`SELECT `+recordCols+` FROM records WHERE run = `, q.arg(run), ` AND seq > `, q.arg(after), ` ORDER BY seq`)
	return s.queryRecords(ctx, "read records", q.limit(limit))
}

// PendingSteps implements Store.
func (s *sqlStore) PendingSteps(ctx context.Context, run string) ([]Record, error) {
	q := &query{}
	q.add(`SELECT `+recordCols+` FROM records WHERE run = `, q.arg(run), ` AND kind = 'intent' AND open = 1 ORDER BY seq`)
	return s.queryRecords(ctx, "pending steps", q)
}

// Recover implements Store: it completes the intents of every instance that lockDead finds
// gone, holding those instances until its transaction has committed, so that two peers
// recovering at once never both complete one intent.
func (s *sqlStore) Recover(ctx context.Context) ([]Record, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	ids, err := collect(ctx, s.r, "recover", `SELECT DISTINCT instance FROM records WHERE open = 1`, nil, func(rows rows) (id string, err error) {
		err = rows.Scan(&id)
		return id, err
	})
	if err != nil {
		return nil, err
	}
	dead, release, err := s.inst.lockDead(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("store: recover: %w", err)
	}
	defer release() // after the write: a dead instance stays locked until its intents are completed
	if len(dead) == 0 {
		return nil, nil
	}
	var out []Record
	err = s.write(ctx, durable, func(ctx context.Context, tx querier) error {
		out = nil
		type step struct {
			run, instance string
			step          int64
		}
		pending, err := collect(ctx, tx, "recover", `SELECT run, seq, instance FROM records WHERE open = 1 ORDER BY run, seq`, nil,
			func(rows rows) (p step, err error) {
				err = rows.Scan(&p.run, &p.step, &p.instance)
				return p, err
			})
		if err != nil {
			return err
		}
		for _, p := range pending {
			if !dead[p.instance] {
				continue
			}
			rec, err := s.outcomeTx(ctx, tx, p.run, p.step, StepOutcome{Status: Uncertain, Note: RecoveryNote}, "")
			if err != nil {
				return err
			}
			out = append(out, rec)
		}
		return nil
	})
	return out, err
}

// Duplicate-call keys.

// claimAttempts bounds ClaimKey's retries when a key is released between its claim and the
// read of its holder (Postgres replicas).
const claimAttempts = 10

// ClaimKey implements Store. The claim is one INSERT ... ON CONFLICT DO NOTHING against the
// key's primary key, so of concurrent claims (of any number of replicas) exactly one wins; a
// loser reads the holder, and claims again if the key was released in between.
func (s *sqlStore) ClaimKey(ctx context.Context, key, run string, step int64) (bool, KeyHolder, error) {
	if key == "" {
		return false, KeyHolder{}, fmt.Errorf("%w: empty duplicate-call key", ErrInvalid)
	}
	for range claimAttempts {
		now := s.stamp()
		var won bool
		err := s.write(ctx, durable|single, func(ctx context.Context, tx querier) error {
			n, err := tx.exec(ctx, `INSERT INTO dup_keys (key, run, step, claimed) VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING`,
				s.d.key(key), run, step, tn(now))
			if err != nil {
				return fmt.Errorf("store: claim key: %w", err)
			}
			won = n == 1
			return nil
		})
		if err != nil {
			return false, KeyHolder{}, err
		}
		if won {
			return true, KeyHolder{Key: key, Run: run, Step: step, Claimed: now}, nil
		}
		h, found, err := s.HeldKey(ctx, key)
		if err != nil || found {
			return false, h, err
		}
		// released between the INSERT and the read: claim again
	}
	return false, KeyHolder{}, fmt.Errorf("store: claim key %q: claimed and released %d times while claiming; try again", key, claimAttempts)
}

// ReleaseKey implements Store.
func (s *sqlStore) ReleaseKey(ctx context.Context, key string) error {
	return s.write(ctx, lazy|single, func(ctx context.Context, tx querier) error {
		if _, err := tx.exec(ctx, `DELETE FROM dup_keys WHERE key = $1`, s.d.key(key)); err != nil {
			return fmt.Errorf("store: release key: %w", err)
		}
		return nil
	})
}

// HeldKey implements Store.
func (s *sqlStore) HeldKey(ctx context.Context, key string) (KeyHolder, bool, error) {
	if err := s.check(); err != nil {
		return KeyHolder{}, false, err
	}
	h := KeyHolder{Key: key}
	var claimed int64
	err := queryRow(ctx, s.r, `SELECT run, step, claimed FROM dup_keys WHERE key = $1`, s.d.key(key)).Scan(&h.Run, &h.Step, &claimed)
	if errors.Is(err, sql.ErrNoRows) {
		return KeyHolder{}, false, nil
	}
	if err != nil {
		return KeyHolder{}, false, fmt.Errorf("store: read key: %w", err)
	}
	h.Claimed = nt(claimed)
	return h, true, nil
}
