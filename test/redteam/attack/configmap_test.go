package attack

import (
	"context"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// twoRegistries is a namespace with a production registry (writer-signed, db.wipe needs a
// DBA's approval) served by gateway "pay", and a sandbox registry (format Plain, db.wipe
// without approval) that another team's gateway uses. Both are rendered, and pay's pod
// serves the production rules.
func twoRegistries(t *testing.T) (*world, *pod) {
	w := newWorld(t)
	prod := sourcetest.NewRepo(t)
	w.publish(filepath.Join(prod.Dir, "reg"), w.manifests(strictWipe))
	prod.Commit("db.wipe needs a DBA")
	sandbox := sourcetest.NewRepo(t)
	sandbox.WriteFile("reg/wipe.yaml", looseWipe)
	sandbox.Commit("sandbox: wipe freely")

	w.create(registrySpec(w.ns, "prod", prod.FileURL(), v1alpha1.FormatRegistry))
	w.create(registrySpec(w.ns, "sandbox", sandbox.FileURL(), v1alpha1.FormatPlain))
	w.mustRender(w.ns, "prod")
	w.mustRender(w.ns, "sandbox")
	w.create(gatewaySpec(w.ns, "pay", &v1alpha1.GatewayManifests{Registries: []string{"prod"}}))
	w.create(gatewaySpec(w.ns, "dev", &v1alpha1.GatewayManifests{Registries: []string{"sandbox"}}))
	w.reconcileGateway("pay")
	w.reconcileGateway("dev")

	p := w.pod("pay")
	l, err := p.reload()
	if err != nil {
		t.Fatalf("the working system: pay's pod refuses its own rendering: %v", err)
	}
	if got := needsApproval(l.Manifests, "db.wipe"); got != "approval required" {
		t.Fatalf("the working system: pay serves db.wipe with %s", got)
	}
	return w, p
}

// ATTACK (ConfigMap-only identity): copy another registry's complete rendering — every byte
// of it signed by the controller — over the gateway's `<gw>-manifests`. The pod checks that
// every source has a controller-signed snapshot over exactly its entries, but not that the
// sources are the ones its ReversiGateway names: a Plain source needs no writer signature, so
// db.wipe loses its approval. Nothing must be recomputed; `kubectl edit` is enough.
//
// The same works with any rendering the attacker can read: a Plain registry in the attacker's
// own namespace (arbitrary manifests, the controller's key is one for the cluster), another
// gateway's ToolManifests set, or an old snapshot of a source this gateway never served (no
// high-water mark exists for it).
func TestConfigMapEditorReplacesTheGatewaysSourcesWithAnotherRegistrysRendering(t *testing.T) {
	w, p := twoRegistries(t)

	w.editConfigMap(w.ns, "pay-manifests", w.configMapData(w.ns, "sandbox-manifests"))

	l, err := p.reload()
	if err == nil {
		t.Fatalf("pay's pod accepted the sandbox registry's rendering as its own: it now serves db.wipe with %s (%s); "+
			"a gateway must accept only snapshots of the sources its ReversiGateway names (e.g. a --kube-sources list in the Deployment's args)",
			needsApproval(l.Manifests, "db.wipe"), l.Revision)
	}
}

// ATTACK (ConfigMap-only identity): stop the controllers from healing the gateway's
// rendering. A ConfigMap labelled reversi.dev/registry=prod with a controller reference to
// the prod ManifestRegistry (its UID is on prod-manifests, which the attacker can read) counts
// as a shard of prod's rendering for the ReversiGateway controller, which then refuses prod
// ("have 2 of 1 shards") and stops before it writes `<gw>-manifests` again; the registry's own
// reconcile takes the unchanged-revision shortcut, which looks only at the shards it named, so
// the rogue shard stays. Any edit of `<gw>-manifests` the pod accepts (the test above) then
// stays served, and legitimate updates of prod stop reaching the gateway.
func TestConfigMapEditorBlocksDriftHealingWithARogueShard(t *testing.T) {
	w, _ := twoRegistries(t)
	good := w.configMapData(w.ns, "pay-manifests")
	// The defence works on its own: an edit is restored by the next reconcile.
	w.editConfigMap(w.ns, "pay-manifests", w.configMapData(w.ns, "sandbox-manifests"))
	w.reconcileGateway("pay")
	if !equalData(w.configMapData(w.ns, "pay-manifests"), good) {
		t.Fatal("the working system: the ReversiGateway reconcile does not restore an edited pay-manifests")
	}

	var prodCM corev1.ConfigMap
	w.get(w.ns, "prod-manifests", &prodCM)
	owner := *metav1.GetControllerOf(&prodCM)
	w.create(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "prod-manifests-x",
		Labels:          map[string]string{controllers.LabelRegistry: "prod"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: owner.APIVersion, Kind: owner.Kind, Name: owner.Name, UID: owner.UID, Controller: ptr.To(true)}}},
		Data: map[string]string{"digest": "x", "shard": "5", "shards": "9", "manifests.json": "[]"}})
	w.editConfigMap(w.ns, "pay-manifests", w.configMapData(w.ns, "sandbox-manifests"))

	if _, c := w.reconcileRegistry(w.ns, "prod"); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("prod: %+v", c)
	}
	err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: w.ns, Name: "prod-manifests-x"}, &corev1.ConfigMap{})
	rogueStays := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	gw := w.reconcileGateway("pay")
	healed := equalData(w.configMapData(w.ns, "pay-manifests"), good)
	if !healed {
		c := ready(gw.Status.Conditions)
		t.Fatalf("pay-manifests was not restored: the rogue shard is still there (%v) and the ReversiGateway reconcile stopped before rendering: Ready=%s %s: %s; "+
			"the registry's reconcile must delete (or the gateway's ignore) ConfigMaps it did not render, and a failing source must not stop the healing of the others' drift",
			rogueStays, c.Status, c.Reason, c.Message)
	}
}

func equalData(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
