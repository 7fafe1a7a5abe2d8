package approvals

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/approvalsig"
)

// TestForgedDecisionHeld: whoever may write approvalrequests/status (here the controller's own
// identity, which the webhook lets through, standing for a user once the webhook's status rule
// is gone) writes an Approved phase on a held finance request (quorum 2): with no signature,
// with a signature by another key, and with the signature (and approvers, decidedAt) of
// another request that finance really approved. The gateway keeps the call held each time
// (Pending, the intent refused) and journals one ignored record saying why; the request
// finance approved runs once. Source: issue 16 review ("the gateway believes any
// ApprovalRequest status.phase").
func TestForgedDecisionHeld(t *testing.T) {
	ns := setupNamespace(t, "decision")
	gw, inner := queueOfRun1(t, ns)
	held := func(args string) store.Approval {
		t.Helper()
		a, err := gw.CreateApproval(t.Context(), store.ApprovalRequest{Tool: "memory.delete_entities", ArgsDigest: "sha256:" + strings.Repeat(args, 32),
			Run: "run-1", Actor: actor, Roles: []string{"finance"}, Quorum: 2, Expires: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	intent := func(a store.Approval) error {
		_, err := gw.RecordIntent(t.Context(), store.Intent{Run: "run-1", Tool: a.Tool, ArgsDigest: a.ArgsDigest, Approval: a.ID})
		return err
	}

	// The honest path: finance (alice, bob) approves `real`; the controller signs; it runs once.
	real := held("0a")
	for _, who := range []string{"alice", "bob"} {
		if out, err := kubectl(t, who, approvalYAML(ns, real.ID+"-"+who, real.ID, "Approve"), "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply by %s: %v\n%s", who, err, out)
		}
	}
	waitFor(t, 20*time.Second, func() string {
		if got, err := gw.GetApproval(t.Context(), real.ID); err != nil || got.State != store.ApprovalApproved {
			return fmt.Sprintf("the approved request is %s %v", got.State, err)
		}
		return ""
	})
	signed := request(t, ns, real.ID)
	if err := approvalsig.Verify(signed, ctlKey.Trust); err != nil {
		t.Fatalf("the controller's decision does not verify: %v (%+v)", err, signed.Status.Decision)
	}

	other, err := controllers.EphemeralSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	forge := func(a store.Approval, sign func(ar *v1alpha1.ApprovalRequest)) {
		t.Helper()
		ar := request(t, ns, a.ID)
		base := ar.DeepCopy()
		now := metav1.NewTime(time.Now().Truncate(time.Second))
		ar.Status.Phase, ar.Status.DecidedAt, ar.Status.ApprovedCount = v1alpha1.ApprovalApproved, &now, 2
		ar.Status.Approvals = []v1alpha1.CountedApproval{
			{Name: a.ID + "-alice", Username: "alice", Groups: []string{"finance"}, Decision: v1alpha1.DecisionApprove, CountedAt: now},
			{Name: a.ID + "-bob", Username: "bob", Groups: []string{"finance"}, Decision: v1alpha1.DecisionApprove, CountedAt: now}}
		sign(ar)
		if err := env.Client.Status().Patch(t.Context(), ar, client.MergeFrom(base)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, func() string { // the gateway's informer has seen the write
			var c v1alpha1.ApprovalRequest
			if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(ar), &c); err != nil || c.Status.Phase != v1alpha1.ApprovalApproved {
				return "not written"
			}
			got, err := gw.GetApproval(t.Context(), a.ID)
			if err != nil || len(got.Decisions) != 2 {
				return fmt.Sprintf("the gateway has not seen the write: %+v %v", got, err)
			}
			return ""
		})
	}
	cases := map[string]func(ar *v1alpha1.ApprovalRequest){
		"unsigned": func(*v1alpha1.ApprovalRequest) {},
		"another key": func(ar *v1alpha1.ApprovalRequest) {
			d, err := approvalsig.Sign(ar, other.Signer, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			ar.Status.Decision = d
		},
		"another request's signature": func(ar *v1alpha1.ApprovalRequest) {
			ar.Status.DecidedAt, ar.Status.Approvals = signed.Status.DecidedAt, signed.Status.Approvals
			ar.Status.Decision = signed.Status.Decision.DeepCopy()
		},
	}
	for i, name := range []string{"unsigned", "another key", "another request's signature"} {
		t.Run(strings.ReplaceAll(name, " ", "-"), func(t *testing.T) {
			a := held(fmt.Sprintf("%d1", i))
			forge(a, cases[name])
			got, err := gw.GetApproval(t.Context(), a.ID)
			if err != nil || got.State != store.ApprovalPending {
				t.Errorf("the gateway sees the forged request as %s %v, want pending", got.State, err)
			}
			if err := intent(a); !errors.Is(err, store.ErrNotApproved) {
				t.Errorf("an intent on the forged decision: %v, want ErrNotApproved", err)
			}
			waitFor(t, 10*time.Second, func() string {
				recs, _ := inner.Records(t.Context(), "run-1", 0, 0)
				n := 0
				for _, r := range recs {
					if r.Kind == store.KindApproval && r.Approval == a.ID {
						switch {
						case r.Event == store.EventIgnored && strings.Contains(r.Note, "not the controller's decision"):
							n++
						case r.Event == store.EventApproved:
							return "an approved record of the forged decision"
						}
					}
				}
				if n != 1 {
					return fmt.Sprintf("%d ignored records saying why, want 1", n)
				}
				return ""
			})
		})
	}
	if err := intent(real); err != nil {
		t.Fatalf("the approved request: %v", err)
	}
	if err := intent(real); !errors.Is(err, store.ErrConsumed) {
		t.Fatalf("the approved request again: %v, want ErrConsumed", err)
	}
}

// TestDeniedStaysDenied: a request the gateway saw Denied is never honoured as Approved later,
// even when its status is wiped and its counted Deny deleted (rights of a cluster
// administrator: the status written by the controller's own identity here, the Approval
// deleted) and finance then approves it afresh, signed by the controller. Source: issue 16
// review ("deleting a Denied request undoes the Deny"; "the controller counts afresh after a
// wipe").
func TestDeniedStaysDenied(t *testing.T) {
	ns := setupNamespace(t, "denied")
	gw, inner := queueOfRun1(t, ns)
	a, err := gw.CreateApproval(t.Context(), store.ApprovalRequest{Tool: "memory.delete_entities", ArgsDigest: "sha256:" + strings.Repeat("0d", 32),
		Run: "run-1", Actor: actor, Roles: []string{"finance"}, Quorum: 2, Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl(t, "alice", approvalYAML(ns, a.ID+"-alice", a.ID, "Deny"), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply by alice: %v\n%s", err, out)
	}
	waitFor(t, 20*time.Second, func() string {
		recs, _ := inner.Records(t.Context(), "run-1", 0, 0)
		for _, r := range recs {
			if r.Kind == store.KindApproval && r.Approval == a.ID && r.Event == store.EventDenied {
				return ""
			}
		}
		return "no denied record yet"
	})

	// The Deny withdrawn, the status wiped; finance approves afresh and the controller signs.
	if err := env.Client.Delete(t.Context(), &v1alpha1.Approval{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: a.ID + "-alice"}}); err != nil {
		t.Fatal(err)
	}
	ar := request(t, ns, a.ID)
	ar.Status = v1alpha1.ApprovalRequestStatus{}
	if err := env.Client.Status().Update(t.Context(), ar); err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{"alice", "bob"} {
		if out, err := kubectl(t, who, approvalYAML(ns, a.ID+"-"+who+"-again", a.ID, "Approve"), "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply by %s: %v\n%s", who, err, out)
		}
	}
	waitFor(t, 20*time.Second, func() string {
		if err := approvalsig.Verify(request(t, ns, a.ID), ctlKey.Trust); err != nil {
			return "not signed Approved yet: " + err.Error()
		}
		return ""
	})
	var got store.Approval
	waitFor(t, 10*time.Second, func() string { // the gateway's informer has the new, signed status
		got, err = gw.GetApproval(t.Context(), a.ID)
		approving := 0
		for _, d := range got.Decisions {
			if d.Approve {
				approving++
			}
		}
		if err == nil && approving < 2 {
			return "the gateway has not seen the new status"
		}
		return ""
	})
	if err != nil || got.State != store.ApprovalDenied {
		t.Errorf("the gateway sees the request it saw Denied as %s %v, want denied", got.State, err)
	}
	if _, err := gw.RecordIntent(t.Context(), store.Intent{Run: "run-1", Tool: a.Tool, ArgsDigest: a.ArgsDigest, Approval: a.ID}); !errors.Is(err, store.ErrNotApproved) {
		t.Errorf("an intent on the request seen Denied: %v, want ErrNotApproved", err)
	}
}
