package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// Issue 24 in Kubernetes mode: a request kept as an ApprovalRequest (recorded with its UID) is
// decided by the controller; the gateway's queue journals the phase it reads as a decision
// record with a Once key, and that append writes the phase's outbox rows in its transaction:
// one per receiver whose filters admit it, decided_by from the run's counted records (not the
// rejected one), the record's note. The same record appended again writes nothing more; a
// phase record of a request the store decides itself (Decide writes those), one without a
// Once key, and a counted record write no row.
func TestKeptPhaseRecordsWriteTheirNotices(t *testing.T) {
	forEach(t, func(t *testing.T, s Store, clock *fakeClock) {
		ctx := context.Background()
		o := outboxOf(t, s)
		noErr(t, o.SetNotificationReceivers(ctx, receivers))
		must[Run](t)(s.CreateRun(ctx, Run{ID: "r1", Actor: "agent"}))
		req := ApprovalRequest{Tool: "mem.delete", ArgsDigest: "sha256:1", Run: "r1", Actor: "agent", Roles: []string{"finance"},
			Quorum: 2, Expires: clock.Now().Add(time.Hour), ArgsPreview: `{"card":"[redacted]"}`}
		kept := req
		kept.ID, kept.UID, kept.SpecDigest = "apr-kept", "uid-1", "sha256:spec"
		k := must[Approval](t)(s.CreateApproval(ctx, kept))
		quiet := kept
		quiet.ID, quiet.UID, quiet.Tool = "apr-quiet", "uid-2", "quiet.delete"
		must[Approval](t)(s.CreateApproval(ctx, quiet))
		own := must[Approval](t)(s.CreateApproval(ctx, req)) // decided by this store
		rows := func() []string {
			var out []string
			for _, n := range must[[]Notification](t)(o.ListNotifications(ctx, NotificationFilter{})) {
				if n.Notice.Type != NoticeApprovalRequested {
					out = append(out, fmt.Sprintf("%s %s kept=%v by=%v note=%q", n.Sink, n.Notice.Key, n.Notice.Kept, n.Notice.DecidedBy, n.Notice.Note))
				}
			}
			slices.Sort(out)
			return out
		}
		appendRec := func(r ApprovalRecord) {
			t.Helper()
			if _, err := s.AppendApproval(ctx, r); err != nil {
				t.Fatalf("append %+v: %v", r, err)
			}
		}
		for _, who := range []string{"alice", "bob"} {
			appendRec(ApprovalRecord{Run: "r1", Request: k.ID, Tool: k.Tool, Event: EventCounted, Approver: who, Decision: "Approve", Once: "counted/" + who})
		}
		appendRec(ApprovalRecord{Run: "r1", Request: k.ID, Tool: k.Tool, Event: EventRejected, Approver: "mallory", Decision: "Approve", Once: "rejected/mallory"})
		if got := rows(); len(got) != 0 {
			t.Fatalf("rows before any phase: %q", got)
		}
		for _, r := range []ApprovalRecord{
			{Run: "r1", Request: own.ID, Tool: own.Tool, Event: EventApproved, Note: "approved", Once: "phase/approved"},
			{Run: "r1", Request: k.ID, Tool: k.Tool, Event: EventDenied, Note: "no Once key"},
		} {
			appendRec(r)
		}
		if got := rows(); len(got) != 0 {
			t.Fatalf("rows for a store-decided request or a record without Once: %q", got)
		}

		phase := ApprovalRecord{Run: "r1", Request: k.ID, Tool: k.Tool, Event: EventApproved, Note: "approved by alice, bob (quorum 2)", Once: "phase/approved"}
		_ = woke(o) // drain
		appendRec(phase)
		if !woke(o) {
			t.Error("no wake-up after a phase record with notifications")
		}
		appendRec(ApprovalRecord{Run: "r1", Request: "apr-quiet", Tool: "quiet.delete", Event: EventEscalated, Note: "escalated", Once: "phase/escalated"})
		want := []string{
			`chat approval.approved:apr-kept kept=true by=[alice bob] note="approved by alice, bob (quorum 2)"`,
			`hook approval.approved:apr-kept kept=true by=[alice bob] note="approved by alice, bob (quorum 2)"`,
			`hook approval.escalated:apr-quiet kept=true by=[] note="escalated"`, // chat takes mem.* only
		}
		if got := rows(); !slices.Equal(got, want) {
			t.Fatalf("rows:\n%q\nwant\n%q", got, want)
		}
		if _, err := s.AppendApproval(ctx, phase); !errors.Is(err, ErrExists) {
			t.Fatalf("the phase record again: %v, want ErrExists", err)
		}
		if got := rows(); !slices.Equal(got, want) {
			t.Fatalf("rows after the record again:\n%q\nwant\n%q", got, want)
		}
	})
}
