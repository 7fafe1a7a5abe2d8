package store

import (
	"context"
	"testing"
	"time"
)

// TestSummarizeNotifications: the summary a gateway pod reports (issue 24, dead letters
// visible as a condition) counts the dead rows and the pending rows that failed at least once
// of the receivers named, names the newest dead row, and leaves out rows not tried yet,
// delivered rows and the rows of receivers not named (such as those dead-lettered because
// their receiver was removed).
func TestSummarizeNotifications(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, clock *fakeClock) {
		ctx := context.Background()
		o := outboxOf(t, s)
		sum, ok := s.(NotificationSummarizer)
		if !ok {
			t.Fatalf("%T is not a NotificationSummarizer", s)
		}
		summary := func(sinks ...string) NotificationSummary {
			t.Helper()
			return must[NotificationSummary](t)(sum.SummarizeNotifications(ctx, sinks))
		}
		if got := summary("hook"); got.Dead != 0 || got.Retrying != 0 || got.LastDead != nil {
			t.Fatalf("empty outbox: %+v", got)
		}
		noErr(t, o.SetNotificationReceivers(ctx, []Receiver{{Name: "hook"}, {Name: "gone"}}))
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "alice"}))
		req := ApprovalRequest{Tool: "mem.delete", ArgsDigest: "sha256:1", Run: "r1", Actor: "alice", Quorum: 1, Expires: clock.Now().Add(time.Hour)}
		for range 3 {
			must[Approval](t)(s.CreateApproval(ctx, req))
			clock.Advance(time.Second)
		}
		if got := summary("hook", "gone"); got.Dead != 0 || got.Retrying != 0 {
			t.Fatalf("rows not tried yet are counted: %+v", got)
		}
		rows := must[[]Notification](t)(o.ClaimNotifications(ctx, "w", []string{"hook"}, time.Minute, 10))
		if len(rows) != 3 {
			t.Fatalf("claimed %d rows of hook, want 3", len(rows))
		}
		noErr(t, o.FinishNotification(ctx, rows[0].ID, "w", NotificationDead, time.Time{}, "HTTP 400: no"))
		noErr(t, o.FinishNotification(ctx, rows[1].ID, "w", NotificationDead, time.Time{}, "HTTP 500: later"))
		noErr(t, o.FinishNotification(ctx, rows[2].ID, "w", NotificationPending, clock.Now().Add(time.Minute), "HTTP 503"))
		got := summary("hook")
		if got.Dead != 2 || got.Retrying != 1 || got.LastDead == nil || got.LastDead.ID != rows[1].ID || got.LastDead.LastError != "HTTP 500: later" || got.LastDead.Sink != "hook" {
			t.Fatalf("summary %+v (last %+v), want 2 dead, 1 retrying, the last dead %s", got, got.LastDead, rows[1].ID)
		}
		// "gone" is removed: its pending rows are dead-lettered, and not counted once it is not named.
		noErr(t, o.SetNotificationReceivers(ctx, []Receiver{{Name: "hook"}}))
		if got := summary("hook"); got.Dead != 2 || got.Retrying != 1 {
			t.Fatalf("after gone was removed: %+v, want hook's 2 dead and 1 retrying", got)
		}
		if got := summary("gone"); got.Dead != 3 || got.LastDead == nil || got.LastDead.LastError != "the receiver is no longer configured" {
			t.Fatalf("gone's rows: %+v, want its 3 dead letters", got)
		}
		if got := summary(); got.Dead != 0 || got.LastDead != nil {
			t.Fatalf("no sinks: %+v", got)
		}
	})
}
