package attack

import (
	"context"
	"testing"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// ATTACK (git pusher without keys, after one legitimate emergency rollback): the override
// annotation names an exact revision, but it is never consumed and it does not say which
// revision it may replace. An admin rolled prod back to the loose commit on purpose
// (reversi.dev/accept-revision: main@sha1:<loose>), then the writers fixed forward with a
// strict commit on top. The annotation is still there, so a force-push back to the loose
// commit — weeks later, by anyone who can push — is accepted again: the ancestry and index
// sequence checks are skipped, and every gateway takes the older rules (new sequence).
func TestOverrideAnnotationAcceptsTheSameRollbackAgainLater(t *testing.T) {
	w, repo, p := looseProd(t)
	loose := repo.Rev("HEAD")
	tighten(w, repo)
	w.mustRender(w.ns, "prod")

	// The audited emergency rollback.
	repo.Git("reset", "-q", "--hard", loose)
	prod := &v1alpha1.ManifestRegistry{}
	w.get(w.ns, "prod", prod)
	prod.Annotations = map[string]string{v1alpha1.AnnotationAcceptRevision: "main@sha1:" + loose}
	if err := env.Client.Update(context.Background(), prod); err != nil {
		t.Fatal(err)
	}
	if reg := w.mustRender(w.ns, "prod"); reg.Status.AcceptedRevision != "main@sha1:"+loose {
		t.Fatalf("the override did not apply: %+v", reg.Status)
	}
	// Fix forward: a new strict version on top of the rolled-back commit.
	tighten(w, repo)
	w.mustRender(w.ns, "prod")
	w.reconcileGateway("pay")
	if l, err := p.reload(); err != nil || needsApproval(l.Manifests, "db.wipe") != "approval required" {
		t.Fatalf("the working system: the fix-forward is not served: %v", err)
	}

	// Later: the pusher moves main back again.
	repo.Git("reset", "-q", "--hard", loose)
	_, c := w.reconcileRegistry(w.ns, "prod")
	if c.Reason != v1alpha1.ReasonRevisionNotDescendant && c.Reason != v1alpha1.ReasonVersionDowngrade {
		w.reconcileGateway("pay")
		l, err := p.reload()
		t.Fatalf("the second force-push to %s was applied (Ready=%s %s) because the old annotation still names it; the pod: %v, db.wipe %s; "+
			"the override must be used once (the controller removes it, or it must also name the revision it replaces: accept-revision: <from> -> <to>)",
			loose[:12], c.Status, c.Reason, err, needsApproval(l.Manifests, "db.wipe"))
	}
}
