package store

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestAlertRowsFollowTheirEvent: an alert is written with the journal record it announces, in
// its transaction, for the receivers whose filters admit it: a refused reload
// (KindReloadFailed with Event.Alert), a rollback step ending verification_failed or
// unrecoverable (AppendRollback, by itself), the kill switch. Its key is deterministic (the
// record's seq). No receivers, or none admitting it: no row. An alert that cannot be written
// takes its record with it, and a record that cannot be written leaves no alert. In
// Kubernetes mode (SetNoticeNamespace) the notices carry the namespace and the kinds of the
// objects there. Source: issue 24.
func TestAlertRowsFollowTheirEvent(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, clock *fakeClock) {
		ctx := context.Background()
		o := outboxOf(t, s)
		gw := &ObjectRef{Kind: ObjectGateway, Name: "gw-a"}
		refused := func() *Notice {
			return &Notice{Type: NoticeAlertReloadRefused, Object: gw, Severity: SeverityWarning, Reason: "ReloadRefused", Message: "bad"}
		}
		// No receivers: the record, no row.
		must[int64](t)(s.AppendEvent(ctx, Event{Kind: KindReloadFailed, Note: "bad", Alert: refused()}))
		if l := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{})); len(l) != 0 || woke(o) {
			t.Fatalf("rows without receivers: %+v", l)
		}
		noErr(t, o.SetNotificationReceivers(ctx, []Receiver{{Name: "hook"}, {Name: "approvals", Events: []string{NoticeApprovalRequested}},
			{Name: "pay", Tools: []string{"payments.*"}}, {Name: "high", Risk: []string{"high"}}}))
		seq := must[int64](t)(s.AppendEvent(ctx, Event{Kind: KindReloadFailed, Note: "bad", Alert: refused()}))
		if !woke(o) {
			t.Fatal("no wake-up after an alert")
		}
		l := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{}))
		recs := must[[]Record](t)(s.Records(ctx, GatewayJournal, seq-1, 0))
		if len(l) != 1 || l[0].Sink != "hook" || len(recs) != 1 {
			t.Fatalf("rows %+v records %+v, want hook's row of the reload_failed record", l, recs)
		}
		n := l[0].Notice
		if n.Key != "alert.reload_refused:gw-a:"+strconv.FormatInt(seq, 10) || n.Seq != seq || !n.At.Equal(recs[0].Time) ||
			n.Severity != SeverityWarning || n.Object.Name != "gw-a" || n.Object.Kind != ObjectGateway || n.Namespace != "" {
			t.Fatalf("notice %+v (record %+v)", n, recs[0])
		}

		// An alert that cannot be written (an unknown alert type) takes its record with it.
		before := must[[]Record](t)(s.Records(ctx, GatewayJournal, 0, 0))
		_, err := s.AppendEvent(ctx, Event{Kind: KindNote, Note: "x", Alert: &Notice{Type: "alert.bogus", Object: gw}})
		wantErr(t, err, ErrInvalid)
		_, err = s.AppendEvent(ctx, Event{Kind: KindNote, Note: "x", Alert: &Notice{Type: NoticeApprovalRequested}})
		wantErr(t, err, ErrInvalid)
		// A record that cannot be written (no such run) leaves no alert.
		_, err = s.AppendEvent(ctx, Event{Run: "nobody", Kind: KindNote, Note: "x", Alert: refused()})
		wantErr(t, err, ErrNotFound)
		if after := must[[]Record](t)(s.Records(ctx, GatewayJournal, 0, 0)); len(after) != len(before) {
			t.Fatalf("a refused alert left records: %+v", after[len(before):])
		}
		if l := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{})); len(l) != 1 {
			t.Fatalf("rows %+v after refused writes", l)
		}

		// A rollback step: verification_failed and unrecoverable alert, compensated does not.
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "alice"}))
		step := must[int64](t)(s.RecordIntent(ctx, Intent{Run: "r1", Tool: "payments.refund", Mode: "enforce", Decision: "allow"}))
		must[int64](t)(s.RecordOutcome(ctx, "r1", step, StepOutcome{Status: Succeeded}))
		must[int64](t)(s.AppendRollback(ctx, RollbackEntry{Run: "r1", Step: step, Tool: "payments.charge", Status: RollbackStarted}))
		must[int64](t)(s.AppendRollback(ctx, RollbackEntry{Run: "r1", Step: step, Tool: "payments.charge", Status: RollbackCompensated}))
		if l := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{})); len(l) != 1 {
			t.Fatalf("rows %+v after started and compensated", l)
		}
		rseq := must[int64](t)(s.AppendRollback(ctx, RollbackEntry{Run: "r1", Step: step, Tool: "payments.charge",
			Status: RollbackVerificationFailed, Note: "first mismatch: $.total", Risk: Risk{BlastRadius: "high"}}))
		l = must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{}))
		if len(l) != 4 {
			t.Fatalf("rows %+v, want hook, pay and high for the rollback step", l)
		}
		want := "alert.rollback_failed:r1:" + strconv.FormatInt(step, 10) + ":" + strconv.FormatInt(rseq, 10)
		for _, r := range l[1:] {
			n := r.Notice
			if r.Sink == "approvals" || n.Key != want || n.Tool != "payments.refund" || n.Run != "r1" || n.Actor != "alice" || n.Step != step ||
				n.Status != string(RollbackVerificationFailed) || n.Severity != SeverityCritical || n.Reason != "VerificationFailed" ||
				n.Risk.BlastRadius != "high" || n.Object == nil || n.Object.Kind != ObjectRun || n.Object.Name != "r1" {
				t.Fatalf("rollback row %+v", r)
			}
		}
		_, err = s.AppendRollback(ctx, RollbackEntry{Run: "r1", Step: step + 100, Status: RollbackUnrecoverable})
		wantErr(t, err, ErrNotFound)
		if l := must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{})); len(l) != 4 {
			t.Fatalf("a refused rollback record wrote rows: %+v", l[4:])
		}

		// Kubernetes mode: the namespace and the kinds of the objects there.
		o.SetNoticeNamespace("agents")
		hseq := must[int64](t)(s.AppendEvent(ctx, Event{Kind: KindNote, Note: "halted by adam: incident",
			Alert: &Notice{Type: NoticeAlertHalted, Object: gw, Actor: "adam", Severity: SeverityCritical, Reason: "Halted"}}))
		l = must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{}))
		if len(l) != 5 {
			t.Fatalf("rows %+v", l)
		}
		if n := l[4].Notice; n.Namespace != "agents" || *n.Object != (ObjectRef{Kind: "ReversiGateway", Namespace: "agents", Name: "gw-a"}) ||
			n.Key != "alert.halted:agents/gw-a:"+strconv.FormatInt(hseq, 10) || gw.Namespace != "" {
			t.Fatalf("halted notice %+v object %+v", n, n.Object)
		}
		// The approval notices carry it too.
		a := must[Approval](t)(s.CreateApproval(ctx, ApprovalRequest{Tool: "payments.refund", Run: "r1", Actor: "alice", Expires: clock.Now().Add(time.Hour)}))
		l = must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{Sink: "approvals"}))
		if len(l) != 1 || l[0].Notice.Approval != a.ID || l[0].Notice.Namespace != "agents" {
			t.Fatalf("approval rows %+v", l)
		}
	})
}
