package controllers

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/testenv"
)

func getApproval(t *testing.T, ns, name string) *v1alpha1.Approval {
	t.Helper()
	a := &v1alpha1.Approval{}
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, a); err != nil {
		t.Fatal(err)
	}
	return a
}

// rejectedOf is the request's status.rejected entry for an Approval (nil when absent).
func rejectedOf(ar *v1alpha1.ApprovalRequest, name string) *v1alpha1.RejectedApproval {
	i := slices.IndexFunc(ar.Status.Rejected, func(r v1alpha1.RejectedApproval) bool { return r.Name == name })
	if i < 0 {
		return nil
	}
	return &ar.Status.Rejected[i]
}

// Issue 16: the webhook binds each Approval to its request's uid and seals it with a stamp the
// controller verifies; the counted approvals list uid, groups and reason. Approvals without a
// name (generateName: the mutating webhook cannot see the name the API server generates),
// with a stamp of their own or with another request's uid are refused at admission.
func TestApprovalStampAndRequestUID(t *testing.T) {
	ns := approverNamespace(t)
	newRequest(t, ns, "apr-s", nil)
	ar := getRequest(t, ns, "apr-s")

	mustApply(t, "alice", ns, "apr-s-alice", "apr-s", "Approve")
	apr := waitResult(t, ns, "apr-s-alice", v1alpha1.ResultCounted)
	if apr.Spec.RequestRef.UID != string(ar.UID) {
		t.Fatalf("spec.requestRef.uid %q, want the request's %q", apr.Spec.RequestRef.UID, ar.UID)
	}
	if apr.Spec.Stamp == nil || apr.Spec.Stamp.KeyID != stampKey.ID() {
		t.Fatalf("stamp %+v, want one of key %s", apr.Spec.Stamp, stampKey.ID())
	}
	if err := stampKey.Verify(apr); err != nil {
		t.Fatalf("the stored stamp does not verify: %v", err)
	}
	if d := apr.CreationTimestamp.Sub(apr.Spec.Stamp.At.Time); d < -2*time.Second || d > 2*time.Second {
		t.Errorf("stamped at %s, created at %s", apr.Spec.Stamp.At, apr.CreationTimestamp)
	}
	ar = waitPhase(t, ns, "apr-s", v1alpha1.ApprovalPending, 1)
	if c := ar.Status.Approvals[0]; c.Username != "alice" || !slices.Contains(c.Groups, "finance") || c.Reason != "test" {
		t.Errorf("counted approval %+v, want alice with her groups and reason", c)
	}

	for name, c := range map[string]struct{ doc, want string }{
		"generateName": {fmt.Sprintf("apiVersion: reversi.dev/v1alpha1\nkind: Approval\nmetadata: {generateName: apr-s-, namespace: %s}\nspec:\n  requestRef: {name: apr-s}\n  decision: Approve\n", ns),
			"metadata.name is required"},
		"own stamp": {fmt.Sprintf("apiVersion: reversi.dev/v1alpha1\nkind: Approval\nmetadata: {name: apr-s-stamp, namespace: %s}\nspec:\n  requestRef: {name: apr-s}\n  decision: Approve\n  stamp: %s\n", ns,
			fmt.Sprintf("{at: %q, keyID: %s, mac: %s}", apr.Spec.Stamp.At.UTC().Format(time.RFC3339), apr.Spec.Stamp.KeyID, apr.Spec.Stamp.MAC)),
			"spec.stamp is written by the Approval webhook: leave it out"},
		"other uid": {fmt.Sprintf("apiVersion: reversi.dev/v1alpha1\nkind: Approval\nmetadata: {name: apr-s-uid, namespace: %s}\nspec:\n  requestRef: {name: apr-s, uid: 0c2a4d4e-0000-0000-0000-000000000000}\n  decision: Approve\n", ns),
			"spec.requestRef.uid is \"0c2a4d4e-0000-0000-0000-000000000000\" but ApprovalRequest apr-s has uid " + string(ar.UID)},
		"uid of no request": {fmt.Sprintf("apiVersion: reversi.dev/v1alpha1\nkind: Approval\nmetadata: {name: apr-s-none, namespace: %s}\nspec:\n  requestRef: {name: apr-nothing, uid: 0c2a4d4e-0000-0000-0000-000000000000}\n  decision: Approve\n", ns),
			"no ApprovalRequest apr-nothing exists"},
	} {
		out, err := kubectlAs(t, "bob", c.doc, "create", "-f", "-")
		if err == nil || !strings.Contains(out, c.want) || !strings.Contains(out, "mapproval.reversi.dev") {
			t.Errorf("%s: kubectl create by bob gave %v\n%s\nwant a refusal saying %q", name, err, out, c.want)
		}
	}
	// The stamp cannot be changed afterwards (even by an admin; spec is immutable too).
	apr = getApproval(t, ns, "apr-s-alice")
	apr.Spec.Stamp.MAC = strings.Repeat("A", 43)
	if err := k8s.Update(t.Context(), apr); err == nil {
		t.Error("an admin changed an Approval's stamp")
	}
}

// Issue 16, pre-approval: an Approval created before its request existed (its uid is empty),
// or for an earlier request of the same name (another uid), is Rejected with the reason, in
// its status and in the request's status.rejected; the request stays Pending.
func TestApprovalBeforeRequestAndForAnotherUID(t *testing.T) {
	ns := approverNamespace(t)
	mustApply(t, "alice", ns, "early-alice", "apr-early", "Approve")
	if apr := getApproval(t, ns, "early-alice"); apr.Spec.RequestRef.UID != "" || apr.Spec.Stamp == nil {
		t.Fatalf("an Approval of no request: uid %q stamp %+v", apr.Spec.RequestRef.UID, apr.Spec.Stamp)
	}
	newRequest(t, ns, "apr-early", func(s *v1alpha1.ApprovalRequestSpec) { s.Quorum = ptrInt32(1) })
	apr := waitResult(t, ns, "early-alice", v1alpha1.ResultRejected)
	if !strings.Contains(apr.Status.Message, "it was made before its request apr-early existed") {
		t.Errorf("pre-approval rejected with %q", apr.Status.Message)
	}
	ar := waitPhase(t, ns, "apr-early", v1alpha1.ApprovalPending, 0)
	if r := rejectedOf(ar, "early-alice"); r == nil || r.Username != "alice" || r.Decision != v1alpha1.DecisionApprove || !strings.Contains(r.Message, "before its request apr-early existed") || ar.Status.RejectedCount != 1 {
		t.Errorf("status.rejected %+v (count %d)", ar.Status.Rejected, ar.Status.RejectedCount)
	}

	// An earlier request of the same name, approved by bob, then deleted and made again: bob's
	// Approval belongs to the old uid and does not approve the new request.
	newRequest(t, ns, "apr-again", func(s *v1alpha1.ApprovalRequestSpec) { s.Quorum = ptrInt32(1) })
	old := getRequest(t, ns, "apr-again")
	mustApply(t, "bob", ns, "again-bob", "apr-again", "Approve")
	waitPhase(t, ns, "apr-again", v1alpha1.ApprovalApproved, 1)
	if err := k8s.Delete(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() string {
		err := k8s.Get(t.Context(), client.ObjectKeyFromObject(old), &v1alpha1.ApprovalRequest{})
		if !apierrors.IsNotFound(err) {
			return fmt.Sprintf("the old request is still there: %v", err)
		}
		return ""
	})
	newRequest(t, ns, "apr-again", func(s *v1alpha1.ApprovalRequestSpec) { s.Quorum = ptrInt32(1) })
	cur := getRequest(t, ns, "apr-again")
	apr = waitResult(t, ns, "again-bob", v1alpha1.ResultRejected)
	if want := fmt.Sprintf("it was made for another request named apr-again (uid %s; this one is %s)", old.UID, cur.UID); !strings.Contains(apr.Status.Message, want) {
		t.Errorf("an Approval of the old uid: %q, want %q", apr.Status.Message, want)
	}
	ar = waitPhase(t, ns, "apr-again", v1alpha1.ApprovalPending, 0)
	if rejectedOf(ar, "again-bob") == nil {
		t.Errorf("status.rejected %+v", ar.Status.Rejected)
	}
	// An Approval made now counts.
	mustApply(t, "bob", ns, "again-bob-2", "apr-again", "Approve")
	waitPhase(t, ns, "apr-again", v1alpha1.ApprovalApproved, 1)
}

func ptrInt32(n int32) *int32 { return &n }

// Issue 16, self-approval by a second name: the actor check compares identities. An approver
// whose username is the actor's e-mail (in another case), or whose uid is the actor's uid, is
// Rejected as the run's own actor; someone else with a similar name counts.
func TestApprovalActorAliases(t *testing.T) {
	ns := approverNamespace(t)
	newRequest(t, ns, "apr-a", func(s *v1alpha1.ApprovalRequestSpec) {
		s.ActorUID, s.ActorEmail = "uid-agent-7", "agent-7@corp.example"
	})
	fin := []string{"finance", "system:authenticated"}
	for _, c := range []struct {
		name, user, uid, want string
	}{
		{"alias-mail", "Agent-7@Corp.Example", "", "Agent-7@Corp.Example is the run's own actor agent-7 (same e-mail) and cannot approve its own call"},
		{"alias-uid", "a7", "uid-agent-7", "a7 is the run's own actor agent-7 (same uid) and cannot approve its own call"},
	} {
		apr := &v1alpha1.Approval{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: c.name},
			Spec: v1alpha1.ApprovalSpec{RequestRef: v1alpha1.ApprovalRequestReference{Name: "apr-a"}, Decision: v1alpha1.DecisionApprove}}
		if err := clientAs(t, c.user, c.uid, fin...).Create(t.Context(), apr); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := waitResult(t, ns, c.name, v1alpha1.ResultRejected); !strings.Contains(got.Status.Message, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got.Status.Message, c.want)
		}
	}
	other := &v1alpha1.Approval{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "not-alias"},
		Spec: v1alpha1.ApprovalSpec{RequestRef: v1alpha1.ApprovalRequestReference{Name: "apr-a"}, Decision: v1alpha1.DecisionApprove}}
	if err := clientAs(t, "agent-77@corp.example", "uid-agent-77", fin...).Create(t.Context(), other); err != nil {
		t.Fatal(err)
	}
	waitResult(t, ns, "not-alias", v1alpha1.ResultCounted)
	ar := waitPhase(t, ns, "apr-a", v1alpha1.ApprovalPending, 1)
	if ar.Status.Approvals[0].UID != "uid-agent-77" || ar.Status.RejectedCount != 2 {
		t.Errorf("status: approvals %+v, rejected %d", ar.Status.Approvals, ar.Status.RejectedCount)
	}
}

// Issue 16, counting fails closed without the webhook: with the webhook configurations deleted,
// an Approval with a hand-written approver of the right group, one with a stamp copied from
// another Approval, and one with a made-up stamp are not counted; the request stays Pending and
// its Ready condition says why (ApprovalNotStamped).
func TestApprovalWithoutWebhooksNotCounted(t *testing.T) {
	ns := approverNamespace(t)
	newRequest(t, ns, "apr-n", func(s *v1alpha1.ApprovalRequestSpec) { s.Quorum = ptrInt32(2) })
	ar := getRequest(t, ns, "apr-n")
	mustApply(t, "alice", ns, "apr-n-alice", "apr-n", "Approve")
	waitResult(t, ns, "apr-n-alice", v1alpha1.ResultCounted)
	real := getApproval(t, ns, "apr-n-alice")

	ref := v1alpha1.ApprovalRequestReference{Name: "apr-n", UID: string(ar.UID)}
	testenv.WithoutAdmission(t, k8s, ns, func() {
		for _, a := range []*v1alpha1.Approval{
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "apr-n-handwritten"}, Spec: v1alpha1.ApprovalSpec{RequestRef: ref, Decision: v1alpha1.DecisionApprove,
				Approver: &v1alpha1.Approver{Username: "bob", Groups: []string{"finance", "system:authenticated"}}}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "apr-n-copied"}, Spec: v1alpha1.ApprovalSpec{RequestRef: ref, Decision: v1alpha1.DecisionApprove,
				Approver: &v1alpha1.Approver{Username: "bob", Groups: []string{"finance", "system:authenticated"}}, Stamp: real.Spec.Stamp}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "apr-n-madeup"}, Spec: v1alpha1.ApprovalSpec{RequestRef: ref, Decision: v1alpha1.DecisionApprove,
				Approver: &v1alpha1.Approver{Username: "carol", Groups: []string{"finance"}},
				Stamp:    &v1alpha1.ApprovalStamp{At: metav1.Now(), KeyID: "0123456789abcdef", MAC: strings.Repeat("x", 43)}}},
		} {
			if err := k8s.Create(t.Context(), a); err != nil {
				t.Fatalf("without the webhooks, creating %s: %v", a.Name, err)
			}
		}
		for name, why := range map[string]string{
			"apr-n-handwritten": "spec.stamp is missing",
			"apr-n-copied":      "spec.stamp.mac does not match",
			"apr-n-madeup":      "is not a key of the controller",
		} {
			apr := waitResult(t, ns, name, v1alpha1.ResultRejected)
			if !strings.Contains(apr.Status.Message, "carries no valid stamp of the Approval webhook") || !strings.Contains(apr.Status.Message, why) {
				t.Errorf("%s: %q, want the stamp's failure %q", name, apr.Status.Message, why)
			}
		}
	})
	ar = waitPhase(t, ns, "apr-n", v1alpha1.ApprovalPending, 1)
	c := condition(ar.Status.Conditions, v1alpha1.ConditionReady)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonApprovalNotStamped ||
		!strings.Contains(c.Message, "3 Approval(s) (apr-n-copied, apr-n-handwritten, apr-n-madeup) carry no valid stamp") ||
		!strings.Contains(c.Message, "mapproval.reversi.dev") {
		t.Errorf("Ready %+v", c)
	}
	if r := rejectedOf(ar, "apr-n-handwritten"); r == nil || r.Username != "" || ar.Status.RejectedCount != 3 {
		t.Errorf("status.rejected %+v (%d): an unstamped approver must not be listed as who decided", ar.Status.Rejected, ar.Status.RejectedCount)
	}
	// With the webhooks back, bob's own Approval counts and approves.
	mustApply(t, "bob", ns, "apr-n-bob", "apr-n", "Approve")
	ar = waitPhase(t, ns, "apr-n", v1alpha1.ApprovalApproved, 2)
	if c := condition(ar.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Reason != v1alpha1.ReasonApproved {
		t.Errorf("Ready after approval %+v", c)
	}
}

// EnsureStampKey makes the Secret once and reads the same key afterwards; an earlier key kept
// as another entry verifies but does not stamp; a short key is refused with what to do.
func TestEnsureStampKey(t *testing.T) {
	ns := namespace(t)
	ref := types.NamespacedName{Namespace: ns, Name: DefaultStampKeySecret}
	k1, err := EnsureStampKey(t.Context(), k8s, ref)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := EnsureStampKey(t.Context(), k8s, ref)
	if err != nil || k2.ID() != k1.ID() {
		t.Fatalf("second read: %v, id %s want %s", err, k2.ID(), k1.ID())
	}
	a := &v1alpha1.Approval{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a", CreationTimestamp: metav1.Now()},
		Spec: v1alpha1.ApprovalSpec{RequestRef: v1alpha1.ApprovalRequestReference{Name: "r", UID: "u"}, Decision: v1alpha1.DecisionApprove,
			Approver: &v1alpha1.Approver{Username: "alice", Groups: []string{"finance"}}}}
	a.Spec.Stamp = k1.Stamp(a, time.Now())

	// Rotation: the old key moves to another entry, a new one stamps.
	var s corev1.Secret
	if err := k8s.Get(t.Context(), ref, &s); err != nil {
		t.Fatal(err)
	}
	s.Data["2026-01.key"] = s.Data[StampKeyData]
	s.Data[StampKeyData] = bytes.Repeat([]byte{7}, 32)
	if err := k8s.Update(t.Context(), &s); err != nil {
		t.Fatal(err)
	}
	k3, err := EnsureStampKey(t.Context(), k8s, ref)
	if err != nil || k3.ID() == k1.ID() {
		t.Fatalf("after rotation: %v, id %s", err, k3.ID())
	}
	if err := k3.Verify(a); err != nil {
		t.Errorf("an earlier key's stamp: %v", err)
	}
	if st := k3.Stamp(a, time.Now()); st.KeyID != k3.ID() {
		t.Errorf("stamped with %s, want the current key %s", st.KeyID, k3.ID())
	}
	// Any change to what the stamp covers breaks it; so does a creation time far from it.
	for name, edit := range map[string]func(*v1alpha1.Approval){
		"decision": func(a *v1alpha1.Approval) { a.Spec.Decision = v1alpha1.DecisionDeny },
		"groups":   func(a *v1alpha1.Approval) { a.Spec.Approver.Groups = append(a.Spec.Approver.Groups, "cfo") },
		"uid":      func(a *v1alpha1.Approval) { a.Spec.RequestRef.UID = "v" },
		"name":     func(a *v1alpha1.Approval) { a.Name = "b" },
		"late":     func(a *v1alpha1.Approval) { a.CreationTimestamp = metav1.NewTime(time.Now().Add(2 * time.Minute)) },
	} {
		b := a.DeepCopy()
		edit(b)
		if err := k3.Verify(b); err == nil {
			t.Errorf("%s changed: the stamp still verifies", name)
		}
	}

	s.Data[StampKeyData] = []byte("short")
	if err := k8s.Update(t.Context(), &s); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureStampKey(t.Context(), k8s, ref); err == nil || !strings.Contains(err.Error(), `put 32 or more random bytes in "stamp.key"`) {
		t.Errorf("a short key: %v", err)
	}
}
