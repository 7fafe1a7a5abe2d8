package kube

import (
	"context"
	"testing"

	"github.com/reversi-gitops/reversi/gateway/store"
)

// TestDecisionRecordsAreSteps: the fold of a run's ledger puts its decision records among the
// steps (outcome "approval", RunStep.Approval), in Seq order, without counting them as calls
// (issue 16: "the ReversiRun mirror's step list").
func TestDecisionRecordsAreSteps(t *testing.T) {
	ctx := context.Background()
	st := store.NewMemory(nil)
	if _, err := st.CreateRun(ctx, store.Run{ID: "r1", Actor: "agent-7"}); err != nil {
		t.Fatal(err)
	}
	step, _ := st.RecordIntent(ctx, store.Intent{Run: "r1", Tool: "stripe.charge", Decision: "needs_approval"})
	_, _ = st.RecordOutcome(ctx, "r1", step, store.StepOutcome{Status: store.Blocked,
		Note: "stripe.charge requires approval: request apr-1 is waiting for an approver; retry"})
	_, _ = st.AppendApproval(ctx, store.ApprovalRecord{Run: "r1", Request: "apr-1", Tool: "stripe.charge", Event: store.EventRejected,
		Approver: "mallory", Groups: []string{"sales"}, Decision: "Approve", Reason: "lgtm", Note: "mallory holds none of the roles [finance]"})
	m := &Runs{Store: st}
	rs := &runState{intents: map[int64]store.Record{}}
	if err := m.fold(ctx, "r1", rs); err != nil {
		t.Fatal(err)
	}
	if len(rs.steps) != 2 || rs.stepCount != 1 || rs.counts.PendingApproval != 1 {
		t.Fatalf("steps %+v count %d counts %+v", rs.steps, rs.stepCount, rs.counts)
	}
	d := rs.steps[1]
	if d.Outcome != "approval" || d.Seq != 3 || d.Tool != "stripe.charge" || d.ApprovalRequest != "apr-1" || d.Approval == nil ||
		d.Approval.Event != "rejected" || d.Approval.Approver != "mallory" || len(d.Approval.Groups) != 1 || d.Approval.Decision != "Approve" ||
		d.Approval.Reason != "lgtm" || d.Message != "mallory holds none of the roles [finance]" {
		t.Fatalf("decision step %+v %+v", d, d.Approval)
	}
}
