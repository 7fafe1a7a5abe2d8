package controllers

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/export"
	"github.com/reversi-gitops/reversi/pkg/registry"
)

// exportedManifests publishes the seed's manifests signed by k and exports them as ToolManifests
// in ns, as `reversi manifests export --format crd` does.
func exportedManifests(t *testing.T, ns string, k keyPair) []*v1alpha1.ToolManifest {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "reg")
	publish(t, dir, k, fixtures(t)...)
	snap, errs := registry.New(dir).Load(k.Trust)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	var out []*v1alpha1.ToolManifest
	for _, m := range snap.Manifests {
		tm, err := export.ToolManifest(ns, m.Tool, snap.Entries[m.Tool], snap.Canonical[m.Tool])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tm)
	}
	return out
}

func waitToolManifest(t *testing.T, ns, name string, check func(tm *v1alpha1.ToolManifest) string) *v1alpha1.ToolManifest {
	t.Helper()
	var tm *v1alpha1.ToolManifest
	eventually(t, 20*time.Second, func() string {
		tm = &v1alpha1.ToolManifest{}
		if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, tm); err != nil {
			return err.Error()
		}
		if tm.Status.ObservedGeneration != tm.Generation {
			return "status is about an older generation"
		}
		return check(tm)
	})
	return tm
}

func conditionIs(tm *v1alpha1.ToolManifest, typ string, status metav1.ConditionStatus, reason string) string {
	c := condition(tm.Status.Conditions, typ)
	switch {
	case c == nil:
		return typ + " missing"
	case c.Status != status || c.Reason != reason:
		return fmt.Sprintf("%s=%s %s: %s", typ, c.Status, c.Reason, c.Message)
	}
	return ""
}

// 6. A ToolManifest exported with a valid signature becomes Ready; an edited spec loses
// SignatureVerified; without trusted keys the signature is not checked; an invalid spec is
// refused by the full validator.
func TestToolManifestSignatures(t *testing.T) {
	ns := namespace(t)
	k := newKey(t)
	createSecret(t, ns, TrustedKeysSecret, map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	tms := exportedManifests(t, ns, k)
	for _, tm := range tms {
		create(t, tm)
	}
	for _, tm := range tms {
		got := waitToolManifest(t, ns, tm.Name, func(tm *v1alpha1.ToolManifest) string {
			if why := conditionIs(tm, v1alpha1.ConditionSignatureVerified, metav1.ConditionTrue, v1alpha1.ReasonVerified); why != "" {
				return why
			}
			return conditionIs(tm, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSucceeded)
		})
		if len(got.Status.Checksum) != 64 {
			t.Fatalf("checksum %q", got.Status.Checksum)
		}
	}

	// An edit to the spec (a wider permission) no longer matches the signature.
	refund := &v1alpha1.ToolManifest{}
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: export.ObjectName("stripe.refund")}, refund); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(refund.DeepCopy())
	refund.Spec.Permission = "payments:admin"
	if err := k8s.Patch(t.Context(), refund, patch); err != nil {
		t.Fatal(err)
	}
	got := waitToolManifest(t, ns, refund.Name, func(tm *v1alpha1.ToolManifest) string {
		return conditionIs(tm, v1alpha1.ConditionSignatureVerified, metav1.ConditionFalse, v1alpha1.ReasonSignatureVerificationFailed)
	})
	if c := condition(got.Status.Conditions, v1alpha1.ConditionReady); c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "does not verify") {
		t.Fatalf("Ready %+v", c)
	}

	// Unsigned in a namespace with trusted keys: refused.
	unsigned := tms[0].DeepCopy()
	unsigned.ResourceVersion, unsigned.Name, unsigned.Annotations = "", "unsigned", nil
	create(t, unsigned)
	waitToolManifest(t, ns, "unsigned", func(tm *v1alpha1.ToolManifest) string {
		return conditionIs(tm, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonSignatureMissing)
	})

	// Without trusted keys: valid and Ready, the signature not checked (no stale condition).
	ns2 := namespace(t)
	plain := tms[0].DeepCopy()
	plain.ResourceVersion, plain.Namespace = "", ns2
	create(t, plain)
	got = waitToolManifest(t, ns2, plain.Name, func(tm *v1alpha1.ToolManifest) string {
		return conditionIs(tm, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonSucceeded)
	})
	if condition(got.Status.Conditions, v1alpha1.ConditionSignatureVerified) != nil || !strings.Contains(condition(got.Status.Conditions, v1alpha1.ConditionReady).Message, "not checked") {
		t.Fatalf("conditions %+v", got.Status.Conditions)
	}
	// Adding the keys Secret later re-verifies at once.
	createSecret(t, ns2, TrustedKeysSecret, map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	waitToolManifest(t, ns2, plain.Name, func(tm *v1alpha1.ToolManifest) string {
		return conditionIs(tm, v1alpha1.ConditionSignatureVerified, metav1.ConditionTrue, v1alpha1.ReasonVerified)
	})

	// The validator's rules beyond the schema: a duplicate requires entry.
	bad := tms[2].DeepCopy()
	bad.ResourceVersion, bad.Name, bad.Namespace, bad.Annotations = "", "bad", ns2, nil
	bad.Spec.Requires = append(bad.Spec.Requires, v1alpha1.ManifestRequirement{Name: "stripe.get_charge"}, v1alpha1.ManifestRequirement{Name: "stripe.get_charge"})
	create(t, bad)
	got = waitToolManifest(t, ns2, "bad", func(tm *v1alpha1.ToolManifest) string {
		return conditionIs(tm, v1alpha1.ConditionValid, metav1.ConditionFalse, v1alpha1.ReasonValidationFailed)
	})
	if m := condition(got.Status.Conditions, v1alpha1.ConditionValid).Message; !strings.Contains(m, "spec.requires[1]") {
		t.Fatalf("Valid message %q", m)
	}
}

// The CLI's export output applies with the real kubectl and verifies.
func TestExportAppliesWithKubectl(t *testing.T) {
	ns := namespace(t)
	k := newKey(t)
	createSecret(t, ns, TrustedKeysSecret, map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	var yaml bytes.Buffer
	for _, tm := range exportedManifests(t, "", k) {
		if err := export.WriteYAML(&yaml, tm); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := writeKubeconfig(t)
	cmd := exec.Command(testEnv.Kubectl(), "--kubeconfig", kubeconfig, "apply", "-n", ns, "-f", "-")
	cmd.Stdin = &yaml
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	waitToolManifest(t, ns, export.ObjectName("stripe.create_charge"), func(tm *v1alpha1.ToolManifest) string {
		return conditionIs(tm, v1alpha1.ConditionSignatureVerified, metav1.ConditionTrue, v1alpha1.ReasonVerified)
	})
}
