package controllers

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// Issue 17, "the gateway's rights are only its own": the gateway pods report on Leases the
// controller creates, one per pod that runs as the gateway's ServiceAccount; the Role may patch
// exactly those. An existing Lease of a pod's name that the gateway does not control is an
// OwnershipConflict: not adopted, not written, not in the Role. A pod of another
// ServiceAccount gets none (and counts as unreported). A Lease whose pod is gone is deleted,
// and with the last one the leases rule goes (it is never written with no names).
func TestGatewayPodLeases(t *testing.T) {
	ns := namespace(t)
	k := newKey(t)
	repo := signedRegistryRepo(t, k)
	createSecret(t, ns, "manifest-keys", map[string][]byte{"k.pem": k.PublicPEM})
	createSecret(t, ns, "gateway-keys", map[string][]byte{"keys.json": []byte(`{"keys":[]}`)})
	create(t, newRegistry(ns, "payments", repo.FileURL(), withKeys("manifest-keys")))
	// Someone who may create Leases in the namespace takes a name a gateway pod will have.
	holder := "payments-batch"
	squat := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pay-gateway-squat", Labels: map[string]string{"team": "payments"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: ptr.To[int32](15)}}
	create(t, squat)
	create(t, &v1alpha1.ReversiGateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pay"},
		Spec: v1alpha1.ReversiGatewaySpec{
			Upstreams:            []v1alpha1.GatewayUpstream{{Name: "stripe", URL: "http://stripe-mcp.tools.svc:8080/mcp"}},
			Manifests:            &v1alpha1.GatewayManifests{Registries: []string{"payments"}},
			TrustedKeysSecretRef: &v1alpha1.LocalObjectReference{Name: "manifest-keys"},
			Auth:                 &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-keys", Key: "keys.json"}},
		},
	})
	waitGateway(t, ns, "pay", readyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))
	waitRole(t, ns, "pay-gateway", payRules()) // no pod, no Lease, no leases rule
	var dep appsv1.Deployment
	get(t, ns, "pay-gateway", &dep)

	pod := func(name, sa string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: dep.Spec.Template.Labels},
			Spec: corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "gateway", Image: "reversi:latest"}}}}
		create(t, p)
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		if err := k8s.Status().Update(t.Context(), p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// And one that refers to the gateway, but which another object controls.
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "payments-state"}}
	create(t, other)
	gwObj := getGateway(t, ns, "pay")
	taken := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pay-gateway-b", OwnerReferences: []metav1.OwnerReference{
		{APIVersion: "v1", Kind: "ConfigMap", Name: other.Name, UID: other.UID, Controller: ptr.To(true)},
		{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ReversiGateway", Name: "pay", UID: gwObj.UID},
	}}}
	create(t, taken)
	a := pod("pay-gateway-a", "pay-gateway")
	pod("pay-gateway-b", "pay-gateway")
	pod("pay-gateway-squat", "pay-gateway")
	pod("pay-gateway-other", "payments-sa") // the gateway's labels, another identity
	dep.Status = appsv1.DeploymentStatus{ObservedGeneration: dep.Generation, Replicas: 4, UpdatedReplicas: 4, ReadyReplicas: 4, AvailableReplicas: 4}
	if err := k8s.Status().Update(t.Context(), &dep); err != nil {
		t.Fatal(err)
	}

	gw := waitGateway(t, ns, "pay", func(gw *v1alpha1.ReversiGateway) string {
		c := condition(gw.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonOwnershipConflict ||
			!strings.Contains(c.Message, "Lease "+ns+"/pay-gateway-squat exists and is not controlled by ReversiGateway pay") ||
			!strings.Contains(c.Message, "Lease "+ns+"/pay-gateway-b exists and is not controlled by ReversiGateway pay") {
			return fmt.Sprintf("Ready %+v, want False OwnershipConflict naming both Leases", c)
		}
		if m := gw.Status.Manifests; m == nil || gw.Status.ReadyReplicas != 4 || len(m.OtherDigests) != 4 {
			return fmt.Sprintf("status %+v (want the 4 ready pods, none reported)", gw.Status)
		}
		return ""
	})
	waitRole(t, ns, "pay-gateway", payRules("pay-gateway-a"))
	lease := waitLease(t, ns, "pay-gateway-a")
	if !metav1.IsControlledBy(lease, gw) {
		t.Errorf("Lease pay-gateway-a is not controlled by the gateway: %v", lease.OwnerReferences)
	}
	var after coordinationv1.Lease
	get(t, ns, "pay-gateway-squat", &after)
	if after.ResourceVersion != squat.ResourceVersion || len(after.OwnerReferences) != 0 || !reflect.DeepEqual(after.Labels, squat.Labels) {
		t.Errorf("ATTACK: the controller wrote the Lease it does not control: %+v", after.ObjectMeta)
	}
	var takenAfter coordinationv1.Lease
	get(t, ns, "pay-gateway-b", &takenAfter)
	if takenAfter.ResourceVersion != taken.ResourceVersion {
		t.Errorf("ATTACK: the controller wrote the Lease another object controls: %+v", takenAfter.ObjectMeta)
	}
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "pay-gateway-other"}, &coordinationv1.Lease{}); !apierrors.IsNotFound(err) {
		t.Errorf("a pod of another ServiceAccount got a Lease: %v", err)
	}
	// None reports yet; the squatters' and the other identity's pods cannot.
	if m := gw.Status.Manifests; m.LoadedReplicas != 0 || !reflect.DeepEqual(m.OtherDigests, []string{"pay-gateway-a=unreported", "pay-gateway-b=unreported", "pay-gateway-other=unreported", "pay-gateway-squat=unreported"}) {
		t.Errorf("status.manifests %+v", m)
	}

	// A Lease of the gateway's whose labels and controller reference were taken away (it still
	// refers to the gateway) is healed.
	stripped := lease.DeepCopy()
	stripped.Labels = nil
	stripped.OwnerReferences[0].Controller = ptr.To(false)
	if err := k8s.Update(t.Context(), stripped); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() string {
		l := &coordinationv1.Lease{}
		get(t, ns, "pay-gateway-a", l)
		if !metav1.IsControlledBy(l, gw) || l.Labels[v1alpha1.LabelGateway] != "pay" {
			return fmt.Sprintf("the Lease is not healed: %+v", l.ObjectMeta)
		}
		lease = l
		return ""
	})

	// Only what is on a Lease the gateway controls counts: the squatter writes the desired
	// digest on its own Lease, the pod of another identity on its Pod.
	desired := gw.Status.Manifests.DesiredRevision
	patchLease(t, &after, map[string]any{v1alpha1.AnnotationManifestDigest: desired})
	patchLease(t, lease, map[string]any{v1alpha1.AnnotationManifestDigest: desired})
	gw = waitGateway(t, ns, "pay", func(gw *v1alpha1.ReversiGateway) string {
		if m := gw.Status.Manifests; m.LoadedReplicas != 1 || !reflect.DeepEqual(m.OtherDigests, []string{"pay-gateway-b=unreported", "pay-gateway-other=unreported", "pay-gateway-squat=unreported"}) {
			return fmt.Sprintf("status.manifests %+v", m)
		}
		return ""
	})

	// The pod goes: its Lease goes, and with it the leases rule (never an empty resourceNames).
	if err := k8s.Delete(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() string {
		if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "pay-gateway-a"}, &coordinationv1.Lease{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("the Lease of the deleted pod: %v", err)
		}
		return ""
	})
	waitRole(t, ns, "pay-gateway", payRules())
	get(t, ns, "pay-gateway-squat", &after)
	if len(after.OwnerReferences) != 0 {
		t.Errorf("the squatter's Lease was adopted: %v", after.OwnerReferences)
	}
}
