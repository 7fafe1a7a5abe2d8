package controllers

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/approvalsig"
)

// The people of the approval tests, minted by envtest with client certificates: alice and bob
// in finance, carol in cfo, mallory in no group, and agent-7, the run's own actor, in finance
// too (so only the actor rule keeps it from approving).
var people = map[string][]string{
	"alice": {"finance"}, "bob": {"finance"}, "carol": {"cfo"}, "mallory": nil, "agent-7": {"finance"},
}

var (
	peopleOnce sync.Once
	peopleDir  string
	peopleErr  error
)

// kubeconfigOf returns the kubeconfig of one of people.
func kubeconfigOf(t *testing.T, name string) string {
	t.Helper()
	requireEnv(t)
	peopleOnce.Do(func() {
		if peopleDir, peopleErr = os.MkdirTemp("", "reversi-people-"); peopleErr != nil {
			return
		}
		for n, groups := range people {
			if _, peopleErr = testEnv.UserKubeconfig(peopleDir, n, groups...); peopleErr != nil {
				return
			}
		}
	})
	if peopleErr != nil {
		t.Fatal(peopleErr)
	}
	return filepath.Join(peopleDir, name+".kubeconfig")
}

// approverNamespace makes a namespace where every authenticated user has the approver role of
// config/rbac/approver_role.yaml (the real file): RBAC is the outer gate, the rules the inner.
func approverNamespace(t *testing.T) string {
	t.Helper()
	ns := namespace(t)
	b, err := os.ReadFile(filepath.Join(testenv.Root, "config", "rbac", "approver_role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(b, role); err != nil {
		t.Fatal(err)
	}
	role.Name = "approver-" + ns
	create(t, role)
	t.Cleanup(func() { _ = k8s.Delete(t.Context(), role) })
	create(t, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "approvers"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}},
	})
	return ns
}

// kubectlAs runs the envtest kubectl as one of people and returns its combined output.
func kubectlAs(t *testing.T, who string, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(testEnv.Kubectl(), append([]string{"--kubeconfig", kubeconfigOf(t, who)}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// applyApproval is `kubectl apply -f -` of an Approval by who; extra is more spec YAML.
func applyApproval(t *testing.T, who, ns, name, request, decision, extra string) (string, error) {
	t.Helper()
	doc := fmt.Sprintf("apiVersion: reversi.dev/v1alpha1\nkind: Approval\nmetadata: {name: %s, namespace: %s}\nspec:\n  requestRef: {name: %s}\n  decision: %s\n  reason: test\n%s",
		name, ns, request, decision, extra)
	return kubectlAs(t, who, doc, "apply", "-f", "-")
}

func mustApply(t *testing.T, who, ns, name, request, decision string) {
	t.Helper()
	if out, err := applyApproval(t, who, ns, name, request, decision, ""); err != nil {
		t.Fatalf("kubectl apply by %s: %v\n%s", who, err, out)
	}
}

// newRequest creates an ApprovalRequest held for roles with quorum, as the gateway "agents"
// would (as testGatewayUser: admission admits only a gateway's identity).
func newRequest(t *testing.T, ns, name string, mut func(*v1alpha1.ApprovalRequestSpec)) {
	t.Helper()
	spec := v1alpha1.ApprovalRequestSpec{Tool: "stripe.refund", Run: "run-1", Actor: "agent-7", Gateway: "agents",
		ArgumentsDigest: "sha256:" + strings.Repeat("ab", 32), Roles: []string{"finance"}, Quorum: ptr.To[int32](2),
		ExpiresAt: &metav1.Time{Time: time.Now().Add(time.Hour)}}
	if mut != nil {
		mut(&spec)
	}
	ar := &v1alpha1.ApprovalRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
	if err := clientAs(t, testGatewayUser, "", "system:masters").Create(t.Context(), ar); err != nil {
		t.Fatal(err)
	}
}

func getRequest(t *testing.T, ns, name string) *v1alpha1.ApprovalRequest {
	t.Helper()
	ar := &v1alpha1.ApprovalRequest{}
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, ar); err != nil {
		t.Fatal(err)
	}
	return ar
}

// waitPhase waits until the request's phase is phase with approvedCount approvals.
func waitPhase(t *testing.T, ns, name, phase string, approved int32) *v1alpha1.ApprovalRequest {
	t.Helper()
	var ar *v1alpha1.ApprovalRequest
	eventually(t, 20*time.Second, func() string {
		ar = getRequest(t, ns, name)
		if ar.Status.Phase != phase || ar.Status.ApprovedCount != approved {
			return fmt.Sprintf("phase %q with %d approvals (%s), want %s with %d", ar.Status.Phase, ar.Status.ApprovedCount, ar.Status.Message, phase, approved)
		}
		return ""
	})
	return ar
}

// waitResult waits for an Approval's result and returns its message.
func waitResult(t *testing.T, ns, name, result string) *v1alpha1.Approval {
	t.Helper()
	var apr *v1alpha1.Approval
	eventually(t, 20*time.Second, func() string {
		apr = &v1alpha1.Approval{}
		if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, apr); err != nil {
			return err.Error()
		}
		if apr.Status.Result != result {
			return fmt.Sprintf("result %q (%s), want %s", apr.Status.Result, apr.Status.Message, result)
		}
		if c := condition(apr.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue || c.Reason != result {
			return fmt.Sprintf("Ready condition %+v", c)
		}
		return ""
	})
	return apr
}

// events returns the notes of the events about one object.
func events(t *testing.T, ns, name string) []string {
	t.Helper()
	var list eventsv1.EventList
	if err := k8s.List(t.Context(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == name {
			out = append(out, e.Reason+": "+e.Note)
		}
	}
	return out
}

func waitEvent(t *testing.T, ns, name, want string) {
	t.Helper()
	eventually(t, 10*time.Second, func() string {
		ev := events(t, ns, name)
		if !slices.ContainsFunc(ev, func(e string) bool { return strings.Contains(e, want) }) {
			return fmt.Sprintf("no event %q about %s in %q", want, name, ev)
		}
		return ""
	})
}

// approvalEvents lists the approval events (reason Approval*) about one object, each as
// "type reason: note", waiting until there are n of them and then a moment longer, so that an
// event too many is seen.
func approvalEvents(t *testing.T, ns, name string, n int) []string {
	t.Helper()
	list := func() []string {
		var evs eventsv1.EventList
		if err := k8s.List(t.Context(), &evs, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range evs.Items {
			if e.Regarding.Name == name && strings.HasPrefix(e.Reason, "Approval") {
				out = append(out, e.Type+" "+e.Reason+": "+e.Note)
			}
		}
		slices.Sort(out)
		return out
	}
	eventually(t, 10*time.Second, func() string {
		if got := list(); len(got) < n {
			return fmt.Sprintf("%d approval events about %s, want %d: %q", len(got), name, n, got)
		}
		return ""
	})
	time.Sleep(500 * time.Millisecond)
	return list()
}

// Issue 24: each decision is one Kubernetes Event on the ApprovalRequest, with the tool, the
// run, its actor and who decided: ApprovalApproved (Normal) naming both approvers and the
// quorum, ApprovalDenied (Warning) naming the one who denied; no other approval event.
func TestApprovalDecisionEvents(t *testing.T) {
	ns := approverNamespace(t)
	newRequest(t, ns, "apr-ev-ok", nil)
	newRequest(t, ns, "apr-ev-no", func(s *v1alpha1.ApprovalRequestSpec) { s.Tool, s.Run = "stripe.payout", "run-2" })
	mustApply(t, "alice", ns, "apr-ev-ok-alice", "apr-ev-ok", "Approve")
	waitPhase(t, ns, "apr-ev-ok", v1alpha1.ApprovalPending, 1)
	mustApply(t, "bob", ns, "apr-ev-ok-bob", "apr-ev-ok", "Approve")
	mustApply(t, "bob", ns, "apr-ev-no-bob", "apr-ev-no", "Deny")
	waitPhase(t, ns, "apr-ev-ok", v1alpha1.ApprovalApproved, 2)
	waitPhase(t, ns, "apr-ev-no", v1alpha1.ApprovalDenied, 0)

	want := []string{"Normal ApprovalApproved: stripe.refund (run run-1, actor agent-7): approved by alice, bob (quorum 2); the gateway lets the call's retry through once"}
	if got := approvalEvents(t, ns, "apr-ev-ok", 1); !slices.Equal(got, want) {
		t.Errorf("events of apr-ev-ok:\n%q\nwant\n%q", got, want)
	}
	want = []string{"Warning ApprovalDenied: stripe.payout (run run-2, actor agent-7): denied by bob; the call stays blocked"}
	if got := approvalEvents(t, ns, "apr-ev-no", 1); !slices.Equal(got, want) {
		t.Errorf("events of apr-ev-no:\n%q\nwant\n%q", got, want)
	}
}

// The acceptance of issue 8 for the controller and the webhook: a request for [finance] with
// quorum 2 stays Pending after alice, ignores mallory (no role) and the run's own actor, and is
// Approved by bob; an Approval claiming to be alice's applied by mallory is refused.
func TestApprovalQuorumWithKubectl(t *testing.T) {
	ns := approverNamespace(t)
	newRequest(t, ns, "apr-q", nil)
	waitPhase(t, ns, "apr-q", v1alpha1.ApprovalPending, 0)

	mustApply(t, "alice", ns, "apr-q-alice", "apr-q", "Approve")
	apr := waitResult(t, ns, "apr-q-alice", v1alpha1.ResultCounted)
	if a := apr.Spec.Approver; a == nil || a.Username != "alice" || !slices.Contains(a.Groups, "finance") || !slices.Contains(a.Groups, "system:authenticated") {
		t.Fatalf("the webhook stamped %+v, want alice with her groups", apr.Spec.Approver)
	}
	ar := waitPhase(t, ns, "apr-q", v1alpha1.ApprovalPending, 1)
	if !strings.Contains(ar.Status.Message, "1 of 2 approvals; waiting for members of finance") {
		t.Errorf("pending message %q", ar.Status.Message)
	}
	if c := condition(ar.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonWaitingForApprovals {
		t.Errorf("Ready while pending: %+v", c)
	}

	mustApply(t, "mallory", ns, "apr-q-mallory", "apr-q", "Approve")
	if apr := waitResult(t, ns, "apr-q-mallory", v1alpha1.ResultRejected); !strings.Contains(apr.Status.Message, "mallory holds none of the roles [finance]") {
		t.Errorf("mallory's rejection says %q", apr.Status.Message)
	}
	mustApply(t, "agent-7", ns, "apr-q-self", "apr-q", "Approve")
	if apr := waitResult(t, ns, "apr-q-self", v1alpha1.ResultRejected); !strings.Contains(apr.Status.Message, "agent-7 opened run run-1 and cannot approve its own call") {
		t.Errorf("the actor's rejection says %q", apr.Status.Message)
	}

	// Forged approvers are refused at admission, whatever the field says.
	for name, extra := range map[string]string{
		"apr-q-forged":        "  approver: {username: alice}\n",
		"apr-q-forged-groups": "  approver: {username: mallory, groups: [finance]}\n",
	} {
		out, err := applyApproval(t, "mallory", ns, name, "apr-q", "Approve", extra)
		if err == nil || !strings.Contains(out, "mapproval.reversi.dev") || !strings.Contains(out, "leave spec.approver out") {
			t.Errorf("%s: kubectl apply by mallory gave %v\n%s", name, err, out)
		}
	}
	// Writing your own identity exactly is accepted (and stamped in full).
	if out, err := applyApproval(t, "bob", ns, "apr-q-bob", "apr-q", "Approve", "  approver: {username: bob}\n"); err != nil {
		t.Fatalf("bob naming himself: %v\n%s", err, out)
	}
	ar = waitPhase(t, ns, "apr-q", v1alpha1.ApprovalApproved, 2)
	if ar.Status.DecidedAt == nil || len(ar.Status.Approvals) != 2 || ar.Status.Approvals[1].Username != "bob" {
		t.Errorf("approved status: %+v", ar.Status)
	}
	if err := approvalsig.Verify(ar, ctlKey.Trust); err != nil { // what the gateway honours
		t.Errorf("the decision signature: %v (%+v)", err, ar.Status.Decision)
	}
	if c := condition(ar.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonApproved {
		t.Errorf("Ready when approved: %+v", c)
	}
	waitResult(t, ns, "apr-q-bob", v1alpha1.ResultCounted)

	// A late vote is not counted; a spec edit is refused (CEL).
	mustApply(t, "carol", ns, "apr-q-late", "apr-q", "Deny")
	if apr := waitResult(t, ns, "apr-q-late", v1alpha1.ResultRejected); !strings.Contains(apr.Status.Message, "already Approved") {
		t.Errorf("late deny: %q", apr.Status.Message)
	}
	// (The approver role cannot patch; even an admin cannot change the decision.)
	if out, err := kubectlAs(t, "alice", "", "patch", "approval", "apr-q-alice", "-n", ns, "--type=merge", "-p", `{"spec":{"decision":"Deny"}}`); err == nil || !strings.Contains(out, "forbidden") {
		t.Errorf("alice editing her decision: %v\n%s", err, out)
	}
	edit := &v1alpha1.Approval{}
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "apr-q-alice"}, edit); err != nil {
		t.Fatal(err)
	}
	edit.Spec.Decision = v1alpha1.DecisionDeny
	if err := k8s.Update(t.Context(), edit); err == nil || !strings.Contains(err.Error(), "spec is immutable") {
		t.Errorf("an admin editing a decision: %v", err)
	}

	waitEvent(t, ns, "apr-q", v1alpha1.EventApprovalApproved+": stripe.refund (run run-1, actor agent-7): approved by alice, bob (quorum 2)")
	waitEvent(t, ns, "apr-q-mallory", "Rejected: Approve by mallory: not counted")
	waitEvent(t, ns, "apr-q-alice", "Counted: Approve by alice")
}

// One Deny by a finance user denies.
func TestApprovalDeny(t *testing.T) {
	ns := approverNamespace(t)
	newRequest(t, ns, "apr-d", nil)
	mustApply(t, "alice", ns, "apr-d-alice", "apr-d", "Approve")
	waitPhase(t, ns, "apr-d", v1alpha1.ApprovalPending, 1)
	mustApply(t, "bob", ns, "apr-d-bob", "apr-d", "Deny")
	ar := waitPhase(t, ns, "apr-d", v1alpha1.ApprovalDenied, 1)
	if !strings.Contains(ar.Status.Message, "denied by bob") {
		t.Errorf("denied message %q", ar.Status.Message)
	}
	waitResult(t, ns, "apr-d-bob", v1alpha1.ResultCounted)
	waitEvent(t, ns, "apr-d", v1alpha1.EventApprovalDenied+": stripe.refund (run run-1, actor agent-7): denied by bob; the call stays blocked")
}

// A request past expiresAt with onTimeout deny is Expired at that time (the reconciler requeues
// for it, no Approval needed); one with onTimeout escalate becomes Escalated, where only
// escalateTo decides, with the approvals already given still counted.
func TestApprovalExpiryAndEscalation(t *testing.T) {
	ns := approverNamespace(t)
	soon := func(s *v1alpha1.ApprovalRequestSpec) {
		s.ExpiresAt = &metav1.Time{Time: time.Now().Add(2 * time.Second)}
	}
	newRequest(t, ns, "apr-x", soon)
	newRequest(t, ns, "apr-e", func(s *v1alpha1.ApprovalRequestSpec) {
		// Escalation moves the expiry on by the original timeout: 6 s leaves the two votes
		// after it room on a loaded machine (2 s did not, now and then).
		s.ExpiresAt = &metav1.Time{Time: time.Now().Add(6 * time.Second)}
		s.OnTimeout, s.EscalateTo = "escalate", []string{"cfo"}
	})
	mustApply(t, "alice", ns, "apr-e-alice", "apr-e", "Approve")
	waitPhase(t, ns, "apr-e", v1alpha1.ApprovalPending, 1)

	ar := waitPhase(t, ns, "apr-x", v1alpha1.ApprovalExpired, 0)
	if ar.Status.DecidedAt == nil || !strings.Contains(ar.Status.Message, "expired at") {
		t.Errorf("expired status: %+v", ar.Status)
	}
	waitEvent(t, ns, "apr-x", v1alpha1.EventApprovalExpired+": stripe.refund (run run-1, actor agent-7): expired at ")
	mustApply(t, "alice", ns, "apr-x-alice", "apr-x", "Approve")
	if apr := waitResult(t, ns, "apr-x-alice", v1alpha1.ResultRejected); !strings.Contains(apr.Status.Message, "already Expired") {
		t.Errorf("an approval after expiry: %q", apr.Status.Message)
	}

	ar = waitPhase(t, ns, "apr-e", v1alpha1.ApprovalEscalated, 1)
	if ar.Status.EscalatedAt == nil || !strings.Contains(ar.Status.Message, "escalated: 1 of 2 approvals; waiting for members of cfo") {
		t.Errorf("escalated status: %+v", ar.Status)
	}
	waitEvent(t, ns, "apr-e", v1alpha1.EventApprovalEscalated+": stripe.refund (run run-1, actor agent-7): escalated: 1 of 2 approvals; waiting for members of cfo until ")
	mustApply(t, "bob", ns, "apr-e-bob", "apr-e", "Approve")
	if apr := waitResult(t, ns, "apr-e-bob", v1alpha1.ResultRejected); !strings.Contains(apr.Status.Message, "bob holds none of the roles [cfo]") {
		t.Errorf("finance after escalation: %q", apr.Status.Message)
	}
	mustApply(t, "carol", ns, "apr-e-carol", "apr-e", "Approve")
	waitPhase(t, ns, "apr-e", v1alpha1.ApprovalApproved, 2)
}
