package controllers

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

var policyDir = filepath.Join(testenv.Root, "test", "fixtures", "policy", "policy")

// policyFixtures are issue 21's four policies.
func policyFixtures(t testing.TB) []*apipolicy.Policy {
	t.Helper()
	ps, errs := apipolicy.ReadPaths(policyDir)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return ps
}

func publishPolicies(t testing.TB, dir string, o registry.WriteOptions, ps ...*apipolicy.Policy) {
	t.Helper()
	if _, err := registry.New(dir).PublishPolicies(ps, manifest.Approved, o); err != nil {
		t.Fatal(err)
	}
}

func names(ps []*apipolicy.Policy) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return strings.Join(out, ",")
}

// gatewayPolicies assembles and verifies a gateway's rendering as its pod does and returns the
// policies it enforces, and the bundle.
func gatewayPolicies(t *testing.T, ns, gw string, k keyPair) (string, bundle.Bundle) {
	t.Helper()
	cm := configMap(t, ns, gw+"-manifests")
	if cm == nil {
		t.Fatalf("no %s-manifests", gw)
	}
	b, err := bundle.Assemble([]map[string]string{cm.Data})
	if err != nil {
		t.Fatal(err)
	}
	v, errs := b.VerifyGatewayAll(bundle.GatewaySource(ns, gw), k.Trust, ctlKey.Trust, time.Now())
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return names(v.Policies), b
}

// A signed registry's policies are rendered with its manifests and covered by its snapshot; a
// ReversiGateway renders them with spec.policies selecting which it enforces; a tampered or
// unsigned policy commit is refused and both renderings stay.
func TestSignedPoliciesAreRenderedAndSelected(t *testing.T) {
	ns := namespace(t)
	k := newKey(t)
	repo := sourcetest.NewRepo(t)
	dir := filepath.Join(repo.Dir, "reg")
	publish(t, dir, k, fixtures(t)...)
	publishPolicies(t, dir, registry.WriteOptions{By: "alice", Signer: k.Signer}, policyFixtures(t)...)
	repo.Commit("manifests and policies")
	createSecret(t, ns, "manifest-keys", map[string][]byte{"k.pem": k.PublicPEM})
	createSecret(t, ns, "gateway-keys", map[string][]byte{"keys.json": []byte(`{"keys":[]}`)})
	create(t, newRegistry(ns, "payments", repo.FileURL(), withKeys("manifest-keys")))
	reg := waitReady(t, ns, "payments", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, "")
	if a := reg.Status.Artifact; a == nil || a.Policies != 4 || a.Tools != 3 {
		t.Fatalf("artifact %+v", reg.Status.Artifact)
	}
	if c := condition(reg.Status.Conditions, v1alpha1.ConditionReady); !strings.HasSuffix(c.Message, "3 tools, 4 policies") && !strings.HasSuffix(c.Message, "(unchanged)") {
		t.Errorf("Ready message %q", c.Message)
	}
	b, _ := renderedBundle(t, ns, "payments", k.Trust)
	if len(b.Policies) != 4 || b.Snapshots[0].Snapshot.Policies == "" {
		t.Fatalf("registry rendering: %d policies, snapshot %+v", len(b.Policies), b.Snapshots[0].Snapshot)
	}

	create(t, &v1alpha1.ReversiGateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pay"},
		Spec: v1alpha1.ReversiGatewaySpec{
			Mode:                 "enforce",
			Upstreams:            []v1alpha1.GatewayUpstream{{Name: "stripe", URL: "http://stripe-mcp.tools.svc:8080/mcp", Resources: ptr.To(false)}},
			Manifests:            &v1alpha1.GatewayManifests{Registries: []string{"payments"}},
			Policies:             &v1alpha1.GatewayPolicies{Names: []string{"deletions", "content"}},
			TrustedKeysSecretRef: &v1alpha1.LocalObjectReference{Name: "manifest-keys"},
			Auth:                 &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-keys", Key: "keys.json"}},
		},
	})
	eventually(t, 30*time.Second, func() string {
		if cm := configMap(t, ns, "pay-manifests"); cm == nil || cm.Data[bundle.KeyPolicies] == "" {
			return "no policies in pay-manifests yet"
		}
		return ""
	})
	got, gb := gatewayPolicies(t, ns, "pay", k)
	if got != "content,deletions" || len(gb.Policies) != 4 {
		t.Fatalf("enforced %q of %d rendered", got, len(gb.Policies))
	}

	// Unset spec.policies: every policy of the registries.
	gw := getGateway(t, ns, "pay")
	patch := client.MergeFrom(gw.DeepCopy())
	gw.Spec.Policies = nil
	if err := k8s.Patch(t.Context(), gw, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() string {
		if got, _ := gatewayPolicies(t, ns, "pay", k); got != "change-freeze,content,deletions,payments" {
			return "enforced " + got
		}
		return ""
	})
	// A name no registry serves: refused, the rendering stays.
	gw = getGateway(t, ns, "pay")
	patch = client.MergeFrom(gw.DeepCopy())
	gw.Spec.Policies = &v1alpha1.GatewayPolicies{Names: []string{"content", "no-such-policy"}}
	if err := k8s.Patch(t.Context(), gw, patch); err != nil {
		t.Fatal(err)
	}
	waitGateway(t, ns, "pay", func(g *v1alpha1.ReversiGateway) string {
		c := condition(g.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || c.Reason != v1alpha1.ReasonSourceNotReady || !strings.Contains(c.Message, "spec.policies.names: no-such-policy not served") {
			return "Ready " + func() string {
				if c == nil {
					return "none"
				}
				return c.Reason + ": " + c.Message
			}()
		}
		return ""
	})
	if got, _ := gatewayPolicies(t, ns, "pay", k); got != "change-freeze,content,deletions,payments" {
		t.Fatalf("the rendering changed to %q", got)
	}
	before := configMap(t, ns, "payments-manifests")

	// A tampered policy (the card rule loosened to advice, in the committed version file).
	file := filepath.Join(dir, "policies", "content", "v1.json")
	orig, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	repo.WriteFile("reg/policies/content/v1.json", strings.Replace(string(orig), `"effect": "deny"`, `"effect": "advise"`, 1))
	repo.Commit("loosen the card rule")
	requestReconcile(t, ns, "payments")
	reg = waitReady(t, ns, "payments", metav1.ConditionFalse, v1alpha1.ReasonValidationFailed, "main@sha1:"+repo.Rev("HEAD"))
	if c := condition(reg.Status.Conditions, v1alpha1.ConditionReady); !strings.Contains(c.Message, "policies/content/v1.json: policy content v1: edited after publishing") {
		t.Errorf("Ready message %q", c.Message)
	}
	if after := configMap(t, ns, "payments-manifests"); after.ResourceVersion != before.ResourceVersion {
		t.Fatal("the last good rendering was replaced")
	}

	// An unsigned policy version (the index signed again by the writer): refused as a signature.
	repo.WriteFile("reg/policies/content/v1.json", string(orig))
	ps := policyFixtures(t)
	ps[1].Description = "unsigned change"
	publishPolicies(t, dir, registry.WriteOptions{By: "mallory"}, ps[1])
	if _, err := registry.New(dir).Sign(registry.WriteOptions{Signer: k.Signer}); err != nil {
		t.Fatal(err)
	}
	repo.Commit("an unsigned policy")
	requestReconcile(t, ns, "payments")
	reg = waitReady(t, ns, "payments", metav1.ConditionFalse, v1alpha1.ReasonSignatureVerificationFailed, "main@sha1:"+repo.Rev("HEAD"))
	if c := condition(reg.Status.Conditions, v1alpha1.ConditionReady); !strings.Contains(c.Message, "policy content v2: not signed") {
		t.Errorf("Ready message %q", c.Message)
	}
	if after := configMap(t, ns, "payments-manifests"); after.ResourceVersion != before.ResourceVersion {
		t.Fatal("the last good rendering was replaced")
	}
}

// A Plain registry reads policy/*.yaml under its path beside the manifests; its snapshot
// binds them; a broken policy refuses the commit with file:line.
func TestPlainRegistryReadsPolicyFolder(t *testing.T) {
	ns := namespace(t)
	repo := sourcetest.NewRepo(t)
	repo.WriteFile("reg/payments.yaml", mustRead(t, filepath.Join("..", "test", "fixtures", "manifests", "payments.yaml")))
	for _, f := range []string{"content.yaml", "deletions.yaml"} {
		repo.WriteFile("reg/policy/"+f, mustRead(t, filepath.Join(policyDir, f)))
	}
	repo.Commit("plain manifests and policies")
	create(t, newRegistry(ns, "plain", repo.FileURL(), func(r *v1alpha1.ManifestRegistry) { r.Spec.Format = v1alpha1.FormatPlain }))
	reg := waitReady(t, ns, "plain", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, "")
	if a := reg.Status.Artifact; a == nil || a.Policies != 2 || a.Tools != 3 {
		t.Fatalf("artifact %+v", reg.Status.Artifact)
	}
	b, _ := renderedBundle(t, ns, "plain", nil)
	if v, errs := b.VerifyAll(nil, ctlKey.Trust); len(errs) > 0 || names(v.Policies) != "content,deletions" || b.Snapshots[0].Snapshot.Kind != bundle.KindPlain {
		t.Fatalf("plain rendering: %v %s", errs, names(v.Policies))
	}
	before := configMap(t, ns, "plain-manifests")
	repo.WriteFile("reg/policy/broken.yaml", "policy: broken\nrules:\n  - name: r\n    condition: 'args.amount >'\n    effect: deny\n    reason: x\n")
	repo.Commit("a broken policy")
	requestReconcile(t, ns, "plain")
	reg = waitReady(t, ns, "plain", metav1.ConditionFalse, v1alpha1.ReasonValidationFailed, "main@sha1:"+repo.Rev("HEAD"))
	if c := condition(reg.Status.Conditions, v1alpha1.ConditionReady); !strings.Contains(c.Message, "reg/policy/broken.yaml:4") {
		t.Errorf("Ready message %q", c.Message)
	}
	if after := configMap(t, ns, "plain-manifests"); after.ResourceVersion != before.ResourceVersion {
		t.Fatal("the last good rendering was replaced")
	}
}
