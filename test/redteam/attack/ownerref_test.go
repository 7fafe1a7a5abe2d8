package attack

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ATTACK (ConfigMap-only identity; freeze for good): the controllers heal a rendered
// ConfigMap's data, but not its owner references. Give `prod-manifests` another controller
// (an ownerReference with controller: true to a ConfigMap of the attacker's, so no garbage
// collector ever deletes it; prod's reference stays, as a plain owner) and leave the data
// alone. The pod keeps serving it (nothing it verifies changed). From then on
// controllerutil.SetControllerReference refuses to take the ConfigMap over ("already owned
// by another controller"), so every reconcile of prod ends in StorageFailed, and the
// ReversiGateway controller no longer counts prod-manifests as prod's (IsControlledBy): the
// writers' tightening never reaches a gateway, and nothing heals it. The same edit on
// `<gw>-manifests` or `<gw>-config` freezes the ReversiGateway (ApplyFailed).
func TestConfigMapEditorHijacksTheControllerReferenceToFreezeUpdates(t *testing.T) {
	w, repo, p := looseProd(t)

	decoy := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "notes"}}
	w.create(decoy)
	var cm corev1.ConfigMap
	w.get(w.ns, "prod-manifests", &cm)
	refs := cm.OwnerReferences
	for i := range refs {
		refs[i].Controller = ptr.To(false)
	}
	cm.OwnerReferences = append(refs, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: decoy.Name, UID: decoy.UID, Controller: ptr.To(true)})
	if err := env.Client.Update(context.Background(), &cm, client.FieldOwner("kubectl-edit")); err != nil {
		t.Fatal(err)
	}

	rev := tighten(w, repo)
	reg, c := w.reconcileRegistry(w.ns, "prod")
	gw := w.reconcileGateway("pay")
	got := "absent"
	if l, err := p.km.Load(context.Background()); err == nil {
		got = needsApproval(l.Manifests, "db.wipe")
	}
	if c.Status != metav1.ConditionTrue || got != "approval required" {
		gc := ready(gw.Status.Conditions)
		t.Fatalf("after an ownerReferences edit of prod-manifests (data untouched), the writers' commit %s never renders: registry Ready=%s %s (%s; applied %s); gateway Ready=%s %s; "+
			"the pod serves db.wipe with %s. A ConfigMap editor freezes the registry for good; the controller must restore the owner references of what it renders "+
			"(remove a foreign controller reference from a ConfigMap it names, or render into a fresh name and delete the hijacked one) and flag it as drift",
			rev[:12], c.Status, c.Reason, c.Message, reg.Status.Artifact.Revision, gc.Status, gc.Reason, got)
	}
}
