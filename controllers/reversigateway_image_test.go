package controllers

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/testenv"
)

// Issue 17, the reconciler's backstop of the image policy: with the webhook configurations
// deleted (admission bypassed), a ReversiGateway whose spec.image is outside the controller's
// patterns (the default: reversi, reversi:*, reversi@sha256:*) is Ready=False and Stalled
// with reason ImageNotAllowed, a Warning event names the image and the patterns, and nothing
// is rendered: no Deployment, ServiceAccount, Role or ConfigMap. With an allowed image it
// renders; a later change to a disallowed image leaves the Deployment and the rendered
// gateway.yaml as they were.
func TestGatewayImageNotAllowed(t *testing.T) {
	ns := namespace(t)
	const exfil = "attacker.example/exfil:1"
	gw := &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "exfil"}, Spec: v1alpha1.ReversiGatewaySpec{
		Image: exfil, Upstreams: []v1alpha1.GatewayUpstream{{Name: "stripe", URL: "http://stripe-mcp.tools.svc:8080/mcp"}},
		Auth: &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-keys", Key: "keys.json"}}}}
	createSecret(t, ns, "gateway-keys", map[string][]byte{"keys.json": []byte(`{"keys":[]}`)})
	testenv.WithoutAdmission(t, k8s, ns, func() { create(t, gw) })

	const want = `spec.image "` + exfil + `" is not allowed: the controller runs gateway images matching reversi, reversi:*, reversi@sha256:* (reversi controller --gateway-images)`
	got := waitGateway(t, ns, "exfil", readyIs(metav1.ConditionFalse, v1alpha1.ReasonImageNotAllowed))
	if c := condition(got.Status.Conditions, v1alpha1.ConditionReady); !strings.Contains(c.Message, want) {
		t.Errorf("Ready: %q, want it to say %q", c.Message, want)
	}
	if c := condition(got.Status.Conditions, v1alpha1.ConditionStalled); c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonImageNotAllowed {
		t.Errorf("Stalled: %+v", c)
	}
	waitEvent(t, ns, "exfil", v1alpha1.ReasonImageNotAllowed+": "+want)
	for name, obj := range map[string]client.Object{
		"exfil-gateway": &appsv1.Deployment{}, "exfil-gateway ": &corev1.ServiceAccount{}, "exfil-gateway  ": &rbacv1.Role{},
		"exfil-config": &corev1.ConfigMap{}, "exfil-manifests": &corev1.ConfigMap{},
	} {
		if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: strings.TrimSpace(name)}, obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s: %v, want NotFound: nothing is rendered for a disallowed image", obj, name, err)
		}
	}

	// An allowed image renders.
	setImage := func(image string) {
		t.Helper()
		cur := getGateway(t, ns, "exfil")
		patch := client.MergeFrom(cur.DeepCopy())
		cur.Spec.Image = image
		if err := k8s.Patch(t.Context(), cur, patch); err != nil {
			t.Fatal(err)
		}
	}
	setImage("reversi:v2")
	waitGateway(t, ns, "exfil", readyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))
	var dep appsv1.Deployment
	get(t, ns, "exfil-gateway", &dep)
	if img := dep.Spec.Template.Spec.Containers[0].Image; img != "reversi:v2" {
		t.Fatalf("the Deployment runs %q, want reversi:v2", img)
	}
	cfg := configMap(t, ns, "exfil-config")

	// Back to a disallowed image (and another upstream), admission bypassed: nothing changes.
	testenv.WithoutAdmission(t, k8s, ns, func() {
		cur := getGateway(t, ns, "exfil")
		patch := client.MergeFrom(cur.DeepCopy())
		cur.Spec.Image = exfil
		cur.Spec.Upstreams[0].URL = "http://exfil.attacker.example/mcp"
		if err := k8s.Patch(t.Context(), cur, patch); err != nil {
			t.Fatal(err)
		}
	})
	waitGateway(t, ns, "exfil", readyIs(metav1.ConditionFalse, v1alpha1.ReasonImageNotAllowed))
	get(t, ns, "exfil-gateway", &dep)
	if img := dep.Spec.Template.Spec.Containers[0].Image; img != "reversi:v2" {
		t.Errorf("the Deployment now runs %q: a disallowed image was rendered", img)
	}
	if now := configMap(t, ns, "exfil-config"); now == nil || now.Data[GatewayConfigKey] != cfg.Data[GatewayConfigKey] {
		t.Errorf("gateway.yaml changed for a gateway whose image is not allowed")
	}
}
