package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// The approval logic both SQL stores (SQLite, Postgres) share: the statements differ, the
// rules and the order of the steps do not. Source: issue 16 (consumption in the intent's
// transaction, decision records).

const approvalCols = `id, run, tool, args_digest, actor, roles, quorum, created, expires, on_timeout, escalate_to,
	reason, state, decisions, escalated, decided, consumed, actor_uid, actor_email, uid, spec_digest`

func scanApproval(sc interface{ Scan(...any) error }) (Approval, error) {
	var a Approval
	var roles, escalate, decisions, state string
	var created, expires, decided, consumed int64
	if err := sc.Scan(&a.ID, &a.Run, &a.Tool, &a.ArgsDigest, &a.Actor, &roles, &a.Quorum, &created, &expires,
		&a.OnTimeout, &escalate, &a.Reason, &state, &decisions, &a.Escalated, &decided, &consumed,
		&a.ActorUID, &a.ActorEmail, &a.UID, &a.SpecDigest); err != nil {
		return Approval{}, err
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
		a.ActorUID, a.ActorEmail, a.UID, a.SpecDigest}
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

// consumeRow consumes approval id for a write of (run, tool, argsDigest) inside the caller's
// transaction: read returns the row (ErrNotFound when there is none), Approval.consume checks
// it, and mark writes the consumption time with `... WHERE id = ? AND consumed = 0`, returning
// the rows affected. Zero rows means another transaction consumed it between the read and the
// write (Postgres replicas at READ COMMITTED): ErrConsumed, so of concurrent consumers exactly
// one wins whatever the isolation. rollback: an already consumed approval is not an error
// (RollbackEntry.Approval) and nothing is written.
func consumeRow(id, run, tool, argsDigest string, now time.Time, rollback bool,
	read func() (Approval, error), mark func(at int64) (int64, error)) (*Approval, error) {
	a, err := read()
	if err != nil {
		return nil, err
	}
	if err := a.consume(run, tool, argsDigest, now); err != nil {
		if rollback && errors.Is(err, ErrConsumed) {
			return &a, nil
		}
		return nil, err
	}
	n, err := mark(tn(a.Consumed))
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

// decideRow is Decide inside the caller's transaction: read the request (ErrNotFound), apply
// the decision, save it when the rules accept it, and journal the decision records (counted
// or rejected, and the phase reached) with journal, which skips a record already in the run
// or a run this store does not have. ruleErr is the rules' refusal (ErrNotAllowed,
// ErrNotPending): the transaction still commits, so the rejected record stays. err fails the
// transaction.
func decideRow(id string, d Decision, now time.Time, read func() (Approval, error), save func(*Approval) error,
	journal func(*Record) error) (out Approval, ruleErr, err error) {
	a, err := read()
	if err != nil {
		return Approval{}, nil, err
	}
	recs, ruleErr := a.decide(d, now)
	if ruleErr != nil && !errors.Is(ruleErr, ErrNotAllowed) && !errors.Is(ruleErr, ErrNotPending) {
		return Approval{}, nil, ruleErr // invalid: nothing is written
	}
	if ruleErr == nil {
		if err := save(&a); err != nil {
			return Approval{}, nil, fmt.Errorf("store: approval %s: %w", id, err)
		}
	}
	for _, r := range recs {
		rec, _, err := approvalRecord(r)
		if err != nil {
			return Approval{}, nil, err
		}
		if err := journal(&rec); err != nil && !errors.Is(err, ErrExists) && !errors.Is(err, ErrNotFound) {
			return Approval{}, nil, err
		}
	}
	return a, ruleErr, nil
}
