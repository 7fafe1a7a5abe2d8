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
