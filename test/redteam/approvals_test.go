package redteam

// The acceptance tests of issue 16 ("Approvals and runs that cannot be forged, stolen or
// replayed"): one attack per subtest of TestApprovals, each in a run of its own (the agent
// names its run with Reversi-Run-Id) with entities of its own, on one shared approvals world
// (approvals_world_test.go). Each asserts that the attack fails, that the honest path still
// works (alice and bob of finance reach the quorum of 2 and the retry passes once), and what
// the ledger (the ReversiRun's decision records) and the objects' status say afterwards.
// Names, reasons and texts not yet in the API are the design's (design16.md), as strings.

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/podrun"
)

func TestApprovals(t *testing.T) {
	aw := newApprovalsWorld(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller log (end):\n%s", aw.controller.Tail(6000))
			t.Logf("pay's gateway log (end):\n%s", aw.pay.proc.Tail(4000))
			t.Logf("ops's gateway log (end):\n%s", aw.ops.proc.Tail(4000))
		}
	})
	t.Run("ForgedCopyWithLooserRules", aw.testForgedCopy)
	t.Run("RunIDOfAnotherGateway", aw.testStolenRunID)
	t.Run("ReplayAfterRemovingConsumedAt", aw.testReplay)
	t.Run("OtherGatewayServiceAccount", aw.testOtherGatewaySA)
	t.Run("AliasOfTheActor", aw.testAlias)
	t.Run("ApprovalBeforeItsRequest", aw.testPreApproval)
	t.Run("DecisionsAreLedgerRecords", aw.testLedger)
	// Last: it deletes the webhook configurations (and restores them).
	t.Run("WebhookConfigurationsDeleted", aw.testNoWebhooks)
}

// refused reports whether a write was refused (by RBAC or admission), and checks that an
// admission refusal names want (the identity allowed) when want is not "".
func refused(t testing.TB, err error, what, want string) bool {
	t.Helper()
	if err == nil {
		return false
	}
	if want != "" && !strings.Contains(err.Error(), want) {
		t.Errorf("%s was refused without naming the identity allowed (%s): %v", what, want, err)
	}
	return true
}

// forgedCopies makes copies of the real request with loosened rules (no roles, quorum 1):
// as ops's ServiceAccount, and when admission refuses that, as pay's own ServiceAccount by a
// direct create (not through pay's store). carol, who is not in finance, approves each copy
// that exists. It returns the copies' names.
func (aw *approvalsWorld) forgedCopies(t *testing.T, real *v1alpha1.ApprovalRequest) []string {
	t.Helper()
	forge := func(c client.Client, name string) error {
		cp := &v1alpha1.ApprovalRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: *real.Spec.DeepCopy()}
		cp.Spec.Roles, cp.Spec.Quorum = nil, ptr.To[int32](1)
		return c.Create(aw.ctx, cp)
	}
	var copies []string
	name := real.Name + "-copy-ops"
	err := forge(aw.opsSA, name)
	if err == nil {
		t.Errorf("ATTACK: ops's ServiceAccount created %s, a copy of pay's request %s with no roles and quorum 1 (spec.gateway %s)", name, real.Name, real.Spec.Gateway)
		copies = append(copies, name)
	} else {
		refused(t, err, "ops's copy of "+real.Name, aw.paySAName)
		name = real.Name + "-copy-pay"
		if err := forge(aw.paySA, name); err != nil {
			t.Logf("pay's ServiceAccount cannot create the copy either: %v", err)
		} else {
			copies = append(copies, name)
		}
	}
	for _, c := range copies {
		aw.mustDecide(t, carol, c, v1alpha1.DecisionApprove)
		if ar, ok := aw.waitRequest(t, c, 20*time.Second, func(ar *v1alpha1.ApprovalRequest) string {
			if ar.Status.Phase != v1alpha1.ApprovalApproved {
				return "phase " + ar.Status.Phase
			}
			return ""
		}); !ok {
			t.Logf("the controller did not approve the copy %s (phase %s: %s): the attack has no approved copy to use", c, ar.Status.Phase, ar.Status.Message)
		}
	}
	return copies
}

// testForgedCopy: a copy of pay's held request with loosened rules, approved by carol (not
// finance), does not let pay's call through while the real request (finance, quorum 2) is
// Pending, nor after finance denied the real one. The gateway journals the copies as ignored.
func (aw *approvalsWorld) testForgedCopy(t *testing.T) {
	s := aw.open7(t, "rt-copy")

	// While the real request is Pending.
	args := createFor("copy-pending")
	id := s.held(t, toolCreate, args)
	copies := aw.forgedCopies(t, aw.request(t, id))
	switch got, text := s.heldOrPassed(t, toolCreate, args); got {
	case "":
		t.Errorf("ATTACK: pay let %s through on the forged copies %v approved by carol (not finance) while %s (finance, quorum 2) is Pending: %q",
			toolCreate, copies, id, oneLine(text))
	case id:
	default:
		t.Errorf("the retry is not held for the real request %s: %q", id, oneLine(text))
	}
	if ar := aw.request(t, id); ar.Status.Phase != v1alpha1.ApprovalPending || ar.Status.ApprovedCount != 0 {
		t.Errorf("the real request %s: phase %s, %d approved; want Pending, 0", id, ar.Status.Phase, ar.Status.ApprovedCount)
	}
	for _, c := range copies {
		aw.wantRecord(t, s.run, c, eventIgnored, "")
	}
	if aw.honest(t, s, args, id) {
		if ar := aw.request(t, id); ar.Annotations[v1alpha1.AnnotationConsumedAt] == "" {
			t.Errorf("the consumed request %s has no %s mirror: %v", id, v1alpha1.AnnotationConsumedAt, ar.Annotations)
		}
	}

	// After a Deny of the real one by a finance member.
	args = createFor("copy-denied")
	id = s.held(t, toolCreate, args)
	copies = aw.forgedCopies(t, aw.request(t, id))
	aw.mustDecide(t, alice, id, v1alpha1.DecisionDeny)
	if ar, ok := aw.waitRequest(t, id, 20*time.Second, func(ar *v1alpha1.ApprovalRequest) string {
		if ar.Status.Phase != v1alpha1.ApprovalDenied {
			return "phase " + ar.Status.Phase
		}
		return ""
	}); !ok {
		t.Fatalf("alice's Deny did not deny %s: phase %s %q", id, ar.Status.Phase, ar.Status.Message)
	}
	// The gateway's informer may lag the API server a moment: until it sees the Deny, the call
	// is still held for the request; it must never pass.
	var text string
	deadline := time.Now().Add(5 * time.Second)
	for {
		var isErr bool
		text, isErr = s.call(t, toolCreate, args)
		if !isErr {
			t.Errorf("ATTACK: after finance denied %s, pay let %s through on the forged copies %v approved by carol: %q", id, toolCreate, copies, oneLine(text))
			break
		}
		if strings.Contains(text, "approval "+id+" for this call was denied") {
			break
		}
		if time.Now().After(deadline) || !strings.Contains(text, "request "+id+" is waiting") {
			t.Errorf("the call after the Deny is not blocked as denied by %s: %q", id, oneLine(text))
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	aw.wantRecord(t, s.run, id, eventDenied, "")
	for _, c := range copies {
		aw.wantRecord(t, s.run, c, eventIgnored, "")
	}
}

// testStolenRunID: ops's agent sends agent-7's run id and makes the same call while finance's
// approval waits for agent-7's retry: refused ("belongs to another gateway"), nothing is
// consumed, the ReversiRun keeps pay's steps and actor, and pay's retry passes once.
func (aw *approvalsWorld) testStolenRunID(t *testing.T) {
	const run = "rt-steal"
	s7 := aw.open7(t, run)
	args := createFor("stolen")
	id := s7.held(t, toolCreate, args)
	pending := func(rr *v1alpha1.ReversiRun) bool {
		return slices.ContainsFunc(rr.Status.Steps, func(s v1alpha1.RunStep) bool {
			return s.Tool == toolCreate && s.Outcome == "pending_approval" && s.ApprovalRequest == id
		})
	}
	if err := podrun.Poll(aw.ctx, 10*time.Second, func() string {
		if rr := aw.reversiRun(t, run); !pending(rr) {
			return "ReversiRun " + run + " does not show the held call yet:" + stepsText(rr)
		}
		return ""
	}); err != nil {
		t.Fatal(err)
	}
	aw.mustDecide(t, alice, id, v1alpha1.DecisionApprove)
	aw.mustDecide(t, bob, id, v1alpha1.DecisionApprove)
	if ar, ok := aw.waitRequest(t, id, 20*time.Second, func(ar *v1alpha1.ApprovalRequest) string {
		if ar.Status.Phase != v1alpha1.ApprovalApproved {
			return "phase " + ar.Status.Phase
		}
		return ""
	}); !ok {
		t.Fatalf("%s is not Approved by alice and bob: %s %q", id, ar.Status.Phase, ar.Status.Message)
	}

	// The attack.
	s9 := aw.open(t, aw.ops, actor9, aw.agent9Key, run)
	text, isErr := s9.call(t, toolCreate, args)
	switch {
	case !isErr:
		t.Errorf("ATTACK: ops's agent-9, sending agent-7's run id %s, ran %s on the approval finance gave agent-7 (%s): %q", run, toolCreate, id, oneLine(text))
	case !strings.Contains(text, textOtherGateway):
		t.Errorf("ops refused agent-9's call without saying the run %q: %q", textOtherGateway, oneLine(text))
	}
	if ar := aw.request(t, id); ar.Annotations[v1alpha1.AnnotationConsumedAt] != "" {
		t.Errorf("ATTACK: ops consumed pay's approval %s (consumedAt %s by %q)", id, ar.Annotations[v1alpha1.AnnotationConsumedAt], ar.Annotations[v1alpha1.AnnotationConsumedBy])
	}
	if why := aw.stays(3*time.Second, func() string {
		rr := aw.reversiRun(t, run)
		if rr.Spec.Actor != actor7 || rr.Spec.Gateway != payGW {
			return fmt.Sprintf("spec actor %s gateway %s", rr.Spec.Actor, rr.Spec.Gateway)
		}
		if !pending(rr) || slices.ContainsFunc(rr.Status.Steps, func(s v1alpha1.RunStep) bool { return s.Outcome == "succeeded" }) {
			return "its steps are not pay's any more:" + stepsText(rr)
		}
		return ""
	}); why != "" {
		t.Errorf("ATTACK: ops overwrote pay's ReversiRun %s: %s", run, why)
	}

	// ops's agent in a run of its own is served.
	if text, isErr := aw.open(t, aw.ops, actor9, aw.agent9Key, "rt-ops-own").call(t, "memory.read_graph", map[string]any{}); isErr {
		t.Errorf("honest path: agent-9 on ops, in a run of its own, cannot read the graph: %q", oneLine(text))
	}

	// The honest path: agent-7's retry passes once.
	if s7.passesOnce(t, toolCreate, args, id) {
		aw.wantRecord(t, run, id, eventConsumed, "")
		aw.wantRecordCount(t, run, id, eventConsumed, 1)
		if n := aw.succeeded(t, run, toolCreate); n != 1 {
			t.Errorf("ReversiRun %s shows %d succeeded %s steps, want pay's 1:%s", run, n, toolCreate, stepsText(aw.reversiRun(t, run)))
		}
	}
}

// testReplay: after the approved call ran once, removing reversi.dev/consumedAt (and
// consumedBy) from the request and resetting the ReversiRun's status does not let the call
// run again: consumption lives in pay's store.
func (aw *approvalsWorld) testReplay(t *testing.T) {
	const run = "rt-replay"
	s := aw.open7(t, run)
	args := createFor("replayed")
	id := s.held(t, toolCreate, args)
	if !aw.honest(t, s, args, id) {
		t.FailNow()
	}

	// The attack: ops's ServiceAccount removes the annotations (the admin when admission
	// refuses it), and the admin resets the run's status.
	strip := map[string]any{"metadata": map[string]any{"annotations": map[string]any{v1alpha1.AnnotationConsumedAt: nil, v1alpha1.AnnotationConsumedBy: nil}}}
	patch, err := json.Marshal(strip)
	must(t, err)
	ar := &v1alpha1.ApprovalRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id}}
	if err := aw.opsSA.Patch(aw.ctx, ar, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Logf("ops's ServiceAccount cannot remove the annotations (%v); the admin does", err)
		must(t, aw.k8s.Patch(aw.ctx, ar, client.RawPatch(types.MergePatchType, patch)))
	}
	if ar := aw.request(t, id); ar.Annotations[v1alpha1.AnnotationConsumedAt] != "" {
		t.Fatalf("the annotation was not removed: %v", ar.Annotations)
	}
	reset := []byte(`{"status":{"steps":[],"stepCount":0,"counts":{},"pendingApprovals":[]}}`)
	if err := aw.k8s.Status().Patch(aw.ctx, &v1alpha1.ReversiRun{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: run}},
		client.RawPatch(types.MergePatchType, reset)); err != nil {
		t.Logf("the admin's reset of ReversiRun %s's status: %v", run, err)
	}

	// Three replays, spread over the time pay's cache needs to see the edit.
	var ran []string
	for range 3 {
		time.Sleep(700 * time.Millisecond)
		got, text := s.heldOrPassed(t, toolCreate, args)
		switch got {
		case "":
			ran = append(ran, oneLine(text))
		case id, "-":
			t.Errorf("a replay is not held for a new request: %q", oneLine(text))
		}
	}
	if len(ran) > 0 {
		t.Errorf("ATTACK: with %s removed, the one approval %s ran %s %d more times: %q", v1alpha1.AnnotationConsumedAt, id, toolCreate, len(ran), ran)
	}
	// The mirror is rebuilt from pay's ledger, which the edit did not touch.
	if n := aw.succeeded(t, run, toolCreate); n != 1 {
		t.Errorf("ReversiRun %s shows %d succeeded %s steps, want 1:%s", run, n, toolCreate, stepsText(aw.reversiRun(t, run)))
	}
	aw.wantRecordCount(t, run, id, eventConsumed, 1)
}

// testOtherGatewaySA: ops's ServiceAccount cannot create requests or runs for pay, write the
// status of pay's run, or confirm its rollback; pay executes no rollback it did not get from an
// operator, and still answers the operator's.
func (aw *approvalsWorld) testOtherGatewaySA(t *testing.T) {
	const run = "rt-sa"
	s := aw.open7(t, run)
	args := createFor("sa")
	id := s.held(t, toolCreate, args)
	real := aw.request(t, id)
	aw.honest(t, s, args, id)

	// What pay created carries its identity (the webhook's stamp).
	rr := aw.reversiRun(t, run)
	for what, got := range map[string]string{"ApprovalRequest " + id: real.Annotations[v1alpha1.AnnotationCreatedBy], "ReversiRun " + run: rr.Annotations[v1alpha1.AnnotationCreatedBy]} {
		if got != aw.paySAName {
			t.Errorf("%s: annotation %s %q, want %s", what, v1alpha1.AnnotationCreatedBy, got, aw.paySAName)
		}
	}

	// A request for pay.
	req := &v1alpha1.ApprovalRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "apr-forged-by-ops"},
		Spec: v1alpha1.ApprovalRequestSpec{Tool: toolCreate, ArgumentsDigest: real.Spec.ArgumentsDigest, Run: run, Actor: actor7, Gateway: payGW, Quorum: ptr.To[int32](1)}}
	if err := aw.opsSA.Create(aw.ctx, req); !refused(t, err, "ops's ApprovalRequest for pay", aw.paySAName) {
		t.Errorf("ATTACK: ops's ServiceAccount created ApprovalRequest %s with spec.gateway %s", req.Name, payGW)
		_ = aw.k8s.Delete(aw.ctx, req)
	}
	// A run for pay.
	forgedRun := &v1alpha1.ReversiRun{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "rt-forged-by-ops"},
		Spec: v1alpha1.ReversiRunSpec{Actor: actor7, Gateway: payGW}}
	if err := aw.opsSA.Create(aw.ctx, forgedRun); !refused(t, err, "ops's ReversiRun for pay", aw.paySAName) {
		t.Errorf("ATTACK: ops's ServiceAccount created ReversiRun %s with spec.gateway %s", forgedRun.Name, payGW)
		_ = aw.k8s.Delete(aw.ctx, forgedRun)
	}
	// The status of pay's run.
	status := []byte(`{"status":{"phase":"RolledBack","steps":[],"stepCount":0}}`)
	if err := aw.opsSA.Status().Patch(aw.ctx, &v1alpha1.ReversiRun{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: run}},
		client.RawPatch(types.MergePatchType, status)); !refused(t, err, "ops's status write on pay's run", "") {
		t.Errorf("ATTACK: ops's ServiceAccount rewrote the status of pay's ReversiRun %s (phase RolledBack, no steps)", run)
	}

	// The operator's dry run: pay answers with a plan.
	operator := []byte(`{"spec":{"rollback":{"confirm":false}}}`)
	must(t, aw.k8s.Patch(aw.ctx, &v1alpha1.ReversiRun{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: run}}, client.RawPatch(types.MergePatchType, operator)))
	if err := podrun.Poll(aw.ctx, 20*time.Second, func() string {
		rr := aw.reversiRun(t, run)
		if rb := rr.Status.Rollback; rb == nil || !rb.DryRun || rb.ObservedGeneration != rr.Generation {
			return fmt.Sprintf("pay has not answered the operator's dry run of generation %d: %+v", rr.Generation, rb)
		}
		return ""
	}); err != nil {
		t.Errorf("honest path: %v", err)
	}

	// ops confirms pay's rollback.
	confirm := []byte(`{"spec":{"rollback":{"confirm":true}}}`)
	if err := aw.opsSA.Patch(aw.ctx, &v1alpha1.ReversiRun{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: run}},
		client.RawPatch(types.MergePatchType, confirm)); !refused(t, err, "ops's spec.rollback.confirm on pay's run", "") {
		t.Errorf("ATTACK: ops's ServiceAccount set spec.rollback.confirm on pay's ReversiRun %s", run)
	}
	if why := aw.stays(4*time.Second, func() string {
		rr := aw.reversiRun(t, run)
		if rb := rr.Status.Rollback; rb != nil && (!rb.DryRun || rb.Phase != "") {
			return fmt.Sprintf("status.rollback phase %s (dryRun %v, replica %s): %s", rb.Phase, rb.DryRun, rb.Replica, rb.Message)
		}
		return ""
	}); why != "" {
		t.Errorf("ATTACK: pay executed the rollback of %s that ops confirmed: %s", run, why)
	}
}

// testAlias: the actor under other names — a finance user whose username is the actor's
// e-mail, and one with the actor's uid — is Rejected with a message naming the actor; the
// request stays Pending and the call held; then finance's quorum passes once.
func (aw *approvalsWorld) testAlias(t *testing.T) {
	const run = "rt-alias"
	s := aw.open7(t, run)
	args := createFor("alias")
	id := s.held(t, toolCreate, args)
	if ar := aw.request(t, id); ar.Spec.ActorUID != actor7UID || ar.Spec.ActorEmail != actor7Email {
		t.Errorf("the request %s does not carry the actor's uid and e-mail (actorUID %q, actorEmail %q; want %q, %q; auth.KeyEntry declares uid %v, email %v)",
			id, ar.Spec.ActorUID, ar.Spec.ActorEmail, actor7UID, actor7Email, keyEntryHas("uid"), keyEntryHas("email"))
	}

	aw.mustDecide(t, emailAlias, id, v1alpha1.DecisionApprove)
	seven := &v1alpha1.Approval{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: approvalName(id, uidAlias)},
		Spec: v1alpha1.ApprovalSpec{RequestRef: v1alpha1.ApprovalRequestReference{Name: id}, Decision: v1alpha1.DecisionApprove, Reason: "redteam seven"}}
	must(t, aw.clients[uidAlias].Create(aw.ctx, seven))
	if a := aw.waitApproval(t, seven.Name, 20*time.Second); a.Spec.Approver == nil || a.Spec.Approver.UID != actor7UID {
		t.Errorf("world: the impersonated alias's Approval is not stamped with uid %s: %s", actor7UID, approverText(a.Spec.Approver))
	}
	for _, who := range []string{emailAlias, uidAlias} {
		aw.wantRejected(t, approvalName(id, who), actor7)
	}
	if ar := aw.request(t, id); ar.Status.Phase != v1alpha1.ApprovalPending || ar.Status.ApprovedCount != 0 {
		t.Errorf("ATTACK: the actor's aliases decided its own request %s: phase %s, %d approved (%v)", id, ar.Status.Phase, ar.Status.ApprovedCount, ar.Status.Approvals)
	}
	if got, text := s.heldOrPassed(t, toolCreate, args); got == "" {
		t.Errorf("ATTACK: agent-7's call passed on its own approvals as %s and %s: %q", emailAlias, uidAlias, oneLine(text))
	}
	for _, who := range []string{emailAlias, uidAlias} {
		aw.wantRecord(t, run, id, eventRejected, who)
	}
	aw.honest(t, s, args, id)
}

// testPreApproval: an Approval made before its request is Rejected.
//
// Request names are random ("apr-<24 hex>", made by the gateway), so nobody can name a
// request before the gateway makes it. The name becomes known, and free, when a request is
// deleted (by an operator cleaning up, or by someone with delete rights): Approvals made then
// name a request that does not exist. The request then comes back under the same name with
// the same spec — re-created by pay's ServiceAccount, the only identity admission lets create
// pay's requests, as a restore (or a replica replaying its queue) would. alice's and bob's
// Approvals, made while no such request existed, must not count for the new object: they
// are Rejected ("made before its request existed"), the request stays Pending, and pay,
// whose store knows the first object's uid, does not let the call through (it journals the
// re-created object as ignored). A new request then passes with finance's quorum, once.
func (aw *approvalsWorld) testPreApproval(t *testing.T) {
	const run = "rt-pre"
	s := aw.open7(t, run)
	args := createFor("pre-approved")
	id := s.held(t, toolCreate, args)
	saved := aw.request(t, id)
	must(t, aw.k8s.Delete(aw.ctx, saved))
	if err := podrun.Poll(aw.ctx, 10*time.Second, func() string {
		if err := aw.k8s.Get(aw.ctx, types.NamespacedName{Namespace: ns, Name: id}, &v1alpha1.ApprovalRequest{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("%s not deleted yet: %v", id, err)
		}
		return ""
	}); err != nil {
		t.Fatal(err)
	}
	aw.mustDecide(t, alice, id, v1alpha1.DecisionApprove)
	aw.mustDecide(t, bob, id, v1alpha1.DecisionApprove)
	time.Sleep(time.Second) // the Approvals are older than the request by more than the timestamps' second
	again := &v1alpha1.ApprovalRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: id}, Spec: saved.Spec}
	must(t, aw.paySA.Create(aw.ctx, again))

	for _, who := range []string{alice, bob} {
		aw.wantRejected(t, approvalName(id, who), textBeforeRequest)
	}
	if ar := aw.request(t, id); ar.Status.Phase != v1alpha1.ApprovalPending || ar.Status.ApprovedCount != 0 {
		t.Errorf("ATTACK: Approvals made before the request %s existed decided it: phase %s, %d approved (%v)", id, ar.Status.Phase, ar.Status.ApprovedCount, ar.Status.Approvals)
	}
	next, text := s.heldOrPassed(t, toolCreate, args)
	if next == "" {
		t.Errorf("ATTACK: pay let %s through on Approvals made before the request %s existed: %q", toolCreate, id, oneLine(text))
		next, text = s.heldOrPassed(t, toolCreate, args)
	}
	aw.wantRecord(t, run, id, eventIgnored, "")
	switch next {
	case id:
		t.Errorf("pay holds the call for the re-created request %s, not one it made: %q", id, oneLine(text))
	case "", "-":
		t.Errorf("the call is not held for a new request: %q", oneLine(text))
	default:
		aw.honest(t, s, args, next)
	}
}

// testLedger: the decisions are records of the run's ledger: `reversi approvals show` on pay's
// data folder and `kubectl get reversiruns -o yaml` show who decided what (approver, groups,
// decision) — carol's rejected approval, alice's and bob's counted ones, the approval and the
// consumption.
func (aw *approvalsWorld) testLedger(t *testing.T) {
	const run = "rt-ledger"
	s := aw.open7(t, run)
	args := createFor("ledger")
	id := s.held(t, toolCreate, args)
	aw.mustDecide(t, carol, id, v1alpha1.DecisionApprove)
	aw.wantRejected(t, approvalName(id, carol), carol, "finance")
	if !aw.honest(t, s, args, id) {
		t.FailNow()
	}

	// The objects' status.
	ar := aw.request(t, id)
	for _, who := range []string{alice, bob} {
		if !slices.ContainsFunc(ar.Status.Approvals, func(c v1alpha1.CountedApproval) bool {
			return c.Username == who && c.Decision == v1alpha1.DecisionApprove && slices.Contains(c.Groups, "finance")
		}) {
			t.Errorf("the request %s's status.approvals lack %s (finance): %+v", id, who, ar.Status.Approvals)
		}
	}
	if ar.Status.RejectedCount != 1 || !slices.ContainsFunc(ar.Status.Rejected, func(r v1alpha1.RejectedApproval) bool {
		return r.Username == carol && strings.Contains(r.Message, "finance")
	}) {
		t.Errorf("the request %s's status.rejected does not list carol's approval: %s", id, rejectedText(ar))
	}

	// reversi approvals show, on pay's store.
	out, err := exec.CommandContext(aw.ctx, reversiBin, "approvals", "show", id, "--data", aw.pay.dataDir()).CombinedOutput()
	var missing []string
	for _, want := range []string{id, alice, bob, carol, "finance", eventCounted, eventRejected, eventApproved, eventConsumed} {
		if !strings.Contains(string(out), want) {
			missing = append(missing, want)
		}
	}
	if err != nil || len(missing) > 0 {
		t.Errorf("reversi approvals show %s --data <pay's data folder> (%v) does not show %q:\n%s", id, err, missing, podrun.Tail(out, 1500))
	}

	// kubectl get reversiruns -o yaml.
	kout, err := exec.CommandContext(aw.ctx, aw.env.Kubectl(), "--kubeconfig", aw.admin, "get", "reversiruns", "-n", ns, "-o", "yaml").Output()
	must(t, err)
	var list v1alpha1.ReversiRunList
	must(t, yaml.Unmarshal(kout, &list))
	i := slices.IndexFunc(list.Items, func(r v1alpha1.ReversiRun) bool { return r.Name == run })
	if i < 0 {
		t.Fatalf("kubectl get reversiruns -o yaml lists no %s:\n%s", run, kout)
	}
	rr := &list.Items[i]
	want := func(event, approver, group, decision string) {
		t.Helper()
		if !slices.ContainsFunc(records(rr, id, event), func(s v1alpha1.RunStep) bool {
			a := s.Approval
			return (approver == "" || a.Approver == approver) && (group == "" || slices.Contains(a.Groups, group)) && (decision == "" || a.Decision == decision)
		}) {
			t.Errorf("kubectl get reversiruns -o yaml: %s has no %q record of %s by %q (groups ∋ %q, decision %q); its steps:%s", run, event, id, approver, group, decision, stepsText(rr))
		}
	}
	want(eventRejected, carol, "sales", v1alpha1.DecisionApprove)
	want(eventCounted, alice, "finance", v1alpha1.DecisionApprove)
	want(eventCounted, bob, "finance", v1alpha1.DecisionApprove)
	want(eventApproved, "", "", "")
	want(eventConsumed, "", "", "")
	if n := len(records(rr, id, eventConsumed)); n > 1 {
		t.Errorf("%s has %d consumed records of %s, want 1", run, n, id)
	}
}

// testNoWebhooks: with the webhook configurations deleted, Approvals carrying a hand-written
// spec.approver (carol writes alice and bob, both finance: a quorum of 2 by one person) are
// not counted, and the request's Ready condition says ApprovalNotStamped. With the
// configurations restored, finance's quorum passes once.
func (aw *approvalsWorld) testNoWebhooks(t *testing.T) {
	const run = "rt-nowebhook"
	s := aw.open7(t, run)
	args := createFor("unstamped")
	id := s.held(t, toolCreate, args)

	var mut admissionregistrationv1.MutatingWebhookConfigurationList
	var val admissionregistrationv1.ValidatingWebhookConfigurationList
	must(t, aw.k8s.List(aw.ctx, &mut))
	must(t, aw.k8s.List(aw.ctx, &val))
	if len(mut.Items) == 0 || len(val.Items) == 0 {
		t.Fatalf("world: no webhook configurations to delete (%d mutating, %d validating)", len(mut.Items), len(val.Items))
	}
	for i := range mut.Items {
		must(t, aw.k8s.Delete(aw.ctx, &mut.Items[i]))
	}
	for i := range val.Items {
		must(t, aw.k8s.Delete(aw.ctx, &val.Items[i]))
	}
	restored := false
	restore := func() {
		if restored {
			return
		}
		restored = true
		for _, m := range mut.Items {
			m.ObjectMeta = metav1.ObjectMeta{Name: m.Name, Labels: m.Labels, Annotations: m.Annotations}
			must(t, aw.k8s.Create(aw.ctx, &m))
		}
		for _, v := range val.Items {
			v.ObjectMeta = metav1.ObjectMeta{Name: v.Name, Labels: v.Labels, Annotations: v.Annotations}
			must(t, aw.k8s.Create(aw.ctx, &v))
		}
		if err := podrun.Poll(aw.ctx, 30*time.Second, func() string {
			if err := aw.forgedApproverDryRun(id); err == nil || strings.Contains(err.Error(), "failed calling webhook") {
				return fmt.Sprintf("the restored webhooks do not refuse a hand-written approver yet: %v", err)
			}
			return ""
		}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(restore)
	if err := podrun.Poll(aw.ctx, 30*time.Second, func() string {
		if err := aw.forgedApproverDryRun(id); err != nil {
			return "the API server still calls the webhooks: " + err.Error()
		}
		return ""
	}); err != nil {
		t.Fatal(err)
	}

	// carol writes two Approvals with the approvers she wants.
	var forged []string
	for _, who := range []string{alice, bob} {
		apr := forgedApprover(id, who)
		must(t, aw.clients[carol].Create(aw.ctx, apr))
		forged = append(forged, apr.Name)
	}
	if why := aw.stays(5*time.Second, func() string {
		if ar := aw.request(t, id); ar.Status.Phase != v1alpha1.ApprovalPending || ar.Status.ApprovedCount != 0 {
			return fmt.Sprintf("phase %s, %d approved (%+v)", ar.Status.Phase, ar.Status.ApprovedCount, ar.Status.Approvals)
		}
		return ""
	}); why != "" {
		t.Errorf("ATTACK: carol's hand-written approvers %v decided %s: %s", forged, id, why)
	}
	for _, name := range forged {
		if a := aw.waitApproval(t, name, 5*time.Second); a.Status.Result == v1alpha1.ResultCounted {
			t.Errorf("ATTACK: the unstamped Approval %s (approver %s) was counted", name, approverText(a.Spec.Approver))
		}
	}
	ar, ok := aw.waitRequest(t, id, 10*time.Second, func(ar *v1alpha1.ApprovalRequest) string {
		if c := apimeta.FindStatusCondition(ar.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionFalse ||
			c.Reason != v1alpha1.ReasonApprovalNotStamped || !strings.Contains(c.Message, "webhook") {
			return "not said"
		}
		return ""
	})
	if !ok {
		t.Errorf("the request %s does not say its Approvals are not stamped (Ready=False %s, naming the webhook configurations): %s",
			id, v1alpha1.ReasonApprovalNotStamped, conditionText(ar.Status.Conditions))
	}
	if got, text := s.heldOrPassed(t, toolCreate, args); got == "" {
		t.Errorf("ATTACK: pay let %s through on carol's hand-written approvers: %q", toolCreate, oneLine(text))
	}

	restore()
	aw.honest(t, s, args, id)
}

// forgedApprover is carol's Approval of request claiming to be who (finance).
func forgedApprover(request, who string) *v1alpha1.Approval {
	return &v1alpha1.Approval{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: request + "-as-" + who},
		Spec: v1alpha1.ApprovalSpec{RequestRef: v1alpha1.ApprovalRequestReference{Name: request}, Decision: v1alpha1.DecisionApprove,
			Approver: &v1alpha1.Approver{Username: who, Groups: []string{"finance"}}}}
}

// forgedApproverDryRun creates (dry run) carol's Approval claiming to be alice: nil when the
// API server accepts it, which it does only without the webhooks.
func (aw *approvalsWorld) forgedApproverDryRun(request string) error {
	apr := forgedApprover(request, alice)
	apr.Name += "-probe"
	return aw.clients[carol].Create(aw.ctx, apr, client.DryRunAll)
}
