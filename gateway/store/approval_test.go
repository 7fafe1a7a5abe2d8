package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// consume is the approved call's retry: an intent naming the approval (Intent.Approval), in a
// run it opens when missing.
func consume(t *testing.T, s Store, id, run, tool, digest string) error {
	t.Helper()
	if _, err := s.CreateRun(context.Background(), Run{ID: run, Actor: "agent-alice"}); err != nil && !errors.Is(err, ErrExists) {
		t.Fatal(err)
	}
	_, err := s.RecordIntent(context.Background(), Intent{Run: run, Tool: tool, ArgsDigest: digest, Approval: id, Decision: "allow"})
	return err
}

func newRequest(id string) ApprovalRequest {
	return ApprovalRequest{ID: id, Tool: "stripe.charge", ArgsDigest: "sha256:d", Run: "r1", Actor: "agent-alice",
		Roles: []string{"finance"}, Quorum: 2, Expires: time.Date(2026, 3, 1, 12, 15, 0, 0, time.UTC),
		OnTimeout: "deny", Reason: "irreversible"}
}

func TestApprovalValidation(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		for name, mut := range map[string]func(*ApprovalRequest){
			"no tool":    func(r *ApprovalRequest) { r.Tool = "" },
			"no run":     func(r *ApprovalRequest) { r.Run = "" },
			"no actor":   func(r *ApprovalRequest) { r.Actor = "" },
			"quorum 11":  func(r *ApprovalRequest) { r.Quorum = 11 },
			"on_timeout": func(r *ApprovalRequest) { r.OnTimeout = "approve" },
			"expired":    func(r *ApprovalRequest) { r.Expires = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC) },
		} {
			req := newRequest("")
			mut(&req)
			if _, err := s.CreateApproval(ctx, req); err == nil {
				t.Errorf("%s: accepted", name)
			} else {
				wantErr(t, err, ErrInvalid)
			}
		}
		req := newRequest("")
		req.Quorum = 0
		a := must[Approval](t)(s.CreateApproval(ctx, req))
		if a.ID == "" || a.Quorum != 1 || a.State != ApprovalPending || a.Created.IsZero() {
			t.Fatalf("defaults: %+v", a)
		}
		_, err := s.CreateApproval(ctx, ApprovalRequest{ID: a.ID, Tool: "t", Run: "r", Actor: "a", Expires: a.Expires})
		wantErr(t, err, ErrExists)
		_, err = s.GetApproval(ctx, "nope")
		wantErr(t, err, ErrNotFound)
		_, err = s.Decide(ctx, "nope", Decision{By: "x", Approve: true})
		wantErr(t, err, ErrNotFound)
		wantErr(t, consume(t, s, "nope", "r", "t", "d"), ErrNotFound)
	})
}

func TestApprovalQuorum(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		created := must[Approval](t)(s.CreateApproval(ctx, newRequest("apr-1")))
		got := must[Approval](t)(s.GetApproval(ctx, "apr-1"))
		if got.ID != "apr-1" || got.Quorum != 2 || got.Roles[0] != "finance" || got.State != ApprovalPending ||
			!got.Expires.Equal(created.Expires) || got.Reason != "irreversible" || got.OnTimeout != "deny" {
			t.Fatalf("stored request %+v", got)
		}

		// the run's own actor cannot approve, even with the role
		_, err := s.Decide(ctx, "apr-1", Decision{By: "agent-alice", Roles: []string{"finance"}, Approve: true})
		wantErr(t, err, ErrNotAllowed)
		// no matching role
		_, err = s.Decide(ctx, "apr-1", Decision{By: "bob", Roles: []string{"sales"}, Approve: true})
		wantErr(t, err, ErrNotAllowed)
		_, err = s.Decide(ctx, "apr-1", Decision{Roles: []string{"finance"}, Approve: true})
		wantErr(t, err, ErrInvalid)
		// retry before approval is refused
		wantErr(t, consume(t, s, "apr-1", "r1", "stripe.charge", "sha256:d"), ErrNotApproved)

		a := must[Approval](t)(s.Decide(ctx, "apr-1", Decision{By: "carol", Roles: []string{"ops", "finance"}, Approve: true, Comment: "ok"}))
		if a.State != ApprovalPending || len(a.Decisions) != 1 || a.Decisions[0].At.IsZero() {
			t.Fatalf("one of two: %+v", a)
		}
		// the same principal again does not count twice
		_, err = s.Decide(ctx, "apr-1", Decision{By: "carol", Roles: []string{"finance"}, Approve: true})
		wantErr(t, err, ErrNotAllowed)
		if a := must[Approval](t)(s.GetApproval(ctx, "apr-1")); a.State != ApprovalPending || len(a.Decisions) != 1 {
			t.Fatalf("a refused decision changed the request: %+v", a)
		}
		a = must[Approval](t)(s.Decide(ctx, "apr-1", Decision{By: "dave", Roles: []string{"finance"}, Approve: true}))
		if a.State != ApprovalApproved || a.Decided.IsZero() {
			t.Fatalf("two of two: %+v", a)
		}
		_, err = s.Decide(ctx, "apr-1", Decision{By: "erin", Roles: []string{"finance"}, Approve: false})
		wantErr(t, err, ErrNotPending)

		// the retry: a different call does not match, the same one passes once
		wantErr(t, consume(t, s, "apr-1", "r1", "stripe.charge", "sha256:other"), ErrMismatch)
		wantErr(t, consume(t, s, "apr-1", "r2", "stripe.charge", "sha256:d"), ErrMismatch)
		wantErr(t, consume(t, s, "apr-1", "r1", "stripe.refund", "sha256:d"), ErrMismatch)
		if err := consume(t, s, "apr-1", "r1", "stripe.charge", "sha256:d"); err != nil {
			t.Fatal(err)
		}
		wantErr(t, consume(t, s, "apr-1", "r1", "stripe.charge", "sha256:d"), ErrConsumed)
		if a := must[Approval](t)(s.GetApproval(ctx, "apr-1")); a.Consumed.IsZero() {
			t.Fatalf("consumed not recorded: %+v", a)
		}
	})
}

func TestApprovalDenyAndList(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		must[Approval](t)(s.CreateApproval(ctx, newRequest("apr-1")))
		req := newRequest("apr-2")
		req.Run, req.Roles, req.Quorum = "r2", nil, 1
		must[Approval](t)(s.CreateApproval(ctx, req))

		must[Approval](t)(s.Decide(ctx, "apr-1", Decision{By: "carol", Roles: []string{"finance"}, Approve: true}))
		a := must[Approval](t)(s.Decide(ctx, "apr-1", Decision{By: "dave", Roles: []string{"finance"}}))
		if a.State != ApprovalDenied || len(a.Decisions) != 2 {
			t.Fatalf("one deny denies: %+v", a)
		}
		wantErr(t, consume(t, s, "apr-1", "r1", "stripe.charge", "sha256:d"), ErrNotApproved)

		// no roles: any principal but the actor
		_, err := s.Decide(ctx, "apr-2", Decision{By: "agent-alice", Approve: true})
		wantErr(t, err, ErrNotAllowed)
		if a := must[Approval](t)(s.Decide(ctx, "apr-2", Decision{By: "zed", Approve: true})); a.State != ApprovalApproved {
			t.Fatalf("quorum 1 without roles: %+v", a)
		}

		all := must[[]Approval](t)(s.ListApprovals(ctx, ApprovalFilter{}))
		if len(all) != 2 || all[0].ID != "apr-1" || all[1].ID != "apr-2" {
			t.Fatalf("list: %+v", all)
		}
		if l := must[[]Approval](t)(s.ListApprovals(ctx, ApprovalFilter{Run: "r2"})); len(l) != 1 || l[0].ID != "apr-2" {
			t.Fatalf("by run: %+v", l)
		}
		if l := must[[]Approval](t)(s.ListApprovals(ctx, ApprovalFilter{State: ApprovalDenied})); len(l) != 1 || l[0].ID != "apr-1" {
			t.Fatalf("by state: %+v", l)
		}
		if l := must[[]Approval](t)(s.ListApprovals(ctx, ApprovalFilter{Limit: 1})); len(l) != 1 || l[0].ID != "apr-1" {
			t.Fatalf("limit: %+v", l)
		}
	})
}

func TestApprovalExpiry(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, clock *fakeClock) {
		ctx := context.Background()
		deny := newRequest("apr-deny")
		esc := newRequest("apr-esc")
		esc.OnTimeout, esc.EscalateTo = "escalate", []string{"cfo"}
		must[Approval](t)(s.CreateApproval(ctx, deny))
		must[Approval](t)(s.CreateApproval(ctx, esc))
		must[Approval](t)(s.Decide(ctx, "apr-esc", Decision{By: "carol", Roles: []string{"finance"}, Approve: true}))

		clock.Advance(16 * time.Minute) // past the 15 minute timeout
		if a := must[Approval](t)(s.GetApproval(ctx, "apr-deny")); a.State != ApprovalExpired {
			t.Fatalf("on_timeout deny: %+v", a)
		}
		if l := must[[]Approval](t)(s.ListApprovals(ctx, ApprovalFilter{State: ApprovalExpired})); len(l) != 1 || l[0].ID != "apr-deny" {
			t.Fatalf("expired listed: %+v", l)
		}
		_, err := s.Decide(ctx, "apr-deny", Decision{By: "dave", Roles: []string{"finance"}, Approve: true})
		wantErr(t, err, ErrNotPending)
		wantErr(t, consume(t, s, "apr-deny", "r1", "stripe.charge", "sha256:d"), ErrNotApproved)

		a := must[Approval](t)(s.GetApproval(ctx, "apr-esc"))
		if a.State != ApprovalPending || !a.Escalated || len(a.Roles) != 1 || a.Roles[0] != "cfo" {
			t.Fatalf("escalated: %+v", a)
		}
		_, err = s.Decide(ctx, "apr-esc", Decision{By: "dave", Roles: []string{"finance"}, Approve: true})
		wantErr(t, err, ErrNotAllowed) // finance no longer decides
		a = must[Approval](t)(s.Decide(ctx, "apr-esc", Decision{By: "frank", Roles: []string{"cfo"}, Approve: true}))
		if a.State != ApprovalApproved {
			t.Fatalf("the earlier approval still counts toward the quorum: %+v", a)
		}

		esc2 := newRequest("apr-esc2")
		esc2.OnTimeout, esc2.EscalateTo = "escalate", []string{"cfo"}
		esc2.Expires = clock.Now().Add(time.Minute)
		must[Approval](t)(s.CreateApproval(ctx, esc2))
		clock.Advance(3 * time.Minute) // past the escalation's extra minute too
		if a := must[Approval](t)(s.GetApproval(ctx, "apr-esc2")); a.State != ApprovalExpired || !a.Escalated {
			t.Fatalf("expired after escalation: %+v", a)
		}
	})
}

func TestConsumeRace(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		req := newRequest("apr-1")
		req.Quorum = 1
		must[Approval](t)(s.CreateApproval(ctx, req))
		must[Approval](t)(s.Decide(ctx, "apr-1", Decision{By: "carol", Roles: []string{"finance"}, Approve: true}))
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "agent-alice"}))
		var passed atomic.Int32
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				_, err := s.RecordIntent(ctx, Intent{Run: "r1", Tool: "stripe.charge", ArgsDigest: "sha256:d", Approval: "apr-1"})
				if err == nil {
					passed.Add(1)
				} else if !errors.Is(err, ErrConsumed) {
					t.Errorf("losing retry: %v, want %v", err, ErrConsumed)
				}
			})
		}
		wg.Wait()
		if passed.Load() != 1 {
			t.Fatalf("%d retries passed", passed.Load())
		}
		// only the winner's intent and its consumption were written
		recs := must[[]Record](t)(s.Records(ctx, "r1", 0, 0))
		if len(recs) != 2 || recs[0].Kind != KindIntent || recs[0].Approval != "apr-1" || recs[1].Event != EventConsumed {
			t.Fatalf("records %+v", recs)
		}
	})
}
