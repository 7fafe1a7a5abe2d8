package controllers

// Outside review of issue 16 (i16-atk): attacks on the ApprovalRequest reconciler that still
// work. Each test FAILS while the attack succeeds.

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// TestAttackDenyHiddenByApprovalStatus: bob (finance) denies; before the reconciler judges
// his Deny, someone who holds patch on approvals/status — which no webhook judges
// (vapproval.reversi.dev covers approvals only; test/redteam ApprovalStatusIsNotAdmissionChecked
// shows the write admitted) — sets its status to Rejected at generation 1. The reconciler
// takes that for its own earlier verdict ("judged before") and skips the Deny for good: alice
// and carol (finance) then approve and the request is Approved, although one Deny denies.
// The window is the time between the Deny's create and its reconcile: a leader election
// (webhooks are served by every replica, the reconciler by the leader only), a slow or
// backed-off reconcile of the request (e.g. its status patch conflicting with metadata edits).
// A fake client stands for the API server so the test controls when the reconciler runs.
func TestAttackDenyHiddenByApprovalStatus(t *testing.T) {
	for _, hidden := range []bool{false, true} {
		phase := decideWithDeny(t, hidden)
		switch {
		case !hidden && phase != v1alpha1.ApprovalDenied:
			t.Fatalf("control: with bob's Deny untouched the request is %s, want Denied", phase)
		case hidden && phase != v1alpha1.ApprovalDenied:
			t.Errorf("ATTACK: with bob's Deny marked Rejected through approvals/status before the reconcile, the request is %s (want Denied: one Deny denies)", phase)
		}
	}
}

// decideWithDeny reconciles a finance quorum-2 request with bob's Deny, then alice's and
// carol's approvals; hidden: bob's Deny carries a Rejected status written by someone else.
func decideWithDeny(t *testing.T, hidden bool) string {
	t.Helper()
	t0 := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	spec := financeQuorum(2)
	spec.ExpiresAt = &metav1.Time{Time: t0.Add(time.Hour)}
	w := newFakeRequestWorld(t, spec, t0)
	w.now = t0.Add(10 * time.Second)
	for i, v := range []struct{ who, decision string }{{"bob", v1alpha1.DecisionDeny}, {"alice", v1alpha1.DecisionApprove}, {"carol", v1alpha1.DecisionApprove}} {
		w.vote(w.ar.Name+"-"+v.who, v.who, v.decision, time.Duration(i+1)*time.Second, "finance")
	}
	if hidden {
		bob := w.approval(w.ar.Name + "-bob")
		bob.Status = v1alpha1.ApprovalStatus{Result: v1alpha1.ResultRejected, ObservedGeneration: bob.Generation, Message: "not counted: withdrawn"}
		if err := w.c.Status().Update(t.Context(), bob); err != nil {
			t.Fatal(err)
		}
	}
	got := w.reconcile()
	t.Logf("hidden=%v: phase %s, counted %d, rejected %d: %s", hidden, got.Status.Phase, len(got.Status.Approvals), got.Status.RejectedCount, got.Status.Message)
	return got.Status.Phase
}
