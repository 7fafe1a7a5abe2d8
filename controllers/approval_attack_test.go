package controllers

// Outside review of issue 16 (i16-atk): attacks on the ApprovalRequest reconciler that still
// work. Each test FAILS while the attack succeeds.

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

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
	key, err := EphemeralStampKey()
	if err != nil {
		t.Fatal(err)
	}
	const ns, name = "agents", "apr-h"
	t0 := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	ar := &v1alpha1.ApprovalRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: "uid-req", Generation: 1,
		CreationTimestamp: metav1.NewTime(t0)},
		Spec: v1alpha1.ApprovalRequestSpec{Tool: "stripe.refund", Run: "run-1", Actor: "agent-7", Gateway: "pay",
			ArgumentsDigest: "sha256:ab", Roles: []string{"finance"}, Quorum: ptr.To[int32](2),
			ExpiresAt: &metav1.Time{Time: t0.Add(time.Hour)}}}
	objs := []client.Object{ar}
	for i, v := range []struct{ who, decision string }{{"bob", v1alpha1.DecisionDeny}, {"alice", v1alpha1.DecisionApprove}, {"carol", v1alpha1.DecisionApprove}} {
		at := t0.Add(time.Duration(i+1) * time.Second)
		apr := &v1alpha1.Approval{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-" + v.who, Generation: 1, CreationTimestamp: metav1.NewTime(at)},
			Spec: v1alpha1.ApprovalSpec{RequestRef: v1alpha1.ApprovalRequestReference{Name: name, UID: "uid-req"}, Decision: v.decision,
				Approver: &v1alpha1.Approver{Username: v.who, UID: "uid-" + v.who, Groups: []string{"finance", "system:authenticated"}}}}
		apr.Spec.Stamp = key.Stamp(apr, at) // what the Approval webhook writes
		if hidden && v.who == "bob" {
			apr.Status = v1alpha1.ApprovalStatus{Result: v1alpha1.ResultRejected, ObservedGeneration: 1, Message: "not counted: withdrawn"}
		}
		objs = append(objs, apr)
	}
	c := fake.NewClientBuilder().WithScheme(v1alpha1.NewScheme()).
		WithStatusSubresource(&v1alpha1.ApprovalRequest{}, &v1alpha1.Approval{}).
		WithIndex(&v1alpha1.Approval{}, ApprovalRequestIndex, func(o client.Object) []string {
			return []string{o.(*v1alpha1.Approval).Spec.RequestRef.Name}
		}).
		WithObjects(objs...).Build()
	r := &ApprovalRequestReconciler{Client: c, Key: key}
	if _, err := r.Reconcile(t.Context(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	got := &v1alpha1.ApprovalRequest{}
	if err := c.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, got); err != nil {
		t.Fatal(err)
	}
	t.Logf("hidden=%v: phase %s, counted %d, rejected %d: %s", hidden, got.Status.Phase, len(got.Status.Approvals), got.Status.RejectedCount, got.Status.Message)
	return got.Status.Phase
}
