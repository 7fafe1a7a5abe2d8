package controllers

// Outside review of issue 16, second round (i16-atk2): attacks on the ApprovalRequest
// reconciler and its decision signature that still work. Each test FAILS while the attack
// succeeds (its t.Errorf lines start with "ATTACK:"). A fake client stands for the API server
// so the test controls when the reconciler runs and what the status says.

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/approvalsig"
)

// TestAttackSignedAfterDenyWithdrawn: the signature exists against whoever may write
// approvalrequests/status (docs/security.md "Signed decisions": "it never signs a status
// someone else wrote"). Finance quorum 2: alice approves, carol denies (counted: Denied), bob
// approves too late (Rejected). mallory, who may write approvalrequests/status (the webhook's
// status rule removed, as in test/redteam ForgedPhaseWithStatusRuleRemoved) and delete
// Approvals (ValidateDelete allows any delete: "withdrawing a vote"), deletes carol's Deny and
// writes status Approved by alice and bob. The controller's re-judge sees only the live
// Approvals — alice then bob reach quorum 2 — and signs: the gateway then honours a request
// finance denied. The re-judge cannot tell a deleted counted Deny from one never cast.
func TestAttackSignedAfterDenyWithdrawn(t *testing.T) {
	t0 := time.Now().Add(-10 * time.Minute).UTC().Truncate(time.Second)
	w := newFakeRequestWorld(t, financeQuorum(2), t0)
	w.vote("apr-x-alice", "alice", v1alpha1.DecisionApprove, 1*time.Second, "finance")
	w.vote("apr-x-carol", "carol", v1alpha1.DecisionDeny, 2*time.Second, "finance")
	w.vote("apr-x-bob", "bob", v1alpha1.DecisionApprove, 3*time.Second, "finance")
	w.now = t0.Add(5 * time.Second)
	got := w.reconcile()
	if got.Status.Phase != v1alpha1.ApprovalDenied || got.Status.Decision != nil {
		t.Fatalf("control: phase %s, decision %+v, want Denied unsigned", got.Status.Phase, got.Status.Decision)
	}

	// mallory: delete carol's Deny, write the status she wants.
	if err := w.c.Delete(t.Context(), w.approval("apr-x-carol")); err != nil {
		t.Fatal(err)
	}
	base := got.DeepCopy()
	at := metav1.NewTime(t0.Add(3 * time.Second))
	got.Status = v1alpha1.ApprovalRequestStatus{Phase: v1alpha1.ApprovalApproved, DecidedAt: &at, ApprovedCount: 2, ObservedGeneration: 1,
		Approvals: []v1alpha1.CountedApproval{
			{Name: "apr-x-alice", Username: "alice", UID: "uid-alice", Groups: []string{"finance"}, Decision: v1alpha1.DecisionApprove, CountedAt: at},
			{Name: "apr-x-bob", Username: "bob", UID: "uid-bob", Groups: []string{"finance"}, Decision: v1alpha1.DecisionApprove, CountedAt: at}}}
	if err := w.c.Status().Patch(t.Context(), got, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	w.now = t0.Add(20 * time.Second)
	after := w.reconcile()
	if err := approvalsig.Verify(after, w.sk.Trust); err == nil {
		t.Errorf("ATTACK: the controller signed the Approved status mallory wrote over carol's counted Deny (deleted): phase %s by %v, decision key %s: the gateway lets finance's denied call through",
			after.Status.Phase, approvalsig.Approvers(after), after.Status.Decision.KeyID)
	}
}

// TestAttackRejectedBeyondListFlipsOnEscalation: status.rejected lists the first 32 rejected
// Approvals; the rest "are judged again each time, to the same verdict". Not so across an
// escalation: the roles then become escalateTo. finance request, escalate to ops after 60 s.
// 32 Approvals of users without a role are rejected first (anyone allowed to create Approvals
// can make them); dave (ops, not finance) approves at 40 s and is Rejected ("holds none of the
// roles [finance]"). After the escalation the reconciler judges dave's Approval again against
// the escalated roles and counts it: the request turns Approved on an Approval made, and
// Rejected, before the escalation (with 31 rejected before it, it stays Rejected for good). The
// re-judge from the spec rejects dave, so the decision is never signed: the request is stuck
// "Approved" while the gateway holds the call, and ops can no longer approve it (a request
// that is not pending refuses every further Approval). With a Deny instead, the flip denies.
func TestAttackRejectedBeyondListFlipsOnEscalation(t *testing.T) {
	for _, noise := range []int{v1alpha1.MaxCountedApprovals - 1, v1alpha1.MaxCountedApprovals} {
		t.Run(fmt.Sprintf("%d-rejected-first", noise), func(t *testing.T) {
			t0 := time.Now().Add(-10 * time.Minute).UTC().Truncate(time.Second)
			spec := financeQuorum(1)
			spec.ExpiresAt = &metav1.Time{Time: t0.Add(60 * time.Second)}
			spec.OnTimeout, spec.EscalateTo = "escalate", []string{"ops"}
			w := newFakeRequestWorld(t, spec, t0)
			for i := range noise {
				w.vote(fmt.Sprintf("apr-x-noise-%02d", i), fmt.Sprintf("nobody-%02d", i), v1alpha1.DecisionApprove, time.Duration(i%30+1)*time.Second)
			}
			w.vote("apr-x-zz-dave", "dave", v1alpha1.DecisionApprove, 40*time.Second, "ops")
			w.now = t0.Add(50 * time.Second)
			first := w.reconcile()
			if r := w.approval("apr-x-zz-dave").Status.Result; r != v1alpha1.ResultRejected || first.Status.Phase != v1alpha1.ApprovalPending {
				t.Fatalf("control: before the escalation dave's Approval is %q and the request %s, want Rejected and Pending", r, first.Status.Phase)
			}
			w.now = t0.Add(70 * time.Second) // escalated at 60 s
			w.reconcile()
			w.now = t0.Add(75 * time.Second)
			got := w.reconcile()
			dave := w.approval("apr-x-zz-dave")
			t.Logf("%d rejected first: request %s (escalated %v), dave's Approval %s %q, rejectedCount %d, signed %v",
				noise, got.Status.Phase, got.Status.EscalatedAt != nil, dave.Status.Result, dave.Status.Message, got.Status.RejectedCount, got.Status.Decision != nil)
			if got.Status.Phase != v1alpha1.ApprovalEscalated || dave.Status.Result != v1alpha1.ResultRejected {
				t.Errorf("ATTACK: with %d Approvals rejected first, dave's Approval made (and Rejected) before the escalation flipped to %s and the request is %s (signed: %v): the verdict depends on how many were rejected before",
					noise, dave.Status.Result, got.Status.Phase, got.Status.Decision != nil)
			}
			if got.Status.RejectedCount != int32(noise+1) {
				t.Errorf("ATTACK: rejectedCount %d for %d rejected Approvals", got.Status.RejectedCount, noise+1)
			}
		})
	}
}

// TestAttackWithdrawnCountedApprovalStrandsRequest: deleting an Approval is allowed to anyone
// RBAC lets delete (ValidateDelete: "withdrawing a vote the controller has not counted yet"),
// also after it was counted. Finance quorum 2: alice approves (counted, 1 of 2), then her
// Approval is deleted (by her, or by anyone with delete on approvals); carol approves. The
// reconciler, trusting status.approvals, goes Approved by alice and carol; the re-judge sees
// only carol, so the decision is never signed. The request now says Approved, the gateway holds
// the call for good, and every further Approval is refused as "already Approved": a deletion
// strands the request where a Deny would at least say Denied.
func TestAttackWithdrawnCountedApprovalStrandsRequest(t *testing.T) {
	t0 := time.Now().Add(-10 * time.Minute).UTC().Truncate(time.Second)
	w := newFakeRequestWorld(t, financeQuorum(2), t0)
	w.vote("apr-x-alice", "alice", v1alpha1.DecisionApprove, 1*time.Second, "finance")
	w.now = t0.Add(2 * time.Second)
	if got := w.reconcile(); got.Status.ApprovedCount != 1 {
		t.Fatalf("control: %d counted", got.Status.ApprovedCount)
	}
	if err := w.c.Delete(t.Context(), w.approval("apr-x-alice")); err != nil {
		t.Fatal(err)
	}
	w.vote("apr-x-carol", "carol", v1alpha1.DecisionApprove, 3*time.Second, "finance")
	w.now = t0.Add(4 * time.Second)
	w.reconcile()
	w.vote("apr-x-dave", "dave", v1alpha1.DecisionApprove, 5*time.Second, "finance")
	w.now = t0.Add(6 * time.Second)
	got := w.reconcile()
	if got.Status.Phase == v1alpha1.ApprovalApproved && approvalsig.Verify(got, w.sk.Trust) != nil {
		t.Errorf("ATTACK: request %s is %s by %v but unsigned (%v) for good: dave's later Approval %s %q",
			got.Name, got.Status.Phase, approvalsig.Approvers(got), approvalsig.Verify(got, w.sk.Trust),
			w.approval("apr-x-dave").Status.Result, w.approval("apr-x-dave").Status.Message)
	}
}

// TestAttackOnePersonTwoUsernamesWithoutUID: "one person, one vote" compares uids (and, in
// the standalone store, e-mails); Kubernetes' client-certificate authenticator never sets a
// uid, nor does the OIDC one without a uid claim mapping, and an Approval carries no e-mail.
// dana, with a client certificate CN=dana@corp.example and an OIDC token mapped with the
// usual prefix (oidc:dana@corp.example), is two approvers: finance's quorum of 2 is one person.
func TestAttackOnePersonTwoUsernamesWithoutUID(t *testing.T) {
	t0 := time.Now().Add(-10 * time.Minute).UTC().Truncate(time.Second)
	w := newFakeRequestWorld(t, financeQuorum(2), t0)
	for i, user := range []string{"dana@corp.example", "oidc:dana@corp.example"} {
		ct := t0.Add(time.Duration(i+1) * time.Second)
		apr := &v1alpha1.Approval{ObjectMeta: metav1.ObjectMeta{Namespace: fakeNS, Name: fmt.Sprintf("apr-x-dana-%d", i), Generation: 1},
			Spec: v1alpha1.ApprovalSpec{RequestRef: v1alpha1.ApprovalRequestReference{Name: w.ar.Name, UID: string(w.ar.UID)}, Decision: v1alpha1.DecisionApprove,
				Approver: &v1alpha1.Approver{Username: user, Groups: []string{"finance", "system:authenticated"}}}}
		apr.Spec.Stamp = w.stamp.Stamp(apr, ct)
		if err := w.c.Create(t.Context(), apr); err != nil {
			t.Fatal(err)
		}
		apr.CreationTimestamp = metav1.NewTime(ct)
		if err := w.c.Update(t.Context(), apr); err != nil {
			t.Fatal(err)
		}
	}
	w.now = t0.Add(5 * time.Second)
	if got := w.reconcile(); got.Status.Phase == v1alpha1.ApprovalApproved {
		t.Errorf("ATTACK: one person (no uid) reached finance's quorum of 2 as %v; signed: %v", approvalsig.Approvers(got), approvalsig.Verify(got, w.sk.Trust) == nil)
	}
}
