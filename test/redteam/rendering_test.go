package redteam

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/internal/podrun"
	"github.com/reversi-gitops/reversi/pkg/bundle"
)

// Revisions an attacker writes into the unsigned `revision` key.
const (
	forgedRevision  = "main@sha1:0badc0de0badc0de0badc0de0badc0de0badc0de"
	forgedRevision2 = "main@sha1:5ca1ab1e5ca1ab1e5ca1ab1e5ca1ab1e5ca1ab1e"
)

// renderingAttack is one write of the ConfigMap-only identity to a rendering, with the
// controller running.
type renderingAttack struct {
	configMap string
	// ownerKind and ownerName are the object that owns the ConfigMap (the drift event's
	// regarding object).
	ownerKind, ownerName string
	// edit makes what the attacker writes from what the ConfigMap holds.
	edit func(before map[string]string) map[string]string
	// served is the digest a gateway reports when it serves the attack, and revision a
	// revision it must never show ("" when none).
	served, revision string
}

// attackRendering writes the attack as mallory and asserts what every rendering attack must
// end in: the controller restores the data it rendered, a Warning RenderingDrift event names
// mallory, and the gateway never serves (or shows) what mallory wrote. The caller then checks
// that the last good rules keep serving.
func (w *world) attackRendering(t *testing.T, a renderingAttack) {
	t.Helper()
	cm := &corev1.ConfigMap{}
	must(t, w.mallory.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: a.configMap}, cm))
	before := maps.Clone(cm.Data)
	reports := w.watchPod(t, w.pay.pod.Name)
	start := time.Now()
	cm.Data = a.edit(before)
	must(t, w.mallory.Update(w.ctx, cm, client.FieldOwner(attacker)))

	// Wait for the controller to restore its rendering; stop early (after a grace period
	// for the restore) once the gateway is seen serving the attack.
	_ = podrun.Poll(w.ctx, 20*time.Second, func() string {
		if reports.seen(a.served, a.revision) && time.Since(start) > 3*time.Second {
			return ""
		}
		if !maps.Equal(w.configMap(t, a.configMap).Data, before) {
			return "not restored"
		}
		return ""
	})
	if now := w.configMap(t, a.configMap).Data; !maps.Equal(now, before) {
		t.Errorf("ConfigMap %s was not restored by the controller: it still holds what %s wrote (digest %s, revision %q)",
			a.configMap, attacker, now[bundle.KeyDigest], now["revision"])
	}
	w.wantEvent(t, a.ownerKind, a.ownerName, start, corev1.EventTypeWarning, eventRenderingDrift, attacker)
	if err := w.pay.settled(t, memoryReg); err != nil {
		t.Logf("after the attack: %v", err)
	}
	if reports.seen(a.served, a.revision) {
		t.Errorf("the gateway served what %s wrote into %s: its pod reported %s", attacker, a.configMap, reports)
	}
	if a.revision != "" {
		if got := w.pay.metricsRevision(t); strings.Contains(got, a.revision) {
			t.Errorf("the gateway's /metrics shows the unsigned revision %s wrote: %q", attacker, got)
		}
	}
}

// testSwapRegistryEntry: mallory swaps the v2 entry of memory.create_entities in
// `memory-manifests` for the older signed v1 entry and recomputes the unsigned digest.
func (w *world) testSwapRegistryEntry(t *testing.T) {
	old := entry(t, w.v1Registry, "memory.create_entities")
	w.attackRendering(t, renderingAttack{
		configMap: memoryReg + "-manifests", ownerKind: "ManifestRegistry", ownerName: memoryReg,
		edit:   func(d map[string]string) map[string]string { return swapped(t, d, old) },
		served: swapped(t, w.configMap(t, payGW+"-manifests").Data, old)[bundle.KeyDigest],
	})
	w.pay.requireHeld(t, "memory.create_entities", createArgs)
}

// testSwapGatewayEntry: the same swap in `pay-manifests`.
func (w *world) testSwapGatewayEntry(t *testing.T) {
	old := entry(t, w.v1Gateway, "memory.create_entities")
	attacked := swapped(t, w.configMap(t, payGW+"-manifests").Data, old)
	w.attackRendering(t, renderingAttack{
		configMap: payGW + "-manifests", ownerKind: "ReversiGateway", ownerName: payGW,
		edit:   func(d map[string]string) map[string]string { return swapped(t, d, old) },
		served: attacked[bundle.KeyDigest],
	})
	w.pay.requireHeld(t, "memory.create_entities", createArgs)
}

// testAddOtherEntry: mallory adds the signed entry of memory.delete_entities, copied from
// `other-manifests`, to a rendering the gateway loads (configMap: the registry's or the
// gateway's).
func (w *world) testAddOtherEntry(t *testing.T, configMap, ownerKind, ownerName string) {
	foreign := entry(t, w.configMap(t, otherReg+"-manifests").Data, "memory.delete_entities")
	w.pay.requireBlocked(t, "memory.delete_entities", deleteArgs, "no manifest")
	w.attackRendering(t, renderingAttack{
		configMap: configMap, ownerKind: ownerKind, ownerName: ownerName,
		edit:   func(d map[string]string) map[string]string { return added(t, d, foreign) },
		served: added(t, w.configMap(t, payGW+"-manifests").Data, foreign)[bundle.KeyDigest],
	})
	w.pay.requireBlocked(t, "memory.delete_entities", deleteArgs, "no manifest")
	w.pay.requireHeld(t, "memory.create_entities", createArgs)
}

// testReplaceWithOlderRendering: mallory replaces the whole `pay-manifests` with the
// complete rendering of v1 saved before v2 (an older snapshot). Then, with the controller
// stopped (nothing re-renders), the older rendering is put back and the gateway process
// restarted with the same data folder: it must not serve the older rules after the restart
// either.
func (w *world) testReplaceWithOlderRendering(t *testing.T) {
	v1Digest := w.v1Gateway[bundle.KeyDigest]
	w.attackRendering(t, renderingAttack{
		configMap: payGW + "-manifests", ownerKind: "ReversiGateway", ownerName: payGW,
		edit:   func(map[string]string) map[string]string { return maps.Clone(w.v1Gateway) },
		served: v1Digest,
	})
	w.pay.requireHeld(t, "memory.create_entities", createArgs)

	// Nothing re-renders now: the gateway alone stands between the older rendering and the
	// agent.
	w.stopController()
	reports := w.watchPod(t, w.pay.pod.Name)
	w.writeAsMallory(t, payGW+"-manifests", w.v1Gateway)
	err := podrun.Poll(w.ctx, 15*time.Second, func() string {
		if reports.seen(v1Digest, "") || w.pay.leaseAnnotation(t, v1alpha1.AnnotationManifestError) != "" {
			return ""
		}
		return "the gateway has neither loaded nor refused the older rendering"
	})
	if reports.seen(v1Digest, "") {
		t.Errorf("with the controller stopped, the gateway loaded the older rendering (digest %s)", v1Digest)
	} else if err != nil {
		t.Logf("%v", err)
	}
	w.pay.requireHeld(t, "memory.create_entities", createArgs)

	// A restart of the gateway process (same sqlite folder) reads the older rendering first.
	if up := w.pay.restart(t); !up {
		t.Logf("the restarted gateway refused to start: %s", oneLine(w.pay.proc.Tail(600)))
	} else if text, isErr := w.pay.call(t, "memory.create_entities", createArgs); !isErr {
		t.Errorf("after a restart the gateway serves the older rendering: memory.create_entities was allowed without approval: %s (pod reports digest %s, v1 is %s)",
			oneLine(text), w.pay.leaseAnnotation(t, v1alpha1.AnnotationManifestDigest), v1Digest)
	}
	w.startController(t)
}

// testEditRevision: mallory edits (or adds) the unsigned `revision` key of a rendering. The
// revision the gateway reports (the annotation on its pod's Lease, the /metrics label) must
// never show the edited value: first in `memory-manifests` with the controller running, then
// in `pay-manifests` with the controller stopped.
func (w *world) testEditRevision(t *testing.T) {
	setRevision := func(rev string) func(map[string]string) map[string]string {
		return func(d map[string]string) map[string]string {
			out := maps.Clone(d)
			out["revision"] = rev // the key the format once had; now refused as unknown
			return out
		}
	}
	w.attackRendering(t, renderingAttack{
		configMap: memoryReg + "-manifests", ownerKind: "ManifestRegistry", ownerName: memoryReg,
		edit: setRevision(forgedRevision), revision: forgedRevision,
	})
	w.pay.requireHeld(t, "memory.create_entities", createArgs)

	w.stopController()
	// A mark that only the gateway's next report replaces: it reports after each reload.
	w.patchLeaseAnnotations(t, w.pay.pod.Name, map[string]any{v1alpha1.AnnotationManifestRevision: "unreported"})
	w.writeAsMallory(t, payGW+"-manifests", setRevision(forgedRevision2)(w.configMap(t, payGW+"-manifests").Data))
	if err := podrun.Poll(w.ctx, 15*time.Second, func() string {
		if w.pay.leaseAnnotation(t, v1alpha1.AnnotationManifestRevision) == "unreported" {
			return "the gateway has not reported since the edit"
		}
		return ""
	}); err != nil {
		t.Logf("%v", err)
	}
	if got := w.pay.leaseAnnotation(t, v1alpha1.AnnotationManifestRevision); strings.Contains(got, forgedRevision2) {
		t.Errorf("the gateway's pod reports the unsigned revision mallory wrote on its Lease: %s=%q", v1alpha1.AnnotationManifestRevision, got)
	}
	if got := w.pay.metricsRevision(t); strings.Contains(got, forgedRevision2) {
		t.Errorf("the gateway's /metrics shows the unsigned revision mallory wrote: revision=%q", got)
	}
	w.pay.requireHeld(t, "memory.create_entities", createArgs)
	w.startController(t)
}

// writeAsMallory replaces the data of a ConfigMap as the ConfigMap-only identity.
func (w *world) writeAsMallory(t *testing.T, name string, data map[string]string) {
	t.Helper()
	cm := &corev1.ConfigMap{}
	must(t, w.mallory.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: name}, cm))
	cm.Data = maps.Clone(data)
	must(t, w.mallory.Update(w.ctx, cm, client.FieldOwner(attacker)))
}

// reset brings the world back to its last good state after a subtest: the controller runs,
// renderings that differ from what the controller rendered are deleted (it renders them
// again), the gateway re-renders and its process runs, and create_entities is held.
func (w *world) reset(t *testing.T) {
	t.Helper()
	if exited, _ := w.controller.Exited(); exited {
		w.startController(t)
	}
	for _, name := range []string{memoryReg, otherReg} {
		cm := w.configMap(t, name+"-manifests")
		if !maps.Equal(cm.Data, w.good[name]) {
			must(t, client.IgnoreNotFound(w.k8s.Delete(w.ctx, cm)))
		}
	}
	for _, name := range []string{memoryReg, otherReg} {
		w.waitReady(t, name, 60*time.Second)
		if err := podrun.Poll(w.ctx, 30*time.Second, func() string {
			cm := &corev1.ConfigMap{}
			if err := w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: name + "-manifests"}, cm); err != nil {
				return err.Error()
			}
			w.good[name] = cm.Data
			return ""
		}); err != nil {
			t.Fatal(err)
		}
	}
	w.annotate(t, &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: payGW}},
		map[string]any{v1alpha1.AnnotationRequestedAt: time.Now().UTC().Format(time.RFC3339Nano)})
	// The gateway's rendering first (a gateway started on the attacked one may refuse to
	// start), then its process.
	if err := podrun.Poll(w.ctx, 30*time.Second, func() string {
		reg, gw := w.configMap(t, memoryReg+"-manifests").Data, w.configMap(t, payGW+"-manifests").Data
		if reg[bundle.KeyDigest] != gw[bundle.KeyDigest] {
			return "the gateway's rendering is not the registry's yet"
		}
		return ""
	}); err != nil {
		t.Fatalf("reset: %v", err)
	}
	// And its gateway.yaml, which the pod checks against the Deployment's digest.
	want := ""
	for _, e := range w.pay.pod.Spec.Containers[0].Env {
		if e.Name == controllers.ConfigDigestEnv {
			want = e.Value
		}
	}
	if err := podrun.Poll(w.ctx, 30*time.Second, func() string {
		sum := sha256.Sum256([]byte(w.configMap(t, payGW+"-config").Data[controllers.GatewayConfigKey]))
		if got := "sha256:" + hex.EncodeToString(sum[:]); got != want {
			return "the gateway's config is not restored yet: " + got + ", want " + want
		}
		return ""
	}); err != nil {
		t.Fatalf("reset: %v", err)
	}
	w.pay.ensureRunning(t)
	if err := w.pay.settled(t, memoryReg); err != nil {
		t.Fatalf("reset: %v", err)
	}
	if !w.pay.requireHeld(t, "memory.create_entities", createArgs) {
		t.Fatal("reset: the world does not hold memory.create_entities any more")
	}
}

// testEditGatewayConfig: mallory loosens the gateway's own config (`pay-config`: enforce →
// observe, in which nothing is blocked). With the controller running it is restored at once
// and named; with the controller stopped, a restarted gateway refuses the edited file (the
// Deployment names its digest) instead of serving without enforcement.
func (w *world) testEditGatewayConfig(t *testing.T) {
	loosen := func(d map[string]string) map[string]string {
		out := maps.Clone(d)
		out["gateway.yaml"] = strings.Replace(d["gateway.yaml"], "mode: enforce", "mode: observe", 1)
		if out["gateway.yaml"] == d["gateway.yaml"] {
			t.Fatalf("gateway.yaml has no mode: enforce:\n%s", d["gateway.yaml"])
		}
		return out
	}
	w.attackRendering(t, renderingAttack{configMap: payGW + "-config", ownerKind: "ReversiGateway", ownerName: payGW, edit: loosen})

	w.stopController()
	w.writeAsMallory(t, payGW+"-config", loosen(w.configMap(t, payGW+"-config").Data))
	if up := w.pay.restart(t); up {
		if text, isErr := w.pay.call(t, "memory.delete_entities", map[string]any{"entityNames": []any{"x"}}); !isErr {
			t.Errorf("a gateway restarted on the loosened gateway.yaml let a call without a manifest through: %s", oneLine(text))
		}
		t.Errorf("the gateway started on a gateway.yaml the Deployment does not name")
	} else if out := w.pay.proc.Tail(2000); !strings.Contains(out, "the gateway's config ConfigMap was changed by someone other than the controller") {
		t.Errorf("the gateway stopped for another reason: %s", oneLine(out))
	}
	w.startController(t)
}
