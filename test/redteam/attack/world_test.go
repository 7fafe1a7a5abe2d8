// Package attack holds an outside reviewer's attacks on issue 15's chain of trust (commit →
// controller → rendering → gateway pod). Each test starts from a working system — a real
// control plane (envtest), the real reconcilers, real git repositories made with the git CLI,
// the gateway pod's own loader (gateway/kube) and a real SQLite store — and asserts what the
// security model (docs/security.md) promises; a failing test is an attack that works today.
//
// The reconcilers are called directly (no manager), so that nothing heals or races behind
// the test's back and no assertion depends on timing.
package attack

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/gateway/kube"
	"github.com/reversi-gitops/reversi/gateway/proxy"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing/signingtest"
)

var (
	env    *testenv.Env
	envErr error
)

func TestMain(m *testing.M) {
	e, err := testenv.Start()
	if err != nil {
		envErr = err
		os.Exit(m.Run())
	}
	env = e
	code := m.Run()
	_ = e.Stop()
	os.Exit(code)
}

// world is one namespace with the controller's key, one writer key (trusted by the gateway),
// and the three reconcilers.
type world struct {
	t      *testing.T
	ns     string
	ctl    *controllers.SigningKey
	writer signingtest.Key
	regs   *controllers.ManifestRegistryReconciler
	gws    *controllers.ReversiGatewayReconciler
	tms    *controllers.ToolManifestReconciler
}

// writerKeys is the Secret of trusted writer keys in every world namespace.
const writerKeys = "writer-keys"

func newWorld(t *testing.T) *world {
	t.Helper()
	if envErr != nil {
		t.Fatalf("control plane: %v", envErr)
	}
	ctl, err := controllers.EphemeralSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ctl: ctl, writer: signingtest.NewKey(t)}
	w.ns = w.namespace("w")
	w.regs = &controllers.ManifestRegistryReconciler{Client: env.Client, APIReader: env.Client, Key: ctl,
		AllowFileURLs: true, TempDir: t.TempDir()}
	w.gws = &controllers.ReversiGatewayReconciler{Client: env.Client, APIReader: env.Client, Key: ctl}
	w.tms = &controllers.ToolManifestReconciler{Client: env.Client}
	return w
}

// namespace makes a fresh namespace with the writer-keys Secret (also as the ToolManifest
// controller's reversi-trusted-keys).
func (w *world) namespace(prefix string) string {
	w.t.Helper()
	name := fmt.Sprintf("%s-%s-%d", prefix, strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(w.t.Name())), time.Now().UnixNano()%1000000)
	if len(name) > 60 {
		name = name[len(name)-60:]
	}
	name = strings.Trim(name, "-")
	w.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	w.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: "gateway-auth"}, Data: map[string][]byte{"keys.json": []byte(`{"keys":[]}`)}})
	for _, s := range []string{writerKeys, controllers.TrustedKeysSecret} {
		w.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: s}, Data: map[string][]byte{"w.pem": w.writer.PublicPEM}})
	}
	return name
}

func (w *world) create(obj client.Object) {
	w.t.Helper()
	if err := env.Client.Create(context.Background(), obj); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) get(ns, name string, obj client.Object) {
	w.t.Helper()
	if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, obj); err != nil {
		w.t.Fatalf("%T %s/%s: %v", obj, ns, name, err)
	}
}

// manifests parses YAML manifest documents.
func (w *world) manifests(yaml string) []*manifest.Manifest {
	w.t.Helper()
	docs, errs := manifest.ParseFile("m.yaml", []byte(yaml))
	ms, verrs := manifest.ValidateDocuments(docs)
	if len(errs)+len(verrs) > 0 {
		w.t.Fatal(errs, verrs)
	}
	return ms
}

// publish writes approved, writer-signed versions of ms into the registry folder dir.
func (w *world) publish(dir string, ms []*manifest.Manifest) {
	w.t.Helper()
	if _, err := registry.New(dir).Publish(ms, manifest.Approved, registry.WriteOptions{By: "alice", Signer: w.writer.Signer}); err != nil {
		w.t.Fatal(err)
	}
}

// Manifests of one tool, db.wipe: the strict version needs a DBA's approval, the loose one
// does not.
const (
	strictWipe = `
tool: db.wipe
description: Delete every row of a table.
effect: idempotent
permission: db:write
approval: { roles: [dba], quorum: 1 }
`
	looseWipe = `
tool: db.wipe
description: Delete every row of a table.
effect: idempotent
permission: db:write
`
)

// registrySpec is a ManifestRegistry of branch main of url at path reg.
func registrySpec(ns, name, url, format string) *v1alpha1.ManifestRegistry {
	reg := &v1alpha1.ManifestRegistry{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ManifestRegistrySpec{URL: url, Ref: &v1alpha1.GitRef{Branch: "main"}, Path: "reg", Format: format,
			Interval: &metav1.Duration{Duration: time.Hour}},
	}
	if format != v1alpha1.FormatPlain {
		reg.Spec.Verify = &v1alpha1.RegistryVerification{ManifestKeysSecretRef: &v1alpha1.LocalObjectReference{Name: writerKeys}}
	}
	return reg
}

// reconcileRegistry runs one reconcile of a registry and returns it with its Ready condition.
func (w *world) reconcileRegistry(ns, name string) (*v1alpha1.ManifestRegistry, *metav1.Condition) {
	w.t.Helper()
	if _, err := w.regs.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}}); err != nil {
		w.t.Fatalf("reconcile registry %s/%s: %v", ns, name, err)
	}
	reg := &v1alpha1.ManifestRegistry{}
	w.get(ns, name, reg)
	return reg, ready(reg.Status.Conditions)
}

// mustRender reconciles a registry and fails unless it is Ready=True.
func (w *world) mustRender(ns, name string) *v1alpha1.ManifestRegistry {
	w.t.Helper()
	reg, c := w.reconcileRegistry(ns, name)
	if c == nil || c.Status != metav1.ConditionTrue {
		w.t.Fatalf("registry %s/%s not ready: %+v", ns, name, c)
	}
	return reg
}

func ready(conds []metav1.Condition) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == v1alpha1.ConditionReady {
			return &conds[i]
		}
	}
	return nil
}

// gatewaySpec is an enforcing ReversiGateway that verifies writer signatures.
func gatewaySpec(ns, name string, m *v1alpha1.GatewayManifests) *v1alpha1.ReversiGateway {
	return &v1alpha1.ReversiGateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ReversiGatewaySpec{
			Mode:                 "enforce",
			Upstreams:            []v1alpha1.GatewayUpstream{{Name: "db", URL: "http://db-mcp.tools.svc:8080/mcp"}},
			Manifests:            m,
			TrustedKeysSecretRef: &v1alpha1.LocalObjectReference{Name: writerKeys},
			Auth:                 &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-auth", Key: "keys.json"}},
		},
	}
}

// reconcileGateway runs one reconcile of a gateway and returns it.
func (w *world) reconcileGateway(name string) *v1alpha1.ReversiGateway {
	w.t.Helper()
	if _, err := w.gws.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: w.ns, Name: name}}); err != nil {
		w.t.Fatalf("reconcile gateway %s: %v", name, err)
	}
	gw := &v1alpha1.ReversiGateway{}
	w.get(w.ns, name, gw)
	if testing.Verbose() {
		w.t.Logf("gateway %s: %+v", name, ready(gw.Status.Conditions))
	}
	return gw
}

// pod is a gateway pod's manifest loader (gateway/kube, as `reversi gateway --kube-configmap
// NS/<gw>-manifests --kube-trusted-keys writer-keys` runs it with $REVERSI_CONTROLLER_KEYS)
// and its SQLite store, which keeps the high-water marks across restarts.
type pod struct {
	w     *world
	km    *kube.Manifests
	store store.Store
	seen  string // what the last reload loaded
}

func (w *world) pod(gateway string) *pod {
	w.t.Helper()
	km, err := kube.WatchManifests(context.Background(), kube.ManifestOptions{Config: env.Config, Namespace: w.ns,
		ConfigMap: gateway + "-manifests", TrustedKeysSecret: writerKeys, ControllerKeys: w.ctl.Trust, Gateway: gateway, Debounce: time.Millisecond})
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(km.Close)
	st, err := store.OpenSQLite(filepath.Join(w.t.TempDir(), "data"), nil)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = st.Close() })
	return &pod{w: w, km: km, store: st}
}

// reload is what proxy.Gateway.Reload does before it swaps the engine: load and verify the
// rendering, then advance the high-water marks in the store. It waits until the pod's
// informers show a change from what the previous reload saw (the digest and the signed
// revision, which names each snapshot's sequence): the load then either fails (the rendering
// is refused) or returns other manifests or snapshots, whose marks the store advances or
// refuses.
func (p *pod) reload() (proxy.Loaded, error) {
	p.w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := p.km.Load(context.Background())
		if err != nil {
			p.seen = ""
			return l, err
		}
		if seen := digestOf(l.Manifests) + " " + l.Revision; seen != p.seen {
			p.seen = seen
			return l, p.store.AdvanceHighWater(context.Background(), l.Marks)
		}
		if time.Now().After(deadline) {
			p.w.t.Fatalf("the pod's informers never showed a rendering other than %s", p.seen)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// current loads the rendering as the pod's informers hold it now, without waiting for a change:
// for attacks the controller refused, so that nothing new was written.
func (p *pod) current() []*manifest.Manifest {
	p.w.t.Helper()
	l, err := p.km.Load(context.Background())
	if err != nil {
		p.w.t.Fatalf("the pod refuses the rendering it served: %v", err)
	}
	if err := p.store.AdvanceHighWater(context.Background(), l.Marks); err != nil {
		p.w.t.Fatalf("the pod's store refuses the rendering it served: %v", err)
	}
	return l.Manifests
}

// digestOf is the set digest of loaded manifests (what the gateway reports).
func digestOf(ms []*manifest.Manifest) string {
	b, err := bundle.FromManifests("", ms)
	if err != nil {
		return ""
	}
	return b.Digest()
}

// needsApproval reports whether the loaded db.wipe needs approval ("absent" when not loaded).
func needsApproval(ms []*manifest.Manifest, tool string) string {
	for _, m := range ms {
		if m.Tool == tool {
			if m.Approval.Required {
				return "approval required"
			}
			return "no approval"
		}
	}
	return "absent"
}

// configMapData reads a ConfigMap's data.
func (w *world) configMapData(ns, name string) map[string]string {
	w.t.Helper()
	var cm corev1.ConfigMap
	w.get(ns, name, &cm)
	return cm.Data
}

// editConfigMap replaces a ConfigMap's data as the ConfigMap-only attacker does (kubectl
// edit: field manager "kubectl-edit").
func (w *world) editConfigMap(ns, name string, data map[string]string) {
	w.t.Helper()
	var cm corev1.ConfigMap
	w.get(ns, name, &cm)
	cm.Data = data
	if err := env.Client.Update(context.Background(), &cm, client.FieldOwner("kubectl-edit")); err != nil {
		w.t.Fatal(err)
	}
}

// patchStatus merge-patches a registry's or gateway's status subresource, as someone with
// only `*/status` rights does.
func (w *world) patchStatus(obj client.Object, patch map[string]any) {
	w.t.Helper()
	raw, err := json.Marshal(map[string]any{"status": patch})
	if err != nil {
		w.t.Fatal(err)
	}
	if err := env.Client.Status().Patch(context.Background(), obj, client.RawPatch(types.MergePatchType, raw)); err != nil {
		w.t.Fatal(err)
	}
}
