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
)

// fakeRequestWorld is one request, its Approvals and a reconciler over a fake API server.
type fakeRequestWorld struct {
	t     *testing.T
	c     client.Client
	r     *ApprovalRequestReconciler
	stamp *StampKey
	sk    *SigningKey
	ar    *v1alpha1.ApprovalRequest
	t0    time.Time
	now   time.Time
}

const fakeNS = "agents"

func newFakeRequestWorld(t *testing.T, spec v1alpha1.ApprovalRequestSpec, t0 time.Time) *fakeRequestWorld {
	t.Helper()
	stamp, err := EphemeralStampKey()
	if err != nil {
		t.Fatal(err)
	}
	sk, err := EphemeralSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	ar := &v1alpha1.ApprovalRequest{ObjectMeta: metav1.ObjectMeta{Namespace: fakeNS, Name: "apr-x", UID: "uid-apr-x", Generation: 1,
		CreationTimestamp: metav1.NewTime(t0)}, Spec: spec}
	c := fake.NewClientBuilder().WithScheme(v1alpha1.NewScheme()).
		WithStatusSubresource(&v1alpha1.ApprovalRequest{}, &v1alpha1.Approval{}).
		WithIndex(&v1alpha1.Approval{}, ApprovalRequestIndex, func(o client.Object) []string {
			return []string{o.(*v1alpha1.Approval).Spec.RequestRef.Name}
		}).
		WithObjects(ar).Build()
	w := &fakeRequestWorld{t: t, c: c, stamp: stamp, sk: sk, ar: ar, t0: t0, now: t0}
	w.r = &ApprovalRequestReconciler{Client: c, Key: stamp, Signing: sk, Now: func() time.Time { return w.now }}
	return w
}

// vote creates a stamped Approval (as the webhook would) created at t0+at.
func (w *fakeRequestWorld) vote(name, who, decision string, at time.Duration, groups ...string) {
	w.t.Helper()
	ct := w.t0.Add(at)
	apr := &v1alpha1.Approval{ObjectMeta: metav1.ObjectMeta{Namespace: fakeNS, Name: name, Generation: 1, CreationTimestamp: metav1.NewTime(ct)},
		Spec: v1alpha1.ApprovalSpec{RequestRef: v1alpha1.ApprovalRequestReference{Name: w.ar.Name, UID: string(w.ar.UID)}, Decision: decision,
			Approver: &v1alpha1.Approver{Username: who, UID: "uid-" + who, Groups: append(groups, "system:authenticated")}}}
	apr.Spec.Stamp = w.stamp.Stamp(apr, ct)
	if err := w.c.Create(w.t.Context(), apr); err != nil {
		w.t.Fatal(err)
	}
	// the fake client overwrites creationTimestamp on create: put it back
	apr.CreationTimestamp = metav1.NewTime(ct)
	if err := w.c.Update(w.t.Context(), apr); err != nil {
		w.t.Fatal(err)
	}
}

func (w *fakeRequestWorld) reconcile() *v1alpha1.ApprovalRequest {
	w.t.Helper()
	if _, err := w.r.Reconcile(w.t.Context(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: fakeNS, Name: w.ar.Name}}); err != nil {
		w.t.Fatalf("reconcile: %v", err)
	}
	return w.request()
}

func (w *fakeRequestWorld) request() *v1alpha1.ApprovalRequest {
	w.t.Helper()
	got := &v1alpha1.ApprovalRequest{}
	if err := w.c.Get(w.t.Context(), types.NamespacedName{Namespace: fakeNS, Name: w.ar.Name}, got); err != nil {
		w.t.Fatal(err)
	}
	return got
}

func (w *fakeRequestWorld) approval(name string) *v1alpha1.Approval {
	w.t.Helper()
	got := &v1alpha1.Approval{}
	if err := w.c.Get(w.t.Context(), types.NamespacedName{Namespace: fakeNS, Name: name}, got); err != nil {
		w.t.Fatal(err)
	}
	return got
}

func financeQuorum(q int32) v1alpha1.ApprovalRequestSpec {
	return v1alpha1.ApprovalRequestSpec{Tool: "stripe.refund", Run: "run-1", Actor: "agent-7", Gateway: "pay",
		ArgumentsDigest: "sha256:ab", Roles: []string{"finance"}, Quorum: ptr.To(q)}
}
