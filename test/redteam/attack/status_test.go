package attack

import (
	"errors"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// looseProd is a namespace whose prod registry serves db.wipe without approval (v1), rendered
// and served by gateway pay's pod.
func looseProd(t *testing.T) (*world, *sourcetest.Repo, *pod) {
	return prodServing(t, looseWipe, "no approval")
}

// prodServing is a namespace whose prod registry (format Registry, one signed commit) serves
// the manifest yaml of db.wipe, rendered for gateway pay and loaded by its pod, which finds
// db.wipe with want (needsApproval).
func prodServing(t *testing.T, yaml, want string) (*world, *sourcetest.Repo, *pod) {
	w := newWorld(t)
	repo := sourcetest.NewRepo(t)
	w.publish(filepath.Join(repo.Dir, "reg"), w.manifests(yaml))
	repo.Commit("db.wipe v1")
	w.create(registrySpec(w.ns, "prod", repo.FileURL(), v1alpha1.FormatRegistry))
	w.mustRender(w.ns, "prod")
	w.create(gatewaySpec(w.ns, "pay", &v1alpha1.GatewayManifests{Registries: []string{"prod"}}))
	w.reconcileGateway("pay")
	p := w.pod("pay")
	l, err := p.reload()
	if err != nil || needsApproval(l.Manifests, "db.wipe") != want {
		t.Fatalf("the working system: %v, db.wipe %s", err, needsApproval(l.Manifests, "db.wipe"))
	}
	return w, repo, p
}

// tighten is the writers' reviewed change: db.wipe v2 needs a DBA.
func tighten(w *world, repo *sourcetest.Repo) string {
	w.publish(filepath.Join(repo.Dir, "reg"), w.manifests(strictWipe))
	return repo.Commit("db.wipe v2: a DBA approves")
}

func snapshotOf(w *world, cm string) bundle.Snapshot {
	w.t.Helper()
	b, err := bundle.Assemble([]map[string]string{w.configMapData(w.ns, cm)})
	if err != nil {
		w.t.Fatal(err)
	}
	return b.Snapshots[0].Snapshot
}

// ATTACK (ManifestRegistry status editor; TUF: a freeze attack): the controller takes the
// sequence it signs from status.artifact.sequence, which anyone with
// manifestregistries/status rights writes. Set it to MaxInt64 (and drop renderingDigest so the
// unchanged-revision shortcut is not taken): the controller signs a snapshot with sequence
// MaxInt64, every gateway records it as its high-water mark, and the next snapshot's sequence
// (max(last+1, now): last+1 overflows) is lower — every later rendering of that registry is
// refused by every gateway, forever (the store is never reset). The writers' tightening of
// db.wipe never reaches the pods.
func TestRegistryStatusEditorFreezesEveryGatewayWithAHugeSequence(t *testing.T) {
	w, repo, p := looseProd(t)

	prod := &v1alpha1.ManifestRegistry{}
	w.get(w.ns, "prod", prod)
	w.patchStatus(prod, map[string]any{"artifact": map[string]any{"sequence": int64(math.MaxInt64), "renderingDigest": nil}})
	w.mustRender(w.ns, "prod")
	signed := snapshotOf(w, "prod-manifests").Sequence
	if limit := time.Now().UnixMilli() + bundle.MaxFutureSequence; signed > limit {
		t.Fatalf("the controller signed the attacker's sequence %d", signed)
	}
	w.reconcileGateway("pay")
	p.current()

	tighten(w, repo)
	w.mustRender(w.ns, "prod")
	w.reconcileGateway("pay")
	l, err := p.reload()
	if errors.Is(err, store.ErrDowngrade) {
		t.Fatalf("after the status edit the controller signed sequence %d (the attacker's number); the writers' newest state (db.wipe v2, %s) "+
			"now has sequence %d and every gateway refuses it: %v; the controller must not sign a sequence taken from status that it cannot vouch for "+
			"(e.g. the larger of now and the sequence of its own last verified snapshot, refusing one far in the future; checked arithmetic)",
			signed, needsApproval(l.Manifests, "db.wipe"), snapshotOf(w, "prod-manifests").Sequence, err)
	}
	if err != nil || needsApproval(l.Manifests, "db.wipe") != "approval required" {
		t.Fatalf("the pod serves db.wipe with %s: %v", needsApproval(l.Manifests, "db.wipe"), err)
	}
}

// ATTACK (git pusher without keys + ManifestRegistry status editor; TUF: rollback): a
// force-push back to the commit before the writers' tightening is refused
// (RevisionNotDescendant) — until status.artifact is cleared. The ancestry check, the index
// sequence check and the sequence the controller signs all come from status, so the
// controller then applies the older commit as a first apply: no override annotation, no
// status.acceptedRevision, no accepted_revision in the snapshot, no event; it signs it with
// a new, higher sequence, and every gateway accepts the downgrade (the pods keep no mark of
// the writer's index sequence, only of the controller's).
func TestRegistryStatusEditorAndPusherRollBackWithoutTheOverride(t *testing.T) {
	w, repo, p := looseProd(t)
	loose := repo.Rev("HEAD")
	tighten(w, repo)
	w.mustRender(w.ns, "prod")
	w.reconcileGateway("pay")
	if l, err := p.reload(); err != nil || needsApproval(l.Manifests, "db.wipe") != "approval required" {
		t.Fatalf("the working system: the tightening is not served: %v", err)
	}

	repo.Git("reset", "-q", "--hard", loose) // the force-push
	if _, c := w.reconcileRegistry(w.ns, "prod"); c == nil || c.Reason != v1alpha1.ReasonRevisionNotDescendant {
		t.Fatalf("the force-push alone: Ready %+v, want RevisionNotDescendant", c)
	}
	prod := &v1alpha1.ManifestRegistry{}
	w.get(w.ns, "prod", prod)
	w.patchStatus(prod, map[string]any{"artifact": nil})

	reg, c := w.reconcileRegistry(w.ns, "prod")
	snap := snapshotOf(w, "prod-manifests")
	w.reconcileGateway("pay")
	if got := needsApproval(p.current(), "db.wipe"); c.Reason != v1alpha1.ReasonRevisionNotDescendant || got != "approval required" {
		t.Fatalf("the gateway serves db.wipe with %s: revision %s was applied (Ready=%s %s, status.acceptedRevision %q, snapshot accepted_revision %q, sequence %d) "+
			"without the %s annotation; the controller must keep what it last applied where a status editor cannot reset it "+
			"(e.g. read Since, the index sequence and the sequence from its own last signed snapshot in the rendering), and gateways should also keep the writer index sequence as a mark",
			got, snap.Revision, c.Status, c.Reason, reg.Status.AcceptedRevision, snap.AcceptedRevision, snap.Sequence, v1alpha1.AnnotationAcceptRevision)
	}
}

// ATTACK (ManifestRegistry status editor; freeze the newest reviewed state out): sequenceFor
// reuses the sequence of any recorded snapshot that "says the same" as the one to sign, even
// when that sequence is lower than the rendering's. The writers' new commit is public; before
// the controller's next poll, write status.artifact as if that commit were already applied
// (its revision, the digest of its entries — computable from the repository — and sequence
// 1). The controller takes status as the record of this very snapshot and signs the new
// revision with sequence 1, below the pods' high-water mark: every pod refuses the
// writers' tightening and keeps serving the older, looser rules, while the registry says
// Ready with the new revision and takes the unchanged-revision shortcut from then on. Done
// again for each new commit (one status patch per poll interval), no update ever arrives.
func TestRegistryStatusEditorMakesTheNextRevisionOlderThanServed(t *testing.T) {
	w, repo, p := looseProd(t)
	rev := tighten(w, repo)
	snap, errs := registry.New(filepath.Join(repo.Dir, "reg")).Load(w.writer.Trust)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	digest := bundle.FromSnapshot("ManifestRegistry "+w.ns+"/prod", snap).Digest()

	prod := &v1alpha1.ManifestRegistry{}
	w.get(w.ns, "prod", prod)
	served := prod.Status.Artifact.Sequence
	w.patchStatus(prod, map[string]any{"artifact": map[string]any{"revision": "main@sha1:" + rev, "digest": digest, "sequence": 1}})

	reg := w.mustRender(w.ns, "prod")
	w.reconcileGateway("pay")
	l, err := p.reload()
	if err != nil || needsApproval(l.Manifests, "db.wipe") != "approval required" {
		t.Fatalf("the writers' commit %s was signed with sequence %d (the pods served %d) after a status edit, and the pod refuses it: %v; it keeps serving db.wipe without approval "+
			"while prod says Ready at that revision. A new snapshot must never get a sequence lower than the highest recorded one "+
			"(sequenceFor: reuse a 'same' sequence only when it is the highest, else nextSequence(highest))",
			rev[:12], reg.Status.Artifact.Sequence, served, err)
	}
}
