package attack

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// ATTACK (git pusher without a writer key; TUF: mix-and-match across repositories): the
// writer's index signature covers the sequence, the served set and the history, but not
// which registry it is. The same writers also keep a staging registry (another repository or
// folder), which is busier, so its index sequence is higher, and where db.wipe needs no
// approval. Copy it over prod's spec.path in a new commit on top of the applied one: the
// ancestry check passes, the index sequence does not go down, every signature verifies — the
// controller applies staging's rules as prod's, and the gateway accepts them.
func TestPusherCopiesAnotherRegistrysSignedFolder(t *testing.T) {
	w, repo, p := prodServing(t, strictWipe, "approval required")
	staging := filepath.Join(t.TempDir(), "staging")
	w.publish(staging, w.manifests(looseWipe))
	for _, tool := range []string{"db.read_a", "db.read_b", "db.read_c"} {
		w.publish(staging, w.manifests("tool: "+tool+"\ndescription: Read.\neffect: read_only\npermission: db:read\n"))
	}

	if err := os.RemoveAll(filepath.Join(repo.Dir, "reg")); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-r", staging, filepath.Join(repo.Dir, "reg")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	repo.Git("add", "-A")
	repo.Commit("tidy up")

	before := w.configMapData(w.ns, "pay-manifests")
	reg, c := w.reconcileRegistry(w.ns, "prod")
	w.reconcileGateway("pay")
	if c.Reason != v1alpha1.ReasonRegistryMismatch || !equalData(w.configMapData(w.ns, "pay-manifests"), before) {
		t.Fatalf("prod applied staging's signed registry (Ready=%s %s, index sequence %d); "+
			"the index signature must name the registry (e.g. an id in index.json, signed, that spec or the gateway pins)",
			c.Status, c.Reason, reg.Status.Artifact.IndexSequence)
	}
	if got := needsApproval(p.current(), "db.wipe"); got != "approval required" {
		t.Fatalf("the pod serves db.wipe with %s", got)
	}
}
