package redteam

import (
	"fmt"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/podrun"
)

// testNoAdoption (issue 17, "ReversiGateway as a confused deputy"): a ReversiGateway named
// after an existing object it does not control (a ConfigMap, ServiceAccount, Role,
// RoleBinding, PersistentVolumeClaim, Deployment, Service of another team) overwrites and
// adopts nothing: its Ready condition is False with reason OwnershipConflict naming the
// object, and the object is as it was (data, rules, subjects, spec, owner references); the
// gateway's Role does not name it.
func (w *world) testNoAdoption(t *testing.T) {
	victims := map[string]func(name string) client.Object{
		"ConfigMap": func(gw string) client.Object {
			return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gw + "-config"}, Data: map[string]string{"team": "payments"}}
		},
		"ServiceAccount": func(gw string) client.Object {
			return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gw + "-gateway", Labels: map[string]string{"team": "payments"}}}
		},
		"Role": func(gw string) client.Object {
			return &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gw + "-gateway"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"db-creds"}, Verbs: []string{"get"}}}}
		},
		"RoleBinding": func(gw string) client.Object {
			return &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gw + "-gateway"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "payments-reader"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "payments-oncall"}}}
		},
		"Service": func(gw string) client.Object {
			return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gw + "-gateway"},
				Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "payments"}, Ports: []corev1.ServicePort{{Name: "http", Port: 8080}}}}
		},
		"PersistentVolumeClaim": func(gw string) client.Object {
			return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gw + "-data", Labels: map[string]string{"team": "payments"}},
				Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("5Gi")}}}}
		},
		"Deployment": func(gw string) client.Object {
			labels := map[string]string{"app": "payments"}
			return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gw + "-gateway"},
				Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
					Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
						Spec: corev1.PodSpec{ServiceAccountName: "payments-sa", Containers: []corev1.Container{{Name: "payments", Image: "registry.internal/payments:1"}}}}}}
		},
	}
	for kind, make := range victims {
		t.Run(kind, func(t *testing.T) {
			gw := "victim-" + strings.ToLower(kind)
			victim := make(gw)
			must(t, w.k8s.Create(w.ctx, victim))
			before := victim.DeepCopyObject().(client.Object)
			must(t, w.k8s.Get(w.ctx, client.ObjectKeyFromObject(victim), before))
			must(t, w.k8s.Create(w.ctx, &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gw},
				Spec: v1alpha1.ReversiGatewaySpec{Mode: "enforce", Manifests: &v1alpha1.GatewayManifests{Registries: []string{memoryReg}},
					Upstreams:            []v1alpha1.GatewayUpstream{{Name: "memory", URL: "http://127.0.0.1:9/mcp"}},
					Auth:                 &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-keys", Key: "keys.json"}},
					TrustedKeysSecretRef: &v1alpha1.LocalObjectReference{Name: "manifest-keys"}}}))
			t.Cleanup(func() {
				_ = w.k8s.Delete(w.ctx, &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gw}})
				_ = w.k8s.Delete(w.ctx, victim)
			})
			var g v1alpha1.ReversiGateway
			if err := podrun.Poll(w.ctx, 30*time.Second, func() string {
				must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: gw}, &g))
				c := apimeta.FindStatusCondition(g.Status.Conditions, v1alpha1.ConditionReady)
				if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "OwnershipConflict" ||
					!strings.Contains(c.Message, fmt.Sprintf("%s %s/%s", kind, ns, victim.GetName())) {
					return "Ready is not OwnershipConflict naming the " + kind + ": " + conditionText(g.Status.Conditions)
				}
				return ""
			}); err != nil {
				t.Error(err)
			}
			// Nor is it granted: the gateway's ServiceAccount (whose token whoever may create
			// Deployments in the namespace can have) may not read a ConfigMap the gateway
			// does not control.
			if kind == "ConfigMap" {
				out, _ := exec.CommandContext(w.ctx, w.env.Kubectl(), "--kubeconfig", w.admin, "auth", "can-i", "get", "configmaps/"+victim.GetName(),
					"-n", ns, "--as", "system:serviceaccount:"+ns+":"+gw+"-gateway").CombinedOutput()
				if got := strings.TrimSpace(string(out)); got != "no" {
					t.Errorf("ATTACK: kubectl auth can-i get configmaps/%s as the gateway's ServiceAccount: %q, want no", victim.GetName(), got)
				}
			}
			after := victim.DeepCopyObject().(client.Object)
			must(t, w.k8s.Get(w.ctx, client.ObjectKeyFromObject(victim), after))
			if !reflect.DeepEqual(content(before), content(after)) || len(after.GetOwnerReferences()) != 0 || after.GetResourceVersion() != before.GetResourceVersion() {
				t.Errorf("ATTACK: the controller wrote the %s %s it does not control: before %+v, after %+v (owners %v)",
					kind, victim.GetName(), content(before), content(after), after.GetOwnerReferences())
			}
		})
	}
}

// content is what an attack on obj would change: its data, rules, subjects, spec and labels.
func content(obj client.Object) any {
	switch o := obj.(type) {
	case *corev1.ConfigMap:
		return []any{o.Labels, o.Data}
	case *corev1.ServiceAccount:
		return []any{o.Labels, o.Secrets}
	case *rbacv1.Role:
		return []any{o.Labels, o.Rules}
	case *rbacv1.RoleBinding:
		return []any{o.Labels, o.RoleRef, o.Subjects}
	case *corev1.Service:
		return []any{o.Labels, o.Spec.Selector, o.Spec.Ports}
	case *appsv1.Deployment:
		return []any{o.Labels, o.Spec.Template}
	case *corev1.PersistentVolumeClaim:
		return []any{o.Labels, o.Spec.Resources}
	}
	return nil
}
