package controllers

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// Attacks on issue 17's guarantees at the reconciler (the admin creates the gateways, so the
// admission checks pass: these are what the controller itself does with a spec).

// canI asks the API server whether user may do verb on resource (group "" unless
// "resource.group") named name in ns.
func canI(t *testing.T, user, verb, resource, ns, name string) bool {
	t.Helper()
	res, group, _ := strings.Cut(resource, ".")
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: user,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &authzv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: group, Resource: res, Name: name}}}
	if err := k8s.Create(t.Context(), sar); err != nil {
		t.Fatal(err)
	}
	return sar.Status.Allowed
}

// attackGateway is a minimal valid ReversiGateway: one url upstream, an API key file.
func attackGateway(ns, name string) *v1alpha1.ReversiGateway {
	return &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ReversiGatewaySpec{Upstreams: []v1alpha1.GatewayUpstream{{Name: "stripe", URL: "http://stripe-mcp.tools.svc:8080/mcp"}},
			Auth: &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-keys", Key: "keys.json"}}}}
}

// A ReversiGateway named after another team's ConfigMap (`<gw>-config`, or `<gw>-manifests`)
// is an OwnershipConflict, and the ConfigMap is not written. But the Role is written before
// the ConfigMaps, and it names them: the gateway's ServiceAccount (whose token anyone who may
// create Deployments or pods in the namespace can have: the author must be allowed to create
// Deployments) could read the ConfigMap the controller does not control. The Role must name
// only ConfigMaps the gateway controls (or that do not exist yet).
func TestGatewayRoleNamesNoForeignConfigMap(t *testing.T) {
	ns := namespace(t)
	for _, cm := range []string{"vault-config", "ledger-manifests", "both-config", "both-manifests"} {
		create(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cm}, Data: map[string]string{"dsn": "postgres://payments:hunter2@db/payments"}})
	}
	createSecret(t, ns, "gateway-keys", map[string][]byte{"keys.json": []byte(`{"keys":[]}`)})
	for _, name := range []string{"vault", "ledger", "both"} {
		create(t, attackGateway(ns, name))
	}
	for name, cm := range map[string]string{"vault": "vault-config", "ledger": "ledger-manifests", "both": "both-config"} {
		waitGateway(t, ns, name, func(gw *v1alpha1.ReversiGateway) string {
			c := condition(gw.Status.Conditions, v1alpha1.ConditionReady)
			if c == nil || c.Reason != v1alpha1.ReasonOwnershipConflict || !strings.Contains(c.Message, "ConfigMap "+ns+"/"+cm) {
				return fmt.Sprintf("Ready %+v, want OwnershipConflict naming ConfigMap %s", c, cm)
			}
			return ""
		})
		// Give a Role written after the conflict time to appear.
		time.Sleep(500 * time.Millisecond)
		sa := GatewayServiceAccountUsername(ns, name)
		if canI(t, sa, "get", "configmaps", ns, cm) {
			var role rbacv1.Role
			_ = k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name + "-gateway"}, &role)
			t.Errorf("ATTACK: %s may get ConfigMap %s, which the gateway does not control (Role rules %+v)", sa, cm, role.Rules)
		}
		// Never an empty resourceNames, which would be every ConfigMap of the namespace.
		if canI(t, sa, "get", "configmaps", ns, "payments-settings") {
			t.Errorf("ATTACK: %s may get every ConfigMap", sa)
		}
		var role rbacv1.Role
		if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name + "-gateway"}, &role); err == nil {
			for _, r := range role.Rules {
				if slices.Contains(r.Resources, "configmaps") && slices.Contains(r.ResourceNames, cm) {
					t.Errorf("ATTACK: the Role of %s names ConfigMap %s, which it does not control: %+v", name, cm, r)
				}
			}
		} else if !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
}

// Whoever may create pods in the namespace may run one as the gateway's ServiceAccount with
// the gateway's labels, under any name: the controller then created a Lease of that name
// (controlled by the ReversiGateway, patchable by the gateway's ServiceAccount) and deleted it
// once the pod was gone. So a pod named like another component's leader-election Lease that
// does not exist yet took that name first: its holder is then whatever the gateway's
// ServiceAccount writes, and the controller deletes the Lease later under the component's
// feet. A gateway pod's Lease is named as the Deployment names its pods: `<gw>-gateway-…`.
func TestGatewayPodLeaseNamesAreTheGateways(t *testing.T) {
	ns := namespace(t)
	createSecret(t, ns, "gateway-keys", map[string][]byte{"keys.json": []byte(`{"keys":[]}`)})
	create(t, attackGateway(ns, "pay"))
	waitGateway(t, ns, "pay", readyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))
	labels := gatewayLabels(getGateway(t, ns, "pay"))
	for _, name := range []string{"payments-controller-leader", "pay-gateway-7d9f8-x2k4q"} {
		create(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec: corev1.PodSpec{ServiceAccountName: "pay-gateway", Containers: []corev1.Container{{Name: "gateway", Image: "reversi:latest"}}}})
	}
	waitLease(t, ns, "pay-gateway-7d9f8-x2k4q") // the Deployment's kind of name: reported
	eventually(t, 10*time.Second, func() string {
		var role rbacv1.Role
		get(t, ns, "pay-gateway", &role)
		for _, r := range role.Rules {
			if slices.Contains(r.Resources, "leases") && slices.Contains(r.ResourceNames, "pay-gateway-7d9f8-x2k4q") {
				return ""
			}
		}
		return fmt.Sprintf("the Role does not name the Lease of pod pay-gateway-7d9f8-x2k4q: %+v", role.Rules)
	})
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "payments-controller-leader"}, &coordinationv1.Lease{}); !apierrors.IsNotFound(err) {
		t.Errorf("ATTACK: a pod named payments-controller-leader made the controller create the Lease payments-controller-leader: %v", err)
	}
	if canI(t, GatewayServiceAccountUsername(ns, "pay"), "patch", "leases.coordination.k8s.io", ns, "payments-controller-leader") {
		t.Errorf("ATTACK: the gateway's ServiceAccount may patch Lease payments-controller-leader")
	}
}

// gatewayPodPrefix holds for long names too: the API server cuts a generateName to 58
// characters, so a long gateway's pods start with only the first 58 of `<gw>-gateway-`.
func TestGatewayPodPrefix(t *testing.T) {
	for name, want := range map[string]string{
		"pay":                   "pay-gateway-",
		strings.Repeat("a", 50): strings.Repeat("a", 50) + "-gateway",
		strings.Repeat("b", 60): strings.Repeat("b", 58),
	} {
		gw := &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if got := gatewayPodPrefix(gw); got != want {
			t.Errorf("gatewayPodPrefix(%s) = %q, want %q", name, got, want)
		}
	}
}

// Whoever may create pods as the gateway's ServiceAccount (its labels, names of its kind)
// could grow the gateway's Role, which names every pod's Lease and is rewritten on every pod
// event, and its Leases, without end: at most maxPodLeases pods get a Lease, the Deployment's
// own (controlled by one of its ReplicaSets) first.
func TestGatewayPodLeasesAreBounded(t *testing.T) {
	gw := &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "pay"}}
	pod := func(name, rs string) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, Labels: selectorLabels(gw)}, Spec: corev1.PodSpec{ServiceAccountName: "pay-gateway"}}
		if rs != "" {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs, UID: "rs-uid", Controller: ptr.To(true)}}
		}
		return p
	}
	var pods []corev1.Pod
	for i := range 3 * maxPodLeases {
		pods = append(pods, pod(fmt.Sprintf("pay-gateway-flood-%04d", i), ""))
	}
	pods = append(pods, pod("pay-gateway-7d9f8-x2k4q", "pay-gateway-7d9f8"), pod("pay-gateway-7d9f8-zzzzz", "pay-gateway-7d9f8"),
		pod("pay-gateway-other-abcde", "payments-7d9f8"), pod("payments-7d9f8-abcde", "pay-gateway-7d9f8"))
	got, skipped := leasePods(gw, pods)
	if len(got) != maxPodLeases || skipped != 3*maxPodLeases+3-maxPodLeases {
		t.Fatalf("%d pods get a Lease, %d left out; want %d and %d", len(got), skipped, maxPodLeases, 3*maxPodLeases+3-maxPodLeases)
	}
	if got[0].Name != "pay-gateway-7d9f8-x2k4q" || got[1].Name != "pay-gateway-7d9f8-zzzzz" || got[2].Name != "pay-gateway-flood-0000" {
		t.Errorf("the Deployment's pods do not come first: %s, %s, %s", got[0].Name, got[1].Name, got[2].Name)
	}
	if got, skipped := leasePods(gw, pods[:10]); len(got) != 10 || skipped != 0 {
		t.Errorf("ten pods: %d get a Lease, %d left out", len(got), skipped)
	}
}
