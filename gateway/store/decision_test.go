package store

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// approvalRecords returns the KindApproval records of run.
func approvalRecords(t *testing.T, s Store, run string) []Record {
	t.Helper()
	var out []Record
	for _, r := range must[[]Record](t)(s.Records(context.Background(), run, 0, 0)) {
		if r.Kind == KindApproval {
			out = append(out, r)
		}
	}
	return out
}

func events(recs []Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, string(r.Event))
	}
	return out
}

// TestDecisionRecords: the store's own decisions are records of the request's run (issue 16,
// "Decisions are ledger records"): a refused decision is a rejected record with why, a counted
// one names approver, groups, decision and reason, the phase reached is a record, and the
// retry's intent writes the consumption; all of it survives a restart.
func TestDecisionRecords(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "agent-alice"}))
		must[Approval](t)(s.CreateApproval(ctx, newRequest("apr-1")))
		_, err := s.Decide(ctx, "apr-1", Decision{By: "bob", Roles: []string{"sales"}, Approve: true, Comment: "looks fine"})
		wantErr(t, err, ErrNotAllowed)
		must[Approval](t)(s.Decide(ctx, "apr-1", Decision{By: "carol", Roles: []string{"finance", "ops"}, Approve: true, Comment: "FIN-12"}))
		must[Approval](t)(s.Decide(ctx, "apr-1", Decision{By: "dave", Roles: []string{"finance"}, Approve: true}))
		step := must[int64](t)(s.RecordIntent(ctx, Intent{Run: "r1", Tool: "stripe.charge", ArgsDigest: "sha256:d", Approval: "apr-1"}))
		s = restart(t, s)
		recs := approvalRecords(t, s, "r1")
		if got := strings.Join(events(recs), ","); got != "rejected,counted,counted,approved,consumed" {
			t.Fatalf("events %s: %+v", got, recs)
		}
		rej, c := recs[0], recs[1]
		if rej.Approver != "bob" || !slices.Equal(rej.Groups, []string{"sales"}) || rej.Decision != "Approve" || rej.Reason != "looks fine" ||
			!strings.Contains(rej.Note, "bob holds none of the roles") || rej.Approval != "apr-1" || rej.Tool != "stripe.charge" {
			t.Errorf("rejected record %+v", rej)
		}
		if c.Approver != "carol" || !slices.Equal(c.Groups, []string{"finance", "ops"}) || c.Decision != "Approve" || c.Reason != "FIN-12" {
			t.Errorf("counted record %+v", c)
		}
		if cons := recs[4]; cons.Step != step || cons.Seq != step+1 {
			t.Errorf("consumed record %+v, want step %d right after the intent", cons, step)
		}
		in := must[[]Record](t)(s.Records(ctx, "r1", step-1, 1))[0]
		if in.Kind != KindIntent || in.Approval != "apr-1" {
			t.Errorf("the intent does not carry the approval: %+v", in)
		}
	})
}

// TestDecisionRecordsDeny: one Deny denies, and says so in the run.
func TestDecisionRecordsDeny(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "agent-alice"}))
		must[Approval](t)(s.CreateApproval(ctx, newRequest("apr-1")))
		must[Approval](t)(s.Decide(ctx, "apr-1", Decision{By: "carol", Roles: []string{"finance"}, Comment: "no ticket"}))
		recs := approvalRecords(t, s, "r1")
		if got := strings.Join(events(recs), ","); got != "counted,denied" || recs[0].Decision != "Deny" {
			t.Fatalf("events %s: %+v", got, recs)
		}
	})
}

// TestActorIdentityRule: the actor approving under another name, with the same uid or as the
// actor's e-mail (case-insensitive), is refused and journaled as rejected (issue 16, "The
// actor check compares identities, not strings").
func TestActorIdentityRule(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "agent-7"}))
		req := newRequest("apr-1")
		req.Actor, req.ActorUID, req.ActorEmail, req.Quorum = "agent-7", "uid-7", "agent-7@corp.example", 1
		must[Approval](t)(s.CreateApproval(ctx, req))
		_, err := s.Decide(ctx, "apr-1", Decision{By: "Agent-7@Corp.Example", Roles: []string{"finance"}, Approve: true})
		wantErr(t, err, ErrNotAllowed)
		_, err = s.Decide(ctx, "apr-1", Decision{By: "seven", UID: "uid-7", Roles: []string{"finance"}, Approve: true})
		wantErr(t, err, ErrNotAllowed)
		if a := must[Approval](t)(s.GetApproval(ctx, "apr-1")); a.State != ApprovalPending || len(a.Decisions) != 0 ||
			a.ActorUID != "uid-7" || a.ActorEmail != "agent-7@corp.example" {
			t.Fatalf("after the aliases: %+v", a)
		}
		recs := approvalRecords(t, s, "r1")
		if len(recs) != 2 || !strings.Contains(recs[0].Note, "same e-mail") || !strings.Contains(recs[1].Note, "same uid") {
			t.Fatalf("rejected records %+v", recs)
		}
		// another person with another uid counts
		if a := must[Approval](t)(s.Decide(ctx, "apr-1", Decision{By: "carol", UID: "uid-c", Roles: []string{"finance"}, Approve: true})); a.State != ApprovalApproved {
			t.Fatalf("carol: %+v", a)
		}
	})
}

// TestKeptRequest: a request kept in Kubernetes (UID and SpecDigest) is only recorded: the
// store does not decide or expire it, and consumes it once in an intent whatever its state
// (gateway/kube checks the object's phase first).
func TestKeptRequest(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, clock *fakeClock) {
		ctx := context.Background()
		req := ApprovalRequest{ID: "apr-k", Tool: "stripe.charge", ArgsDigest: "sha256:d", Run: "r1", Actor: "agent-alice", UID: "uid-1"}
		_, err := s.CreateApproval(ctx, req)
		wantErr(t, err, ErrInvalid) // a uid without a digest
		req.SpecDigest = "sha256:spec"
		must[Approval](t)(s.CreateApproval(ctx, req)) // no expiry: it waits in Kubernetes
		_, err = s.Decide(ctx, "apr-k", Decision{By: "carol", Approve: true})
		wantErr(t, err, ErrNotAllowed)
		clock.Advance(48 * time.Hour)
		a := must[Approval](t)(s.GetApproval(ctx, "apr-k"))
		if a.UID != "uid-1" || a.SpecDigest != "sha256:spec" || a.State != ApprovalPending || !a.Kept() {
			t.Fatalf("kept request %+v", a)
		}
		wantErr(t, consume(t, s, "apr-k", "r1", "stripe.charge", "sha256:other"), ErrMismatch)
		if err := consume(t, s, "apr-k", "r1", "stripe.charge", "sha256:d"); err != nil {
			t.Fatal(err)
		}
		wantErr(t, consume(t, s, "apr-k", "r1", "stripe.charge", "sha256:d"), ErrConsumed)
		s = restart(t, s)
		wantErr(t, consume(t, s, "apr-k", "r1", "stripe.charge", "sha256:d"), ErrConsumed)
		// the refused replays wrote nothing: one intent
		n := 0
		for _, r := range must[[]Record](t)(s.Records(ctx, "r1", 0, 0)) {
			if r.Kind == KindIntent {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d intents, want 1", n)
		}
	})
}

// TestAppendApprovalOnce: a record with a Once key is written once per run, also after a
// restart; bad records name what is wrong.
func TestAppendApprovalOnce(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "a"}))
		rec := ApprovalRecord{Run: "r1", Request: "apr-1", Tool: "t", Event: EventCounted, Approver: "carol",
			Groups: []string{"finance"}, Decision: "Approve", Reason: "ok", Once: "counted/apr-1-carol"}
		must[int64](t)(s.AppendApproval(ctx, rec))
		_, err := s.AppendApproval(ctx, rec)
		wantErr(t, err, ErrExists)
		s = restart(t, s)
		_, err = s.AppendApproval(ctx, rec)
		wantErr(t, err, ErrExists)
		other := rec
		other.Request = "apr-2" // the key is per request
		must[int64](t)(s.AppendApproval(ctx, other))
		rec.Once = "" // no key: every append is a record
		must[int64](t)(s.AppendApproval(ctx, rec))
		must[int64](t)(s.AppendApproval(ctx, rec))
		if n := len(approvalRecords(t, s, "r1")); n != 4 {
			t.Fatalf("%d records, want 4", n)
		}
		must[int64](t)(s.AppendApproval(ctx, ApprovalRecord{Run: GatewayJournal, Request: "apr-x", Event: EventIgnored, Note: "not ours"}))
		for name, bad := range map[string]ApprovalRecord{
			"no request": {Run: "r1", Event: EventCounted},
			"event":      {Run: "r1", Request: "apr-1", Event: "approved-ish"},
			"decision":   {Run: "r1", Request: "apr-1", Event: EventCounted, Decision: "yes"},
		} {
			_, err := s.AppendApproval(ctx, bad)
			wantErr(t, err, ErrInvalid)
			if err != nil && name == "event" && !strings.Contains(err.Error(), "approved-ish") {
				t.Errorf("%s: %v does not name the value", name, err)
			}
		}
		_, err = s.AppendApproval(ctx, ApprovalRecord{Run: "nope", Request: "apr-1", Event: EventCounted})
		wantErr(t, err, ErrNotFound)
	})
}

// TestRollbackApprovalConsumed: a rollback record naming the compensation's approval consumes
// it in its transaction, and a resumed rollback of the step may name it again.
func TestRollbackApprovalConsumed(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, _ *fakeClock) {
		ctx := context.Background()
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "agent-alice"}))
		step := must[int64](t)(s.RecordIntent(ctx, Intent{Run: "r1", Tool: "stripe.charge"}))
		req := newRequest("apr-rb")
		req.Tool, req.Quorum, req.Roles = "stripe.refund", 1, nil
		must[Approval](t)(s.CreateApproval(ctx, req))
		e := RollbackEntry{Run: "r1", Step: step, Tool: "stripe.refund", Status: RollbackStarted, Approval: "apr-rb", ArgsDigest: "sha256:d"}
		_, err := s.AppendRollback(ctx, e)
		wantErr(t, err, ErrNotApproved)
		must[Approval](t)(s.Decide(ctx, "apr-rb", Decision{By: "carol", Approve: true}))
		must[int64](t)(s.AppendRollback(ctx, e))
		if a := must[Approval](t)(s.GetApproval(ctx, "apr-rb")); a.Consumed.IsZero() {
			t.Fatal("not consumed")
		}
		must[int64](t)(s.AppendRollback(ctx, e)) // resumed
		bad := e
		bad.ArgsDigest = "sha256:other"
		_, err = s.AppendRollback(ctx, bad)
		wantErr(t, err, ErrMismatch)
	})
}

// TestSQLiteMigratesVersion2: a data folder written before issue 16 (schema version 2) opens:
// the new columns are added, its records and requests read back, and the new writes work.
func TestSQLiteMigratesVersion2(t *testing.T) {
	dir := sqliteFixture(t, "testdata/schema-v2.sql",
		`INSERT INTO runs (id, actor, gateway, started, last_activity, status, next_seq) VALUES ('r1', 'agent-alice', 'gw', 1, 1, 'idle', 1)`,
		`INSERT INTO records (run, seq, kind, time, step, tool, decision) VALUES ('r1', 1, 'intent', 1, 1, 'stripe.charge', 'allow')`,
		`INSERT INTO approvals (id, run, tool, args_digest, actor, roles, quorum, created, expires, on_timeout, escalate_to, reason, state, decisions, escalated, decided, consumed)
		 VALUES ('apr-1', 'r1', 'stripe.charge', 'sha256:d', 'agent-alice', '[]', 1, 1, 4102444800000000000, 'deny', '[]', 'r', 'approved', '[]', 0, 2, 0)`)
	s, err := OpenSQLite(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	recs := must[[]Record](t)(s.Records(ctx, "r1", 0, 0))
	if len(recs) != 1 || recs[0].Tool != "stripe.charge" || recs[0].Approval != "" {
		t.Fatalf("old records %+v", recs)
	}
	if a := must[Approval](t)(s.GetApproval(ctx, "apr-1")); a.State != ApprovalApproved || a.UID != "" {
		t.Fatalf("old request %+v", a)
	}
	if err := consume(t, s, "apr-1", "r1", "stripe.charge", "sha256:d"); err != nil {
		t.Fatal(err)
	}
	if ev := events(approvalRecords(t, s, "r1")); len(ev) != 1 || ev[0] != "consumed" {
		t.Fatalf("records after migration: %v", ev)
	}
	var v int
	if err := queryRow(context.Background(), s.r, `PRAGMA user_version`).Scan(&v); err != nil || v != 6 {
		t.Fatalf("user_version %d, %v", v, err)
	}
}
