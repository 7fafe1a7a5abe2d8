package store

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/reversi-gitops/reversi/internal/approvalrules"
)

// ApprovalState is where an approval request stands.
type ApprovalState string

const (
	ApprovalPending  ApprovalState = "pending"
	ApprovalApproved ApprovalState = "approved"
	ApprovalDenied   ApprovalState = "denied"
	ApprovalExpired  ApprovalState = "expired" // timed out with on_timeout deny (or nobody to escalate to)
)

// ApprovalRequest is a blocked call waiting for approvers (standalone mode). The arguments are
// not stored, only their digest; the retry of the same call (Run, Tool, ArgsDigest) passes once
// the request is approved (Consume).
type ApprovalRequest struct {
	ID         string
	Tool       string
	ArgsDigest string
	Run        string
	Actor      string   // the run's actor: may not approve its own request
	Roles      []string // an approver must hold one of these; empty: any principal but Actor
	Quorum     int      // distinct approving principals needed, 1..10
	Created    time.Time
	Expires    time.Time // the approval timeout, absolute
	OnTimeout  string    // "deny" (also "") or "escalate"
	EscalateTo []string  // the roles that decide after an escalation
	Reason     string    // why approval is needed
	// ArgsPreview is the arguments as JSON with the manifest's audit.redaction paths hidden,
	// for approvers (engine.ArgumentsPreview). Kept by the Kubernetes queue (gateway/kube);
	// Memory and SQLite do not store it.
	ArgsPreview string
}

// Decision is one principal's verdict on a request.
type Decision struct {
	By      string   // the principal; required
	Roles   []string // the roles or groups the principal holds
	Approve bool     // false: deny
	Comment string
	At      time.Time // set by the store
}

// Approval is a request with its decisions and state. Rules (Decide):
//   - only a pending request can be decided (ErrNotPending);
//   - the run's own Actor cannot approve (ErrNotAllowed);
//   - a principal must hold one of Roles when Roles is not empty (ErrNotAllowed);
//   - a principal decides once (ErrNotAllowed for a second decision);
//   - one deny denies; Quorum distinct approving principals approve.
//
// Expiry: when Expires passes while pending, OnTimeout "escalate" with EscalateTo set replaces
// Roles with EscalateTo and extends Expires by the original timeout (once; approvals already
// given still count); otherwise the request becomes ApprovalExpired.
type Approval struct {
	ApprovalRequest
	State     ApprovalState
	Decisions []Decision
	Escalated bool
	Decided   time.Time // when the state left pending; zero while pending
	Consumed  time.Time // when Consume let the retry through; zero before
}

// ApprovalFilter selects requests for ListApprovals. Empty fields match everything;
// Limit <= 0 means no limit.
type ApprovalFilter struct {
	Run   string
	State ApprovalState
	Limit int
}

// prepareApproval validates a new request and fills the defaults.
func prepareApproval(req ApprovalRequest, now time.Time) (Approval, error) {
	if req.ID == "" {
		req.ID = newID("apr-")
	}
	if req.Tool == "" || req.Run == "" || req.Actor == "" {
		return Approval{}, fmt.Errorf("%w: an approval request needs tool, run and actor", ErrInvalid)
	}
	if req.Quorum < 1 {
		req.Quorum = 1
	}
	if req.Quorum > 10 {
		return Approval{}, fmt.Errorf("%w: quorum %d is above 10", ErrInvalid, req.Quorum)
	}
	switch req.OnTimeout {
	case "", "deny", "escalate":
	default:
		return Approval{}, fmt.Errorf("%w: on_timeout %q (deny or escalate)", ErrInvalid, req.OnTimeout)
	}
	req.Created = now.UTC()
	req.Expires = req.Expires.UTC()
	if !req.Expires.After(req.Created) {
		return Approval{}, fmt.Errorf("%w: the request expires at %s, not after it is created", ErrInvalid, req.Expires)
	}
	return Approval{ApprovalRequest: req, State: ApprovalPending}, nil
}

// rules is a as the shared approval rules see it (internal/approvalrules).
func (a *Approval) rules() approvalrules.State {
	st := approvalrules.State{Actor: a.Actor, Run: a.Run, Roles: a.Roles, Quorum: a.Quorum, Created: a.Created,
		Expires: a.Expires, OnTimeout: a.OnTimeout, EscalateTo: a.EscalateTo, Phase: approvalrules.Phase(a.State),
		Escalated: a.Escalated, Decided: a.Decided}
	for _, d := range a.Decisions {
		st.Votes = append(st.Votes, approvalrules.Vote{By: d.By, Groups: d.Roles, Approve: d.Approve, At: d.At})
	}
	return st
}

// fromRules copies back what the rules change (the decision list is appended by decide).
func (a *Approval) fromRules(st approvalrules.State) {
	a.Roles, a.Expires, a.State, a.Escalated, a.Decided = st.Roles, st.Expires, ApprovalState(st.Phase), st.Escalated, st.Decided
}

// settle applies expiry as of now (approvalrules.State.Settle). It reports whether a changed.
func (a *Approval) settle(now time.Time) bool {
	st := a.rules()
	if !st.Settle(now) {
		return false
	}
	a.fromRules(st)
	return true
}

// decide applies d to a as of now (see Approval for the rules, approvalrules.State.Cast).
func (a *Approval) decide(d Decision, now time.Time) error {
	a.settle(now)
	if d.By == "" {
		return fmt.Errorf("%w: a decision needs the deciding principal", ErrInvalid)
	}
	d.At = now.UTC()
	st := a.rules()
	if err := st.Cast(approvalrules.Vote{By: d.By, Groups: d.Roles, Approve: d.Approve, At: d.At}); err != nil {
		if errors.Is(err, approvalrules.ErrNotPending) {
			return fmt.Errorf("%w: %s is %s", ErrNotPending, a.ID, a.State)
		}
		return fmt.Errorf("%w: %s", ErrNotAllowed, approvalrules.Why(err))
	}
	d.Roles = slices.Clone(d.Roles)
	a.Decisions = append(a.Decisions, d)
	a.fromRules(st)
	return nil
}

// consume lets the retry through once (see Store.Consume).
func (a *Approval) consume(run, tool, argsDigest string, now time.Time) error {
	a.settle(now)
	if a.Run != run || a.Tool != tool || a.ArgsDigest != argsDigest {
		return fmt.Errorf("%w: %s is for %s in run %s", ErrMismatch, a.ID, a.Tool, a.Run)
	}
	if a.State != ApprovalApproved {
		return fmt.Errorf("%w: %s is %s", ErrNotApproved, a.ID, a.State)
	}
	if !a.Consumed.IsZero() {
		return fmt.Errorf("%w: %s at %s", ErrConsumed, a.ID, a.Consumed.Format(time.RFC3339))
	}
	a.Consumed = now.UTC()
	return nil
}

func (f ApprovalFilter) match(a *Approval) bool {
	return (f.Run == "" || a.Run == f.Run) && (f.State == "" || a.State == f.State)
}

func cloneApproval(a *Approval) Approval {
	c := *a
	c.Roles = slices.Clone(a.Roles)
	c.EscalateTo = slices.Clone(a.EscalateTo)
	c.Decisions = slices.Clone(a.Decisions)
	for i := range c.Decisions {
		c.Decisions[i].Roles = slices.Clone(c.Decisions[i].Roles)
	}
	return c
}
