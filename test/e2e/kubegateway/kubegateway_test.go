// Package kubegateway tests a ReversiGateway end to end in one process: a real control plane
// (envtest), the controllers, a signed git registry, and `reversi gateway` started with the
// arguments of the rendered Deployment's container, the rendered gateway.yaml and a token of
// the rendered ServiceAccount (so its RBAC is the real one), fronting
// @modelcontextprotocol/server-memory (issue 9).
package kubegateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	fluxmeta "github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/gateway/auth"
	"github.com/reversi-gitops/reversi/internal/cli"
	"github.com/reversi-gitops/reversi/internal/podrun"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing/signingtest"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
	"github.com/reversi-gitops/reversi/test/flux"
	"github.com/reversi-gitops/reversi/test/syncbuf"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// memoryManifests are v1 of the registry: server-memory's tools, exposed as memory.<tool>.
const memoryManifests = `
- tool: memory.read_graph
  description: Read the whole knowledge graph.
  effect: read_only
  permission: memory:read
- tool: memory.create_entities
  description: Create entities.
  effect: compensable
  permission: memory:write
  compensation:
    tool: memory.delete_entities
    kind: compensation
    argument_map:
      name: $args.entities.0.name
- tool: memory.delete_entities
  description: Delete entities.
  effect: irreversible
  permission: memory:write
`

func parseManifests(t testing.TB, src string) []*manifest.Manifest {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	docs, errs := manifest.ReadPaths(p)
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Fatal(errs)
	}
	return ms
}

func eventually(t testing.TB, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var why string
	for time.Now().Before(deadline) {
		if why = cond(); why == "" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("after %s: %s", timeout, why)
}

func freePort(t testing.TB) int {
	t.Helper()
	port, err := podrun.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// saKubeconfig mints a token of the ServiceAccount (TokenRequest) and writes a kubeconfig
// using it; it returns the file and a rest.Config of the same identity.
func saKubeconfig(t testing.TB, env *testenv.Env, ns, sa string) (string, *rest.Config) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sa.kubeconfig")
	cfg, err := podrun.ServiceAccountKubeconfig(t.Context(), env.Config, ns, sa, p)
	if err != nil {
		t.Fatal(err)
	}
	return p, cfg
}

// world is a running end-to-end set-up: the control plane, the controllers, a signed git
// registry (v1: memoryManifests), a ReversiGateway "pay" in namespace "agents" and `reversi
// gateway` run as its container would, with an agent session connected (create_entities
// allowed under v1). Shared by TestReversiGatewayEndToEnd and BenchmarkPRToEnforcement.
type world struct {
	env          *testenv.Env
	k8s          client.Client
	ctx          context.Context
	ns           string
	must         func(error)
	key          signingtest.Key
	repo         *sourcetest.Repo
	regDir       string
	v1           []*manifest.Manifest
	cs           *mcp.ClientSession
	gwStatus     func() *v1alpha1.ReversiGateway
	annotations  func() map[string]string
	createEntity func(name string) *mcp.CallToolResult
	stopMgr      func()
	mgrDone      chan struct{}
	stop         func()
	stderr       *syncbuf.Buffer
	desired1     string
	// dataDir is the gateway's --data (its SQLite store; /var/lib/reversi in the pod).
	dataDir string
	// commit commits the repository (signed, with Flux); requestFetch asks for the new commit
	// at once, as a git webhook would: the registry's requestedAt annotation, or with Flux the
	// GitRepository's.
	commit       func(msg string) string
	requestFetch func()
}

// worldOptions change how startWorld delivers the registry.
type worldOptions struct {
	// flux: a real source-controller fetches the repository over `git http-backend` and
	// verifies each commit's SSH signature (GitRepository spec.verify), and the ManifestRegistry
	// consumes its artifact through spec.sourceRef with spec.verify.commit (issue 22).
	flux bool
	// manifests replaces memoryManifests as v1 of the registry (server-memory's tools).
	manifests string
	// notifications are the gateway's spec.notifications, and secrets Secrets created in the
	// namespace before it (the receivers' URLs and keys): the gateway is started with the
	// container's secretKeyRef env read from them, as the kubelet would.
	notifications []v1alpha1.GatewayNotification
	secrets       map[string]map[string][]byte
}

func startWorld(t testing.TB) *world { return startWorldWith(t, worldOptions{}) }

func startWorldWith(t testing.TB, o worldOptions) *world {
	env, err := testenv.Start(testenv.Options{Webhooks: true})
	if err != nil {
		t.Fatalf("control plane: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	k8s := env.Client
	if o.flux {
		// Before the manager starts: it watches the Flux kinds the API server serves then.
		flux.Start(t, env.Environment, flux.Options{SkipKustomize: true})
		if err := sourcev1.AddToScheme(env.Scheme); err != nil {
			t.Fatal(err)
		}
	}
	mgrCtx, stopMgr := context.WithCancel(context.Background())
	t.Cleanup(stopMgr)
	// One manager per test, several tests per process: controller names repeat.
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, WebhookServer: env.WebhookServer(),
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	// With the admission webhooks (issue 16): the gateway's runs are admitted because it runs
	// as the ServiceAccount of ReversiGateway pay, no --gateway-identity needed.
	if err := controllers.Setup(mgr, controllers.Options{AllowFileURLs: true, Webhooks: true,
		FluxArtifactHosts: []string{"127.0.0.1"}}); err != nil { // source-controller serves its storage on 127.0.0.1 here
		t.Fatal(err)
	}
	mgrDone := make(chan struct{})
	go func() { defer close(mgrDone); _ = mgr.Start(mgrCtx) }()

	ctx := t.Context()
	ns := "agents"
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))

	// The registry: a git repository of signed manifest versions.
	key := signingtest.NewKey(t)
	repo := sourcetest.NewRepo(t)
	regDir := filepath.Join(repo.Dir, "reg")
	src := memoryManifests
	if o.manifests != "" {
		src = o.manifests
	}
	v1 := parseManifests(t, src)
	_, err = registry.New(regDir).Publish(v1, manifest.Approved, registry.WriteOptions{By: "alice", Signer: key.Signer})
	must(err)
	commitKey := sourcetest.NewSSHKey(t)
	commit := repo.Commit
	if o.flux {
		commit = func(msg string) string { return repo.CommitSigned(msg, commitKey) }
	}
	commit("memory tools")

	// The agent's API key and the Secrets.
	entry, secret, err := auth.NewKey("agent-7", auth.Agent, nil, nil)
	must(err)
	keyFile, err := json.Marshal(auth.KeyFile{Keys: []auth.KeyEntry{entry}})
	must(err)
	for name, data := range map[string]map[string][]byte{
		"manifest-keys": {"alice.pem": key.PublicPEM},
		"gateway-keys":  {"keys.json": keyFile},
		"unrelated":     {"password": []byte("hunter2")},
		"commit-keys":   {"alice.sshpub": commitKey.AuthorizedKey},
	} {
		must(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}))
	}
	for name, data := range o.secrets {
		must(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}))
	}
	regSpec := v1alpha1.ManifestRegistrySpec{URL: repo.FileURL(), Ref: &v1alpha1.GitRef{Branch: "main"}, Path: "reg",
		Interval: &metav1.Duration{Duration: time.Hour},
		Verify:   &v1alpha1.RegistryVerification{ManifestKeysSecretRef: &v1alpha1.LocalObjectReference{Name: "manifest-keys"}}}
	requestFetch := func() {
		requestAt(t, ctx, k8s, &v1alpha1.ManifestRegistry{}, ns, "memory", v1alpha1.AnnotationRequestedAt)
	}
	if o.flux {
		srv := sourcetest.ServeHTTP(t, filepath.Dir(repo.Dir), sourcetest.HTTPAuth{})
		must(k8s.Create(ctx, &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "memory"},
			Spec: sourcev1.GitRepositorySpec{URL: srv.RepoURL(t, repo.Dir), Reference: &sourcev1.GitRepositoryRef{Branch: "main"},
				Interval: metav1.Duration{Duration: time.Hour}, Timeout: &metav1.Duration{Duration: 30 * time.Second},
				Verification: &sourcev1.GitRepositoryVerification{Mode: sourcev1.ModeGitHEAD, SecretRef: fluxmeta.LocalObjectReference{Name: "commit-keys"}}}}))
		regSpec.URL, regSpec.Ref = "", nil
		regSpec.SourceRef = &v1alpha1.SourceReference{Kind: v1alpha1.SourceKindGitRepository, Name: "memory"}
		regSpec.Verify.Commit = &v1alpha1.CommitVerification{Mode: v1alpha1.CommitVerifyHEAD, SecretRef: v1alpha1.LocalObjectReference{Name: "commit-keys"}}
		requestFetch = func() {
			requestAt(t, ctx, k8s, &sourcev1.GitRepository{}, ns, "memory", fluxmeta.ReconcileRequestAnnotation)
		}
	}
	must(k8s.Create(ctx, &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "memory"}, Spec: regSpec}))

	node, args, uenv := upstreams.Memory(t)
	var upEnv []v1alpha1.ValueFrom
	for _, kv := range uenv {
		k, v, _ := strings.Cut(kv, "=")
		upEnv = append(upEnv, v1alpha1.ValueFrom{Name: k, Value: v})
	}
	port := freePort(t)
	must(k8s.Create(ctx, &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pay"},
		Spec: v1alpha1.ReversiGatewaySpec{
			Mode: "enforce", Permissions: []string{"memory:read", "memory:write"}, Port: int32(port),
			Upstreams:            []v1alpha1.GatewayUpstream{{Name: "memory", Command: node, Args: args, Env: upEnv}},
			Manifests:            &v1alpha1.GatewayManifests{Registries: []string{"memory"}},
			TrustedKeysSecretRef: &v1alpha1.LocalObjectReference{Name: "manifest-keys"},
			Auth:                 &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-keys", Key: "keys.json"}},
			Notifications:        o.notifications,
		}}))

	gwStatus := func() *v1alpha1.ReversiGateway {
		gw := &v1alpha1.ReversiGateway{}
		must(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "pay"}, gw))
		return gw
	}
	var dep appsv1.Deployment
	eventually(t, 30*time.Second, func() string {
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "pay-gateway"}, &dep); err != nil {
			return err.Error()
		}
		if gw := gwStatus(); gw.Status.Manifests == nil || int(gw.Status.Manifests.Tools) != len(v1) {
			return fmt.Sprintf("status %+v", gw.Status)
		}
		return ""
	})

	// The ServiceAccount's RBAC, exactly: its keys and ConfigMaps by name, nothing else.
	kubeconfig, saCfg := saKubeconfig(t, env, ns, "pay-gateway")
	sa := kubernetes.NewForConfigOrDie(saCfg)
	if _, err := sa.CoreV1().Secrets(ns).Get(ctx, "manifest-keys", metav1.GetOptions{}); err != nil {
		t.Fatalf("the gateway cannot read its trusted keys: %v", err)
	}
	if _, err := sa.CoreV1().ConfigMaps(ns).Get(ctx, "pay-manifests", metav1.GetOptions{}); err != nil {
		t.Fatalf("the gateway cannot read its manifests: %v", err)
	}
	for what, err := range map[string]error{
		"get Secret unrelated":        second(sa.CoreV1().Secrets(ns).Get(ctx, "unrelated", metav1.GetOptions{})),
		"get Secret gateway-keys":     second(sa.CoreV1().Secrets(ns).Get(ctx, "gateway-keys", metav1.GetOptions{})),
		"list Secrets":                second(sa.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})),
		"get ConfigMap memory-manif…": second(sa.CoreV1().ConfigMaps(ns).Get(ctx, "memory-manifests", metav1.GetOptions{})),
		"list ConfigMaps":             second(sa.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})),
		"delete Pods":                 sa.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}),
		"get Pod pay-gateway-0":       second(sa.CoreV1().Pods(ns).Get(ctx, "pay-gateway-0", metav1.GetOptions{})),
		"patch Pod pay-gateway-0":     second(sa.CoreV1().Pods(ns).Patch(ctx, "pay-gateway-0", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})),
		"patch Lease pay-gateway-0":   second(sa.CoordinationV1().Leases(ns).Patch(ctx, "pay-gateway-0", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})), // no pod, no Lease, no rule
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s as the gateway's ServiceAccount: %v, want Forbidden", what, err)
		}
	}

	// The gateway's pod (envtest runs no kubelet: the test creates it and plays the Deployment
	// controller's status); it reports on the Lease the controller creates for it.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pay-gateway-0", Labels: dep.Spec.Template.Labels},
		Spec: corev1.PodSpec{ServiceAccountName: dep.Spec.Template.Spec.ServiceAccountName,
			Containers: []corev1.Container{{Name: "gateway", Image: dep.Spec.Template.Spec.Containers[0].Image}}}}
	must(k8s.Create(ctx, pod))
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	must(k8s.Status().Update(ctx, pod))
	dep.Status = appsv1.DeploymentStatus{ObservedGeneration: dep.Generation, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1, AvailableReplicas: 1}
	must(k8s.Status().Update(ctx, &dep))

	// `reversi gateway` as the container runs it: its args, the rendered gateway.yaml and key
	// file at local paths, POD_NAME, and the ServiceAccount's credentials.
	dir := t.TempDir()
	var cfgMap corev1.ConfigMap
	must(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "pay-config"}, &cfgMap))
	keysPath := filepath.Join(dir, "keys.json")
	must(os.WriteFile(keysPath, keyFile, 0o600))
	cfgPath := filepath.Join(dir, "gateway.yaml")
	gwYAML := strings.ReplaceAll(cfgMap.Data[controllers.GatewayConfigKey], controllers.GatewayAuthDir+"/"+controllers.GatewayAuthKey, keysPath)
	must(os.WriteFile(cfgPath, []byte(gwYAML), 0o600))
	dataDir := filepath.Join(dir, "data")
	argv := append([]string(nil), dep.Spec.Template.Spec.Containers[0].Args...)
	for i := range argv {
		switch {
		case i > 0 && argv[i-1] == "--config":
			argv[i] = cfgPath
		case i > 0 && argv[i-1] == "--data":
			argv[i] = dataDir
		}
	}
	t.Logf("reversi %s", strings.Join(argv, " "))
	t.Setenv("KUBECONFIG", kubeconfig)
	t.Setenv(controllers.PodNameEnv, "pay-gateway-0")
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		switch {
		case e.Name == controllers.ControllerKeysEnv:
			t.Setenv(e.Name, e.Value)
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil: // the receivers' URLs and keys, as the kubelet reads them
			var sec corev1.Secret
			must(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: e.ValueFrom.SecretKeyRef.Name}, &sec))
			t.Setenv(e.Name, string(sec.Data[e.ValueFrom.SecretKeyRef.Key]))
		}
	}
	gwCtx, stopGW := context.WithCancel(context.Background())
	stderr := &syncbuf.Buffer{}
	gwDone := make(chan error, 1)
	go func() {
		root := cli.NewRoot()
		root.SetArgs(argv)
		root.SetOut(&bytes.Buffer{})
		root.SetErr(stderr)
		gwDone <- root.ExecuteContext(gwCtx)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			stopGW()
			select {
			case err := <-gwDone:
				if err != nil {
					t.Errorf("gateway: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Error("the gateway did not stop")
			}
		})
	}
	t.Cleanup(func() { stop(); t.Logf("gateway stderr:\n%s", stderr.String()) })

	// annotations are the pod's report: the annotations of its Lease (nil while it has none).
	annotations := func() map[string]string {
		l := &coordinationv1.Lease{}
		err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "pay-gateway-0"}, l)
		if apierrors.IsNotFound(err) {
			return nil
		}
		must(err)
		return l.Annotations
	}
	desired1 := gwStatus().Status.Manifests.DesiredRevision
	eventually(t, 60*time.Second, func() string {
		select {
		case err := <-gwDone:
			t.Fatalf("the gateway exited: %v\n%s", err, stderr.String())
		default:
		}
		if a := annotations(); a[v1alpha1.AnnotationManifestDigest] != desired1 {
			return fmt.Sprintf("the pod's Lease annotations %v, want digest %s", a, desired1)
		}
		return ""
	})
	eventually(t, 20*time.Second, func() string {
		gw := gwStatus()
		c := apimetaReady(gw)
		if gw.Status.Manifests.LoadedReplicas != 1 || c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Sprintf("status %+v, Ready %+v", gw.Status.Manifests, c)
		}
		return ""
	})

	// An agent: v1 lets it create entities.
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: "http://127.0.0.1:" + strconv.Itoa(port) + "/mcp", HTTPClient: &http.Client{Transport: podrun.Bearer{Token: secret}}}, nil)
	must(err)
	t.Cleanup(func() { _ = cs.Close() })
	createEntity := func(name string) *mcp.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "memory.create_entities", Arguments: map[string]any{
			"entities": []any{map[string]any{"name": name, "entityType": "person", "observations": []any{"e2e"}}}}})
		must(err)
		return res
	}
	if res := createEntity("ada"); res.IsError {
		t.Fatalf("v1 allows memory.create_entities: %s", text(res))
	}
	return &world{env: env, k8s: k8s, ctx: ctx, ns: ns, must: must, key: key, repo: repo, regDir: regDir, v1: v1, cs: cs,
		gwStatus: gwStatus, annotations: annotations, createEntity: createEntity, stopMgr: stopMgr, mgrDone: mgrDone,
		stop: stop, stderr: stderr, desired1: desired1, dataDir: dataDir, commit: commit, requestFetch: requestFetch}
}

// requestAt sets the annotation (a requestedAt: reversi.dev's or Flux's) on the object to now,
// which makes its controller reconcile it at once.
func requestAt(t testing.TB, ctx context.Context, k8s client.Client, obj client.Object, ns, name, annotation string) {
	t.Helper()
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, obj); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	obj.SetAnnotations(map[string]string{annotation: time.Now().Format(time.RFC3339Nano)})
	if err := k8s.Patch(ctx, obj, patch); err != nil {
		t.Fatal(err)
	}
}

func TestReversiGatewayEndToEnd(t *testing.T) {
	w := startWorld(t)
	k8s, ctx, ns, must, key, regDir, v1 := w.k8s, w.ctx, w.ns, w.must, w.key, w.regDir, w.v1
	gwStatus, annotations, createEntity, stopMgr, mgrDone, stop, stderr, desired1 := w.gwStatus, w.annotations, w.createEntity, w.stopMgr, w.mgrDone, w.stop, w.stderr, w.desired1
	var err error

	// A merged PR: create_entities now needs memory:admin, which the gateway's scope lacks.
	v2 := parseManifests(t, strings.Replace(memoryManifests, "  permission: memory:write\n  compensation:", "  permission: memory:admin\n  compensation:", 1))
	_, err = registry.New(regDir).Publish(v2[1:2], manifest.Approved, registry.WriteOptions{By: "alice", Signer: key.Signer})
	must(err)
	w.commit("create_entities needs memory:admin")
	began := time.Now()
	w.requestFetch()
	var desired2 string
	eventually(t, 30*time.Second, func() string {
		desired2 = gwStatus().Status.Manifests.DesiredRevision
		if a := annotations(); desired2 == desired1 || a[v1alpha1.AnnotationManifestDigest] != desired2 {
			return fmt.Sprintf("pod serves %s, desired %s", a[v1alpha1.AnnotationManifestDigest], desired2)
		}
		return ""
	})
	res := createEntity("bob")
	latency := time.Since(began)
	t.Logf("commit → requestedAt → rendered → enforced by the running gateway: %s", latency.Round(time.Millisecond))
	if !res.IsError || !strings.Contains(text(res), "Blocked by Reversi") {
		t.Fatalf("v2 must block memory.create_entities: %s", text(res))
	}
	if latency > 5*time.Second {
		t.Errorf("the new rule took %s to be enforced, more than 5 s", latency)
	}

	// With the controller down, someone edits the rendering by hand: create_entities back to
	// memory:write, checksum and digest recomputed, the old signature kept. The gateway itself
	// refuses it and keeps enforcing v2.
	stopMgr()
	<-mgrDone
	var cm corev1.ConfigMap
	must(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "pay-manifests"}, &cm))
	b, err := bundle.Assemble([]map[string]string{cm.Data})
	must(err)
	loose, err := manifest.CanonicalJSON(v1[1])
	must(err)
	for i := range b.Entries {
		if b.Entries[i].Tool == "memory.create_entities" {
			b.Entries[i].Manifest = loose
			b.Entries[i].Checksum, err = manifest.Checksum(v1[1])
			must(err)
			b.Entries[i].Version = v1[1].Version
		}
	}
	shards, err := b.Shards(0)
	must(err)
	cm.Data = shards[0]
	must(k8s.Update(ctx, &cm))
	eventually(t, 10*time.Second, func() string {
		if a := annotations(); !strings.Contains(a[v1alpha1.AnnotationManifestError], "memory.create_entities") {
			return fmt.Sprintf("no refusal reported on the pod's Lease: %v", a)
		}
		return ""
	})
	// The refused reload is an alert, and an Event on the ReversiGateway (issue 24).
	eventually(t, 10*time.Second, func() string {
		var evs eventsv1.EventList
		must(k8s.List(ctx, &evs, client.InNamespace(ns)))
		for _, e := range evs.Items {
			if e.Regarding.Kind == "ReversiGateway" && e.Regarding.Name == "pay" && e.Reason == "ReloadRefused" &&
				e.Type == corev1.EventTypeWarning && e.ReportingController == "reversi-gateway" && strings.Contains(e.Note, "memory.create_entities") {
				return ""
			}
		}
		return "no ReloadRefused Event on ReversiGateway pay"
	})
	a := annotations()
	t.Logf("refused: %s", a[v1alpha1.AnnotationManifestError])
	if a[v1alpha1.AnnotationManifestDigest] != desired2 {
		t.Fatalf("the pod reports %s after a refused edit, want %s", a[v1alpha1.AnnotationManifestDigest], desired2)
	}
	if res := createEntity("eve"); !res.IsError || !strings.Contains(text(res), "Blocked by Reversi") {
		t.Fatalf("a hand-edited rendering loosened the rules: %s", text(res))
	}

	// An unsigned entry is refused the same way.
	for i := range b.Entries {
		b.Entries[i].Signature, b.Entries[i].KeyID = "", ""
	}
	shards, err = b.Shards(0)
	must(err)
	must(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "pay-manifests"}, &cm))
	cm.Data = shards[0]
	must(k8s.Update(ctx, &cm))
	eventually(t, 10*time.Second, func() string {
		if a := annotations(); !strings.Contains(a[v1alpha1.AnnotationManifestError], "not signed") {
			return fmt.Sprintf("no refusal of the unsigned rendering: %v", a)
		}
		return ""
	})
	if res := createEntity("mallory"); !res.IsError {
		t.Fatalf("an unsigned rendering loosened the rules: %s", text(res))
	}
	stop()
	if !strings.Contains(stderr.String(), "reload refused") {
		t.Errorf("no reload refusal on stderr:\n%s", stderr.String())
	}
}

func second[T any](_ T, err error) error { return err }

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func apimetaReady(gw *v1alpha1.ReversiGateway) *metav1.Condition {
	for i := range gw.Status.Conditions {
		if gw.Status.Conditions[i].Type == v1alpha1.ConditionReady {
			return &gw.Status.Conditions[i]
		}
	}
	return nil
}

// TestReversiGatewayWithFlux is delivery path 1 of issue 22: a real source-controller fetches
// the registry over `git http-backend` and verifies each commit's SSH signature, the
// ManifestRegistry consumes its artifact (spec.sourceRef, with spec.verify.commit), and the
// running gateway enforces what a signed commit says; an unsigned commit changes nothing.
func TestReversiGatewayWithFlux(t *testing.T) {
	w := startWorldWith(t, worldOptions{flux: true})
	k8s, ctx, ns, must := w.k8s, w.ctx, w.ns, w.must
	source := func() *sourcev1.GitRepository {
		gr := &sourcev1.GitRepository{}
		must(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "memory"}, gr))
		return gr
	}
	registryStatus := func() *v1alpha1.ManifestRegistry {
		reg := &v1alpha1.ManifestRegistry{}
		must(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "memory"}, reg))
		return reg
	}
	art := source().Status.Artifact
	reg := registryStatus()
	if reg.Status.Artifact == nil || reg.Status.Artifact.Revision != art.Revision || reg.Status.Artifact.SourceDigest != art.Digest {
		t.Fatalf("registry artifact %+v, want the GitRepository's revision %s and digest %s", reg.Status.Artifact, art.Revision, art.Digest)
	}
	if c := findCondition(reg.Status.Conditions, v1alpha1.ConditionSourceVerified); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("registry SourceVerified %+v, want True", c)
	}

	// A signed merge: create_entities needs memory:admin, which the gateway's scope lacks.
	v2 := parseManifests(t, strings.Replace(memoryManifests, "  permission: memory:write\n  compensation:", "  permission: memory:admin\n  compensation:", 1))
	_, err := registry.New(w.regDir).Publish(v2[1:2], manifest.Approved, registry.WriteOptions{By: "alice", Signer: w.key.Signer})
	must(err)
	head := w.commit("create_entities needs memory:admin")
	began := time.Now()
	w.requestFetch()
	eventually(t, 60*time.Second, func() string {
		d := w.gwStatus().Status.Manifests.DesiredRevision
		if a := w.annotations(); d == w.desired1 || a[v1alpha1.AnnotationManifestDigest] != d {
			return fmt.Sprintf("pod serves %s, desired %s", a[v1alpha1.AnnotationManifestDigest], d)
		}
		return ""
	})
	res := w.createEntity("bob")
	t.Logf("signed commit → GitRepository artifact → ManifestRegistry → enforced by the running gateway: %s", time.Since(began).Round(time.Millisecond))
	if !res.IsError || !strings.Contains(text(res), "Blocked by Reversi") {
		t.Fatalf("the signed v2 must block memory.create_entities: %s", text(res))
	}
	if got := registryStatus().Status.Artifact.Revision; got != "main@sha1:"+head {
		t.Fatalf("registry revision %s, want the signed head main@sha1:%s", got, head)
	}
	desired2 := w.gwStatus().Status.Manifests.DesiredRevision

	// An unsigned commit (the manifest itself signed by alice) loosens the rule again: Flux
	// refuses the commit, the registry keeps v2 and says why, the gateway keeps blocking.
	_, err = registry.New(w.regDir).Publish(w.v1[1:2], manifest.Approved, registry.WriteOptions{By: "alice", Signer: w.key.Signer})
	must(err)
	unsigned := w.repo.Commit("create_entities back to memory:write, unsigned")
	w.requestFetch()
	eventually(t, 60*time.Second, func() string {
		reg := registryStatus()
		c := findCondition(reg.Status.Conditions, v1alpha1.ConditionReady)
		sv := findCondition(reg.Status.Conditions, v1alpha1.ConditionSourceVerified)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonCommitVerificationFailed || !strings.Contains(c.Message, "GitRepository "+ns+"/memory") ||
			sv == nil || sv.Status != metav1.ConditionFalse {
			return fmt.Sprintf("registry Ready %+v, SourceVerified %+v (GitRepository %+v)", c, sv, source().Status.Conditions)
		}
		return ""
	})
	reg = registryStatus()
	t.Logf("unsigned commit %s refused: %s", unsigned[:12], findCondition(reg.Status.Conditions, v1alpha1.ConditionReady).Message)
	if reg.Status.Artifact.Revision != "main@sha1:"+head {
		t.Fatalf("after the unsigned commit the registry serves %s, want the signed main@sha1:%s", reg.Status.Artifact.Revision, head)
	}
	if d := w.gwStatus().Status.Manifests.DesiredRevision; d != desired2 {
		t.Fatalf("the gateway's desired rendering changed to %s after an unsigned commit", d)
	}
	if res := w.createEntity("mallory"); !res.IsError || !strings.Contains(text(res), "Blocked by Reversi") {
		t.Fatalf("an unsigned commit loosened the rule: %s", text(res))
	}
}

func findCondition(conds []metav1.Condition, t string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}
