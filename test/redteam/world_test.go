package redteam

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/gateway/auth"
	"github.com/reversi-gitops/reversi/internal/podrun"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// Names of the world.
const (
	ns        = "agents"
	systemNS  = "reversi-system"
	memoryReg = "memory" // the gateway's registry (format Registry)
	otherReg  = "other"  // another registry in the namespace, not used by the gateway
	payGW     = "pay"
	attacker  = "mallory" // the ConfigMap-only identity, and the field manager of its writes

	// signingKeySecret is where the controller keeps its snapshot signing key (issue 15).
	signingKeySecret = systemNS + "/reversi-controller-signing-key"
)

// Reasons, event reasons and annotations of issue 15 (design15.md). Strings, not the API's
// constants: the tests are written against the design, before the fixes add them.
const (
	reasonRevisionNotDescendant    = "RevisionNotDescendant"
	reasonCommitVerificationFailed = "CommitVerificationFailed"
	reasonSourceTooLarge           = "SourceTooLarge"
	reasonInvalidSpec              = "InvalidSpec"
	eventRenderingDrift            = "RenderingDrift"
	eventRevisionOverrideAccepted  = "RevisionOverrideAccepted"
	eventTagSkipped                = "TagSkipped"
	annotationAcceptRevision       = "reversi.dev/accept-revision"
)

// The manifests. v1 of memory.create_entities needs no approval; v2 (a later signed commit)
// needs finance's. memory.delete_entities is defined only by the other registry, with no
// approval at all.
const (
	memoryV1 = `- tool: memory.read_graph
  description: Read the whole knowledge graph.
  effect: read_only
  permission: memory:read
- tool: memory.create_entities
  description: Create entities (existing names are left alone).
  effect: idempotent
  permission: memory:write
`
	createEntitiesV2 = `- tool: memory.create_entities
  description: Create entities (existing names are left alone). Finance signs off on each call.
  effect: idempotent
  permission: memory:write
  approval: {roles: [finance], quorum: 1, timeout: 30m}
`
	otherManifests = `- tool: memory.delete_entities
  description: Delete entities and their relations.
  effect: idempotent
  permission: memory:write
  approval: never
`
)

// The calls the agent makes.
var (
	createArgs = map[string]any{"entities": []any{map[string]any{"name": "acme-corp", "entityType": "customer", "observations": []any{"signed 2026-11"}}}}
	deleteArgs = map[string]any{"entityNames": []any{"nobody"}}
)

// reversiBin is bin/reversi, built once for the test binary (TestMain).
var reversiBin string

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard()) // the test's own clients log nothing
	dir, err := os.MkdirTemp("", "redteam-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	reversiBin = filepath.Join(dir, "reversi")
	if err := podrun.Build(context.Background(), testenv.Root, reversiBin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// controllerArgs is the controller's command line, in one place: the admin kubeconfig, no
// webhooks, no metrics or probes, checkouts in tempDir, and the controller's snapshot
// signing key once the binary has the flag (issue 15). No test gives it --allow-file-urls:
// every repository is served over HTTP, and the file:// test expects a refusal.
func controllerArgs(kubeconfig, tempDir string) []string {
	args := []string{"controller", "--kubeconfig", kubeconfig, "--webhooks=false",
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--temp-dir", tempDir}
	if controllerHasFlag("--signing-key-secret") {
		args = append(args, "--signing-key-secret", signingKeySecret)
	}
	return args
}

var controllerHelp = sync.OnceValue(func() string {
	out, _ := exec.Command(reversiBin, "controller", "--help").CombinedOutput()
	return string(out)
})

func controllerHasFlag(flag string) bool { return strings.Contains(controllerHelp(), flag+" ") }

// world is the running system every attack starts from: envtest, the controller process, a
// signed git registry served over HTTP, a ReversiGateway and its gateway process (run as the
// rendered Deployment's container), an agent session, and the ConfigMap-only identity.
type world struct {
	ctx     context.Context
	dir     string
	env     *testenv.Env
	k8s     client.Client // admin
	mallory client.Client // may do anything to ConfigMaps in ns, nothing else
	admin   string        // the admin kubeconfig
	kubelet *podrun.Kubelet

	controller *podrun.Process
	ctrlTemp   string
	// controllerFlags are added after controllerArgs (the approvals world serves webhooks).
	controllerFlags []string

	writerKey string             // the registry writer's Ed25519 private key (reversi keygen)
	committer *sourcetest.SSHKey // signs commits and tags; trusted by Secret committers
	agentKey  string             // the agent's API key
	auditKey  string             // an auditor's API key (for /metrics)

	memory *gitRegistry
	other  *gitRegistry
	pay    *gateway

	// The renderings of v1 (before v2 was pushed), saved as an attacker with read access
	// would have saved them.
	v1Registry, v1Gateway map[string]string
	// good is what the registries rendered last when all was well (reset compares with it).
	good map[string]map[string]string
}

// gitRegistry is a git repository served over HTTP and the ManifestRegistry reading it.
type gitRegistry struct {
	name string
	repo *sourcetest.Repo
	url  string
	path string // spec.path
	v1   string // the commit of v1 (create_entities without approval)
}

// createKeySecrets makes the Secrets of the world's keys in ns: manifest-keys (the writer's
// public key), committers (the committer's SSH key) and gateway-keys (the API key file).
func (w *world) createKeySecrets(t *testing.T, writerPub, keyFile []byte) {
	for name, data := range map[string]map[string][]byte{
		"manifest-keys": {"platform.pem": writerPub},
		"committers":    {"platform.sshpub": w.committer.AuthorizedKey},
		"gateway-keys":  {"keys.json": keyFile},
	} {
		must(t, w.k8s.Create(w.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}))
	}
}

// newControlPlane starts envtest with o, the admin kubeconfig, the kubelet and the
// namespaces: the start of every world.
func newControlPlane(t *testing.T, o testenv.Options) *world {
	w := &world{ctx: t.Context(), dir: t.TempDir()}
	env, err := testenv.Start(o)
	if err != nil {
		t.Fatalf("control plane: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	w.env, w.k8s = env, env.Client
	if w.admin, err = env.AdminKubeconfig(w.dir); err != nil {
		t.Fatal(err)
	}
	w.kubelet = &podrun.Kubelet{Client: w.k8s, Config: env.Config, Dir: filepath.Join(w.dir, "pods"),
		BaseEnv: []string{"PATH=" + os.Getenv("PATH"), "HOME=" + w.dir}}
	must(t, os.MkdirAll(w.kubelet.Dir, 0o700))
	for _, n := range []string{ns, systemNS} {
		must(t, w.k8s.Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}))
	}
	return w
}

func newWorld(t *testing.T) *world {
	w := newControlPlane(t, testenv.Options{})
	var err error
	w.mallory = w.configMapOnlyClient(t)

	// Keys: the registry writer's (reversi keygen), the committer's SSH key, the API keys.
	w.reversi(t, w.dir, "keygen", filepath.Join(w.dir, "writer"))
	w.writerKey = filepath.Join(w.dir, "writer.key")
	writerPub, err := os.ReadFile(filepath.Join(w.dir, "writer.pub"))
	must(t, err)
	w.committer = sourcetest.NewSSHKey(t)
	agent, agentKey, err := auth.NewKey("agent-7", auth.Agent, nil, nil)
	must(t, err)
	auditor, auditKey, err := auth.NewKey("auditor-1", auth.Auditor, nil, nil)
	must(t, err)
	w.agentKey, w.auditKey = agentKey, auditKey
	keyFile, err := json.Marshal(auth.KeyFile{Keys: []auth.KeyEntry{agent, auditor}})
	must(t, err)
	w.createKeySecrets(t, writerPub, keyFile)

	// The registries: v1 of memory, and the other registry.
	w.memory = w.newGitRegistry(t, memoryReg, "registry")
	w.publish(t, w.memory, memoryV1, "approved")
	w.memory.v1 = w.memory.repo.CommitSigned("memory tools: read the graph, create entities", w.committer)
	w.other = w.newGitRegistry(t, otherReg, "registry")
	w.publish(t, w.other, otherManifests, "approved")
	w.other.repo.CommitSigned("delete entities, no approval", w.committer)

	w.ctrlTemp = filepath.Join(w.dir, "checkouts")
	must(t, os.MkdirAll(w.ctrlTemp, 0o700))
	w.startController(t)
	t.Cleanup(func() { w.controller.Stop() })

	for _, r := range []*gitRegistry{w.memory, w.other} {
		w.createRegistry(t, r, v1alpha1.FormatRegistry, &v1alpha1.GitRef{Branch: "main"}, &v1alpha1.RegistryVerification{
			ManifestKeysSecretRef: &v1alpha1.LocalObjectReference{Name: "manifest-keys"},
			Commit:                &v1alpha1.CommitVerification{Mode: "HEAD", SecretRef: v1alpha1.LocalObjectReference{Name: "committers"}}})
	}
	for _, r := range []*gitRegistry{w.memory, w.other} {
		w.waitReady(t, r.name, 60*time.Second)
	}
	w.pay = w.startGateway(t, payGW, memoryReg, &v1alpha1.LocalObjectReference{Name: "manifest-keys"})

	// v1 serves: create_entities needs no approval. Save the renderings an attacker would keep.
	if text, isErr := w.pay.call(t, "memory.create_entities", createArgs); isErr {
		t.Fatalf("under v1, memory.create_entities was refused: %s", text)
	}
	w.v1Registry = w.configMap(t, memoryReg+"-manifests").Data
	w.v1Gateway = w.configMap(t, payGW+"-manifests").Data

	// v2: a later signed commit; create_entities needs finance's approval. Published as a
	// draft and approved, as a team does.
	w.publish(t, w.memory, createEntitiesV2, "draft")
	w.reversi(t, w.memory.repo.Dir, "manifests", "approve", "memory.create_entities", "--registry", w.memory.path,
		"--by", "finance-lead", "--key", w.writerKey, "--note", "finance approves each call")
	w.memory.repo.CommitSigned("memory.create_entities: finance approves each call", w.committer)
	w.reconcile(t, memoryReg)
	if err := podrun.Poll(w.ctx, 30*time.Second, func() string {
		if text, isErr := w.pay.call(t, "memory.create_entities", createArgs); !isErr || !strings.Contains(text, "requires approval") {
			return "memory.create_entities is not held for approval yet: " + oneLine(text)
		}
		return ""
	}); err != nil {
		t.Fatalf("v2 was not enforced: %v", err)
	}
	must(t, w.pay.settled(t, memoryReg))
	w.good = map[string]map[string]string{}
	for _, name := range []string{memoryReg, otherReg} {
		w.good[name] = w.configMap(t, name+"-manifests").Data
	}
	return w
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// configMapOnlyClient is a user minted by envtest, bound to a Role with every verb on
// configmaps in ns and nothing else.
func (w *world) configMapOnlyClient(t *testing.T) client.Client {
	kubeconfig, err := w.env.UserKubeconfig(w.dir, attacker)
	must(t, err)
	must(t, w.k8s.Create(w.ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "configmap-editor"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"*"}}}}))
	must(t, w.k8s.Create(w.ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "configmap-editor"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "configmap-editor"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: attacker}}}))
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	must(t, err)
	c, err := client.New(cfg, client.Options{Scheme: w.env.Scheme})
	must(t, err)
	return c
}

// reversi runs the reversi binary in dir and returns its output; it fails the test on error.
func (w *world) reversi(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(w.ctx, reversiBin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("reversi %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// newGitRegistry makes a repository served over smart HTTP (git http-backend on 127.0.0.1),
// with partial clone filters allowed.
func (w *world) newGitRegistry(t *testing.T, name, path string) *gitRegistry {
	repo := sourcetest.NewRepo(t)
	repo.Git("config", "uploadpack.allowFilter", "true")
	srv := sourcetest.ServeHTTP(t, filepath.Dir(repo.Dir), sourcetest.HTTPAuth{})
	return &gitRegistry{name: name, repo: repo, url: srv.RepoURL(t, repo.Dir), path: path}
}

// publish adds the manifests to the registry folder of r with `reversi manifests publish`,
// signed by the writer key (not committed).
func (w *world) publish(t testing.TB, r *gitRegistry, manifests, status string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "manifests.yaml")
	must(t, os.WriteFile(f, []byte(manifests), 0o600))
	w.reversi(t, r.repo.Dir, "manifests", "publish", f, "--registry", r.path, "--by", "platform-team",
		"--key", w.writerKey, "--status", status, "--note", "reviewed")
}

// startController runs `reversi controller` as its own process.
func (w *world) startController(t testing.TB) {
	t.Helper()
	args := append(controllerArgs(w.admin, w.ctrlTemp), w.controllerFlags...)
	p, err := podrun.Start("controller", reversiBin, args, os.Environ(), filepath.Join(w.dir, "controller.log"))
	must(t, err)
	w.controller = p
}

// stopController stops the controller process (nothing re-renders until startController).
func (w *world) stopController() { w.controller.Stop() }

func (w *world) createRegistry(t testing.TB, r *gitRegistry, format string, ref *v1alpha1.GitRef, verify *v1alpha1.RegistryVerification) {
	t.Helper()
	must(t, w.k8s.Create(w.ctx, &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: r.name},
		Spec: v1alpha1.ManifestRegistrySpec{URL: r.url, Ref: ref, Path: r.path, Format: format,
			Interval: &metav1.Duration{Duration: time.Hour}, Verify: verify}}))
}

// gateway is a ReversiGateway whose pod the test plays: the gateway process runs the rendered
// container (args, env) with the pod's volumes in local folders; its data folder (sqlite)
// survives restarts.
type gateway struct {
	w         *world
	name      string
	port      int
	pod       *corev1.Pod
	proc      *podrun.Process
	container *podrun.Container
	agent     *mcp.ClientSession
}

// startGateway applies a ReversiGateway in enforce mode fronting server-memory with the
// manifests of registry, waits for its rendering, plays its pod and connects the agent.
func (w *world) startGateway(t *testing.T, name, registry string, trusted *v1alpha1.LocalObjectReference) *gateway {
	g := &gateway{w: w, name: name}
	var err error
	if g.port, err = podrun.FreePort(); err != nil {
		t.Fatal(err)
	}
	node, args, uenv := upstreams.MemoryAt(t, filepath.Join(w.dir, name+"-memory.jsonl"))
	var upEnv []v1alpha1.ValueFrom
	for _, kv := range uenv {
		k, v, _ := strings.Cut(kv, "=")
		upEnv = append(upEnv, v1alpha1.ValueFrom{Name: k, Value: v})
	}
	m := &v1alpha1.GatewayManifests{Registries: []string{registry}}
	if w.registry(t, registry).Spec.Format == v1alpha1.FormatPlain {
		m.PlainRegistries = []string{registry} // its manifests carry no writer signature: accepted on purpose
	}
	must(t, w.k8s.Create(w.ctx, &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ReversiGatewaySpec{
			Mode: "enforce", Permissions: []string{"memory:read", "memory:write"}, Port: int32(g.port),
			Upstreams:            []v1alpha1.GatewayUpstream{{Name: "memory", Command: node, Args: args, Env: upEnv}},
			Manifests:            m,
			TrustedKeysSecretRef: trusted,
			Auth:                 &v1alpha1.GatewayAuth{KeysSecretRef: &v1alpha1.SecretKeyReference{Name: "gateway-keys", Key: "keys.json"}},
		}}))
	var dep appsv1.Deployment
	if err := podrun.Poll(w.ctx, 60*time.Second, func() string {
		if err := w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: name + "-gateway"}, &dep); err != nil {
			return "Deployment " + name + "-gateway: " + err.Error()
		}
		if gw := w.reversiGateway(t, name); gw.Status.Manifests == nil || gw.Status.Manifests.DesiredRevision == "" {
			return "ReversiGateway " + name + " has no desired manifests yet: " + conditionText(gw.Status.Conditions)
		}
		return ""
	}); err != nil {
		t.Fatal(err)
	}
	if g.pod, err = w.kubelet.CreatePod(w.ctx, &dep, name+"-gateway-0"); err != nil {
		t.Fatal(err)
	}
	g.start(t)
	t.Cleanup(g.stop)
	g.waitServing(t, w.reversiGateway(t, name).Status.Manifests.DesiredRevision)
	g.connect(t)
	return g
}

// start runs the gateway container as a process (volumes, env and args resolved anew).
func (g *gateway) start(t testing.TB) {
	t.Helper()
	p, c, err := g.w.kubelet.Start(g.w.ctx, g.pod, g.pod.Spec.Containers[0].Name, reversiBin, "gateway-"+g.name)
	must(t, err)
	g.proc, g.container = p, c
}

// dataDir is the local folder of the pod's data volume (the sqlite store).
func (g *gateway) dataDir() string { return g.container.Mounts[controllers.GatewayDataDir] }

func (g *gateway) stop() {
	if g.agent != nil {
		_ = g.agent.Close()
		g.agent = nil
	}
	if g.proc != nil {
		g.proc.Stop()
	}
}

// waitServing waits until the pod reports serving digest (on its Lease).
func (g *gateway) waitServing(t testing.TB, digest string) {
	t.Helper()
	if err := podrun.Poll(g.w.ctx, 60*time.Second, func() string {
		if exited, err := g.proc.Exited(); exited {
			return fmt.Sprintf("the gateway process exited (%v): %s", err, g.proc.Tail(2048))
		}
		if d := g.leaseAnnotation(t, v1alpha1.AnnotationManifestDigest); d != digest {
			return fmt.Sprintf("pod %s reports digest %q on its Lease, want %s", g.pod.Name, d, digest)
		}
		return ""
	}); err != nil {
		t.Fatal(err)
	}
}

func (g *gateway) endpoint() string { return "http://127.0.0.1:" + strconv.Itoa(g.port) }

// connect opens the agent's session (a new one after a restart).
func (g *gateway) connect(t testing.TB) {
	t.Helper()
	if g.agent != nil {
		_ = g.agent.Close()
	}
	var err error
	if g.agent, err = podrun.ConnectAgent(g.w.ctx, "agent-7", g.endpoint()+"/mcp", g.w.agentKey); err != nil {
		t.Fatal(err)
	}
}

// restart stops the gateway process and starts it again with the same data folder, as a
// container restart in the same pod. It reports whether the new process has come up
// (/healthz answers) or refused to start (exited).
func (g *gateway) restart(t testing.TB) (up bool) {
	t.Helper()
	g.stop()
	g.start(t)
	must(t, g.waitUp())
	if exited, _ := g.proc.Exited(); exited {
		return false
	}
	g.connect(t)
	return true
}

// waitUp waits until the process answers /healthz or has exited.
func (g *gateway) waitUp() error {
	return podrun.Poll(g.w.ctx, 60*time.Second, func() string {
		if exited, _ := g.proc.Exited(); exited {
			return ""
		}
		return g.healthy()
	})
}

// ensureRunning starts the gateway process again when it has exited.
func (g *gateway) ensureRunning(t testing.TB) {
	t.Helper()
	if exited, _ := g.proc.Exited(); !exited {
		return
	}
	g.start(t)
	must(t, g.waitUp())
	if exited, err := g.proc.Exited(); exited {
		t.Fatalf("the gateway process exited again (%v): %s", err, g.proc.Tail(2048))
	}
	g.connect(t)
}
