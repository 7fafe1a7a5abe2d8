package attack

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// ATTACK (ManifestRegistry editor with the usual delete and create verbs; TUF: rollback):
// the ancestry, index-sequence and registry-id checks compare only with what this
// ManifestRegistry object applied, and the pods' high-water mark is the controller's
// sequence, which is the clock. Delete prod (the finalizer removes its rendering, so status
// and the signed snapshot are both gone) and create it again under the same name, pinned to
// the commit before the writers' tightening (spec.ref.commit; no push needed): a first
// apply, so no check runs and no override is needed (no annotation, no
// status.acceptedRevision, no RevisionOverrideAccepted event). The new snapshot's sequence
// is "now", above every pod's mark for "ManifestRegistry <ns>/prod", so the pods accept the
// older rules although the writer-signed index proof in the snapshot says sequence 1 after
// they served sequence 2 of the same registry id.
func TestRegistryEditorRecreatesTheRegistryAtAnOlderCommit(t *testing.T) {
	w, repo, p := looseProd(t)
	loose := repo.Rev("HEAD")
	tighten(w, repo)
	w.mustRender(w.ns, "prod")
	w.reconcileGateway("pay")
	if l, err := p.reload(); err != nil || needsApproval(l.Manifests, "db.wipe") != "approval required" {
		t.Fatalf("the working system: the tightening is not served: %v", err)
	}

	prod := &v1alpha1.ManifestRegistry{}
	w.get(w.ns, "prod", prod)
	if err := env.Client.Delete(context.Background(), prod); err != nil {
		t.Fatal(err)
	}
	// The finalizer: the rendering goes, then the object.
	if _, err := w.regs.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: w.ns, Name: "prod"}}); err != nil {
		t.Fatal(err)
	}
	again := registrySpec(w.ns, "prod", repo.FileURL(), v1alpha1.FormatRegistry)
	again.Spec.Ref = &v1alpha1.GitRef{Commit: loose}
	w.create(again)
	reg, c := w.reconcileRegistry(w.ns, "prod")
	w.reconcileGateway("pay")
	l, err := p.reload()
	if err == nil && needsApproval(l.Manifests, "db.wipe") == "no approval" {
		t.Fatalf("after deleting and recreating prod at commit %s (Ready=%s %s, acceptedRevision %q), the pod serves db.wipe without approval again (%s); "+
			"pods should keep a mark of the writer-signed index (registry id → highest index sequence) and refuse a lower one whatever the controller's sequence, "+
			"and the controller should keep its baseline per registry id (or per source name) outside the object a namespace editor can delete",
			loose[:12], c.Status, c.Reason, reg.Status.AcceptedRevision, l.Revision)
	}
}
