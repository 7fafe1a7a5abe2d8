package attack

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/source/sourcetest"
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
	w := newWorld(t)
	repo := sourcetest.NewRepo(t)
	w.publish(filepath.Join(repo.Dir, "reg"), w.manifests(strictWipe))
	repo.Commit("db.wipe needs a DBA")
	w.create(registrySpec(w.ns, "prod", repo.FileURL(), v1alpha1.FormatRegistry))
	w.mustRender(w.ns, "prod")
	w.create(gatewaySpec(w.ns, "pay", &v1alpha1.GatewayManifests{Registries: []string{"prod"}}))
	w.reconcileGateway("pay")
	p := w.pod("pay")
	if l, err := p.reload(); err != nil || needsApproval(l.Manifests, "db.wipe") != "approval required" {
		t.Fatalf("the working system: %v", err)
	}

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
