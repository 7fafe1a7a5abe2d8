// Package approvalrules holds the rules that decide an approval request from the votes cast on
// it: who may vote, the quorum, one deny denies, and expiry or escalation. They are pure
// functions of the request, the votes and the time, shared by the gateway's standalone queue
// (gateway/store) and the ApprovalRequest reconciler (controllers), so both decide alike.
//
// Source: DESIGN.md "Approval" (the approver must hold one of the roles; the run's own actor
// cannot approve; the quorum counts distinct persons (a uid or e-mail shared by two usernames is one person); one Deny denies; a request past
// expiresAt is Expired or escalates), seed "Tool manifests", Approval (quorum, timeout,
// on_timeout, escalate_to).
package approvalrules

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Phase is where a request stands.
type Phase string

const (
	Pending  Phase = "pending"
	Approved Phase = "approved"
	Denied   Phase = "denied"
	Expired  Phase = "expired" // timed out with on_timeout deny (or nobody to escalate to)
)

// Errors of Cast. Callers wrap them in their own errors (test with errors.Is).
var (
	// ErrNotPending: the request was already decided or has expired.
	ErrNotPending = errors.New("the approval request is not pending")
	// ErrNotEligible: the voter may not decide this request (the run's own actor approving,
	// missing role, or a second vote by the same username).
	ErrNotEligible = errors.New("not allowed to decide this request")
	// ErrNoVoter: the vote names nobody.
	ErrNoVoter = errors.New("a decision needs the deciding principal")
	// ErrActorAlias (wraps ErrNotEligible): the voter is the run's actor under another
	// username (same uid or e-mail, see ActorAlias).
	ErrActorAlias = fmt.Errorf("%w: the run's actor under another name", ErrNotEligible)
)

// refusal is an error of Eligible: a sentinel and the reason in words.
type refusal struct {
	kind error
	why  string
}

func (r *refusal) Error() string { return r.kind.Error() + ": " + r.why }
func (r *refusal) Unwrap() error { return r.kind }

func refuse(kind error, format string, a ...any) error {
	return &refusal{kind: kind, why: fmt.Sprintf(format, a...)}
}

// Why is the reason of an error of Eligible or Cast without the sentinel's text, e.g.
// "mallory holds none of the roles [finance]"; for other errors, their text.
func Why(err error) string {
	var r *refusal
	if errors.As(err, &r) {
		return r.why
	}
	return err.Error()
}

// Vote is one principal's decision.
type Vote struct {
	By      string   // the username; required
	UID     string   // the voter's uid as authenticated, when known (Kubernetes user info uid)
	Email   string   // the voter's e-mail claim, when known (standalone gateways' identities)
	Groups  []string // the roles or groups the principal holds
	Approve bool     // false: deny
	At      time.Time
}

// State is a request and the votes counted so far. Roles and Expires are the effective ones:
// Settle replaces them on escalation.
type State struct {
	Actor      string   // the run's actor: may not approve its own request
	ActorUID   string   // the actor's uid claim, when its credential has one (see ActorAlias)
	ActorEmail string   // the actor's e-mail claim, when its credential has one (see ActorAlias)
	Run        string   // for messages
	Roles      []string // a voter must hold one of these; empty: anyone but Actor
	Quorum     int      // distinct approving usernames needed; < 1 counts as 1
	Created    time.Time
	Expires    time.Time // zero: never
	OnTimeout  string    // "deny" (also "") or "escalate"
	EscalateTo []string

	Phase     Phase
	Escalated bool
	Votes     []Vote    // counted votes, in order; no two are one person (see Eligible)
	Decided   time.Time // when Phase left Pending; zero while pending
}

// Settle applies expiry as of now and reports whether s changed. A pending request past
// Expires escalates once when OnTimeout is "escalate" and EscalateTo is set: Roles become
// EscalateTo and Expires moves on by the original timeout (Expires - Created); votes already
// counted still count. Otherwise it becomes Expired, decided at Expires.
func (s *State) Settle(now time.Time) bool {
	if s.Phase != Pending || s.Expires.IsZero() || now.Before(s.Expires) {
		return false
	}
	if s.OnTimeout == "escalate" && !s.Escalated && len(s.EscalateTo) > 0 {
		timeout := s.Expires.Sub(s.Created)
		s.Escalated = true
		s.Roles = slices.Clone(s.EscalateTo)
		s.Expires = s.Expires.Add(timeout)
		if now.Before(s.Expires) {
			return true
		}
	}
	s.Phase = Expired
	s.Decided = s.Expires
	return true
}

// Eligible says whether v may be counted on s as it stands (expiry is not applied: call
// Settle first). The error wraps ErrNotPending, ErrNotEligible or ErrNoVoter and says why
// in words an approver understands.
func (s *State) Eligible(v Vote) error {
	if v.By == "" {
		return ErrNoVoter
	}
	if s.Phase != Pending {
		return refuse(ErrNotPending, "it is %s", s.Phase)
	}
	if how := ActorAlias(Principal{Name: s.Actor, UID: s.ActorUID, Email: s.ActorEmail}, Principal{Name: v.By, UID: v.UID, Email: v.Email}); v.Approve && how != "" {
		if how == SameUsername {
			if s.Run != "" {
				return refuse(ErrNotEligible, "%s opened run %s and cannot approve its own call", v.By, s.Run)
			}
			return refuse(ErrNotEligible, "%s is the run's actor and cannot approve its own call", v.By)
		}
		return refuse(ErrActorAlias, "%s is the run's own actor %s (%s) and cannot approve its own call", v.By, s.Actor, how)
	}
	if len(s.Roles) > 0 && !slices.ContainsFunc(v.Groups, func(g string) bool { return slices.Contains(s.Roles, g) }) {
		return refuse(ErrNotEligible, "%s holds none of the roles %v", v.By, s.Roles)
	}
	for _, prev := range s.Votes {
		// One person, one vote: a second username with the same uid or e-mail is the same
		// voter (issue 16 review: two authenticators give one person two usernames).
		switch how := ActorAlias(Principal{Name: prev.By, UID: prev.UID, Email: prev.Email}, Principal{Name: v.By, UID: v.UID, Email: v.Email}); how {
		case "":
		case SameUsername:
			return refuse(ErrNotEligible, "%s already decided", v.By)
		default:
			return refuse(ErrNotEligible, "%s already decided as %s (%s)", v.By, prev.By, how)
		}
	}
	return nil
}

// Cast settles s as of v.At, checks v (Eligible) and counts it: a deny denies; the approval
// that reaches Quorum distinct persons approves. On error s is settled but v not counted.
func (s *State) Cast(v Vote) error {
	s.Settle(v.At)
	if err := s.Eligible(v); err != nil {
		return err
	}
	v.Groups = slices.Clone(v.Groups)
	s.Votes = append(s.Votes, v)
	if !v.Approve {
		s.Phase, s.Decided = Denied, v.At
		return nil
	}
	if s.Approvals() >= max(s.Quorum, 1) {
		s.Phase, s.Decided = Approved, v.At
	}
	return nil
}

// Approvals is the number of distinct persons whose approval was counted (Eligible counts no
// person twice, under any username).
func (s *State) Approvals() int {
	n := 0
	for _, v := range s.Votes {
		if v.Approve {
			n++ // By is unique among Votes
		}
	}
	return n
}

// Principal is an identity as far as the actor rule needs it: the username (the actor's
// principal as the gateway mapped it, or the approver's username as the API server
// authenticated it) and, when known, the uid and the e-mail claim.
type Principal struct {
	Name, UID, Email string
}

// How ActorAlias found a voter to be the actor.
const (
	SameUsername = "same username"
	SameUID      = "same uid"
	SameEmail    = "same e-mail"
)

// ActorAlias says whether voter is actor under any name, and how ("" when not): the same
// username; the same uid (both non-empty); or a shared e-mail address, case-insensitive. A
// principal's addresses are its e-mail claim and its username when that is an address, also
// after a prefix the API server puts before a username claim (up to the last ':' or '#', as
// in "oidc:dana@corp.example" or "https://issuer#dana@corp.example"). The rule compares
// identities, not strings: an agent known to the API server as agent-7@corp.example is agent-7
// when its e-mail is that address (issue 16, "the actor check compares identities"), and the
// same rule keeps one person from voting twice under two usernames.
func ActorAlias(actor, voter Principal) string {
	switch {
	case voter.Name != "" && voter.Name == actor.Name:
		return SameUsername
	case actor.UID != "" && voter.UID == actor.UID:
		return SameUID
	}
	for _, a := range addresses(actor) {
		for _, b := range addresses(voter) {
			if strings.EqualFold(a, b) {
				return SameEmail
			}
		}
	}
	return ""
}

// addresses are p's e-mail addresses: its e-mail claim, and its username when that is an
// address after any prefix ending in ':' or '#'.
func addresses(p Principal) []string {
	var out []string
	if strings.Contains(p.Email, "@") {
		out = append(out, p.Email)
	}
	name := p.Name
	if i := strings.LastIndexAny(name, ":#"); i >= 0 {
		name = name[i+1:]
	}
	if at := strings.Index(name, "@"); at > 0 && at < len(name)-1 {
		out = append(out, name)
	}
	return out
}
