package config

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// `kubectl apply -k config/samples --dry-run=server` admits every sample (strict field
// validation, as kubectl does by default): the six kinds and the Secret of trusted keys.
func TestSamplesApplyWithKubectl(t *testing.T) {
	ns := namespace(t, "samples-kubectl")
	out, err := kubectl(t, "apply", "-n", ns, "-k", "config/samples", "--dry-run=server")
	if err != nil {
		t.Fatalf("kubectl apply -k config/samples --dry-run=server: %v\n%s", err, out)
	}
	for _, want := range []string{"secret/reversi-trusted-keys", "manifestregistry.reversi.dev/tool-manifests", "toolmanifest.reversi.dev/tickets-close",
		"reversigateway.reversi.dev/agents", "approvalrequest.reversi.dev/apr-7f3a", "approval.reversi.dev/apr-7f3a-alice", "reversirun.reversi.dev/run-5c1e"} {
		if !strings.Contains(out, want) {
			t.Errorf("the dry run does not mention %s:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "(server dry run)"); n != 7 {
		t.Errorf("%d objects in the server dry run, want 7:\n%s", n, out)
	}
}

// The sample ToolManifest is signed, as `reversi manifests export --format crd` writes it: its
// annotations verify against the sample Secret's key over the checksum of its spec, which is the
// check the ToolManifest reconciler makes (SignatureVerified), and the sample gateway selects it.
func TestSampleToolManifestIsSigned(t *testing.T) {
	var pem []byte
	var tm *v1alpha1.ToolManifest
	var gw *v1alpha1.ReversiGateway
	for _, u := range samples(t) {
		switch u.GetKind() {
		case "Secret":
			data, _ := u.Object["stringData"].(map[string]any)
			for _, v := range data {
				pem = append(pem, v.(string)...)
			}
		case "ToolManifest":
			tm = &v1alpha1.ToolManifest{}
			if err := env(t).Scheme.Convert(u, tm, nil); err != nil {
				t.Fatal(err)
			}
		case "ReversiGateway":
			gw = &v1alpha1.ReversiGateway{}
			if err := env(t).Scheme.Convert(u, gw, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if tm == nil || gw == nil || len(pem) == 0 {
		t.Fatal("the samples lack the ToolManifest, the ReversiGateway or the trusted keys Secret")
	}
	trust, err := signing.ParseTrustSet(pem)
	if err != nil {
		t.Fatalf("the sample Secret's keys: %v", err)
	}
	raw, err := tm.ManifestObject()
	if err != nil {
		t.Fatal(err)
	}
	m, errs := manifest.Validate(raw)
	if len(errs) > 0 {
		t.Fatalf("the sample ToolManifest: %v", errs)
	}
	sum, err := manifest.Checksum(m)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := base64.StdEncoding.DecodeString(tm.Annotations[v1alpha1.AnnotationSignature])
	if err != nil {
		t.Fatal(err)
	}
	if err := trust.Verify(tm.Annotations[v1alpha1.AnnotationKeyID], sig, signing.Message(m.Tool, m.Version, sum)); err != nil {
		t.Errorf("the sample ToolManifest's signature does not verify against the sample key: %v", err)
	}
	if gw.Spec.TrustedKeysSecretRef == nil || gw.Spec.TrustedKeysSecretRef.Name != "reversi-trusted-keys" {
		t.Errorf("the sample gateway trusts %v, want the sample Secret reversi-trusted-keys", gw.Spec.TrustedKeysSecretRef)
	}
	for k, v := range gw.Spec.Manifests.Selector.MatchLabels {
		if tm.Labels[k] != v {
			t.Errorf("the sample gateway's selector %s=%s does not pick the sample ToolManifest (labels %v)", k, v, tm.Labels)
		}
	}
}
