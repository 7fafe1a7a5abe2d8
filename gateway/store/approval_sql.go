package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
)

// The approval queue and its decision records in SQL (sqlStore). Source: issue 16
// (consumption in the intent's transaction, decision records).

const approvalCols = `id, run, tool, args_digest, actor, roles, quorum, created, expires, on_timeout, escalate_to,
	reason, state, decisions, escalated, decided, consumed, actor_uid, actor_email, uid, spec_digest, args_preview, risk`

func scanApproval(sc interface{ Scan(...any) error }) (Approval, error) {
	var a Approval
	var roles, escalate, decisions, state, risk string
	var created, expires, decided, consumed int64
	if err := sc.Scan(&a.ID, &a.Run, &a.Tool, &a.ArgsDigest, &a.Actor, &roles, &a.Quorum, &created, &expires,
		&a.OnTimeout, &escalate, &a.Reason, &state, &decisions, &a.Escalated, &decided, &consumed,
		&a.ActorUID, &a.ActorEmail, &a.UID, &a.SpecDigest, &a.ArgsPreview, &risk); err != nil {
		return Approval{}, err
	}
	if risk != "" {
		if err := json.Unmarshal([]byte(risk), &a.Risk); err != nil {
			return Approval{}, fmt.Errorf("store: approval %s: risk: %w", a.ID, err)
		}
	}
	a.State = ApprovalState(state)
	a.Created, a.Expires, a.Decided, a.Consumed = nt(created), nt(expires), nt(decided), nt(consumed)
	for _, f := range []struct {
		s string
		v any
	}{{roles, &a.Roles}, {escalate, &a.EscalateTo}, {decisions, &a.Decisions}} {
		if err := json.Unmarshal([]byte(f.s), f.v); err != nil {
			return Approval{}, fmt.Errorf("store: approval %s: %w", a.ID, err)
		}
	}
	return a, nil
}

// approvalArgs are a's columns in approvalCols order (indexes 5 roles, 8 expires, 12 state,
// 13 decisions, 14 escalated, 15 decided, 16 consumed are used by updates).
func approvalArgs(a *Approval) []any {
	j := func(v any) string {
		b, _ := json.Marshal(v) // slices of strings and Decisions always encode
		return string(b)
	}
	return []any{a.ID, a.Run, a.Tool, a.ArgsDigest, a.Actor, j(a.Roles), a.Quorum, tn(a.Created), tn(a.Expires),
		a.OnTimeout, j(a.EscalateTo), a.Reason, string(a.State), j(a.Decisions), a.Escalated, tn(a.Decided), tn(a.Consumed),
		a.ActorUID, a.ActorEmail, a.UID, a.SpecDigest, a.ArgsPreview, riskColumn(a.Risk)}
}

// riskColumn is the risk column: "" for none, else JSON.
func riskColumn(r Risk) string {
	if r == (Risk{}) {
		return ""
	}
	b, _ := json.Marshal(r) // strings always encode
	return string(b)
}

// encodeGroups is the groups column ("" for none).
func encodeGroups(g []string) string {
	if len(g) == 0 {
		return ""
	}
	b, _ := json.Marshal(g)
	return string(b)
}

// onceExists is the ErrExists of a decision record whose Once key is already in its run.
func onceExists(rec *Record) error {
	return fmt.Errorf("%w: the record %s of %s is already in run %q", ErrExists, rec.IdempotencyKey, rec.Approval, rec.Run)
}

// consumeTx consumes approval id for a write of (run, tool, argsDigest) inside tx: the row is
// read (held until tx ends where replicas write concurrently: dialect.forUpdate),
// Approval.consume checks it, and a conditional UPDATE (consumed = 0) writes the mark. Zero
// rows affected means another transaction consumed it between the read and the write
// (Postgres replicas at READ COMMITTED): ErrConsumed, so of concurrent consumers exactly one
// wins whatever the isolation. rollback: an already consumed approval is not an error
// (RollbackEntry.Approval) and nothing is written. Errors: ErrNotFound, ErrMismatch,
// ErrNotApproved, ErrConsumed.
func (s *sqlStore) consumeTx(ctx context.Context, tx querier, id, run, tool, argsDigest string, rollback bool) (*Approval, error) {
	now := s.stamp()
	a, err := s.readApprovalTx(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	if err := a.consume(run, tool, argsDigest, now); err != nil {
		if rollback && errors.Is(err, ErrConsumed) {
			return &a, nil
		}
		return nil, err
	}
	n, err := tx.exec(ctx, `UPDATE approvals SET consumed = $1 WHERE id = $2 AND consumed = 0`, tn(a.Consumed), id)
	if err != nil {
		return nil, fmt.Errorf("store: consume approval %s: %w", id, err)
	}
	if n == 0 {
		if rollback {
			return &a, nil
		}
		return nil, consumedError(id, now)
	}
	return &a, nil
}

// readApprovalTx reads request id in tx (see consumeTx for the lock). Errors: ErrNotFound.
func (s *sqlStore) readApprovalTx(ctx context.Context, tx querier, id string) (Approval, error) {
	a, err := scanApproval(queryRow(ctx, tx, `SELECT `+approvalCols+` FROM approvals WHERE id = $1`+s.d.forUpdate, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Approval{}, fmt.Errorf("%w: approval %s", ErrNotFound, id)
	}
	if err != nil {
		return Approval{}, fmt.Errorf("store: approval %s: %w", id, err)
	}
	return a, nil
}

// AppendApproval implements Store.
func (s *sqlStore) AppendApproval(ctx context.Context, ar ApprovalRecord) (int64, error) {
	rec, _, err := approvalRecord(ar)
	if err != nil {
		return 0, err
	}
	var wrote bool
	err = s.write(ctx, lazy, func(ctx context.Context, tx querier) error {
		wrote = false
		if err := s.appendApprovalTx(ctx, tx, &rec); err != nil {
			return err
		}
		var err error
		wrote, err = s.keptPhaseNoticeTx(ctx, tx, ar)
		return err
	})
	if wrote {
		s.ob.signal()
	}
	return rec.Seq, err
}

// keptPhaseNoticeTx announces, in the transaction of its record, the phase a request kept in
// Kubernetes reached (issue 24): such a request is decided by the controller, not by Decide
// or SettleApprovals, and the gateway's queue (gateway/kube) journals the phase it reads as a
// decision record with a Once key ("phase/approved"), once per run. The notice is the
// request's as recorded here, decided by the approvers whose counted records the run has. A
// request this store decides, a record without a Once key or of another event writes
// nothing here.
func (s *sqlStore) keptPhaseNoticeTx(ctx context.Context, tx querier, r ApprovalRecord) (bool, error) {
	typ, ok := noticeOfEvent[r.Event]
	if !ok || r.Once == "" {
		return false, nil
	}
	a, err := s.readApprovalTx(ctx, tx, r.Request)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil || !a.Kept() || a.Run != r.Run {
		return false, err
	}
	if typ == NoticeApprovalApproved || typ == NoticeApprovalDenied {
		ds, err := collect(ctx, tx, "counted approvals", `SELECT approver, decision FROM records WHERE run = $1 AND approval = $2
			AND kind = $3 AND event = $4 ORDER BY seq`, []any{r.Run, r.Request, string(KindApproval), string(EventCounted)},
			func(rs rows) (Decision, error) {
				var by, decision string
				err := rs.Scan(&by, &decision)
				return Decision{By: by, Approve: decision == "Approve"}, err
			})
		if err != nil {
			return false, err
		}
		a.Decisions = ds
	}
	return s.noticeTx(ctx, tx, noticeOf(&a, typ, r.Note, s.stamp()))
}

// appendApprovalTx appends a decision record unless its Once key is already in the run. The
// run is read first (and held, with dialect.forUpdate), so two writers checking at once are
// serialised and the second finds the first's record; the unique index records_approval_once
// is the backstop. Errors: ErrNotFound (no run), ErrExists.
func (s *sqlStore) appendApprovalTx(ctx context.Context, tx querier, rec *Record) error {
	if rec.IdempotencyKey != "" {
		var id string
		err := queryRow(ctx, tx, `SELECT id FROM runs WHERE id = $1`+s.d.forUpdate, rec.Run).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: run %q", ErrNotFound, rec.Run)
		}
		if err != nil {
			return fmt.Errorf("store: decision record: %w", err)
		}
		var n int
		if err := queryRow(ctx, tx, `SELECT count(*) FROM records WHERE run = $1 AND approval = $2 AND idempotency_key = $3 AND kind = 'approval'`,
			rec.Run, rec.Approval, s.d.key(rec.IdempotencyKey)).Scan(&n); err != nil {
			return fmt.Errorf("store: decision record: %w", err)
		}
		if n > 0 {
			return onceExists(rec)
		}
	}
	return s.appendTx(ctx, tx, rec, "")
}

// CreateApproval implements Store.
func (s *sqlStore) CreateApproval(ctx context.Context, req ApprovalRequest) (Approval, error) {
	a, err := prepareApproval(req, s.stamp())
	if err != nil {
		return Approval{}, err
	}
	const insert = `INSERT INTO approvals (` + approvalCols + `) VALUES ($1, $2, $3, $4, $5, $6, $7,
		$8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23) ON CONFLICT DO NOTHING`
	// The request and its approval.requested notifications commit together (issue 24).
	var wrote bool
	err = s.write(ctx, durable, func(ctx context.Context, tx querier) error {
		wrote = false
		n, err := tx.exec(ctx, insert, approvalArgs(&a)...)
		if err != nil {
			return fmt.Errorf("store: create approval %s: %w", a.ID, err)
		}
		if n == 0 {
			return fmt.Errorf("%w: approval %s", ErrExists, a.ID)
		}
		wrote, err = s.noticeTx(ctx, tx, noticeOf(&a, NoticeApprovalRequested, "", a.Created))
		return err
	})
	if err != nil {
		return Approval{}, err
	}
	if wrote {
		s.ob.signal()
	}
	return a, nil
}

// GetApproval implements Store.
func (s *sqlStore) GetApproval(ctx context.Context, id string) (Approval, error) {
	if err := s.check(); err != nil {
		return Approval{}, err
	}
	a, err := scanApproval(queryRow(ctx, s.r, `SELECT `+approvalCols+` FROM approvals WHERE id = $1`, id))
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
// in Go over the run's (or all) requests. Requests created at the same instant (a test's
// clock) come in the order they were created where the database keeps it (SQLite).
func (s *sqlStore) ListApprovals(ctx context.Context, f ApprovalFilter) ([]Approval, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	all, err := collect(ctx, s.r, "list approvals", `SELECT `+approvalCols+` FROM approvals WHERE ($1 = '' OR run = $1) ORDER BY created, `+s.d.rowOrder,
		[]any{f.Run}, func(rows rows) (Approval, error) { return scanApproval(rows) })
	if err != nil {
		return nil, err
	}
	now := s.now()
	var out []Approval
	for _, a := range all {
		a.settle(now)
		if !f.match(&a) {
			continue
		}
		out = append(out, a)
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
	}
	return out, nil
}

// Decide implements Store: in one transaction the request is read (and held: see
// consumeTx), decided, written back when the rules accept the decision, and the decision
// records (counted or rejected, and the phase reached) appended; a record already in the run,
// or of a run this store does not have, is skipped. The rules' refusal (ErrNotAllowed,
// ErrNotPending) still commits, so the rejected record stays; it is returned after the
// commit.
func (s *sqlStore) Decide(ctx context.Context, id string, d Decision) (Approval, error) {
	var out Approval
	var ruleErr error
	var wrote bool
	err := s.write(ctx, durable, func(ctx context.Context, tx querier) error {
		wrote = false
		a, err := s.readApprovalTx(ctx, tx, id)
		if err != nil {
			return err
		}
		var recs []ApprovalRecord
		now := s.stamp()
		recs, ruleErr = a.decide(d, now)
		if ruleErr != nil && !errors.Is(ruleErr, ErrNotAllowed) && !errors.Is(ruleErr, ErrNotPending) {
			return ruleErr // invalid: nothing is written
		}
		if ruleErr == nil {
			args := approvalArgs(&a)
			if _, err := tx.exec(ctx, `UPDATE approvals SET roles = $1, expires = $2, state = $3, decisions = $4,
				escalated = $5, decided = $6 WHERE id = $7`, args[5], args[8], args[12], args[13], args[14], args[15], id); err != nil {
				return fmt.Errorf("store: approval %s: %w", id, err)
			}
		}
		for _, r := range recs {
			rec, _, err := approvalRecord(r)
			if err != nil {
				return err
			}
			if err := s.appendApprovalTx(ctx, tx, &rec); err != nil && !errors.Is(err, ErrExists) && !errors.Is(err, ErrNotFound) {
				return err
			}
		}
		out = a
		// the phase reached (approved, denied; expired, escalated when the decision came
		// late) is announced in the same transaction (issue 24)
		wrote, err = s.phaseNoticesTx(ctx, tx, &a, recs, now)
		return err
	})
	if err != nil {
		return Approval{}, err
	}
	if wrote {
		s.ob.signal()
	}
	return out, ruleErr
}
