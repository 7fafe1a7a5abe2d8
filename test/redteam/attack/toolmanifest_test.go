package attack

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/export"
	"github.com/reversi-gitops/reversi/pkg/registry"
)

// signedToolManifest is db.wipe as the writers export it (reversi manifests export --format
// crd) from their registry folder dir after publishing yaml: the newest version, signed.
func (w *world) signedToolManifest(dir, yaml string) *v1alpha1.ToolManifest {
	w.t.Helper()
	w.publish(dir, w.manifests(yaml))
	snap, errs := registry.New(dir).Load(w.writer.Trust)
	if len(errs) > 0 {
		w.t.Fatal(errs)
	}
	tm, err := export.ToolManifest(w.ns, "db.wipe", snap.Entries["db.wipe"], snap.Canonical["db.wipe"])
	if err != nil {
		w.t.Fatal(err)
	}
	return tm
}

// applyToolManifest creates or replaces the ToolManifest's spec and signature and runs the
// ToolManifest reconcile, which must find it Ready (valid and signed by a trusted writer).
func (w *world) applyToolManifest(tm *v1alpha1.ToolManifest) {
	w.t.Helper()
	cur := &v1alpha1.ToolManifest{}
	if err := w.getMaybe(tm.Name, cur); err != nil {
		w.create(tm)
	} else {
		cur.Spec, cur.Annotations = tm.Spec, tm.Annotations
		if err := env.Client.Update(context.Background(), cur); err != nil {
			w.t.Fatal(err)
		}
	}
	if _, err := w.tms.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: w.ns, Name: tm.Name}}); err != nil {
		w.t.Fatal(err)
	}
	w.get(w.ns, tm.Name, cur)
	if c := ready(cur.Status.Conditions); c == nil || c.Status != metav1.ConditionTrue {
		w.t.Fatalf("ToolManifest %s not Ready: %+v", tm.Name, c)
	}
}

func (w *world) getMaybe(name string, tm *v1alpha1.ToolManifest) error {
	return env.Client.Get(context.Background(), types.NamespacedName{Namespace: w.ns, Name: name}, tm)
}

// toolManifestGateway is gateway pay selecting the namespace's exported ToolManifests, with
// db.wipe v1 (no approval) applied and served, and the writers' v1 and v2 exports.
func toolManifestGateway(t *testing.T) (w *world, p *pod, v1, v2 *v1alpha1.ToolManifest) {
	w = newWorld(t)
	dir := filepath.Join(t.TempDir(), "reg")
	v1 = w.signedToolManifest(dir, looseWipe)
	v2 = w.signedToolManifest(dir, strictWipe)
	w.applyToolManifest(v1)
	w.create(gatewaySpec(w.ns, "pay", &v1alpha1.GatewayManifests{Selector: &metav1.LabelSelector{
		MatchLabels: map[string]string{"app.kubernetes.io/managed-by": "reversi"}}}))
	w.reconcileGateway("pay")
	p = w.pod("pay")
	if l, err := p.reload(); err != nil || needsApproval(l.Manifests, "db.wipe") != "no approval" {
		t.Fatalf("the working system: %v", err)
	}
	return w, p, v1, v2
}

// ATTACK (ToolManifest editor; TUF: rollback of one target): after the writers' db.wipe v2
// (approval required) is applied and served, put back the v1 object they exported earlier —
// a valid writer signature over an older version. The ToolManifest controller finds it
// signed, the ReversiGateway controller signs the new set with a higher sequence, and the
// pods accept it: nothing remembers that db.wipe was already at v2. (Registry-format sources
// are protected by the index sequence; ToolManifests have none.)
func TestToolManifestEditorPutsBackAnOlderSignedVersion(t *testing.T) {
	w, p, v1, v2 := toolManifestGateway(t)
	w.applyToolManifest(v2)
	w.reconcileGateway("pay")
	if l, err := p.reload(); err != nil || needsApproval(l.Manifests, "db.wipe") != "approval required" {
		t.Fatalf("the working system: v2 is not served: %v", err)
	}

	w.applyToolManifest(v1)
	w.reconcileGateway("pay")
	l, err := p.reload()
	if err == nil && needsApproval(l.Manifests, "db.wipe") == "no approval" {
		t.Fatalf("the pod serves db.wipe v1 (no approval) again after v2 was served (%s); "+
			"a writer-signed tool's version must not go down: keep the highest version per tool (controller status, and a per-tool mark in the gateway's store), "+
			"since a legitimate rollback is a new, higher version", l.Revision)
	}
}

// ATTACK (ReversiGateway status editor; freeze): the ToolManifests snapshot's sequence comes
// from status.manifests.toolManifestsSequence. Set it to MaxInt64: the controller signs the
// unchanged set with that sequence, the pods record it, and every later change of the
// ToolManifests (max(last+1, now) overflows to now) is refused by every pod, forever.
func TestGatewayStatusEditorFreezesToolManifestUpdates(t *testing.T) {
	w, p, _, v2 := toolManifestGateway(t)

	gw := &v1alpha1.ReversiGateway{}
	w.get(w.ns, "pay", gw)
	w.patchStatus(gw, map[string]any{"manifests": map[string]any{"toolManifestsSequence": int64(math.MaxInt64)}})
	w.reconcileGateway("pay")
	p.current()

	w.applyToolManifest(v2)
	w.reconcileGateway("pay")
	l, err := p.reload()
	if errors.Is(err, store.ErrDowngrade) {
		t.Fatalf("db.wipe v2 (%s) is refused by the pod for good: %v; the controller must not sign a sequence it read from status unchecked",
			needsApproval(l.Manifests, "db.wipe"), err)
	}
	if err != nil || needsApproval(l.Manifests, "db.wipe") != "approval required" {
		t.Fatalf("the pod serves db.wipe with %s: %v", needsApproval(l.Manifests, "db.wipe"), err)
	}
}

// ATTACK (ToolManifest editor alone, two steps; TUF: rollback of one target): the version
// check compares a ToolManifest only with the version the gateway's *previous* rendering
// served. Take db.wipe out of one rendering — delete its ToolManifest (relabelling it out of
// the selector, or making it invalid, does the same) — let the gateway render without it,
// then apply the writers' older v1 export again: the previous rendering has no db.wipe, so
// nothing is older than it, the controller signs the set with a higher sequence, and the pod
// (which keeps one mark per source, not per tool) serves v1 without approval.
func TestToolManifestEditorDropsTheToolThenPutsBackAnOlderVersion(t *testing.T) {
	w, p, v1, v2 := toolManifestGateway(t)
	w.applyToolManifest(v2)
	w.reconcileGateway("pay")
	if l, err := p.reload(); err != nil || needsApproval(l.Manifests, "db.wipe") != "approval required" {
		t.Fatalf("the working system: v2 is not served: %v", err)
	}

	cur := &v1alpha1.ToolManifest{}
	w.get(w.ns, v2.Name, cur)
	if err := env.Client.Delete(context.Background(), cur); err != nil {
		t.Fatal(err)
	}
	w.reconcileGateway("pay") // a rendering without db.wipe

	old := &v1alpha1.ToolManifest{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: v1.Name, Labels: v1.Labels, Annotations: v1.Annotations}, Spec: v1.Spec}
	w.applyToolManifest(old)
	w.reconcileGateway("pay")
	l, err := p.reload()
	if err == nil && needsApproval(l.Manifests, "db.wipe") == "no approval" {
		t.Fatalf("the pod serves db.wipe v1 (no approval) again after v2 was served (%s), once db.wipe was left out of one rendering; "+
			"the highest version served per tool must be kept across renderings (e.g. a per-tool floor carried in the signed ToolManifests snapshot "+
			"and in status, and a per-tool mark in the pod's store), not only compared with the previous rendering", l.Revision)
	}
}

// ATTACK (ToolManifest editor; freeze another source): a gateway that loads a registry and
// selects ToolManifests refuses the whole merge when a tool comes from both (DuplicateTool,
// stalled). Apply any writer-signed export of a tool the registry defines — here an old
// db.wipe export, which the ToolManifest controller finds validly signed — and the gateway
// stops rendering: the writers' tightening of db.wipe in the registry, and every later
// change of any source, never reaches the pods, which keep the older, looser rules until
// someone finds and removes the ToolManifest.
func TestToolManifestEditorFreezesTheRegistryWithADuplicateTool(t *testing.T) {
	w, repo, _ := looseProd(t)
	w.create(gatewaySpec(w.ns, "mix", &v1alpha1.GatewayManifests{Registries: []string{"prod"},
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/managed-by": "reversi"}}}))
	w.reconcileGateway("mix")
	p := w.pod("mix")
	if l, err := p.reload(); err != nil || needsApproval(l.Manifests, "db.wipe") != "no approval" {
		t.Fatalf("the working system: %v", err)
	}

	w.applyToolManifest(w.signedToolManifest(filepath.Join(t.TempDir(), "old"), looseWipe))
	tighten(w, repo)
	w.mustRender(w.ns, "prod")
	gw := w.reconcileGateway("mix")
	got := "absent"
	if l, err := p.km.Load(context.Background()); err == nil {
		got = needsApproval(l.Manifests, "db.wipe")
	}
	if got != "approval required" {
		c := ready(gw.Status.Conditions)
		t.Fatalf("one signed ToolManifest for a tool the registry defines stops the gateway (Ready=%s %s: %s): the writers' tightening in prod is not rendered and the pod serves db.wipe with %s; "+
			"a conflict should leave out the ToolManifest's copy of the tool (the registry's reviewed index wins, with an event), not freeze every source of the gateway",
			c.Status, c.Reason, c.Message, got)
	}
}
