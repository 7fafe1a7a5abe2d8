package redteam

// Outside review of issue 16 (i16-atk): attacks on the approvals world that still work. Each
// subtest FAILS while the attack succeeds (its t.Errorf lines start with "ATTACK:"). They run
// on a world of their own (newApprovalsWorld), so the team's TestApprovals stays as it is.

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/kube"
	"github.com/reversi-gitops/reversi/internal/podrun"
	"github.com/reversi-gitops/reversi/internal/testenv"
)

func TestApprovalsAttack(t *testing.T) {
	aw := newApprovalsWorld(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller log (end):\n%s", aw.controller.Tail(4000))
			t.Logf("pay's gateway log (end):\n%s", aw.pay.proc.Tail(4000))
		}
	})
	t.Run("OnePersonTwoUsernamesMakesQuorum", aw.attackSameUIDQuorum)
	t.Run("ApprovalStatusIsNotAdmissionChecked", aw.attackApprovalStatusWritable)
	t.Run("OtherGatewayFloodsTheRunMirror", aw.attackMirrorFlood)
	// Last: it edits the webhook configurations (and restores them).
	t.Run("ForgedPhaseWithStatusRuleRemoved", aw.attackForgedPhase)
}

// grant gives user the verbs on resources (reversi.dev) in ns, as an operator's Role would.
func (aw *approvalsWorld) grant(t *testing.T, name, user string, resources, verbs []string) {
	t.Helper()
	must(t, aw.k8s.Create(aw.ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: resources, Verbs: verbs}}}))
	must(t, aw.k8s.Create(aw.ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}))
}

// attackSameUIDQuorum: one finance person, dana (uid u-dana), authenticated under two
// usernames (as with two authenticators: an OIDC issuer with a prefix and a client
// certificate, or two username claims), approves pay's request twice. The quorum of 2
// "distinct" approvers is reached by one human and agent-7's call runs. The actor rule already
// compares uids (issue 16: "compares identities, not strings"); the quorum does not.
func (aw *approvalsWorld) attackSameUIDQuorum(t *testing.T) {
	const run = "rt-atk-uid"
	s := aw.open7(t, run)
	args := createFor("one-person-quorum")
	id := s.held(t, toolCreate, args)

	for i, user := range []string{"dana", "oidc:dana@corp.example"} {
		cfg := rest.CopyConfig(aw.env.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, UID: "u-dana", Groups: []string{"finance", "system:authenticated"}}
		apr := &v1alpha1.Approval{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-dana-%d", id, i)},
			Spec: v1alpha1.ApprovalSpec{RequestRef: v1alpha1.ApprovalRequestReference{Name: id}, Decision: v1alpha1.DecisionApprove, Reason: "redteam dana"}}
		must(t, aw.newClient(t, cfg).Create(aw.ctx, apr))
		aw.waitApproval(t, apr.Name, 15*time.Second)
	}
	ar, _ := aw.waitRequest(t, id, 5*time.Second, func(ar *v1alpha1.ApprovalRequest) string {
		if ar.Status.Phase == v1alpha1.ApprovalApproved {
			return ""
		}
		return "phase " + ar.Status.Phase
	})
	if ar.Status.Phase == v1alpha1.ApprovalApproved {
		var who []string
		for _, c := range ar.Status.Approvals {
			who = append(who, c.Username+" (uid "+c.UID+")")
		}
		t.Errorf("ATTACK: one person (uid u-dana) reached finance's quorum of 2 on %s under two usernames: counted %v", id, who)
	}
	if got, text := s.heldOrPassed(t, toolCreate, args); got == "" {
		t.Errorf("ATTACK: pay let %s through on one person's two Approvals: %q", toolCreate, oneLine(text))
	}
}

// attackApprovalStatusWritable: the validating webhook vapproval.reversi.dev covers
// approvals, not approvals/status, so a user granted patch on approvals/status (an operator's
// "fix stuck approvals" role, a GitOps tool's status sync) writes any Approval's result. The
// reconciler skips, for good, every Approval whose status says Rejected at the current
// generation ("judged before"), so marking a finance Deny Rejected before the controller judges
// it (while the leader is changing, or while its reconciles are slowed) makes the Deny vanish:
// TestAttackDenyHiddenByApprovalStatus (controllers) shows the request then goes Approved.
// Here: the write itself is admitted, on an Approval of another user.
func (aw *approvalsWorld) attackApprovalStatusWritable(t *testing.T) {
	const run = "rt-atk-aprstatus"
	s := aw.open7(t, run)
	id := s.held(t, toolCreate, createFor("approval-status"))
	aw.mustDecide(t, bob, id, v1alpha1.DecisionDeny)
	name := approvalName(id, bob)
	aw.waitApproval(t, name, 15*time.Second)

	const mallory = "mallory-ops"
	aw.grant(t, "approval-status-fixer", mallory, []string{"approvals/status"}, []string{"get", "patch", "update"})
	cfg := rest.CopyConfig(aw.env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: mallory, Groups: []string{"system:authenticated"}}
	c := aw.newClient(t, cfg)
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"result": v1alpha1.ResultRejected, "observedGeneration": 1,
		"message": "not counted: withdrawn"}})
	must(t, err)
	var perr error
	_ = podrun.Poll(aw.ctx, 10*time.Second, func() string { // RBAC caches the new binding
		perr = c.Status().Patch(aw.ctx, &v1alpha1.Approval{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}},
			client.RawPatch(types.MergePatchType, patch))
		if perr != nil && strings.Contains(perr.Error(), "forbidden") && !strings.Contains(perr.Error(), "admission") && !strings.Contains(perr.Error(), "webhook") {
			return perr.Error()
		}
		return ""
	})
	if perr == nil {
		a := &v1alpha1.Approval{}
		must(t, aw.k8s.Get(aw.ctx, types.NamespacedName{Namespace: ns, Name: name}, a))
		t.Errorf("ATTACK: %s (patch on approvals/status only) rewrote bob's Deny %s to result %q %q: no webhook judges approvals/status, and the reconciler trusts a Rejected result as \"judged before\"",
			mallory, name, a.Status.Result, a.Status.Message)
	} else {
		t.Logf("refused: %v", perr)
	}
}

// attackForgedPhase: the webhook configurations are edited, not deleted: vapprovalrequest
// loses its approvalrequests/status rule (one line of a rules list; the Approval webhooks and
// their stamps stay in place, so "counting fails closed" still holds). mallory, who holds
// patch on approvalrequests/status, writes phase Approved on pay's held request. Nothing was
// counted (no Approval exists), yet pay lets the call through: the gateway believes any
// phase on an object whose uid and spec it recorded, with nothing the controller alone could
// have produced.
func (aw *approvalsWorld) attackForgedPhase(t *testing.T) {
	const run = "rt-atk-phase"
	s := aw.open7(t, run)
	args := createFor("forged-phase")
	id := s.held(t, toolCreate, args)

	var vals admissionregistrationv1.ValidatingWebhookConfigurationList
	must(t, aw.k8s.List(aw.ctx, &vals))
	var edited *admissionregistrationv1.ValidatingWebhookConfiguration
	var saved []admissionregistrationv1.RuleWithOperations
	for i := range vals.Items {
		for j := range vals.Items[i].Webhooks {
			wh := &vals.Items[i].Webhooks[j]
			if wh.Name != "vapprovalrequest.reversi.dev" {
				continue
			}
			edited = &vals.Items[i]
			saved = slices.Clone(wh.Rules)
			for k := range wh.Rules {
				wh.Rules[k].Resources = slices.DeleteFunc(slices.Clone(wh.Rules[k].Resources), func(r string) bool { return r == "approvalrequests/status" })
			}
		}
	}
	if edited == nil {
		t.Fatal("world: no webhook vapprovalrequest.reversi.dev")
	}
	must(t, aw.k8s.Update(aw.ctx, edited))
	t.Cleanup(func() {
		cur := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := aw.k8s.Get(aw.ctx, types.NamespacedName{Name: edited.Name}, cur); err != nil {
			t.Errorf("restore: %v", err)
			return
		}
		for j := range cur.Webhooks {
			if cur.Webhooks[j].Name == "vapprovalrequest.reversi.dev" {
				cur.Webhooks[j].Rules = saved
			}
		}
		if err := aw.k8s.Update(aw.ctx, cur); err != nil {
			t.Errorf("restore: %v", err)
		}
	})

	const mallory = "mallory-status"
	aw.grant(t, "request-status-writer", mallory, []string{"approvalrequests/status"}, []string{"get", "patch", "update"})
	cfg := rest.CopyConfig(aw.env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: mallory, Groups: []string{"system:authenticated"}}
	c := aw.newClient(t, cfg)
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"phase": v1alpha1.ApprovalApproved, "approvedCount": 2,
		"message": "approved by alice, bob (quorum 2)"}})
	must(t, err)
	var perr error
	if err := podrun.Poll(aw.ctx, 15*time.Second, func() string { // the API server and RBAC pick the edits up
		perr = c.Status().Patch(aw.ctx, &v1alpha1.ApprovalRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id}},
			client.RawPatch(types.MergePatchType, patch))
		if perr != nil {
			return perr.Error()
		}
		return ""
	}); err != nil {
		t.Fatalf("the forged phase could not be written even with the status rule removed: %v", perr)
	}
	ar := aw.request(t, id)
	t.Logf("request %s now: phase %s, %d counted Approvals (none exist)", id, ar.Status.Phase, len(ar.Status.Approvals))

	var text string
	passed := podrun.Poll(aw.ctx, 10*time.Second, func() string {
		got, txt := s.heldOrPassed(t, toolCreate, args)
		text = txt
		if got == "" {
			return ""
		}
		return "held"
	}) == nil
	if passed {
		t.Errorf("ATTACK: pay let %s through on request %s whose phase %s was written by %s, with no Approval at all (status.approvals %d): %q",
			toolCreate, id, ar.Status.Phase, mallory, len(ar.Status.Approvals), oneLine(text))
	}
}

// attackMirrorFlood: ops's ServiceAccount may create ApprovalRequests for ops (admission
// allows it) naming any spec.run. Each one naming a run of pay is journaled by pay as an
// "ignored" decision record of that run, once per object, without limit. The ReversiRun's
// status keeps the last 50 steps: 60 such objects push the run's real decision records (who
// approved, the consumption) out of `kubectl get reversiruns -o yaml`, the audit view, and
// fill pay's ledger with records ops chose.
func (aw *approvalsWorld) attackMirrorFlood(t *testing.T) {
	const run = "rt-atk-flood"
	s := aw.open7(t, run)
	args := createFor("flood")
	id := s.held(t, toolCreate, args)
	if !aw.honest(t, s, args, id) {
		t.FailNow()
	}
	real := aw.request(t, id)
	noise := func(i int) *v1alpha1.ApprovalRequest {
		spam := &v1alpha1.ApprovalRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("ops-noise-%02d", i)}, Spec: *real.Spec.DeepCopy()}
		spam.Spec.Gateway = opsGW
		spam.Spec.Reason = "audit noise"
		return spam
	}
	// Admission: ops asks for approvals in its own runs only.
	if err := aw.opsSA.Create(aw.ctx, noise(0)); err == nil || !strings.Contains(err.Error(), "spec.run") {
		t.Errorf("ATTACK: ops's ServiceAccount created a request naming pay's run %s: %v", run, err)
	}
	// Behind admission (the webhook configurations gone), pay journals at most
	// MaxIgnoredPerRun of them, and one note that it stopped.
	const n = v1alpha1.MaxRunSteps + 10
	testenv.WithoutAdmission(t, aw.k8s, ns, func() {
		for i := range n {
			if err := aw.opsSA.Create(aw.ctx, noise(i)); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("ops's ServiceAccount, without admission, cannot create %d: %v", i, err)
			}
		}
	})
	var rr v1alpha1.ReversiRun
	_ = podrun.Poll(aw.ctx, 10*time.Second, func() string {
		must(t, aw.k8s.Get(aw.ctx, types.NamespacedName{Namespace: ns, Name: run}, &rr))
		if len(records(&rr, "", eventIgnored)) < kube.MaxIgnoredPerRun+1 {
			return "not journaled yet"
		}
		return ""
	})
	time.Sleep(2 * time.Second) // and nothing more comes
	must(t, aw.k8s.Get(aw.ctx, types.NamespacedName{Namespace: ns, Name: run}, &rr))
	ignored := len(records(&rr, "", eventIgnored))
	if left := records(&rr, id, eventConsumed); len(left) == 0 || ignored > kube.MaxIgnoredPerRun+1 {
		t.Errorf("ATTACK: ops's ServiceAccount wrote %d ignored records into pay's run %s (%d of its %d mirrored steps); the run's own records of %s (counted %d, consumed %d)",
			ignored, run, ignored, len(rr.Status.Steps), id, len(records(&rr, id, eventCounted)), len(left))
	}
}
