package controllers

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/pkg/bundle"
)

func getGateway(t *testing.T, ns, name string) *v1alpha1.ReversiGateway {
	t.Helper()
	gw := &v1alpha1.ReversiGateway{}
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, gw); err != nil {
		t.Fatal(err)
	}
	return gw
}

// waitGateway waits until check(gw) returns "" for the current generation.
func waitGateway(t *testing.T, ns, name string, check func(*v1alpha1.ReversiGateway) string) *v1alpha1.ReversiGateway {
	t.Helper()
	var gw *v1alpha1.ReversiGateway
	eventually(t, 30*time.Second, func() string {
		gw = getGateway(t, ns, name)
		if gw.Status.ObservedGeneration != gw.Generation {
			return "status is about an older generation"
		}
		return check(gw)
	})
	return gw
}

func readyIs(status metav1.ConditionStatus, reason string) func(*v1alpha1.ReversiGateway) string {
	return func(gw *v1alpha1.ReversiGateway) string {
		c := condition(gw.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || c.Status != status || c.Reason != reason {
			return fmt.Sprintf("Ready %+v, want %s %s", c, status, reason)
		}
		return ""
	}
}

func get(t *testing.T, ns, name string, obj client.Object) {
	t.Helper()
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, obj); err != nil {
		t.Fatalf("%T %s: %v", obj, name, err)
	}
}

// payRules are the rules of the Role of TestGatewayRendersOwnedObjects' gateway "pay", with a
// leases rule naming leases when there are any.
func payRules(leases ...string) []rbacv1.PolicyRule {
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{"pay-config", "pay-manifests"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"manifest-keys"}, Verbs: []string{"get", "list", "watch"}},
	}
	if len(leases) > 0 {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: leases, Verbs: []string{"patch"}})
	}
	return append(rules,
		rbacv1.PolicyRule{APIGroups: []string{"reversi.dev"}, Resources: []string{"approvalrequests"}, Verbs: []string{"get", "list", "watch", "create", "patch"}},
		rbacv1.PolicyRule{APIGroups: []string{"reversi.dev"}, Resources: []string{"reversiruns"}, Verbs: []string{"get", "list", "watch", "create"}},
		rbacv1.PolicyRule{APIGroups: []string{"reversi.dev"}, Resources: []string{"reversiruns/status"}, Verbs: []string{"get", "update", "patch"}},
		rbacv1.PolicyRule{APIGroups: []string{"reversi.dev"}, Resources: []string{"approvals"}, Verbs: []string{"get", "list", "watch"}},
		rbacv1.PolicyRule{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	)
}

// waitRole waits until the Role's rules are exactly want.
func waitRole(t *testing.T, ns, name string, want []rbacv1.PolicyRule) {
	t.Helper()
	eventually(t, 10*time.Second, func() string {
		var role rbacv1.Role
		get(t, ns, name, &role)
		if !reflect.DeepEqual(role.Rules, want) {
			return fmt.Sprintf("Role %s rules:\n%+v\nwant\n%+v", name, role.Rules, want)
		}
		return ""
	})
}

// waitLease waits until the Lease exists and returns it.
func waitLease(t *testing.T, ns, name string) *coordinationv1.Lease {
	t.Helper()
	l := &coordinationv1.Lease{}
	eventually(t, 10*time.Second, func() string {
		if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, l); err != nil {
			return "Lease " + name + ": " + err.Error()
		}
		return ""
	})
	return l
}

// patchLease merge-patches the Lease's annotations (nil removes one), as a gateway pod reports.
func patchLease(t *testing.T, l *coordinationv1.Lease, annotations map[string]any) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		t.Fatal(err)
	}
	if err := k8s.Patch(t.Context(), l.DeepCopy(), client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
}

// The reconciler renders every owned object from the spec: gateway.yaml (secrets only as
// ${ENV} references the Deployment fills from secretKeyRefs), the registry's signed manifests,
// a Role with exactly the gateway's permissions, a hardened Deployment and a Service; the
// status follows the pods' reports of the digest they serve, on their Leases.
func TestGatewayRendersOwnedObjects(t *testing.T) {
	ns := namespace(t)
	k := newKey(t)
	repo := signedRegistryRepo(t, k)
	createSecret(t, ns, "manifest-keys", map[string][]byte{"k.pem": k.PublicPEM})
	createSecret(t, ns, "upstream-token", map[string][]byte{"token": []byte("Bearer s3cr3t-value")})
	createSecret(t, ns, "gateway-keys", map[string][]byte{"keys.json": []byte(`{"keys":[]}`)})
	create(t, newRegistry(ns, "payments", repo.FileURL(), withKeys("manifest-keys")))
	create(t, &v1alpha1.ReversiGateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pay"},
		Spec: v1alpha1.ReversiGatewaySpec{
			Mode: "enforce", Actor: "agent-7", Permissions: []string{"payments:refund"},
			Upstreams: []v1alpha1.GatewayUpstream{{Name: "stripe", URL: "http://stripe-mcp.tools.svc:8080/mcp", Headers: []v1alpha1.ValueFrom{
				{Name: "Authorization", SecretKeyRef: &v1alpha1.SecretKeyReference{Name: "upstream-token", Key: "token"}},
				{Name: "X-Team", Value: "payments"},
			}, Session: "Shared", Resources: ptr.To(false)}},
			Deny:                 []string{"stripe.delete_*"},
			Manifests:            &v1alpha1.GatewayManifests{Registries: []string{"payments"}},
			TrustedKeysSecretRef: &v1alpha1.LocalObjectReference{Name: "manifest-keys"},
			Auth:                 &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-keys", Key: "keys.json"}},
		},
	})

	gw := waitGateway(t, ns, "pay", readyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))
	if c := condition(gw.Status.Conditions, v1alpha1.ConditionReconciling); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("Reconciling while rolling out: %+v", gw.Status.Conditions)
	}
	reg := waitReady(t, ns, "payments", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, "")

	// The manifests: the registry's, signatures kept, verifiable by the pod.
	cm := configMap(t, ns, "pay-manifests")
	if cm == nil || !metav1.IsControlledBy(cm, gw) {
		t.Fatalf("pay-manifests %+v", cm)
	}
	b, err := bundle.Assemble([]map[string]string{cm.Data})
	if err != nil {
		t.Fatal(err)
	}
	ms, errs := b.Verify(k.Trust, ctlKey.Trust)
	if len(errs) > 0 || len(ms) != 3 {
		t.Fatalf("verify: %v (%d manifests)", errs, len(ms))
	}
	for _, e := range b.Entries {
		if !e.Signed() {
			t.Fatalf("%s lost its signature", e.Tool)
		}
	}
	if b.Digest() != reg.Status.Artifact.Digest || gw.Status.Manifests == nil || gw.Status.Manifests.DesiredRevision != b.Digest() || gw.Status.Manifests.Tools != 3 {
		t.Fatalf("digest %s, registry %s, status %+v", b.Digest(), reg.Status.Artifact.Digest, gw.Status.Manifests)
	}
	if want := "ManifestRegistry " + ns + "/payments " + reg.Status.Artifact.Revision + " (sequence " + strconv.FormatInt(reg.Status.Artifact.Sequence, 10) + ")"; b.Revision() != want {
		t.Errorf("revision %q, want %q", b.Revision(), want)
	}

	// gateway.yaml: what the gateway accepts, the secret only by reference.
	cfgMap := configMap(t, ns, "pay-config")
	if cfgMap == nil {
		t.Fatal("no pay-config")
	}
	data := cfgMap.Data[GatewayConfigKey]
	if strings.Contains(data, "s3cr3t") || !strings.Contains(data, "${REVERSI_UPSTREAM_0_HEADER_0}") {
		t.Fatalf("gateway.yaml:\n%s", data)
	}
	g, perrs := config.Parse("gateway.yaml", []byte(data), func(n string) (string, bool) {
		return "Bearer from-env", n == "REVERSI_UPSTREAM_0_HEADER_0"
	})
	if len(perrs) > 0 {
		t.Fatalf("gateway.yaml refused: %v\n%s", perrs, data)
	}
	if g.Mode != config.ModeEnforce || g.Actor != "agent-7" || g.Listen == nil || g.Listen.Address() != "0.0.0.0:7431" ||
		g.Auth.Keys != GatewayAuthDir+"/"+GatewayAuthKey || g.Upstreams[0].Headers["Authorization"] != "Bearer from-env" ||
		g.Upstreams[0].Headers["X-Team"] != "payments" || !reflect.DeepEqual(g.Deny, []string{"stripe.delete_*"}) ||
		!reflect.DeepEqual(g.Permissions, []string{"payments:refund"}) || g.AllowedHosts[0] != "pay-gateway."+ns+".svc" ||
		g.Upstreams[0].PerClient() || !g.Upstreams[0].NoResources {
		t.Fatalf("parsed %+v", g)
	}

	// RBAC: exactly these rules, bound to the gateway's ServiceAccount. No pod yet: no Lease,
	// so no leases rule at all (an empty resourceNames would mean every Lease); no pods rule.
	var role rbacv1.Role
	get(t, ns, "pay-gateway", &role)
	if want := payRules(); !reflect.DeepEqual(role.Rules, want) {
		t.Fatalf("Role rules:\n%+v\nwant\n%+v", role.Rules, want)
	}
	var rb rbacv1.RoleBinding
	get(t, ns, "pay-gateway", &rb)
	if rb.RoleRef.Name != "pay-gateway" || rb.RoleRef.Kind != "Role" || len(rb.Subjects) != 1 ||
		rb.Subjects[0].Kind != "ServiceAccount" || rb.Subjects[0].Name != "pay-gateway" || rb.Subjects[0].Namespace != ns {
		t.Fatalf("RoleBinding %+v", rb)
	}
	var sa corev1.ServiceAccount
	get(t, ns, "pay-gateway", &sa)

	// The Deployment: hardened, probed, configured by args and env.
	var dep appsv1.Deployment
	get(t, ns, "pay-gateway", &dep)
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	wantArgs := []string{"gateway", "--config", "/etc/reversi/config/gateway.yaml", "--kube-configmap", ns + "/pay-manifests",
		"--kube-trusted-keys", "manifest-keys", "--kubeconfig", "", "--namespace", ns, "--gateway-name", "pay", "--store", "sqlite", "--data", GatewayDataDir}
	if !reflect.DeepEqual(c.Args, wantArgs) || c.Image != DefaultGatewayImage || pod.ServiceAccountName != "pay-gateway" {
		t.Fatalf("container %v image %s sa %s", c.Args, c.Image, pod.ServiceAccountName)
	}
	// The pods get the controller's public keys, to verify the snapshots with.
	keysEnv := ""
	for _, e := range c.Env {
		if e.Name == ControllerKeysEnv {
			keysEnv = e.Value
		}
	}
	if keysEnv != string(ctlKey.PublicPEM) {
		t.Errorf("the container's %s is %q", ControllerKeysEnv, keysEnv)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.ReadinessProbe.TimeoutSeconds < 3 ||
		c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.LivenessProbe.TimeoutSeconds < 3 {
		t.Fatalf("probes %+v %+v", c.ReadinessProbe, c.LivenessProbe)
	}
	sc := c.SecurityContext
	if sc == nil || !ptr.Deref(sc.ReadOnlyRootFilesystem, false) || !ptr.Deref(sc.RunAsNonRoot, false) || ptr.Deref(sc.AllowPrivilegeEscalation, true) ||
		!ptr.Deref(pod.SecurityContext.RunAsNonRoot, false) || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Fatalf("security %+v resources %+v", sc, c.Resources)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e := env["REVERSI_UPSTREAM_0_HEADER_0"]; e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != "upstream-token" || e.ValueFrom.SecretKeyRef.Key != "token" {
		t.Fatalf("header env %+v", e)
	}
	if e := env[PodNameEnv]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Fatalf("POD_NAME %+v", e)
	}
	var pvc corev1.PersistentVolumeClaim
	get(t, ns, "pay-data", &pvc)
	var svc corev1.Service
	get(t, ns, "pay-gateway", &svc)
	if svc.Spec.Ports[0].Port != DefaultGatewayPort || svc.Spec.Selector[v1alpha1.LabelGateway] != "pay" {
		t.Fatalf("service %+v", svc.Spec)
	}
	eventually(t, 10*time.Second, func() string {
		var evs eventsv1.EventList
		if err := k8s.List(t.Context(), &evs, client.InNamespace(ns)); err != nil {
			return err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == v1alpha1.EventManifestsRendered && e.Regarding.Name == "pay" && strings.Contains(e.Note, b.Digest()) && strings.Contains(e.Note, reg.Status.Artifact.Revision) {
				return ""
			}
		}
		return "no ManifestsRendered event with the digest and revision"
	})

	// A pod of the Deployment gets a Lease of its name, controlled by the gateway, and the
	// Role may patch exactly that Lease. (envtest runs no kubelet or Deployment controller:
	// the test plays their part.) The pod's own annotation claims the desired digest: pods'
	// annotations are anyone's with pods patch, so it counts for nothing.
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pay-gateway-abc", Labels: dep.Spec.Template.Labels,
		Annotations: map[string]string{v1alpha1.AnnotationManifestDigest: b.Digest()}},
		Spec: corev1.PodSpec{ServiceAccountName: "pay-gateway", Containers: []corev1.Container{{Name: "gateway", Image: "reversi:latest"}}}}
	create(t, p)
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if err := k8s.Status().Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	dep.Status = appsv1.DeploymentStatus{ObservedGeneration: dep.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
	if err := k8s.Status().Update(t.Context(), &dep); err != nil {
		t.Fatal(err)
	}
	lease := waitLease(t, ns, "pay-gateway-abc")
	if !metav1.IsControlledBy(lease, gw) || lease.Labels[v1alpha1.LabelGateway] != "pay" || lease.Labels["app.kubernetes.io/name"] != "reversi-gateway" {
		t.Fatalf("Lease %+v", lease.ObjectMeta)
	}
	waitRole(t, ns, "pay-gateway", payRules("pay-gateway-abc"))
	gw = waitGateway(t, ns, "pay", func(gw *v1alpha1.ReversiGateway) string {
		if gw.Status.ReadyReplicas != 1 || len(gw.Status.Manifests.OtherDigests)+int(gw.Status.Manifests.LoadedReplicas) == 0 {
			return fmt.Sprintf("readyReplicas %d, the ready pod not seen yet: %+v", gw.Status.ReadyReplicas, gw.Status.Manifests)
		}
		return readyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress)(gw)
	})
	if m := gw.Status.Manifests; m.LoadedReplicas != 0 || !reflect.DeepEqual(m.OtherDigests, []string{"pay-gateway-abc=unreported"}) ||
		!strings.Contains(condition(gw.Status.Conditions, v1alpha1.ConditionReady).Message, "pods serving another digest: pay-gateway-abc=unreported") {
		t.Fatalf("a pod without a report on its Lease (its own annotation forged): %+v", m)
	}
	// The pod reports on its Lease: another digest and a refusal, then the desired digest.
	patchLease(t, lease, map[string]any{v1alpha1.AnnotationManifestDigest: "sha256:old", v1alpha1.AnnotationManifestError: "not signed"})
	gw = waitGateway(t, ns, "pay", func(gw *v1alpha1.ReversiGateway) string {
		if m := gw.Status.Manifests; !reflect.DeepEqual(m.OtherDigests, []string{"pay-gateway-abc=sha256:old"}) || m.LastLoadError != "pay-gateway-abc: not signed" {
			return fmt.Sprintf("status.manifests %+v", m)
		}
		return readyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress)(gw)
	})
	if gw.Status.Manifests.LoadedReplicas != 0 || !strings.Contains(condition(gw.Status.Conditions, v1alpha1.ConditionReady).Message, "pods serving another digest: pay-gateway-abc=sha256:old") {
		t.Fatalf("a pod serving another digest: %+v", gw.Status.Manifests)
	}
	patchLease(t, lease, map[string]any{v1alpha1.AnnotationManifestDigest: b.Digest(), v1alpha1.AnnotationManifestError: nil})
	gw = waitGateway(t, ns, "pay", readyIs(metav1.ConditionTrue, v1alpha1.ReasonSucceeded))
	if gw.Status.Manifests.LoadedReplicas != 1 || condition(gw.Status.Conditions, v1alpha1.ConditionReconciling) != nil ||
		condition(gw.Status.Conditions, v1alpha1.ConditionStalled) != nil || gw.Status.Selector == "" {
		t.Fatalf("status %+v", gw.Status)
	}
	t.Logf("Ready: %s", condition(gw.Status.Conditions, v1alpha1.ConditionReady).Message)

	// An edit of the gateway's rendering (here: a signed entry dropped) is restored and named.
	want := configMap(t, ns, "pay-manifests").Data
	edited := configMap(t, ns, "pay-manifests")
	var es []bundle.Entry
	if err := json.Unmarshal([]byte(edited.Data[bundle.KeyManifests]), &es); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(es[1:])
	edited.Data[bundle.KeyManifests] = string(raw)
	if err := k8s.Update(t.Context(), edited, client.FieldOwner("mallory-edit")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() string {
		if got := configMap(t, ns, "pay-manifests").Data; !reflect.DeepEqual(got, want) {
			return "pay-manifests is not restored yet"
		}
		return ""
	})
	waitEvent(t, ns, "pay", v1alpha1.EventRenderingDrift+": ConfigMap "+ns+"/pay-manifests was changed by mallory-edit (data: manifests.json)")
}

// A tool defined by a registry and by a selected ToolManifest: the ToolManifest's copy is left
// out with a Warning event naming both, and the registry's rendering stays as it was.
func TestGatewayDuplicateToolIsLeftOut(t *testing.T) {
	ns := namespace(t)
	k := newKey(t)
	repo := signedRegistryRepo(t, k)
	createSecret(t, ns, "manifest-keys", map[string][]byte{"k.pem": k.PublicPEM})
	createSecret(t, ns, "gateway-keys", map[string][]byte{"keys.json": []byte(`{"keys":[]}`)})
	create(t, newRegistry(ns, "payments", repo.FileURL(), withKeys("manifest-keys")))
	create(t, &v1alpha1.ReversiGateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pay"},
		Spec: v1alpha1.ReversiGatewaySpec{
			Upstreams: []v1alpha1.GatewayUpstream{{Name: "stripe", URL: "http://stripe-mcp.tools.svc:8080/mcp"}},
			Manifests: &v1alpha1.GatewayManifests{Registries: []string{"payments"},
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "payments"}}},
			Auth: &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-keys", Key: "keys.json"}},
		},
	})
	gw := waitGateway(t, ns, "pay", readyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))
	good := configMap(t, ns, "pay-manifests")
	if good == nil || gw.Status.Manifests.Tools != 3 {
		t.Fatalf("first rendering: %+v", gw.Status.Manifests)
	}

	tms := exportedManifests(t, ns, k)
	refund := tms[len(tms)-1]
	refund.Labels = map[string]string{"team": "payments"}
	create(t, refund)
	waitToolManifest(t, ns, refund.Name, func(tm *v1alpha1.ToolManifest) string {
		return conditionIs(tm, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSucceeded)
	})
	// The registry's rules stay: the ToolManifest's copy is left out and named (a ToolManifest
	// editor cannot freeze the registry's updates with it).
	waitEvent(t, ns, "pay", v1alpha1.ReasonDuplicateTool+": ToolManifest "+refund.Name+" defines "+refund.Spec.Tool+", which ManifestRegistry payments defines too: left out")
	gw = waitGateway(t, ns, "pay", readyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))
	if now := configMap(t, ns, "pay-manifests"); now == nil || !reflect.DeepEqual(now.Data, good.Data) || gw.Status.Manifests.Tools != 3 {
		t.Fatal("the rendering changed: the ToolManifest's copy was not left out")
	}

	// Dropping the label resolves it.
	patch := client.MergeFrom(refund.DeepCopy())
	refund.Labels = nil
	if err := k8s.Patch(t.Context(), refund, patch); err != nil {
		t.Fatal(err)
	}
	waitGateway(t, ns, "pay", readyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))
}
