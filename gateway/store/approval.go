package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/reversi-gitops/reversi/pkg/approvalrules"
)

// ApprovalState is where an approval request stands.
type ApprovalState string

const (
	ApprovalPending  ApprovalState = "pending"
	ApprovalApproved ApprovalState = "approved"
	ApprovalDenied   ApprovalState = "denied"
	ApprovalExpired  ApprovalState = "expired" // timed out with on_timeout deny (or nobody to escalate to)
)

// ApprovalRequest is a blocked call waiting for approvers. The arguments are not stored, only
// their digest; the retry of the same call (Run, Tool, ArgsDigest) passes once the request is
// approved, consuming it in the retry's intent (Intent.Approval).
//
// A request is either decided by the store (standalone: Decide) or kept in Kubernetes (UID
// set): gateway/kube creates the ApprovalRequest object and records here its name (ID), UID
// and SpecDigest, and honours only an object that still has both (issue 16, "A gateway
// honours only requests it created, exactly as it created them"). The store then keeps the
// record and its consumption only; the phase is the object's, and Decide refuses it.
type ApprovalRequest struct {
	ID         string
	Tool       string
	ArgsDigest string
	Run        string
	Actor      string // the run's actor: may not approve its own request
	// ActorUID and ActorEmail are the actor's uid and e-mail (auth.Identity), "" when the
	// credential has none: an approver with the same uid, or whose name is that e-mail
	// (case-insensitive), is the actor under another name and may not approve (issue 16).
	ActorUID   string
	ActorEmail string
	// UID is the Kubernetes object's metadata.uid and SpecDigest "sha256:<hex>" of its spec
	// as the API server returned it from the create (see gateway/kube); both "" for a
	// store-decided request. Expires may be zero for a kept request (it waits until decided).
	UID        string
	SpecDigest string
	Roles      []string // an approver must hold one of these; empty: any principal but Actor
	Quorum     int      // distinct approving principals needed, 1..10
	Created    time.Time
	Expires    time.Time // the approval timeout, absolute
	OnTimeout  string    // "deny" (also "") or "escalate"
	EscalateTo []string  // the roles that decide after an escalation
	Reason     string    // why approval is needed
	// ArgsPreview is the arguments as JSON with the manifest's audit.redaction paths hidden,
	// for approvers (engine.ArgumentsPreview). Kept by the Kubernetes queue (gateway/kube), and
	// by the SQL stores for the notifications (issue 24).
	ArgsPreview string
	// Risk is the tool's risk from its manifest (for the notifications and their filters).
	Risk Risk
}

// Kept reports whether the request is kept in Kubernetes (decided there, not by the store).
func (r *ApprovalRequest) Kept() bool { return r.UID != "" }

// Decision is one principal's verdict on a request.
type Decision struct {
	By      string   // the principal; required
	Roles   []string // the roles or groups the principal holds
	Approve bool     // false: deny
	Comment string
	At      time.Time // set by the store
	// UID and Email are the principal's uid and e-mail ("" when unknown): a principal with
	// the actor's uid or e-mail is the actor under another name, and two principals sharing
	// one are one person for the quorum (issue 16, approvalrules.ActorAlias).
	UID   string `json:",omitempty"`
	Email string `json:",omitempty"`
}

// Approval is a request with its decisions and state. Rules (Decide):
//   - only a pending request can be decided (ErrNotPending);
//   - the run's own Actor cannot approve (ErrNotAllowed), nor under another name: a principal
//     with the actor's uid (ActorUID) or named the actor's e-mail (ActorEmail,
//     case-insensitive) (issue 16, "The actor check compares identities, not strings");
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
	Consumed  time.Time // when an intent consumed it (Intent.Approval); zero before
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
	if (req.UID == "") != (req.SpecDigest == "") {
		return Approval{}, fmt.Errorf("%w: a request kept in Kubernetes needs both its uid and its spec digest", ErrInvalid)
	}
	req.Created = now.UTC()
	if req.Expires.IsZero() && req.Kept() {
		return Approval{ApprovalRequest: req, State: ApprovalPending}, nil
	}
	req.Expires = req.Expires.UTC()
	if !req.Expires.After(req.Created) {
		return Approval{}, fmt.Errorf("%w: the request expires at %s, not after it is created", ErrInvalid, req.Expires)
	}
	return Approval{ApprovalRequest: req, State: ApprovalPending}, nil
}

// rules is a as the shared approval rules see it (pkg/approvalrules).
func (a *Approval) rules() approvalrules.State {
	st := approvalrules.State{Actor: a.Actor, ActorUID: a.ActorUID, ActorEmail: a.ActorEmail, Run: a.Run, Roles: a.Roles, Quorum: a.Quorum, Created: a.Created,
		Expires: a.Expires, OnTimeout: a.OnTimeout, EscalateTo: a.EscalateTo, Phase: approvalrules.Phase(a.State),
		Escalated: a.Escalated, Decided: a.Decided}
	for _, d := range a.Decisions {
		st.Votes = append(st.Votes, approvalrules.Vote{By: d.By, UID: d.UID, Email: d.Email, Groups: d.Roles, Approve: d.Approve, At: d.At})
	}
	return st
}

// fromRules copies back what the rules change (the decision list is appended by decide).
func (a *Approval) fromRules(st approvalrules.State) {
	a.Roles, a.Expires, a.State, a.Escalated, a.Decided = st.Roles, st.Expires, ApprovalState(st.Phase), st.Escalated, st.Decided
}

// settle applies expiry as of now (approvalrules.State.Settle). It reports whether a changed.
// A request kept in Kubernetes is never changed: its phase is the object's.
func (a *Approval) settle(now time.Time) bool {
	if a.Kept() {
		return false
	}
	st := a.rules()
	if !st.Settle(now) {
		return false
	}
	a.fromRules(st)
	return true
}

// decide applies d to a as of now (see Approval for the rules, approvalrules.State.Cast) and
// returns the decision records to journal: counted, or rejected (with why) when the rules
// refuse it, then the phase reached. ruleErr (ErrNotPending, ErrNotAllowed) is the refusal;
// a is then unchanged but for expiry, and the rejected record is still to be journaled.
func (a *Approval) decide(d Decision, now time.Time) (recs []ApprovalRecord, ruleErr error) {
	if a.Kept() {
		return nil, fmt.Errorf("%w: %s is an ApprovalRequest in Kubernetes: decide it with an Approval object (reversi approve %s --apply)", ErrNotAllowed, a.ID, a.ID)
	}
	before := a.State
	escalated := a.Escalated
	a.settle(now)
	recs = a.phaseRecords(before, escalated)
	escalated = a.Escalated
	if d.By == "" {
		return nil, fmt.Errorf("%w: a decision needs the deciding principal", ErrInvalid)
	}
	d.At = now.UTC()
	rec := ApprovalRecord{Run: a.Run, Request: a.ID, Tool: a.Tool, Approver: d.By, Groups: slices.Clone(d.Roles),
		Decision: decisionWord(d.Approve), Reason: d.Comment}
	st := a.rules()
	if err := st.Cast(approvalrules.Vote{By: d.By, UID: d.UID, Email: d.Email, Groups: d.Roles, Approve: d.Approve, At: d.At}); err != nil {
		rec.Event, rec.Note = EventRejected, approvalrules.Why(err)
		if errors.Is(err, approvalrules.ErrNotPending) {
			return append(recs, rec), fmt.Errorf("%w: %s is %s", ErrNotPending, a.ID, a.State)
		}
		return append(recs, rec), &RuleError{Err: err}
	}
	d.Roles = slices.Clone(d.Roles)
	a.Decisions = append(a.Decisions, d)
	a.fromRules(st)
	rec.Event, rec.Once = EventCounted, "counted/"+d.By
	recs = append(recs, rec)
	return append(recs, a.phaseRecords(ApprovalPending, escalated)...), nil
}

// RuleError is a decision the approval rules refused: errors.Is(err, ErrNotAllowed) holds, and
// so does errors.Is with the rule's own sentinel (e.g. approvalrules.ErrActorAlias). Its text
// is ErrNotAllowed's and the rule's reason.
type RuleError struct {
	// Err is the refusal of approvalrules.State.Cast.
	Err error
}

func (e *RuleError) Error() string   { return ErrNotAllowed.Error() + ": " + approvalrules.Why(e.Err) }
func (e *RuleError) Unwrap() []error { return []error{ErrNotAllowed, e.Err} }

func decisionWord(approve bool) string {
	if approve {
		return "Approve"
	}
	return "Deny"
}

// phaseRecords are the records of a's phase changes since it was in state before (escalated:
// whether it had escalated), each once per request (Once "phase/<event>").
func (a *Approval) phaseRecords(before ApprovalState, escalated bool) []ApprovalRecord {
	var out []ApprovalRecord
	mk := func(ev ApprovalEvent, note string) {
		out = append(out, ApprovalRecord{Run: a.Run, Request: a.ID, Tool: a.Tool, Event: ev, Once: "phase/" + string(ev), Note: note})
	}
	if a.Escalated && !escalated {
		mk(EventEscalated, fmt.Sprintf("the request timed out and was escalated to %s", strings.Join(a.EscalateTo, ", ")))
	}
	if a.State != before {
		switch a.State {
		case ApprovalApproved:
			mk(EventApproved, fmt.Sprintf("quorum %d reached", a.Quorum))
		case ApprovalDenied:
			mk(EventDenied, "denied")
		case ApprovalExpired:
			mk(EventExpired, "timed out before a decision")
		}
	}
	return out
}

// consume checks that an intent of (run, tool, argsDigest) may consume a as of now and marks
// it consumed (see Intent.Approval). The SQL stores then write the mark with a conditional
// UPDATE (consumed = 0), so a concurrent consumer that read the row before loses there.
func (a *Approval) consume(run, tool, argsDigest string, now time.Time) error {
	a.settle(now)
	if a.Run != run || a.Tool != tool || a.ArgsDigest != argsDigest {
		return fmt.Errorf("%w: %s is for %s in run %s", ErrMismatch, a.ID, a.Tool, a.Run)
	}
	if !a.Kept() && a.State != ApprovalApproved {
		return fmt.Errorf("%w: %s is %s", ErrNotApproved, a.ID, a.State)
	}
	if !a.Consumed.IsZero() {
		return consumedError(a.ID, a.Consumed)
	}
	a.Consumed = now.UTC()
	return nil
}

func consumedError(id string, at time.Time) error {
	return fmt.Errorf("%w: %s let its call through at %s", ErrConsumed, id, at.Format(time.RFC3339))
}

// consumedRecord is the decision record an intent that consumed a writes after itself.
func consumedRecord(a *Approval, step int64) ApprovalRecord {
	return ApprovalRecord{Run: a.Run, Request: a.ID, Tool: a.Tool, Event: EventConsumed, Step: step,
		Once: "consumed", Note: fmt.Sprintf("the approved call ran as step %d", step)}
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

// ApprovalEvent is the event of a KindApproval record (issue 16, "Decisions are ledger
// records"); the ReversiRun mirror shows it as RunStep.Approval.Event.
type ApprovalEvent string

const (
	EventRequested     ApprovalEvent = "requested"      // the request was created
	EventCounted       ApprovalEvent = "counted"        // an approver's decision counted
	EventRejected      ApprovalEvent = "rejected"       // an approver's decision did not count (Note: why)
	EventApproved      ApprovalEvent = "approved"       // the phase became approved
	EventDenied        ApprovalEvent = "denied"         // the phase became denied
	EventExpired       ApprovalEvent = "expired"        // the phase became expired
	EventEscalated     ApprovalEvent = "escalated"      // the request escalated
	EventConsumed      ApprovalEvent = "consumed"       // an intent used it (Step: that step)
	EventReplayRefused ApprovalEvent = "replay_refused" // a retry named it after it was used
	EventIgnored       ApprovalEvent = "ignored"        // an object not exactly as this gateway created it
)

// ApprovalEvents lists every ApprovalEvent.
var ApprovalEvents = []ApprovalEvent{EventRequested, EventCounted, EventRejected, EventApproved, EventDenied,
	EventExpired, EventEscalated, EventConsumed, EventReplayRefused, EventIgnored}

// ApprovalRecord is a decision record to append (Store.AppendApproval). It becomes a Record of
// Kind KindApproval: Approval = Request, Event, Approver, Groups, Decision, Reason, Note, Tool,
// Step, and IdempotencyKey = Once.
type ApprovalRecord struct {
	Run      string        // the request's run; GatewayJournal for a request of no run of this gateway
	Request  string        // required: the request id (ApprovalRequest name)
	Tool     string        // the request's tool
	Event    ApprovalEvent // required, one of ApprovalEvents
	Approver string        // counted, rejected: the approver's username
	Groups   []string      // counted, rejected: the approver's groups
	Decision string        // counted, rejected: Approve or Deny
	Reason   string        // the approver's reason
	Note     string        // why the record was made (a rejection's reason, what was ignored)
	Step     int64         // consumed, replay_refused: the step of the call; otherwise 0
	// Once, when set, makes the record unique in its run: a second append with the same key
	// is refused (ErrExists), so a decision seen twice (two replicas, a restart) is one record.
	Once string
}

// approvalRecord checks r and returns its Record and Groups as JSON.
func approvalRecord(r ApprovalRecord) (Record, string, error) {
	if r.Request == "" || !slices.Contains(ApprovalEvents, r.Event) {
		return Record{}, "", fmt.Errorf("%w: a decision record needs a request and one of the events %v (got %q)", ErrInvalid, ApprovalEvents, r.Event)
	}
	if r.Decision != "" && r.Decision != "Approve" && r.Decision != "Deny" {
		return Record{}, "", fmt.Errorf("%w: decision %q (Approve or Deny)", ErrInvalid, r.Decision)
	}
	groups := ""
	if len(r.Groups) > 0 {
		b, _ := json.Marshal(r.Groups) // strings always encode
		groups = string(b)
	}
	return Record{Run: r.Run, Kind: KindApproval, Step: r.Step, Tool: r.Tool, Approval: r.Request, Event: r.Event,
		Approver: r.Approver, Groups: slices.Clone(r.Groups), Decision: r.Decision, Reason: r.Reason, Note: r.Note,
		IdempotencyKey: r.Once}, groups, nil
}

// decodeGroups reads the groups column ("" is none).
func decodeGroups(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var g []string
	if err := json.Unmarshal([]byte(s), &g); err != nil {
		return nil, fmt.Errorf("store: stored groups are not JSON: %w", err)
	}
	return g, nil
}
