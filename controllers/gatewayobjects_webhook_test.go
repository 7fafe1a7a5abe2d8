package controllers

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

func TestParseGatewayIdentity(t *testing.T) {
	for in, want := range map[string][2]string{
		"agents/pay=alice":                         {"agents/pay", "alice"},
		"*/pay=system:serviceaccount:x:standalone": {"*/pay", "system:serviceaccount:x:standalone"},
	} {
		k, u, err := ParseGatewayIdentity(in)
		if err != nil || k != want[0] || u != want[1] {
			t.Errorf("%q: %q %q %v", in, k, u, err)
		}
	}
	for _, in := range []string{"pay=alice", "agents/pay", "agents/=alice", "/pay=alice", "agents/pay=", "a/b/c=alice"} {
		if _, _, err := ParseGatewayIdentity(in); err == nil || !strings.Contains(err.Error(), "NAMESPACE/GATEWAY=USERNAME") {
			t.Errorf("%q: %v", in, err)
		}
	}
}

// twoGateways makes a namespace with ReversiGateways pay and other, rendered (their pods never
// run here: only their ServiceAccounts, which the gateways control, matter to admission).
func twoGateways(t *testing.T) string {
	t.Helper()
	ns := namespace(t)
	createSecret(t, ns, "gateway-keys", map[string][]byte{"keys.json": []byte(`{"keys":[]}`)})
	for _, name := range []string{"pay", "other"} {
		create(t, &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.ReversiGatewaySpec{Upstreams: []v1alpha1.GatewayUpstream{{Name: "stripe", URL: "http://stripe-mcp.tools.svc:8080/mcp"}},
				Auth: &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-keys", Key: "keys.json"}}}})
	}
	// The webhook reads ReversiGateways and ServiceAccounts from the manager's cache.
	eventually(t, 10*time.Second, func() string {
		for _, name := range []string{"pay", "other"} {
			var sa corev1.ServiceAccount
			if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name + "-gateway"}, &sa); err != nil || len(sa.OwnerReferences) == 0 {
				return fmt.Sprintf("gateway %s has no ServiceAccount yet (%v)", name, err)
			}
		}
		return ""
	})
	return ns
}

func wantRefused(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: admitted, want refused", what)
		return
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v\nwant it to say %q", what, err, p)
		}
	}
}

// Issue 16, admission for the gateway's own objects: only the ServiceAccount of the gateway
// spec.gateway names (or a --gateway-identity user) creates ApprovalRequests and ReversiRuns
// and writes a run's status; the creator is stamped in reversi.dev/created-by, which never
// changes; another gateway's identity cannot change the objects (spec.rollback, the
// consumedAt mirror); operators keep their RBAC; only the controller writes request status.
func TestGatewayObjectsAdmission(t *testing.T) {
	ns := twoGateways(t)
	ctx := t.Context()
	masters := "system:masters" // past RBAC: admission is what is tested
	paySA, otherSA := GatewayServiceAccountUsername(ns, "pay"), GatewayServiceAccountUsername(ns, "other")
	pay, other := clientAs(t, paySA, "", masters), clientAs(t, otherSA, "", masters)
	standalone, ops := clientAs(t, testGatewayUser, "", masters), clientAs(t, "ops", "", masters)

	request := func(name, gw string) *v1alpha1.ApprovalRequest {
		return &v1alpha1.ApprovalRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.ApprovalRequestSpec{
			Tool: "stripe.refund", Run: "run-1", Actor: "agent-7", Gateway: gw, ArgumentsDigest: "sha256:" + strings.Repeat("ab", 32),
			ExpiresAt: &metav1.Time{Time: time.Now().Add(time.Hour)}}}
	}
	run := func(name, gw string) *v1alpha1.ReversiRun {
		return &v1alpha1.ReversiRun{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.ReversiRunSpec{Actor: "agent-7", Gateway: gw}}
	}

	// Creation: the other gateway, an operator and the admin are refused, naming who may.
	for who, c := range map[string]client.Client{"other gateway": other, "ops": ops, "admin": k8s} {
		wantRefused(t, who+" creating pay's request", c.Create(ctx, request("req-"+strings.ReplaceAll(who, " ", "-"), "pay")),
			"vapprovalrequest.reversi.dev", "ApprovalRequest "+ns+"/", "spec.gateway: only gateway pay creates its ApprovalRequests (its identity is "+paySA+")")
		wantRefused(t, who+" creating pay's run", c.Create(ctx, run("run-"+strings.ReplaceAll(who, " ", "-"), "pay")),
			"vreversirun.reversi.dev", "only gateway pay creates its ReversiRuns")
	}
	wantRefused(t, "a request of a gateway nobody runs", pay.Create(ctx, request("req-ghost", "ghost")),
		"no ReversiGateway ghost exists in namespace "+ns+" (or it does not control its ServiceAccount ghost-gateway) and no --gateway-identity names it", "--gateway-identity "+ns+"/ghost=USERNAME")
	forged := request("req-forged", "pay")
	forged.Annotations = map[string]string{v1alpha1.AnnotationCreatedBy: otherSA}
	wantRefused(t, "a created-by written by the creator", pay.Create(ctx, forged),
		"mapprovalrequest.reversi.dev", `metadata.annotations[reversi.dev/created-by]: is "`+otherSA+`" but you are "`+paySA+`"`)

	// The owners create, and are stamped as creators.
	ar, rr := request("req-pay", "pay"), run("run-pay", "pay")
	if err := pay.Create(ctx, ar); err != nil {
		t.Fatal(err)
	}
	if err := pay.Create(ctx, rr); err != nil {
		t.Fatal(err)
	}
	if ar.Annotations[v1alpha1.AnnotationCreatedBy] != paySA || rr.Annotations[v1alpha1.AnnotationCreatedBy] != paySA {
		t.Fatalf("created-by %q and %q, want %s", ar.Annotations[v1alpha1.AnnotationCreatedBy], rr.Annotations[v1alpha1.AnnotationCreatedBy], paySA)
	}
	sr := run("run-agents", "agents") // the standalone gateway of Options.GatewayIdentities
	if err := standalone.Create(ctx, sr); err != nil || sr.Annotations[v1alpha1.AnnotationCreatedBy] != testGatewayUser {
		t.Fatalf("the standalone gateway's run: %v %v", err, sr.Annotations)
	}
	wantRefused(t, "the standalone gateway creating pay's run", standalone.Create(ctx, run("run-x", "pay")), "only gateway pay creates")

	// created-by never changes, not even by an admin.
	edit := rr.DeepCopy()
	edit.Annotations[v1alpha1.AnnotationCreatedBy] = otherSA
	wantRefused(t, "an admin editing created-by", k8s.Update(ctx, edit), "is immutable (it was \""+paySA+"\")")
	wantRefused(t, "an admin removing created-by", k8s.Patch(ctx, request("req-pay", "pay"),
		client.RawPatch(client.Merge.Type(), []byte(`{"metadata":{"annotations":{"reversi.dev/created-by":null}}}`))), "created-by]: is immutable")

	// A run's status: only its gateway.
	status := func(c client.Client) error {
		var cur v1alpha1.ReversiRun
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(rr), &cur); err != nil {
			return err
		}
		cur.Status.Phase = v1alpha1.RunActive
		cur.Status.Steps = []v1alpha1.RunStep{{Seq: 1, Tool: "stripe.refund", Outcome: "succeeded", At: metav1.Now()}}
		return c.Status().Update(ctx, &cur)
	}
	for who, c := range map[string]client.Client{"other gateway": other, "standalone": standalone, "ops": ops, "admin": k8s} {
		wantRefused(t, who+" writing pay's run status", status(c), "vreversirun.reversi.dev", "status: only gateway pay writes the status of its runs")
	}
	if err := status(pay); err != nil {
		t.Fatalf("pay writing its run's status: %v", err)
	}

	// spec.rollback: another gateway is refused, an operator is not.
	confirm := client.RawPatch(client.Merge.Type(), []byte(`{"spec":{"rollback":{"confirm":true}}}`))
	wantRefused(t, "the other gateway confirming pay's rollback", other.Patch(ctx, run("run-pay", "pay"), confirm),
		"you are \""+otherSA+"\", the identity of gateway "+ns+"/other, and this object belongs to gateway pay")
	wantRefused(t, "the standalone gateway confirming pay's rollback", standalone.Patch(ctx, run("run-pay", "pay"), confirm), "the identity of gateway */agents")
	if err := ops.Patch(ctx, run("run-pay", "pay"), confirm); err != nil {
		t.Errorf("an operator confirming a rollback: %v", err)
	}

	// The consumedAt mirror: its gateway patches it, another gateway cannot remove it.
	mirror := client.RawPatch(client.Merge.Type(), []byte(`{"metadata":{"annotations":{"reversi.dev/consumedAt":"2026-12-01T00:00:00Z"}}}`))
	if err := pay.Patch(ctx, request("req-pay", "pay"), mirror); err != nil {
		t.Errorf("pay writing its consumedAt mirror: %v", err)
	}
	unmirror := client.RawPatch(client.Merge.Type(), []byte(`{"metadata":{"annotations":{"reversi.dev/consumedAt":null}}}`))
	wantRefused(t, "the other gateway removing consumedAt", other.Patch(ctx, request("req-pay", "pay"), unmirror), "belongs to gateway pay")

	// A request's status: only the controller (whose username the suite's manager shares with
	// the admin client); it decides the request.
	eventually(t, 10*time.Second, func() string {
		if getRequest(t, ns, "req-pay").Status.Phase == "" {
			return "the controller has not written the request's status"
		}
		return ""
	})
	approve := func(c client.Client) error {
		cur := getRequest(t, ns, "req-pay")
		cur.Status.Phase = v1alpha1.ApprovalApproved
		return c.Status().Update(ctx, cur)
	}
	for who, c := range map[string]client.Client{"pay": pay, "other gateway": other, "ops": ops} {
		wantRefused(t, who+" approving a request by its status", approve(c), "status: only the controller", "create an Approval instead")
	}
	if got := getRequest(t, ns, "req-pay").Status.Phase; got != v1alpha1.ApprovalPending {
		t.Errorf("phase %q after the refused writes", got)
	}
}

// A ServiceAccount named <gw>-gateway that its ReversiGateway does not control (made before
// the gateway, which the reconciler refuses as an OwnershipConflict) is not the gateway's
// identity: it creates no requests or runs in the gateway's name (issue 17).
func TestSquattedGatewayServiceAccountIsNobody(t *testing.T) {
	ns := namespace(t)
	ctx := t.Context()
	create(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "squat-gateway"}})
	create(t, &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "squat"},
		Spec: v1alpha1.ReversiGatewaySpec{Upstreams: []v1alpha1.GatewayUpstream{{Name: "stripe", URL: "http://stripe-mcp.tools.svc:8080/mcp"}}}})
	eventually(t, 10*time.Second, func() string { // the webhook reads ReversiGateways from the cache
		var gw v1alpha1.ReversiGateway
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "squat"}, &gw); err != nil || gw.Status.ObservedGeneration == 0 {
			return fmt.Sprintf("the gateway is not reconciled yet (%v)", err)
		}
		return ""
	})
	var sa corev1.ServiceAccount
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "squat-gateway"}, &sa); err != nil || len(sa.OwnerReferences) != 0 {
		t.Fatalf("the squatted ServiceAccount was adopted or lost: %v %+v", err, sa.OwnerReferences)
	}
	squatter := clientAs(t, GatewayServiceAccountUsername(ns, "squat"), "", "system:masters")
	wantRefused(t, "the squatted ServiceAccount creating a request", squatter.Create(ctx, &v1alpha1.ApprovalRequest{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "req-squat"},
		Spec: v1alpha1.ApprovalRequestSpec{Tool: "stripe.refund", Run: "run-1", Actor: "agent-7", Gateway: "squat", ArgumentsDigest: "sha256:" + strings.Repeat("ab", 32),
			ExpiresAt: &metav1.Time{Time: time.Now().Add(time.Hour)}}}),
		"vapprovalrequest.reversi.dev", "does not control its ServiceAccount squat-gateway")
	wantRefused(t, "the squatted ServiceAccount creating a run", squatter.Create(ctx, &v1alpha1.ReversiRun{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "run-squat"},
		Spec: v1alpha1.ReversiRunSpec{Actor: "agent-7", Gateway: "squat"}}), "vreversirun.reversi.dev", "does not control its ServiceAccount squat-gateway")
}
