package approvalrules

import (
	"errors"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func finance() State {
	return State{Actor: "agent", Run: "run-1", Roles: []string{"finance"}, Quorum: 2, Created: t0,
		Expires: t0.Add(15 * time.Minute), Phase: Pending}
}

func TestCastQuorumRolesActor(t *testing.T) {
	s := finance()
	at := t0.Add(time.Minute)
	for _, c := range []struct {
		v    Vote
		want error
		why  string
	}{
		{Vote{By: "mallory", Approve: true, At: at}, ErrNotEligible, "mallory holds none of the roles [finance]"},
		{Vote{By: "agent", Groups: []string{"finance"}, Approve: true, At: at}, ErrNotEligible, "agent opened run run-1 and cannot approve its own call"},
		{Vote{Approve: true, At: at}, ErrNoVoter, ""},
		{Vote{By: "alice", Groups: []string{"finance"}, Approve: true, At: at}, nil, ""},
		{Vote{By: "alice", Groups: []string{"finance"}, Approve: true, At: at}, ErrNotEligible, "alice already decided"},
	} {
		err := s.Cast(c.v)
		if !errors.Is(err, c.want) || (err == nil) != (c.want == nil) {
			t.Fatalf("%+v: got %v, want %v", c.v, err, c.want)
		}
		if c.why != "" && Why(err) != c.why {
			t.Errorf("why %q, want %q", Why(err), c.why)
		}
	}
	if s.Phase != Pending || s.Approvals() != 1 {
		t.Fatalf("after one approval: %s %d", s.Phase, s.Approvals())
	}
	if err := s.Cast(Vote{By: "bob", Groups: []string{"finance"}, Approve: true, At: at}); err != nil || s.Phase != Approved || !s.Decided.Equal(at) {
		t.Fatalf("quorum: %v %+v", err, s)
	}
	if err := s.Cast(Vote{By: "carol", Groups: []string{"finance"}, At: at}); !errors.Is(err, ErrNotPending) {
		t.Fatalf("vote on a decided request: %v", err)
	}
}

func TestOneDenyDenies(t *testing.T) {
	s := finance()
	_ = s.Cast(Vote{By: "alice", Groups: []string{"finance"}, Approve: true, At: t0})
	if err := s.Cast(Vote{By: "bob", Groups: []string{"finance"}, At: t0}); err != nil || s.Phase != Denied {
		t.Fatalf("deny: %v %s", err, s.Phase)
	}
}

func TestExpiryAndEscalation(t *testing.T) {
	s := finance()
	if !s.Settle(t0.Add(15*time.Minute)) || s.Phase != Expired || !s.Decided.Equal(t0.Add(15*time.Minute)) {
		t.Fatalf("expiry: %+v", s)
	}
	e := finance()
	e.OnTimeout, e.EscalateTo = "escalate", []string{"cfo"}
	_ = e.Cast(Vote{By: "alice", Groups: []string{"finance"}, Approve: true, At: t0})
	if !e.Settle(t0.Add(16*time.Minute)) || e.Phase != Pending || !e.Escalated || e.Roles[0] != "cfo" || !e.Expires.Equal(t0.Add(30*time.Minute)) {
		t.Fatalf("escalation: %+v", e)
	}
	if err := e.Cast(Vote{By: "bob", Groups: []string{"finance"}, Approve: true, At: t0.Add(17 * time.Minute)}); !errors.Is(err, ErrNotEligible) {
		t.Fatalf("finance after escalation: %v", err)
	}
	if err := e.Cast(Vote{By: "frank", Groups: []string{"cfo"}, Approve: true, At: t0.Add(17 * time.Minute)}); err != nil || e.Phase != Approved {
		t.Fatalf("the earlier approval still counts: %v %+v", err, e)
	}
	n := finance()
	n.Expires = time.Time{}
	if n.Settle(t0.Add(1000 * time.Hour)) {
		t.Fatal("a request without expiry expired")
	}
}

// Issue 16: the actor check compares identities. An approver with the actor's uid, or whose
// username (or e-mail) is the actor's e-mail in any case, is the actor and cannot approve;
// other people with similar names can, and the actor may still deny.
func TestActorAliases(t *testing.T) {
	base := func() State {
		s := finance()
		s.Actor, s.ActorUID, s.ActorEmail = "agent-7", "uid-7", "agent-7@corp.example"
		return s
	}
	at := t0.Add(time.Minute)
	fin := []string{"finance"}
	for _, c := range []struct {
		v   Vote
		why string // "" counted
	}{
		{Vote{By: "agent-7@corp.example", Groups: fin, Approve: true, At: at}, "agent-7@corp.example is the run's own actor agent-7 (same e-mail) and cannot approve its own call"},
		{Vote{By: "Agent-7@Corp.Example", Groups: fin, Approve: true, At: at}, "Agent-7@Corp.Example is the run's own actor agent-7 (same e-mail) and cannot approve its own call"},
		{Vote{By: "a7", UID: "uid-7", Groups: fin, Approve: true, At: at}, "a7 is the run's own actor agent-7 (same uid) and cannot approve its own call"},
		{Vote{By: "a7", Email: "AGENT-7@corp.example", Groups: fin, Approve: true, At: at}, "a7 is the run's own actor agent-7 (same e-mail) and cannot approve its own call"},
		{Vote{By: "agent-7", Groups: fin, Approve: true, At: at}, "agent-7 opened run run-1 and cannot approve its own call"},
		{Vote{By: "agent-77@corp.example", UID: "uid-77", Groups: fin, Approve: true, At: at}, ""},
		{Vote{By: "alice", Groups: fin, Approve: true, At: at}, ""},
	} {
		s := base()
		err := s.Cast(c.v)
		if c.why == "" {
			if err != nil {
				t.Errorf("%+v: %v, want counted", c.v, err)
			}
			continue
		}
		if !errors.Is(err, ErrNotEligible) || Why(err) != c.why {
			t.Errorf("%+v: %v, want %q", c.v, err, c.why)
		}
	}
	// An empty uid matches nothing; an actor whose username is an address is matched in any case.
	if how := ActorAlias(Principal{Name: "agent-7"}, Principal{Name: "bob"}); how != "" {
		t.Errorf("empty uids matched: %q", how)
	}
	if how := ActorAlias(Principal{Name: "agent-7@corp.example"}, Principal{Name: "AGENT-7@corp.example"}); how != SameEmail {
		t.Errorf("an address actor in another case: %q", how)
	}
	// The actor may deny its own call.
	s := base()
	if err := s.Cast(Vote{By: "agent-7@corp.example", Groups: fin, At: at}); err != nil || s.Phase != Denied {
		t.Errorf("the actor denying: %v %s", err, s.Phase)
	}
}

// One person, one vote (issue 16 review): a second username with an approver's uid or
// e-mail does not count again towards the quorum; a different person does.
func TestOnePersonOneVote(t *testing.T) {
	at := t0.Add(time.Minute)
	fin := []string{"finance"}
	for _, c := range []struct {
		name   string
		second Vote
		why    string
	}{
		{"same uid", Vote{By: "oidc:dana@corp.example", UID: "u-dana", Groups: fin, Approve: true, At: at}, "oidc:dana@corp.example already decided as dana (same uid)"},
		{"same e-mail", Vote{By: "dana-cert", Email: "DANA@corp.example", Groups: fin, Approve: true, At: at}, "dana-cert already decided as dana (same e-mail)"},
		{"username is the e-mail", Vote{By: "dana@corp.example", Groups: fin, Approve: true, At: at}, "dana@corp.example already decided as dana (same e-mail)"},
		{"a prefixed address", Vote{By: "oidc:Dana@corp.example", Groups: fin, Approve: true, At: at}, "oidc:Dana@corp.example already decided as dana (same e-mail)"},
	} {
		s := finance()
		if err := s.Cast(Vote{By: "dana", UID: "u-dana", Email: "dana@corp.example", Groups: fin, Approve: true, At: at}); err != nil {
			t.Fatal(err)
		}
		err := s.Cast(c.second)
		if !errors.Is(err, ErrNotEligible) || Why(err) != c.why {
			t.Errorf("%s: %v, want %q", c.name, err, c.why)
		}
		if s.Phase != Pending || s.Approvals() != 1 {
			t.Errorf("%s: one person reached the quorum: %s, %d approvals", c.name, s.Phase, s.Approvals())
		}
	}
	s := finance()
	for _, v := range []Vote{{By: "dana", UID: "u-dana", Groups: fin}, {By: "erin", UID: "u-erin", Groups: fin}} {
		v.Approve, v.At = true, at
		if err := s.Cast(v); err != nil {
			t.Fatal(err)
		}
	}
	if s.Phase != Approved {
		t.Fatalf("two persons: %s", s.Phase)
	}
}

// An approval by the actor under another name is ErrActorAlias, which is ErrNotEligible too.
func TestActorAliasIsTyped(t *testing.T) {
	s := finance()
	s.ActorUID = "u-agent"
	err := s.Cast(Vote{By: "seven", UID: "u-agent", Groups: []string{"finance"}, Approve: true, At: t0.Add(time.Minute)})
	if !errors.Is(err, ErrActorAlias) || !errors.Is(err, ErrNotEligible) {
		t.Fatalf("alias vote: %v, want ErrActorAlias and ErrNotEligible", err)
	}
	if err := s.Cast(Vote{By: "mallory", Approve: true, At: t0.Add(time.Minute)}); errors.Is(err, ErrActorAlias) {
		t.Fatalf("a missing role is not an alias: %v", err)
	}
}
