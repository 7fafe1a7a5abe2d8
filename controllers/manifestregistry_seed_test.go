package controllers

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// The seed's rules kept by the controller as by the CLI and the gateway: trusted keys for
// plain files are an error, and an enforced tool cannot lean on a tool that has only drafts.

// Seed: a trusted key "for manifests that are not in a registry is an error". A Plain registry
// with spec.verify.manifestKeysSecretRef stalls as InvalidSpec and renders nothing; without the
// keys it renders.
func TestPlainRegistryWithManifestKeysIsInvalidSpec(t *testing.T) {
	ns := namespace(t)
	k := newKey(t)
	repo := sourcetest.NewRepo(t)
	repo.WriteFile("reg/payments.yaml", mustRead(t, filepath.Join("..", "test", "fixtures", "manifests", "payments.yaml")))
	repo.Commit("plain manifests")
	rev := "main@sha1:" + repo.Rev("HEAD")
	createSecret(t, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	create(t, newRegistry(ns, "plain", repo.FileURL(), func(r *v1alpha1.ManifestRegistry) {
		withKeys("manifest-keys")(r)
		r.Spec.Format = v1alpha1.FormatPlain
	}))

	reg := waitReady(t, ns, "plain", metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec, rev)
	want := `spec.path "reg" (format: Plain) is not a registry, but trusted manifest keys are set (spec.verify.manifestKeysSecretRef): plain manifest files carry no signatures to check; publish them to a signed registry (reversi manifests publish --key), or unset spec.verify.manifestKeysSecretRef`
	if c := condition(reg.Status.Conditions, v1alpha1.ConditionReady); c.Message != want {
		t.Fatalf("Ready message %q\nwant %q", c.Message, want)
	}
	if c := condition(reg.Status.Conditions, v1alpha1.ConditionStalled); c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonInvalidSpec || c.Message != want {
		t.Fatalf("Stalled %+v", c)
	}
	if cm := configMap(t, ns, "plain-manifests"); cm != nil {
		t.Fatalf("rendered %v although the spec is invalid", cm.Name)
	}

	patch := client.MergeFrom(reg.DeepCopy())
	reg.Spec.Verify = nil
	if err := k8s.Patch(t.Context(), reg, patch); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ns, "plain", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, rev)
}

// Seed: "Once all manifests are loaded: the compensation tool … must exist", and a draft "is
// simply absent from the loaded registry". A revision whose approved tool is compensated by a
// tool that has only drafts is ValidationFailed naming the tool, and the last good rendering
// stays, in both formats.
func TestApprovedToolLeaningOnADraftIsValidationFailed(t *testing.T) {
	const (
		refundIsDraft = `compensation.tool: tool "stripe.refund" is only a draft: drafts are not enforced, so compensation.tool cannot use it; approve stripe.refund first (reversi manifests approve stripe.refund, or status: approved in plain files)`
		getIsDraft    = `compensation.verification.tool: tool "stripe.get_charge" is only a draft: drafts are not enforced, so compensation.verification.tool cannot use it; approve stripe.get_charge first (reversi manifests approve stripe.get_charge, or status: approved in plain files)`
	)
	cases := []struct {
		name   string
		plain  bool
		break_ func(t *testing.T, repo *sourcetest.Repo, k keyPair)
		errs   []string
	}{
		{name: "registry", break_: func(t *testing.T, repo *sourcetest.Repo, k keyPair) {
			// What a writer without the draft rule left: create_charge approved, the tools it
			// names only drafts; every version and the index signed by the trusted key.
			dir := filepath.Join(repo.Dir, "reg")
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			writeUncheckedRegistry(t, dir, k, fixtures(t), map[string]manifest.Status{
				"stripe.get_charge": manifest.Draft, "stripe.create_charge": manifest.Approved, "stripe.refund": manifest.Draft,
			})
			repo.Commit("approve create_charge before its compensation")
		}, errs: []string{"index.json: stripe.create_charge v1: " + refundIsDraft, "index.json: stripe.create_charge v1: " + getIsDraft}},
		{name: "plain", plain: true, break_: func(t *testing.T, repo *sourcetest.Repo, k keyPair) {
			fixture := mustRead(t, filepath.Join("..", "test", "fixtures", "manifests", "payments.yaml"))
			repo.WriteFile("reg/payments.yaml", fixture+"  status: draft\n") // stripe.refund is last
			repo.Commit("stripe.refund back to draft")
		}, errs: []string{"reg/payments.yaml:26: stripe.create_charge: " + refundIsDraft}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ns := namespace(t)
			k := newKey(t)
			repo := sourcetest.NewRepo(t)
			mutate := withKeys("manifest-keys")
			if c.plain {
				repo.WriteFile("reg/payments.yaml", mustRead(t, filepath.Join("..", "test", "fixtures", "manifests", "payments.yaml")))
				mutate = func(r *v1alpha1.ManifestRegistry) { r.Spec.Format = v1alpha1.FormatPlain }
			} else {
				publish(t, filepath.Join(repo.Dir, "reg"), k, fixtures(t)...)
			}
			repo.Commit("good")
			createSecret(t, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
			create(t, newRegistry(ns, "reg", repo.FileURL(), mutate))
			good := "main@sha1:" + repo.Rev("HEAD")
			waitReady(t, ns, "reg", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, good)
			before := configMap(t, ns, "reg-manifests")

			c.break_(t, repo, k)
			bad := "main@sha1:" + repo.Rev("HEAD")
			requestReconcile(t, ns, "reg")
			reg := waitReady(t, ns, "reg", metav1.ConditionFalse, v1alpha1.ReasonValidationFailed, bad)
			want := "revision " + bad + " was not applied, the last good rendering stays: " + c.errs[0]
			for _, e := range c.errs[1:] {
				want += "; " + e
			}
			if ready := condition(reg.Status.Conditions, v1alpha1.ConditionReady); ready.Message != want {
				t.Errorf("Ready message %q\nwant %q", ready.Message, want)
			}
			if w := []v1alpha1.InvalidTool{{Tool: "stripe.create_charge", Errors: c.errs}}; !reflect.DeepEqual(reg.Status.InvalidTools, w) {
				t.Errorf("invalid tools %+v\nwant %+v", reg.Status.InvalidTools, w)
			}
			if reg.Status.Artifact == nil || reg.Status.Artifact.Revision != good {
				t.Errorf("artifact %+v, want the last good revision %s", reg.Status.Artifact, good)
			}
			after := configMap(t, ns, "reg-manifests")
			if after == nil || after.ResourceVersion != before.ResourceVersion || !equalData(after.Data, before.Data) {
				t.Fatal("the last good ConfigMap was changed")
			}
		})
	}
}

// writeUncheckedRegistry writes a registry folder as reversi's writers did before they applied
// the draft rule: each manifest as v1 with its status, signed by k, and the index signed by k.
func writeUncheckedRegistry(t *testing.T, dir string, k keyPair, ms []*manifest.Manifest, status map[string]manifest.Status) {
	t.Helper()
	idx := &registry.Index{Format: registry.Format, ID: "0123456789abcdef0123456789abcdef", Sequence: 2, Tools: map[string][]registry.Entry{}} // after a first publish
	for _, m := range ms {
		next := *m
		next.Version, next.Status = 1, status[m.Tool]
		canonical, err := manifest.CanonicalJSON(&next)
		if err != nil {
			t.Fatal(err)
		}
		sum, err := manifest.Checksum(&next)
		if err != nil {
			t.Fatal(err)
		}
		sig, err := k.Signer.Sign(signing.Message(m.Tool, 1, sum))
		if err != nil {
			t.Fatal(err)
		}
		e := registry.Entry{Version: 1, Status: next.Status, Checksum: sum, Author: "alice",
			Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), KeyID: k.Signer.KeyID, Signature: base64.StdEncoding.EncodeToString(sig)}
		if e.Status != manifest.Draft {
			e.Approver = "bob"
		}
		writeJSON(t, filepath.Join(dir, "tools", url.PathEscape(m.Tool), "v1.json"), registry.VersionFile{Tool: m.Tool, Entry: e, Manifest: canonical})
		idx.Tools[m.Tool] = []registry.Entry{e}
	}
	msg, err := idx.IndexMessage()
	if err != nil {
		t.Fatal(err)
	}
	sig, err := k.Signer.Sign(msg)
	if err != nil {
		t.Fatal(err)
	}
	idx.KeyID, idx.Signature = k.Signer.KeyID, base64.StdEncoding.EncodeToString(sig)
	writeJSON(t, filepath.Join(dir, registry.IndexFile), idx)
}

// writeJSON writes v indented, without HTML escaping (a stored manifest must compact back to
// its canonical bytes).
func writeJSON(t *testing.T, p string, v any) {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
