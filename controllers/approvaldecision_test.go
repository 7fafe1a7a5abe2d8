package controllers

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
	"github.com/reversi-gitops/reversi/pkg/approvalsig"
)

// TestDecisionSigned: the controller signs the Approved decision its Approvals reach (the
// signature verifies with its public keys, and not after any edit of what it covers), and does
// not sign an Approved phase someone wrote into the status: not with no Approvals at all, not
// with status.approvals naming an Approval that was Rejected (no finance), and not with the
// signature of another request copied on. A fake client stands for the API server.
func TestDecisionSigned(t *testing.T) {
	stamp, err := EphemeralStampKey()
	if err != nil {
		t.Fatal(err)
	}
	sk, err := EphemeralSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	const ns = "agents"
	t0 := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	request := func(name string) *v1alpha1.ApprovalRequest {
		return &v1alpha1.ApprovalRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), Generation: 1,
			CreationTimestamp: metav1.NewTime(t0)},
			Spec: v1alpha1.ApprovalRequestSpec{Tool: "stripe.refund", Run: "run-1", Actor: "agent-7", Gateway: "pay",
				ArgumentsDigest: "sha256:ab", Roles: []string{"finance"}, Quorum: ptr.To[int32](2), ExpiresAt: &metav1.Time{Time: t0.Add(time.Hour)}}}
	}
	approval := func(ar *v1alpha1.ApprovalRequest, who string, i int, groups ...string) *v1alpha1.Approval {
		at := t0.Add(time.Duration(i+1) * time.Second)
		apr := &v1alpha1.Approval{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ar.Name + "-" + who, Generation: 1, CreationTimestamp: metav1.NewTime(at)},
			Spec: v1alpha1.ApprovalSpec{RequestRef: v1alpha1.ApprovalRequestReference{Name: ar.Name, UID: string(ar.UID)}, Decision: v1alpha1.DecisionApprove,
				Approver: &v1alpha1.Approver{Username: who, UID: "uid-" + who, Groups: append(groups, "system:authenticated")}}}
		apr.Spec.Stamp = stamp.Stamp(apr, at)
		return apr
	}
	forged := func(ar *v1alpha1.ApprovalRequest, who ...string) {
		at := metav1.NewTime(t0.Add(10 * time.Second))
		ar.Status = v1alpha1.ApprovalRequestStatus{Phase: v1alpha1.ApprovalApproved, DecidedAt: &at, ApprovedCount: int32(len(who))}
		for _, w := range who {
			ar.Status.Approvals = append(ar.Status.Approvals, v1alpha1.CountedApproval{Name: ar.Name + "-" + w, Username: w,
				Groups: []string{"finance"}, Decision: v1alpha1.DecisionApprove, CountedAt: at})
		}
	}

	honest := request("apr-ok")
	unbacked := request("apr-none")
	forged(unbacked, "alice", "carol")
	outsider := request("apr-outsider") // alice (finance) and mallory (no finance) approved
	forged(outsider, "alice", "mallory")
	copied := request("apr-copied")
	objs := []client.Object{honest, approval(honest, "alice", 0, "finance"), approval(honest, "carol", 1, "finance"),
		unbacked, outsider, approval(outsider, "alice", 0, "finance"), approval(outsider, "mallory", 1), copied}
	c := fake.NewClientBuilder().WithScheme(v1alpha1.NewScheme()).
		WithStatusSubresource(&v1alpha1.ApprovalRequest{}, &v1alpha1.Approval{}).
		WithIndex(&v1alpha1.Approval{}, ApprovalRequestIndex, func(o client.Object) []string {
			return []string{o.(*v1alpha1.Approval).Spec.RequestRef.Name}
		}).
		WithObjects(objs...).Build()
	r := &ApprovalRequestReconciler{Client: c, Key: stamp, Signing: sk}
	reconcile := func(name string) *v1alpha1.ApprovalRequest {
		t.Helper()
		if _, err := r.Reconcile(t.Context(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}); err != nil {
			t.Fatalf("reconcile %s: %v", name, err)
		}
		got := &v1alpha1.ApprovalRequest{}
		if err := c.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, got); err != nil {
			t.Fatal(err)
		}
		return got
	}

	ok := reconcile("apr-ok")
	if ok.Status.Phase != v1alpha1.ApprovalApproved || ok.Status.Decision == nil {
		t.Fatalf("honest request: phase %s, decision %+v", ok.Status.Phase, ok.Status.Decision)
	}
	if err := approvalsig.Verify(ok, sk.Trust); err != nil {
		t.Fatalf("the controller's signature: %v", err)
	}
	if again := reconcile("apr-ok"); *again.Status.Decision.SignedAt != *ok.Status.Decision.SignedAt {
		t.Errorf("a reconcile signed an unchanged decision again: %v then %v", ok.Status.Decision.SignedAt, again.Status.Decision.SignedAt)
	}

	for _, name := range []string{"apr-none", "apr-outsider"} {
		if got := reconcile(name); got.Status.Decision != nil || approvalsig.Verify(got, sk.Trust) == nil {
			t.Errorf("ATTACK: the controller signed the forged Approved status of %s (approvals %+v): %+v", name, got.Status.Approvals, got.Status.Decision)
		}
	}

	// The honest request's signed status, approvers and all, copied onto another request.
	base := copied.DeepCopy()
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(copied), base); err != nil {
		t.Fatal(err)
	}
	cp := base.DeepCopy()
	cp.Status = *ok.Status.DeepCopy()
	if err := c.Status().Patch(t.Context(), cp, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	if err := approvalsig.Verify(cp, sk.Trust); err == nil {
		t.Error("another request's signature verifies on apr-copied")
	}
	if got := reconcile("apr-copied"); got.Status.Decision != nil {
		t.Errorf("ATTACK: the controller signed the copied Approved status of apr-copied: %+v", got.Status.Decision)
	}
}
