package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/proxy"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/policy"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// ManifestOptions configure WatchManifests.
type ManifestOptions struct {
	// Config reaches the API server (in a pod: the ServiceAccount's token). Required.
	Config *rest.Config
	// Namespace and ConfigMap name shard 0 of the rendering (`<gateway>-manifests`); shards
	// 1… are `<ConfigMap>-1`, … as shard 0's `shards` says. Required.
	Namespace, ConfigMap string
	// TrustedKeysSecret names the Secret whose values are the Ed25519 public keys (PEM) every
	// manifest must be signed by. Empty: signatures are not checked, only each manifest's
	// checksum and the rendering's digest.
	TrustedKeysSecret string
	// ControllerKeys are the controller's public keys: every source of the rendering must
	// come with a snapshot they signed (the set, its revision and sequence), and the rendering
	// with a gateway snapshot of Gateway. Required with TrustedKeysSecret: writer signatures
	// alone do not bind the set.
	ControllerKeys *signing.TrustSet
	// Gateway is the ReversiGateway's name (in Namespace): the rendering must be its own.
	// Required with ControllerKeys.
	Gateway string
	// PodName is this pod (downward API): after each load the gateway writes the digest it
	// serves, or why it refused a rendering, as annotations on the coordination.k8s.io Lease
	// of this name in Namespace (the ReversiGateway controller creates it once it sees the
	// pod; until then the report is retried with backoff). Empty: no report.
	PodName string
	// SyncTimeout bounds the wait for the first list of each watched object (default 30 s).
	SyncTimeout time.Duration
	// Debounce lets the shards of one rendering arrive before a reload (default 100 ms).
	Debounce time.Duration
	// Logf receives what the watcher does (nil: nothing).
	Logf func(format string, args ...any)
}

// Manifests follows a gateway's rendered manifests through the API server: one informer per
// object (a watch with a field selector on its name, so the gateway's Role can name each
// object), never the kubelet's volume refresh, which takes a minute or more. Load assembles
// and verifies; Run reloads the gateway on every change and reports what it serves.
// Source: DESIGN.md "Gateway pods watch their ConfigMap and hot-reload; they verify the
// signatures again before they enforce anything"; issue 9.
type Manifests struct {
	o       ManifestOptions
	cs      kubernetes.Interface
	changed chan struct{}

	rep *reporter // nil without a PodName

	mu      sync.Mutex
	watches map[string]*watch // "configmaps/<name>" or "secrets/<name>"
	closed  bool
}

type watch struct {
	inf  toolscache.SharedIndexInformer
	stop chan struct{}
}

// WatchManifests starts the informers on shard 0 and the trusted-keys Secret (and on the
// other shards shard 0 names), and waits until each has listed. Errors: a missing option, a
// client that cannot be built, or an object that could not be listed in time (usually RBAC:
// the gateway's Role must allow get, list and watch on it by name).
func WatchManifests(ctx context.Context, o ManifestOptions) (*Manifests, error) {
	if o.Config == nil || o.Namespace == "" || o.ConfigMap == "" {
		return nil, errors.New("kube: Config, Namespace and ConfigMap are required")
	}
	if o.ControllerKeys != nil && o.Gateway == "" {
		return nil, errors.New("kube: the gateway's name is required to verify its rendering (--gateway-name)")
	}
	if o.TrustedKeysSecret != "" && o.ControllerKeys == nil {
		return nil, errors.New("kube: trusted manifest keys are set but no controller keys: without the controller's snapshot signatures the set of manifests, its revision and its order cannot be verified (a ReversiGateway's pods get them in $REVERSI_CONTROLLER_KEYS)")
	}
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = 30 * time.Second
	}
	if o.Debounce <= 0 {
		o.Debounce = 100 * time.Millisecond
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	cs, err := kubernetes.NewForConfig(o.Config)
	if err != nil {
		return nil, fmt.Errorf("kube: a client for the API server: %w", err)
	}
	m := &Manifests{o: o, cs: cs, changed: make(chan struct{}, 1), watches: map[string]*watch{}}
	if o.PodName != "" {
		m.rep = newReporter("Lease "+o.Namespace+"/"+o.PodName, m.writeLease, o.Logf)
	}
	if err := m.ensure(ctx, "configmaps", o.ConfigMap); err != nil {
		m.Close()
		return nil, err
	}
	if o.TrustedKeysSecret != "" {
		if err := m.ensure(ctx, "secrets", o.TrustedKeysSecret); err != nil {
			m.Close()
			return nil, err
		}
	}
	if _, err := m.shards(ctx); err != nil && !errors.Is(err, errIncomplete) {
		m.Close()
		return nil, err
	}
	return m, nil
}

// ensure starts the informer of one object unless it runs, and waits until it has listed.
func (m *Manifests) ensure(ctx context.Context, resource, name string) error {
	key := resource + "/" + name
	m.mu.Lock()
	w, ok := m.watches[key]
	if !ok {
		var obj k8sruntime.Object = &corev1.ConfigMap{}
		if resource == "secrets" {
			obj = &corev1.Secret{}
		}
		lw := toolscache.NewListWatchFromClient(m.cs.CoreV1().RESTClient(), resource, m.o.Namespace, fields.OneTermEqualSelector("metadata.name", name))
		w = &watch{inf: toolscache.NewSharedIndexInformer(lw, obj, 0, toolscache.Indexers{}), stop: make(chan struct{})}
		notify := func(any) { m.notify() }
		_, _ = w.inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: notify, UpdateFunc: func(_, _ any) { m.notify() }, DeleteFunc: notify})
		_ = w.inf.SetWatchErrorHandler(func(_ *toolscache.Reflector, err error) {
			m.o.Logf("reversi-gateway: watching %s %s/%s: %v", resource, m.o.Namespace, name, err)
		})
		m.watches[key] = w
		go w.inf.Run(w.stop)
	}
	m.mu.Unlock()
	if w.inf.HasSynced() {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, m.o.SyncTimeout)
	defer cancel()
	if !toolscache.WaitForCacheSync(sctx.Done(), w.inf.HasSynced) {
		return fmt.Errorf("kube: %s %s/%s was not listed within %s: check the gateway's RBAC (get, list, watch on %s named %s)", resource, m.o.Namespace, name, m.o.SyncTimeout, resource, name)
	}
	return nil
}

func (m *Manifests) notify() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// get returns the cached object (nil when it does not exist).
func (m *Manifests) get(resource, name string) any {
	m.mu.Lock()
	w := m.watches[resource+"/"+name]
	m.mu.Unlock()
	if w == nil {
		return nil
	}
	obj, ok, err := w.inf.GetStore().GetByKey(m.o.Namespace + "/" + name)
	if err != nil || !ok {
		return nil
	}
	return obj
}

var errIncomplete = errors.New("incomplete rendering")

func shardName(base string, i int) string {
	if i == 0 {
		return base
	}
	return base + "-" + strconv.Itoa(i)
}

// shards returns the data of every shard shard 0 names, starting informers for shards not
// watched yet and stopping those of shards no longer named.
func (m *Manifests) shards(ctx context.Context) ([]map[string]string, error) {
	first, _ := m.get("configmaps", m.o.ConfigMap).(*corev1.ConfigMap)
	if first == nil {
		return nil, fmt.Errorf("%w: ConfigMap %s/%s does not exist: the ReversiGateway controller renders it", errIncomplete, m.o.Namespace, m.o.ConfigMap)
	}
	n, err := strconv.Atoi(first.Data[bundle.KeyShards])
	if err != nil || n < 1 || n > 1000 {
		return nil, fmt.Errorf("ConfigMap %s/%s: shard count %q is not a number from 1 to 1000: it was not rendered by the controller", m.o.Namespace, m.o.ConfigMap, first.Data[bundle.KeyShards])
	}
	out := []map[string]string{first.Data}
	for i := 1; i < n; i++ {
		name := shardName(m.o.ConfigMap, i)
		if err := m.ensure(ctx, "configmaps", name); err != nil {
			return nil, err
		}
		cm, _ := m.get("configmaps", name).(*corev1.ConfigMap)
		if cm == nil {
			return nil, fmt.Errorf("%w: shard %d of %d (ConfigMap %s/%s) is missing", errIncomplete, i, n, m.o.Namespace, name)
		}
		out = append(out, cm.Data)
	}
	m.mu.Lock()
	for key, w := range m.watches {
		name, ok := strings.CutPrefix(key, "configmaps/"+m.o.ConfigMap+"-")
		if i, err := strconv.Atoi(name); ok && err == nil && i >= n {
			close(w.stop)
			delete(m.watches, key)
		}
	}
	m.mu.Unlock()
	return out, nil
}

// trust reads the trusted keys from the cached Secret; nil when none are configured. A
// configured Secret that is missing or unusable is an error (fail closed).
func (m *Manifests) trust() (*signing.TrustSet, error) {
	if m.o.TrustedKeysSecret == "" {
		return nil, nil
	}
	s, _ := m.get("secrets", m.o.TrustedKeysSecret).(*corev1.Secret)
	if s == nil {
		return nil, fmt.Errorf("trusted keys Secret %s/%s does not exist: nothing can be verified, so nothing is loaded", m.o.Namespace, m.o.TrustedKeysSecret)
	}
	keys := make([]string, 0, len(s.Data))
	for k := range s.Data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var pem []byte
	for _, k := range keys {
		pem = append(append(pem, s.Data[k]...), '\n')
	}
	t, err := signing.ParseTrustSet(pem)
	if err != nil {
		return nil, fmt.Errorf("trusted keys Secret %s/%s: %w", m.o.Namespace, m.o.TrustedKeysSecret, err)
	}
	return t, nil
}

// Load is the gateway's proxy.LoadFunc: it assembles the cached shards (refusing a missing,
// repeated or mixed shard, an unknown key, and a digest that does not match the entries) and
// verifies everything (bundle.Verify: every entry's checksum, manifest and writer signature,
// every source's snapshot signed by the controller over exactly its entries, the set as a
// whole). It returns the manifests with one high-water mark per snapshot (the gateway refuses
// a snapshot older than one it served) and the revision the snapshots name, only when all of
// it passes, else every problem at once.
func (m *Manifests) Load(ctx context.Context) (proxy.Loaded, error) {
	data, err := m.shards(ctx)
	if err != nil {
		return proxy.Loaded{}, err
	}
	b, err := bundle.Assemble(data)
	if err != nil {
		return proxy.Loaded{}, fmt.Errorf("ConfigMap %s/%s: %w", m.o.Namespace, m.o.ConfigMap, err)
	}
	trust, err := m.trust()
	if err != nil {
		return proxy.Loaded{}, err
	}
	var v bundle.Verified
	var errs []error
	if m.o.ControllerKeys != nil {
		v, errs = b.VerifyGatewayAll(bundle.GatewaySource(m.o.Namespace, m.o.Gateway), trust, m.o.ControllerKeys, time.Now())
	} else {
		v, errs = b.VerifyAll(trust, nil)
	}
	var set *policy.Set
	if len(errs) == 0 && len(v.Policies) > 0 {
		set, errs = policy.Compile(v.Policies)
	}
	if len(errs) > 0 {
		return proxy.Loaded{}, fmt.Errorf("ConfigMap %s/%s was refused: %w", m.o.Namespace, m.o.ConfigMap, errors.Join(errs...))
	}
	l := proxy.Loaded{Manifests: v.Manifests, Policy: set}
	if m.o.ControllerKeys != nil { // verified snapshots only: nothing unsigned is shown or kept
		l.Revision = b.Revision()
		l.Marks = marks(b)
	}
	return l, nil
}

// marks are the high-water marks of a verified rendering: one per snapshot, and one per
// Registry snapshot's writer index. Their digests cover the policies the snapshots bind and
// enforce (Snapshot.MarkDigest), so a policy-only change cannot be rolled back at one sequence.
func marks(b bundle.Bundle) []store.HighWater {
	var out []store.HighWater
	for _, ss := range b.Snapshots {
		s := ss.Snapshot
		out = append(out, store.HighWater{Source: s.Source, Sequence: s.Sequence, Revision: s.Revision, Digest: s.MarkDigest()})
		if name := s.IndexMark(); name != "" {
			out = append(out, store.HighWater{Source: name, Sequence: s.Index.Sequence, Revision: s.Revision, Digest: s.MarkDigest()})
		}
	}
	return out
}

// Target is the gateway Run reloads: *proxy.Gateway.
type Target interface {
	Reload(ctx context.Context) proxy.ReloadResult
	Digest() string
	Revision() string
}

// Run reports what gw serves now, then reloads gw after every change of a watched object
// (debounced) until ctx ends, and reports the digest and revision it serves (or why the
// rendering was refused) on the pod's Lease, retrying in the background until each latest
// report is written. A refused rendering leaves gw serving the previous manifests
// (proxy.Gateway.Reload journals reload_failed).
func (m *Manifests) Run(ctx context.Context, gw Target) {
	if m.rep != nil {
		go m.rep.run(ctx)
	}
	m.report(gw.Digest(), gw.Revision(), nil)
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.changed:
		}
		select { // let the rest of a rendering's shards arrive
		case <-ctx.Done():
			return
		case <-time.After(m.o.Debounce):
		}
		select {
		case <-m.changed:
		default:
		}
		res := gw.Reload(ctx)
		if res.Err == nil && res.Changed {
			m.o.Logf("reversi-gateway: serving %d manifests, digest %s (%s)", res.Tools, res.Checksum, gw.Revision())
		}
		m.report(res.Checksum, gw.Revision(), res.Err)
	}
}

// report hands what gw serves now to the reporter (nothing without a PodName).
func (m *Manifests) report(digest, revision string, loadErr error) {
	if m.rep != nil {
		m.rep.set(newReport(digest, revision, loadErr))
	}
}

// writeLease writes r on the pod's Lease (coordination.k8s.io/v1, named PodName, in
// Namespace; the ReversiGateway controller creates it and grants this pod patch on it by
// name): the manifest annotations (a refusal's is removed after a successful load), the
// notification annotations (removed when r has no summary, the last dead letter when there is
// none),
// spec.holderIdentity (the pod's name) and spec.renewTime (now, in microseconds), in one merge
// patch. Errors: the API server's (NotFound or Forbidden until the controller has seen the
// pod); the reporter retries.
func (m *Manifests) writeLease(ctx context.Context, r report) error {
	patch, err := leasePatch(m.o.PodName, r, time.Now())
	if err != nil {
		return err
	}
	_, err = m.cs.CoordinationV1().Leases(m.o.Namespace).Patch(ctx, m.o.PodName, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// leasePatch is the merge patch of a report on the Lease of pod at now.
func leasePatch(pod string, r report, now time.Time) ([]byte, error) {
	orNull := func(s string) any { // null removes the annotation
		if s == "" {
			return nil
		}
		return s
	}
	var dead, retrying any
	if r.notes.reported {
		dead, retrying = strconv.Itoa(r.notes.dead), strconv.Itoa(r.notes.retrying)
	}
	return json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{
			v1alpha1.AnnotationManifestDigest:        r.digest,
			v1alpha1.AnnotationManifestRevision:      r.revision,
			v1alpha1.AnnotationManifestError:         orNull(r.loadErr),
			v1alpha1.AnnotationNotificationsDead:     dead,
			v1alpha1.AnnotationNotificationsRetrying: retrying,
			v1alpha1.AnnotationNotificationsLastDead: orNull(r.notes.lastDead),
		}},
		"spec": map[string]any{"holderIdentity": pod, "renewTime": metav1.NewMicroTime(now)},
	})
}

// Close stops every informer.
func (m *Manifests) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.closed = true
	for key, w := range m.watches {
		close(w.stop)
		delete(m.watches, key)
	}
}
