package approvalsig

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

func key(t *testing.T) (*signing.Signer, *signing.TrustSet) {
	t.Helper()
	priv, pub, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := signing.ParseSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := signing.ParseTrustSet(pub)
	if err != nil {
		t.Fatal(err)
	}
	return s, ts
}

func approved(name, uid string) *v1alpha1.ApprovalRequest {
	at := metav1.NewTime(time.Date(2025, 5, 1, 10, 0, 0, 0, time.UTC))
	return &v1alpha1.ApprovalRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: name, UID: types.UID(uid)},
		Spec: v1alpha1.ApprovalRequestSpec{Tool: "stripe.refund", ArgumentsDigest: "sha256:" + strings.Repeat("a", 64), Run: "r1",
			Actor: "agent-7", Gateway: "pay", Roles: []string{"finance"}, Quorum: ptr.To[int32](2)},
		Status: v1alpha1.ApprovalRequestStatus{Phase: v1alpha1.ApprovalApproved, DecidedAt: &at, Approvals: []v1alpha1.CountedApproval{
			{Name: name + "-bob", Username: "bob", Decision: v1alpha1.DecisionApprove},
			{Name: name + "-alice", Username: "alice", Decision: v1alpha1.DecisionApprove},
		}},
	}
}

func TestMessage(t *testing.T) {
	ar := approved("apr-1", "uid-x")
	want := "reversi-approval-decision:v1\nagents\napr-1\nuid-x\n" + ar.Spec.Digest() + "\nApproved\n2025-05-01T10:00:00Z\nalice,bob"
	if got := string(Message(ar)); got != want {
		t.Fatalf("message\n%q\nwant\n%q", got, want)
	}
}

// TestVerify: the signed decision verifies; every change of what it covers, a signature of
// another request, another key, a missing signature or a quorum not reached does not.
func TestVerify(t *testing.T) {
	s, trust := key(t)
	other, _ := key(t)
	ar := approved("apr-1", "uid-x")
	d, err := Sign(ar, s, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ar.Status.Decision = d
	if err := Verify(ar, trust); err != nil {
		t.Fatalf("honest decision: %v", err)
	}
	cases := map[string]func(ar *v1alpha1.ApprovalRequest){
		"unsigned":      func(ar *v1alpha1.ApprovalRequest) { ar.Status.Decision = nil },
		"other uid":     func(ar *v1alpha1.ApprovalRequest) { ar.UID = "uid-y" },
		"other name":    func(ar *v1alpha1.ApprovalRequest) { ar.Name = "apr-2" },
		"other spec":    func(ar *v1alpha1.ApprovalRequest) { ar.Spec.Quorum = ptr.To[int32](1) },
		"other decided": func(ar *v1alpha1.ApprovalRequest) { ar.Status.DecidedAt = &metav1.Time{Time: time.Now()} },
		"no decided":    func(ar *v1alpha1.ApprovalRequest) { ar.Status.DecidedAt = nil },
		"approver gone": func(ar *v1alpha1.ApprovalRequest) { ar.Status.Approvals = ar.Status.Approvals[:1] },
		"approver swapped": func(ar *v1alpha1.ApprovalRequest) {
			ar.Status.Approvals[0].Username = "mallory"
		},
		"other key": func(ar *v1alpha1.ApprovalRequest) {
			d, _ := Sign(ar, other, time.Now())
			ar.Status.Decision = d
		},
		"garbage": func(ar *v1alpha1.ApprovalRequest) { ar.Status.Decision.Signature = "!!" },
		"pending": func(ar *v1alpha1.ApprovalRequest) { ar.Status.Phase = v1alpha1.ApprovalPending },
	}
	for name, edit := range cases {
		t.Run(name, func(t *testing.T) {
			c := ar.DeepCopy()
			edit(c)
			if err := Verify(c, trust); err == nil {
				t.Fatal("verified")
			}
		})
	}
	// One approver written twice under two Approvals is one approver: below the quorum even
	// when signed (a controller never signs that, but the gateway does not rely on it).
	one := approved("apr-3", "u")
	one.Status.Approvals[1].Username = "bob"
	one.Status.Decision, _ = Sign(one, s, time.Now())
	if err := Verify(one, trust); err == nil || !strings.Contains(err.Error(), "quorum") {
		t.Fatalf("one approver twice: %v", err)
	}
	if err := Verify(approved("apr-4", "u"), trust); !errors.Is(err, ErrUnsigned) {
		t.Fatalf("unsigned: %v", err)
	}
}
