// Package redteam is the acceptance test of issue 15 ("the chain of trust, commit to
// gateway"): one test per attack, each starting from a working system and asserting both that
// the attack fails and that the last good rules keep serving.
//
// The system is real: envtest (kube-apiserver and etcd), `reversi controller` as its own
// process (its peak memory is read from /proc), signed git repositories (SSH-signed commits
// and tags made with the git CLI, a registry published and approved with `reversi manifests`)
// served by `git http-backend` on 127.0.0.1, a ReversiGateway whose pod the test plays
// (internal/podrun: the gateway process runs the rendered container's args and env, its
// sqlite folder survives restarts) fronting @modelcontextprotocol/server-memory, and an agent
// session over HTTP with an API key. The attacker of the rendering attacks is a user minted by
// envtest who may do anything to ConfigMaps in the namespace and nothing else.
//
// The world is built once (TestRedTeam) and shared by the attacks, run in order as subtests;
// each resets what it changed.
package redteam

import (
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

func TestRedTeam(t *testing.T) {
	w := newWorld(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("controller log (end):\n%s", w.controller.Tail(6000))
			t.Logf("gateway log (end):\n%s", w.pay.proc.Tail(6000))
		}
	})
	// Rendering attacks shared the gateway: each resets the world when it is done.
	attack := func(name string, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			defer w.reset(t)
			f(t)
		})
	}
	t.Run("HonestPath", w.testHonestPath)
	attack("SwapRegistryEntryForOlderSignedVersion", w.testSwapRegistryEntry)
	attack("SwapGatewayEntryForOlderSignedVersion", w.testSwapGatewayEntry)
	attack("AddEntryFromOtherRegistry/RegistryConfigMap", func(t *testing.T) {
		w.testAddOtherEntry(t, memoryReg+"-manifests", "ManifestRegistry", memoryReg)
	})
	attack("AddEntryFromOtherRegistry/GatewayConfigMap", func(t *testing.T) {
		w.testAddOtherEntry(t, payGW+"-manifests", "ReversiGateway", payGW)
	})
	attack("ReplaceWithOlderRenderingAndRestart", w.testReplaceWithOlderRendering)
	attack("EditUnsignedRevision", w.testEditRevision)
	attack("EditGatewayConfig", w.testEditGatewayConfig)
	attack("ForcePushOlderSignedCommit/Registry", w.testForcePushRegistry)
	t.Run("ForcePushOlderSignedCommit/Plain", w.testForcePushPlain)
	t.Run("ChainModeRefusesUnsignedCommit", w.testChain)
	t.Run("SemverSkipsUntrustedTag", w.testSemverTags)
	t.Run("LargeBlob", w.testLargeBlob)
	t.Run("FileURLWithoutFlag", w.testFileURL)
	t.Run("ReversiGatewayAdoptsNothing", w.testNoAdoption)
	t.Run("GatewayRightsAreItsOwn", w.testGatewayRightsAreItsOwn)
}

// testHonestPath: the world works as designed before any attack. The gateway runs as the
// Deployment's container; under v2 create_entities is held for finance's approval,
// delete_entities (defined only by the other registry) has no manifest, reads pass; the
// attacker's identity may write ConfigMaps and nothing else.
func (w *world) testHonestPath(t *testing.T) {
	args := strings.Join(w.pay.proc.Args, " ")
	for _, want := range []string{"gateway ", "--kube-configmap " + ns + "/" + payGW + "-manifests", "--kube-trusted-keys manifest-keys", "--store sqlite --data "} {
		if !strings.Contains(args, want) {
			t.Errorf("the gateway's args %q lack %q", args, want)
		}
	}
	for _, e := range w.pay.pod.Spec.Containers[0].Env {
		if !slices.ContainsFunc(w.pay.proc.Env, func(kv string) bool { return strings.HasPrefix(kv, e.Name+"=") }) {
			t.Errorf("the gateway process lacks the container's env %s", e.Name)
		}
	}
	w.pay.requireHeld(t, "memory.create_entities", createArgs)
	w.pay.requireBlocked(t, "memory.delete_entities", deleteArgs, "no manifest")
	w.pay.requireAllowed(t, "memory.read_graph", map[string]any{})

	// The attacker's rights: ConfigMaps, nothing else.
	var cms corev1.ConfigMapList
	if err := w.mallory.List(w.ctx, &cms, client.InNamespace(ns)); err != nil {
		t.Errorf("%s cannot list ConfigMaps: %v", attacker, err)
	}
	reg := &v1alpha1.ManifestRegistry{}
	if err := w.mallory.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: memoryReg}, reg); !apierrors.IsForbidden(err) {
		t.Errorf("%s reading the ManifestRegistry: %v, want Forbidden", attacker, err)
	}
	if err := w.mallory.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: "manifest-keys"}, &corev1.Secret{}); !apierrors.IsForbidden(err) {
		t.Errorf("%s reading a Secret: %v, want Forbidden", attacker, err)
	}
	if err := w.mallory.Create(w.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: "x"}}); !apierrors.IsForbidden(err) {
		t.Errorf("%s creating a ConfigMap in %s: %v, want Forbidden", attacker, systemNS, err)
	}
	if _, err := os.Stat(w.pay.dataDir()); err != nil {
		t.Errorf("the gateway's data folder: %v", err)
	}
}
