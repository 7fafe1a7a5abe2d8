package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
)

// KindRollback is the record of one step of a rollback: the compensation of the step Step was
// started, completed, verified, failed, is waiting for approval, or the step was found not to
// be undoable. The ledger stays append-only: a step's rollback is a sequence of these records,
// the last one saying where it stands. Source: issue 6 ("Every step's outcome is a ledger
// record"), DESIGN.md ReversiRun rollback steps.
const KindRollback Kind = "rollback"

// Rollback statuses: the Status of a KindRollback record.
const (
	// RollbackStarted is written before the compensation's first attempt (write-ahead): a
	// rollback that finds it last resumes with the same idempotency key.
	RollbackStarted Status = "started"
	// RollbackCompensated: the compensation answered without isError; its verification (if
	// any) has not been recorded yet.
	RollbackCompensated Status = "compensated"
	// RollbackVerified: the read-back matched `expect` (seed: Verification).
	RollbackVerified Status = "verified"
	// RollbackVerificationFailed: every read-back attempt mismatched; Note holds the first
	// mismatch (seed: "the compensation fails with the first mismatch in the ledger").
	RollbackVerificationFailed Status = "verification_failed"
	// RollbackUnverified: the compensation ran but nothing could run the read-back.
	RollbackUnverified Status = "unverified"
	// RollbackFailed: every attempt of the compensation failed (Note: the last error).
	RollbackFailed Status = "failed"
	// RollbackWaitingApproval: the compensation requires approval; Note names the request.
	RollbackWaitingApproval Status = "waiting_approval"
	// RollbackDenied: the approval request for the compensation was denied or expired.
	RollbackDenied Status = "denied"
	// RollbackHeld: not run because a step that requires this one is not undone yet.
	RollbackHeld Status = "held"
	// RollbackUnrecoverable, RollbackNotUndone and RollbackSkipped record the plan's verdict
	// for steps that have no compensation to run.
	RollbackUnrecoverable Status = "unrecoverable"
	RollbackNotUndone     Status = "not_undone"
	RollbackSkipped       Status = "skipped"
)

// RollbackStatuses lists every rollback status.
var RollbackStatuses = []Status{RollbackStarted, RollbackCompensated, RollbackVerified, RollbackVerificationFailed,
	RollbackUnverified, RollbackFailed, RollbackWaitingApproval, RollbackDenied, RollbackHeld,
	RollbackUnrecoverable, RollbackNotUndone, RollbackSkipped}

// RollbackEntry is one rollback record to append.
type RollbackEntry struct {
	Run  string // required
	Step int64  // required: the step (intent Seq) being undone
	// Tool is the compensation tool (stored as the record's Tool and CompensationTool); empty
	// for a step without one.
	Tool string
	// IdempotencyKey is the compensation's key (`_meta["reversi/idempotency_key"]`), the same
	// on every attempt and every resumption.
	IdempotencyKey string
	Status         Status // required, one of RollbackStatuses
	Note           string
	// Arguments are the compensation's arguments (the step's journaled handle); JSON-encodable.
	Arguments map[string]any
	// Approval is the id of the approved request the compensation runs under ("" when it
	// needs none). AppendRollback marks it consumed in the same transaction when it is not
	// yet; a compensation's request is bound to its step (its id comes from the run and the
	// step), so a resumed rollback of the step may name it again. Errors as Intent.Approval
	// (ErrNotFound, ErrMismatch, ErrNotApproved), but never ErrConsumed. ArgsDigest is the
	// compensation arguments' digest, checked against the request's.
	Approval   string
	ArgsDigest string
	// Risk is the risk of the step's tool (its manifest's), carried by the alert a
	// verification_failed or unrecoverable record writes, for the receivers' risk filters
	// (zero: not known, admitted by no risk filter). Source: issue 24.
	Risk Risk
}

// alerting are the rollback statuses announced as alert.rollback_failed (issue 24): the step
// is not undone and nothing will retry it by itself.
var alerting = map[Status]string{RollbackVerificationFailed: "VerificationFailed", RollbackUnrecoverable: "Unrecoverable"}

// rollbackAlert is the alert of e, about step of run (the step's call was tool, the run
// opened by actor).
func rollbackAlert(e RollbackEntry, tool, actor string) Notice {
	what := "its compensation ran but the read-back never matched"
	if e.Status == RollbackUnrecoverable {
		what = "it cannot be undone"
	}
	msg := fmt.Sprintf("step %d (%s) of run %s was not rolled back: %s", e.Step, tool, e.Run, what)
	if e.Note != "" {
		msg += " (" + e.Note + ")"
	}
	return Notice{Type: NoticeAlertRollbackFailed, Object: &ObjectRef{Kind: ObjectRun, Name: e.Run}, Run: e.Run, Actor: actor,
		Tool: tool, Risk: e.Risk, Step: e.Step, Status: string(e.Status), Severity: SeverityCritical, Reason: alerting[e.Status],
		Message: msg}
}

// encodeRollback checks e and returns its arguments as JSON ("" for none).
func encodeRollback(e RollbackEntry) (string, error) {
	if e.Run == GatewayJournal || e.Step < 1 {
		return "", fmt.Errorf("%w: a rollback record needs a run and a step", ErrInvalid)
	}
	if !slices.Contains(RollbackStatuses, e.Status) {
		return "", fmt.Errorf("%w: rollback status %q", ErrInvalid, e.Status)
	}
	return jsonColumn(e.Arguments, "the compensation arguments")
}

// rollbackRecord is the record of e (Seq and Time are set when appended).
func rollbackRecord(e RollbackEntry) Record {
	return Record{Run: e.Run, Kind: KindRollback, Step: e.Step, Tool: e.Tool, CompensationTool: e.Tool,
		IdempotencyKey: e.IdempotencyKey, Status: e.Status, Note: e.Note, Approval: e.Approval}
}

// AppendRollback implements Store. With e.Approval, the approval is consumed in the same
// transaction (consumeTx, rollback: a resumed rollback may name it again).
func (s *sqlStore) AppendRollback(ctx context.Context, e RollbackEntry) (int64, error) {
	enc, err := encodeRollback(e)
	if err != nil {
		return 0, err
	}
	rec := rollbackRecord(e)
	var wrote bool
	err = s.write(ctx, durable, func(ctx context.Context, tx querier) error {
		wrote = false
		var kind, tool, actor string
		err := queryRow(ctx, tx, `SELECT r.kind, r.tool, u.actor FROM records r JOIN runs u ON u.id = r.run
			WHERE r.run = $1 AND r.seq = $2 AND r.run <> ''`, e.Run, e.Step).Scan(&kind, &tool, &actor)
		if errors.Is(err, sql.ErrNoRows) || (err == nil && kind != string(KindIntent)) {
			return fmt.Errorf("%w: step %d in run %q", ErrNotFound, e.Step, e.Run)
		}
		if err != nil {
			return fmt.Errorf("store: rollback record: %w", err)
		}
		if e.Approval != "" {
			if _, err := s.consumeTx(ctx, tx, e.Approval, e.Run, e.Tool, e.ArgsDigest, true); err != nil {
				return err
			}
		}
		if err := s.appendTx(ctx, tx, &rec, enc); err != nil {
			return err
		}
		if _, ok := alerting[e.Status]; !ok {
			return nil
		}
		// The step's verdict and its alert commit together (issue 24).
		wrote, err = s.alertTx(ctx, tx, rollbackAlert(e, tool, actor), &rec)
		return err
	})
	if err == nil && wrote {
		s.ob.signal()
	}
	return rec.Seq, err
}
