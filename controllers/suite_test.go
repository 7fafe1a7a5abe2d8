package controllers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing"
	"github.com/reversi-gitops/reversi/pkg/signing/signingtest"
)

// testShardBytes keeps shards small so a few hundred tools span several ConfigMaps.
const testShardBytes = 64 * 1024

// testMaxFileBytes is --source-max-file-bytes of the tests' controller: above the 4 MiB
// default, since BenchmarkReconcileScale's 20,000-tool index.json is about 7 MB (a registry that
// large needs the flag raised).
const testMaxFileBytes = 16 << 20

// keyPair is a test signing key.
type keyPair = signingtest.Key

var newKey = signingtest.NewKey

var (
	k8s     client.Client
	testEnv *testenv.Env
	envErr  error
	// ctlKey is the controller's signing key in these tests: renderings verify against it.
	ctlKey *SigningKey
	// stampKey is the controller's Approval stamp key in these tests.
	stampKey *StampKey
)

// testGatewayUser is the user the tests' standalone gateway "agents" authenticates as
// (Options.GatewayIdentities "*/agents"): it creates the tests' ApprovalRequests.
const testGatewayUser = "gateway-agents"

// testUpstreamImages are the images the tests' container upstreams may run (issue 23).
var testUpstreamImages = []string{"mcp/*"}

// TestMain starts one control plane and one manager running every reconciler for the tests
// of this package.
func TestMain(m *testing.M) {
	env, err := testenv.Start(testenv.Options{Webhooks: true})
	if err != nil {
		envErr = err
		os.Exit(m.Run()) // each test fails with envErr
	}
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:        env.Scheme,
		Metrics:       metricsserver.Options{BindAddress: "0"},
		WebhookServer: env.WebhookServer(),
		// Registries labelled ownManagerLabel, and the ConfigMaps of registries named
		// ownManagerRegistry, belong to a test's own manager (ownManager).
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&v1alpha1.ManifestRegistry{}: {Label: labels.NewSelector().Add(mustRequirement(ownManagerLabel, selection.DoesNotExist))},
			&corev1.ConfigMap{}:          {Label: labels.NewSelector().Add(mustRequirement(LabelRegistry, selection.NotIn, ownManagerRegistry))}}},
	})
	if err == nil {
		ctlKey, err = EphemeralSigningKey()
	}
	if err == nil {
		stampKey, err = EphemeralStampKey()
	}
	if err == nil {
		err = Setup(mgr, Options{MaxShardBytes: testShardBytes, Webhooks: true, SigningKey: ctlKey, StampKey: stampKey, AllowFileURLs: true, SourceMaxFileBytes: testMaxFileBytes,
			GatewayIdentities: GatewayIdentities{"*/agents": testGatewayUser}, UpstreamImages: testUpstreamImages})
	}
	if err != nil {
		envErr = err
	} else {
		go func() {
			if err := mgr.Start(ctx); err != nil {
				fmt.Fprintln(os.Stderr, "manager:", err)
			}
		}()
		k8s, testEnv = env.Client, env
	}
	code := m.Run()
	cancel()
	_ = env.Stop()
	os.Exit(code)
}

// ownManagerLabel marks a ManifestRegistry that the suite's manager leaves alone (its cache
// does not hold it, so no event of its own enqueues it): a test's own manager reconciles it.
const ownManagerLabel = "reversi.dev/test-own-manager"

// ownManagerRegistry is the name of those registries: the suite's manager does not cache their
// ConfigMaps either, so it never restores a drift the test's own manager should see.
const ownManagerRegistry = "own-reg"

func mustRequirement(key string, op selection.Operator, vals ...string) labels.Requirement {
	r, err := labels.NewRequirement(key, op, vals)
	if err != nil {
		panic(err)
	}
	return *r
}

func requireEnv(t testing.TB) {
	t.Helper()
	if envErr != nil {
		t.Fatalf("control plane: %v", envErr)
	}
}

// namespace makes a fresh namespace for one test.
func namespace(t testing.TB) string {
	t.Helper()
	requireEnv(t)
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.Trim(name, "-") + fmt.Sprintf("-%d", time.Now().UnixNano()%100000)
	if err := k8s.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	return name
}

// eventually polls cond every 50 ms until it returns "" or timeout passes; then it fails with
// the last reason.
func eventually(t *testing.T, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var why string
	for time.Now().Before(deadline) {
		if why = cond(); why == "" {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("after %s: %s", timeout, why)
}

// condition returns the registry's condition of type typ (nil when absent).
func condition(conds []metav1.Condition, typ string) *metav1.Condition {
	return apimeta.FindStatusCondition(conds, typ)
}

func getRegistry(t *testing.T, ns, name string) *v1alpha1.ManifestRegistry {
	t.Helper()
	reg := &v1alpha1.ManifestRegistry{}
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, reg); err != nil {
		t.Fatal(err)
	}
	return reg
}

// waitReady waits for Ready=status with reason (and revision, when given) and returns the registry.
func waitReady(t *testing.T, ns, name string, status metav1.ConditionStatus, reason, revision string) *v1alpha1.ManifestRegistry {
	t.Helper()
	var reg *v1alpha1.ManifestRegistry
	eventually(t, 30*time.Second, func() string {
		reg = getRegistry(t, ns, name)
		c := condition(reg.Status.Conditions, v1alpha1.ConditionReady)
		switch {
		case c == nil:
			return "no Ready condition yet"
		case c.Status != status || c.Reason != reason:
			return fmt.Sprintf("Ready=%s %s: %s", c.Status, c.Reason, c.Message)
		case revision != "" && reg.Status.LastAttemptedRevision != revision:
			return fmt.Sprintf("last attempted revision %s, want %s", reg.Status.LastAttemptedRevision, revision)
		case c.ObservedGeneration != reg.Generation:
			return "Ready is about an older generation"
		}
		return ""
	})
	return reg
}

// configMap returns a rendered shard (nil when absent).
func configMap(t *testing.T, ns, name string) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, cm); err != nil {
		return nil
	}
	return cm
}

// renderedBundle assembles and verifies a registry's ConfigMaps, as a gateway would.
func renderedBundle(t *testing.T, ns, reg string, trust *signing.TrustSet) (bundle.Bundle, []*manifest.Manifest) {
	t.Helper()
	var cms corev1.ConfigMapList
	if err := k8s.List(t.Context(), &cms, client.InNamespace(ns), client.MatchingLabels{LabelRegistry: reg}); err != nil {
		t.Fatal(err)
	}
	var shards []map[string]string
	for _, cm := range cms.Items {
		shards = append(shards, cm.Data)
	}
	b, err := bundle.Assemble(shards)
	if err != nil {
		t.Fatal(err)
	}
	ms, errs := b.Verify(trust, ctlKey.Trust)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return b, ms
}

// fixtures are the seed's three manifests.
func fixtures(t testing.TB) []*manifest.Manifest {
	t.Helper()
	docs, errs := manifest.ReadPaths(filepath.Join(testenv.Root, "test", "fixtures", "manifests"))
	ms, verrs := manifest.ValidateDocuments(docs)
	if len(errs)+len(verrs) > 0 {
		t.Fatal(errs, verrs)
	}
	return ms
}

// publish writes approved versions of ms into the registry folder dir, signed by k.
func publish(t testing.TB, dir string, k keyPair, ms ...*manifest.Manifest) {
	t.Helper()
	if _, err := registry.New(dir).Publish(ms, manifest.Approved, registry.WriteOptions{By: "alice", Signer: k.Signer}); err != nil {
		t.Fatal(err)
	}
}

func createSecret(t testing.TB, ns, name string, data map[string][]byte) {
	t.Helper()
	if err := k8s.Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}); err != nil {
		t.Fatal(err)
	}
}

// clientAs is a client of the control plane acting as user (impersonated by the tests'
// system:masters user), with uid and groups. Add system:masters to groups to get past RBAC
// and reach admission.
func clientAs(t testing.TB, user, uid string, groups ...string) client.Client {
	t.Helper()
	requireEnv(t)
	cfg := rest.CopyConfig(testEnv.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, UID: uid, Groups: groups}
	c, err := client.New(cfg, client.Options{Scheme: testEnv.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func create(t testing.TB, obj client.Object) {
	t.Helper()
	if err := k8s.Create(t.Context(), obj); err != nil {
		t.Fatal(err)
	}
}

// writeKubeconfig writes a kubeconfig of a system:masters user of the control plane, for kubectl.
func writeKubeconfig(t *testing.T) string {
	t.Helper()
	requireEnv(t)
	p, err := testEnv.AdminKubeconfig(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}
