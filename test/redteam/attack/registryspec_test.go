package attack

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// ATTACK (ManifestRegistry spec editor): docs/security.md says such an editor can point a
// registry elsewhere "but only at content signed by trusted keys". Switch prod to
// format: Plain (removing spec.verify, which Plain refuses) and to a fork of its repository
// with one more commit that replaces the signed registry with a plain YAML file: the commit
// descends from the applied one, so no override annotation is needed, and a Plain source
// needs no writer signature — neither in the controller nor in the gateway pod, which takes
// the source's kind from the controller's snapshot. The gateway's trusted writer keys are
// bypassed for every tool of that registry.
func TestRegistryEditorSwitchesToPlainToDropWriterSignatures(t *testing.T) {
	w, repo, p := prodServing(t, strictWipe, "approval required")

	fork := sourcetest.NewRepo(t)
	fork.Git("pull", "-q", repo.FileURL(), "main")
	if err := os.RemoveAll(filepath.Join(fork.Dir, "reg")); err != nil {
		t.Fatal(err)
	}
	fork.WriteFile("reg/wipe.yaml", looseWipe)
	fork.Commit("plain files are simpler")

	prod := &v1alpha1.ManifestRegistry{}
	w.get(w.ns, "prod", prod)
	prod.Spec.URL, prod.Spec.Format, prod.Spec.Verify = fork.FileURL(), v1alpha1.FormatPlain, nil
	if err := env.Client.Update(context.Background(), prod); err != nil {
		t.Fatal(err)
	}
	before := w.configMapData(w.ns, "pay-manifests")
	reg, c := w.reconcileRegistry(w.ns, "prod")
	gw := w.reconcileGateway("pay")
	if g := ready(gw.Status.Conditions); g == nil || g.Reason != v1alpha1.ReasonSignatureVerificationFailed || !equalData(w.configMapData(w.ns, "pay-manifests"), before) {
		t.Fatalf("pay rendered prod's unsigned Plain manifests (registry Ready=%s %s, accepted revision %q; gateway %+v); "+
			"a gateway with trusted writer keys must accept a Plain source only when its own spec says so",
			c.Status, c.Reason, reg.Status.AcceptedRevision, g)
	}
	if got := needsApproval(p.current(), "db.wipe"); got != "approval required" {
		t.Fatalf("the pod serves db.wipe with %s", got)
	}
}

// ATTACK (ManifestRegistry spec editor; the Plain opt-in does not say what it trusts): a
// gateway accepts the Plain registry ops (spec.manifests.plainRegistries) because ops verifies
// commit signatures — for Plain, docs/security.md says, the controller's snapshot "vouches
// that the commit verified". The opt-in names the registry only. Remove spec.verify from ops
// and point it at a fork with one unsigned commit on top of the applied one (it descends, so
// no override): the controller signs a Plain snapshot without a commit signer, the gateway
// snapshot still lists ops as accepted unsigned, and the pod serves manifests nobody signed
// in any way. "Cannot skip signature checks (they need the key Secrets)" does not hold.
func TestRegistryEditorDropsCommitVerificationOfAnAcceptedPlainRegistry(t *testing.T) {
	w := newWorld(t)
	key := sourcetest.NewSSHKey(t)
	w.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "commit-keys"}, Data: map[string][]byte{"ops.sshpub": key.AuthorizedKey}})
	repo := sourcetest.NewRepo(t)
	repo.WriteFile("reg/wipe.yaml", strictWipe)
	repo.CommitSigned("db.wipe needs a DBA", key)
	ops := registrySpec(w.ns, "ops", repo.FileURL(), v1alpha1.FormatPlain)
	ops.Spec.Verify = &v1alpha1.RegistryVerification{Commit: &v1alpha1.CommitVerification{Mode: "HEAD", SecretRef: v1alpha1.LocalObjectReference{Name: "commit-keys"}}}
	w.create(ops)
	w.mustRender(w.ns, "ops")
	w.create(gatewaySpec(w.ns, "pay", &v1alpha1.GatewayManifests{Registries: []string{"ops"}, PlainRegistries: []string{"ops"}}))
	w.reconcileGateway("pay")
	p := w.pod("pay")
	if l, err := p.reload(); err != nil || needsApproval(l.Manifests, "db.wipe") != "approval required" {
		t.Fatalf("the working system: %v", err)
	}

	fork := sourcetest.NewRepo(t)
	fork.Git("pull", "-q", repo.FileURL(), "main")
	fork.WriteFile("reg/wipe.yaml", looseWipe)
	fork.Commit("unsigned: wipe freely")
	w.get(w.ns, "ops", ops)
	ops.Spec.URL, ops.Spec.Verify = fork.FileURL(), nil
	if err := env.Client.Update(context.Background(), ops); err != nil {
		t.Fatal(err)
	}
	before := w.configMapData(w.ns, "pay-manifests")
	_, c := w.reconcileRegistry(w.ns, "ops")
	gw := w.reconcileGateway("pay")
	g := ready(gw.Status.Conditions)
	if got := needsApproval(p.current(), "db.wipe"); got != "approval required" || g == nil || g.Reason != v1alpha1.ReasonSignatureVerificationFailed ||
		!equalData(w.configMapData(w.ns, "pay-manifests"), before) {
		t.Fatalf("the pod serves an unsigned commit's db.wipe with %s (registry Ready=%s %s, snapshot commit signer %q, gateway %+v): "+
			"the Plain opt-in must pin what made the source trustworthy (e.g. plainRegistries entries naming the commit keys or a required verify mode, "+
			"carried in the gateway snapshot and checked against the Plain snapshot's commit_signer by the pod), or the controller must refuse "+
			"to drop or weaken spec.verify of an applied registry without the override annotation",
			got, c.Status, c.Reason, snapshotOf(w, "ops-manifests").CommitSigner, g)
	}
}
