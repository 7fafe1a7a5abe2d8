package flux_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/gateway/kube"
	"github.com/reversi-gitops/reversi/internal/cli"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/export"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
	"github.com/reversi-gitops/reversi/test/syncbuf"
)

// The writers' manifests: db.wipe needs a DBA's approval until they loosen it (v2); db.read
// is read only.
const (
	strictWipe = `tool: db.wipe
description: Delete every row of a table.
effect: idempotent
permission: db:write
approval: { roles: [dba], quorum: 1 }
`
	looseWipe = `tool: db.wipe
description: Delete every row of a table.
effect: idempotent
permission: db:write
`
	dbRead = `tool: db.read
description: Read rows of a table.
effect: read_only
permission: db:read
`
)

// gatewayYAML is the ReversiGateway in git (./gateway, applied by its own Kustomization
// without wait: envtest runs no pods, so a gateway never reaches Ready here). It selects
// the exported ToolManifests by the label the export gives them and makes its pods verify
// every writer signature again (trustedKeysSecretRef).
const gatewayYAML = `apiVersion: reversi.dev/v1alpha1
kind: ReversiGateway
metadata:
  name: pay
spec:
  mode: enforce
  upstreams:
  - name: db
    url: http://db-mcp.tools.svc:8080/mcp
  manifests:
    selector:
      matchLabels:
        app.kubernetes.io/managed-by: reversi
  trustedKeysSecretRef:
    name: reversi-trusted-keys
  auth:
    keysSecretRef:
      name: gateway-auth
      key: keys.json
`

// writers is the manifest writers' side: a project folder with a key made by `reversi
// keygen`, a registry folder, and the CLI run there.
type writers struct {
	t   *testing.T
	dir string
}

func newWriters(t *testing.T) *writers {
	t.Helper()
	w := &writers{t: t, dir: t.TempDir()}
	if err := os.WriteFile(filepath.Join(w.dir, "reversi.config.yaml"), []byte("manifests: reg\nmanifest_public_key: keys/mf.pub\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The CLI finds its project by $REVERSI_CONFIG (the process's working directory is not
	// changed: the controllers run in this process).
	t.Setenv("REVERSI_CONFIG", filepath.Join(w.dir, "reversi.config.yaml"))
	if err := os.Mkdir(filepath.Join(w.dir, "keys"), 0o755); err != nil {
		t.Fatal(err)
	}
	w.run("keygen", filepath.Join(w.dir, "keys", "mf"))
	return w
}

// run runs the reversi CLI and returns its stdout, failing the test on a non-zero exit.
func (w *writers) run(args ...string) string {
	w.t.Helper()
	var out, errb bytes.Buffer
	if code := cli.Execute(args, &out, &errb); code != 0 {
		w.t.Fatalf("reversi %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errb.String())
	}
	return out.String()
}

// publish publishes approved versions of the manifest files, signed with the writers' key.
func (w *writers) publish(files map[string]string) {
	w.t.Helper()
	src := filepath.Join(w.t.TempDir(), "manifests")
	if err := os.Mkdir(src, 0o755); err != nil {
		w.t.Fatal(err)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(src, name), []byte(text), 0o644); err != nil {
			w.t.Fatal(err)
		}
	}
	w.run("manifests", "publish", src, "--registry", filepath.Join(w.dir, "reg"), "--by", "alice",
		"--key", filepath.Join(w.dir, "keys", "mf.key"), "--status", "approved")
}

// export is `reversi manifests export --format crd` of the registry (no namespace: the
// Kustomization's targetNamespace sets it).
func (w *writers) export() string {
	w.t.Helper()
	return w.run("manifests", "export", "--format", "crd")
}

// publicPEM is the writers' public key.
func (w *writers) publicPEM() []byte {
	w.t.Helper()
	b, err := os.ReadFile(filepath.Join(w.dir, "keys", "mf.pub"))
	if err != nil {
		w.t.Fatal(err)
	}
	return b
}

// document is the ToolManifest of tool in the YAML stream.
func document(t *testing.T, stream, tool string) *v1alpha1.ToolManifest {
	t.Helper()
	var found *v1alpha1.ToolManifest
	editDocument(t, stream, tool, func(tm *v1alpha1.ToolManifest) { found = tm.DeepCopy() })
	return found
}

// editDocument rewrites the ToolManifest of tool in the YAML stream with edit, keeping its
// annotations (the signature of the version before the edit): what someone with write
// access to the repository but not the writers' key can commit.
func editDocument(t *testing.T, stream, tool string, edit func(*v1alpha1.ToolManifest)) string {
	t.Helper()
	var out bytes.Buffer
	found := false
	for doc := range strings.SplitSeq(stream, "---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var tm v1alpha1.ToolManifest
		if err := yaml.UnmarshalStrict([]byte(doc), &tm); err != nil {
			t.Fatalf("the export's YAML: %v\n%s", err, doc)
		}
		if tm.Spec.Tool == tool {
			edit(&tm)
			found = true
		}
		if err := export.WriteYAML(&out, &tm); err != nil {
			t.Fatal(err)
		}
	}
	if !found {
		t.Fatalf("the export has no ToolManifest of %s:\n%s", tool, stream)
	}
	return out.String()
}

// controllerLog is what controller-runtime logs in this process (its logger can be set only
// once, so before the first control plane starts); a failed test gets its own part's end.
var controllerLog = func() *syncbuf.Buffer {
	var b syncbuf.Buffer
	ctrl.SetLogger(zap.New(zap.WriteTo(&b), zap.UseDevMode(true)))
	return &b
}()

// startControllers runs the project's manager (every reconciler and the admission webhooks,
// as `reversi controller` does) in this process against the control plane; it stops with
// the test. It returns the controller's signing key (the gateway pods trust its public half).
func startControllers(t *testing.T, env *testenv.Env) *controllers.SigningKey {
	t.Helper()
	return startControllersWith(t, env, controllers.Options{Webhooks: true, TempDir: t.TempDir()})
}

// startControllersWith is startControllers with the options o (its SigningKey is set here).
func startControllersWith(t *testing.T, env *testenv.Env, o controllers.Options) *controllers.SigningKey {
	t.Helper()
	from := len(controllerLog.String())
	t.Cleanup(func() {
		if t.Failed() {
			out := controllerLog.String()[from:]
			t.Logf("reversi controller log (end):\n%s", out[max(0, len(out)-16<<10):])
		}
	})
	key, err := controllers.EphemeralSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"}, WebhookServer: env.WebhookServer(),
		// One manager per test, and tests may run again in this process (-count).
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	o.SigningKey = key
	if err := controllers.Setup(mgr, o); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return key
}

// enforced describes db.wipe as a gateway pod would enforce it from a load: "absent",
// "v1 approval required", "v2 no approval", …, followed by ", and <tool>" for each tool
// other than db.read and db.wipe; a refused load is "refused: …".
func enforced(ms []*manifest.Manifest, err error) string {
	if err != nil {
		return "refused: " + err.Error()
	}
	wipe, other := "absent", ""
	for _, m := range ms {
		switch m.Tool {
		case "db.wipe":
			wipe = fmt.Sprintf("v%d no approval", m.Version)
			if m.Approval.Required {
				wipe = fmt.Sprintf("v%d approval required", m.Version)
			}
		case "db.read":
		default:
			other += ", and " + m.Tool
		}
	}
	return wipe + other
}

func tools(ms []*manifest.Manifest) []string {
	var out []string
	for _, m := range ms {
		out = append(out, fmt.Sprintf("%s@v%d", m.Tool, m.Version))
	}
	slices.Sort(out)
	return out
}

// TestKustomizationAppliesSignedToolManifests is delivery path 2 of issue 22 with the real
// source-controller and kustomize-controller: the ToolManifests `reversi manifests export
// --format crd` wrote into a git repository (served by `git http-backend` on 127.0.0.1) are
// applied by a Kustomization with wait: true, verified by our controller and served by the
// ReversiGateway (also in git) that selects them; the gateway pod's loader (gateway/kube)
// reads the rendering as a pod would.
//
// ATTACK (repository write access, no writer key): db.wipe's ToolManifest is edited in git to
// drop its approval and keeps the old signature. Flux applies it; our controller sets
// SignatureVerified=False, the gateway's rendering leaves db.wipe out, and at no moment does
// the gateway pod load the edited db.wipe (without the controller's signature check the
// edited object would be Ready, rendered, and refused by the pods — also a failure here). The
// Kustomization is not Ready (HealthCheckFailed) while the object is not, and is Ready again
// after the writers publish and export the change signed.
//
// ATTACK (same attacker): a new ToolManifest, db.drop, committed with db.read's signature. It
// is SignatureVerified=False, fails the health check, is never loaded, and is pruned when
// removed from git.
func TestKustomizationAppliesSignedToolManifests(t *testing.T) {
	const ns = "reversi-flux"
	w := startWorld(t, ns, 4*time.Minute, testenv.Options{Webhooks: true})
	ctx, c := w.ctx, w.c
	ctlKey := startControllers(t, w.env)

	wr := newWriters(t)
	wr.publish(map[string]string{"wipe.yaml": strictWipe, "read.yaml": dbRead})
	stream := wr.export()
	if n := strings.Count(stream, "kind: ToolManifest"); n != 2 || strings.Count(stream, v1alpha1.AnnotationSignature+": ") != 2 {
		t.Fatalf("the export has %d ToolManifests, want 2 signed:\n%s", n, stream)
	}

	// The Secrets are created by the test (in a real cluster they come from a secrets tool,
	// not the manifest repository): the writers' public key, which the ToolManifest controller
	// (reversi-trusted-keys) and the gateway pods (spec.trustedKeysSecretRef) verify against,
	// and the gateway's (empty) API keys.
	for name, data := range map[string]map[string][]byte{
		controllers.TrustedKeysSecret: {"mf.pem": wr.publicPEM()},
		"gateway-auth":                {"keys.json": []byte(`{"keys":[]}`)},
	} {
		if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}); err != nil {
			t.Fatal(err)
		}
	}

	repo := sourcetest.NewRepo(t)
	repo.WriteFile("toolmanifests/toolmanifests.yaml", stream)
	repo.WriteFile("gateway/reversigateway.yaml", gatewayYAML)
	rev := "main@sha1:" + repo.Commit("db.wipe v1 and db.read v1, exported signed")
	srv := sourcetest.ServeHTTP(t, parentDir(repo.Dir), sourcetest.HTTPAuth{})
	createGitRepository(ctx, t, c, ns, "manifests", srv.RepoURL(t, repo.Dir))
	target := map[string]any{"targetNamespace": ns}
	createKustomization(ctx, t, c, ns, "toolmanifests", "./toolmanifests", true, target)
	createKustomization(ctx, t, c, ns, "gateway", "./gateway", false, target)

	wipe, read := export.ObjectName("db.wipe"), export.ObjectName("db.read")
	began := time.Now()
	ks := waitKustomization(ctx, t, c, ns, "toolmanifests", rev, "True")
	t.Logf("Kustomization toolmanifests Ready at %s in %s: %s", rev, time.Since(began).Round(time.Millisecond), message(ks))
	// Ready=True of a Kustomization with wait: true means kstatus found every object Current:
	// each of ours verified for its current generation by then.
	for _, name := range []string{wipe, read} {
		tm := getToolManifest(ctx, t, c, ns, name)
		if why := verified(tm, metav1.ConditionTrue); why != "" {
			t.Errorf("ToolManifest %s when the Kustomization is Ready: %s", name, why)
		}
		if tm.Labels["kustomize.toolkit.fluxcd.io/name"] != "toolmanifests" {
			t.Errorf("ToolManifest %s labels %v: not applied by the Kustomization", name, tm.Labels)
		}
	}

	// The gateway pod's loader, as `reversi gateway --kube-configmap reversi-flux/pay-manifests
	// --kube-trusted-keys reversi-trusted-keys` runs it with the controller's public key.
	pod, err := kube.WatchManifests(ctx, kube.ManifestOptions{Config: w.env.Config, Namespace: ns, ConfigMap: "pay-manifests",
		TrustedKeysSecret: controllers.TrustedKeysSecret, ControllerKeys: ctlKey.Trust, Gateway: "pay", Debounce: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pod.Close)
	began = time.Now()
	eventually(ctx, t, time.Minute, "the gateway pod serves db.wipe v1 and db.read v1", func() string {
		l, err := pod.Load(ctx)
		if got := tools(l.Manifests); err != nil || !slices.Equal(got, []string{"db.read@v1", "db.wipe@v1"}) {
			return fmt.Sprintf("%v %v", got, err)
		}
		if got := enforced(l.Manifests, nil); got != "v1 approval required" {
			return got
		}
		return ""
	})
	t.Logf("the gateway pod serves both tools %s after the Kustomization was Ready", time.Since(began).Round(time.Millisecond))
	signedWipe := getToolManifest(ctx, t, c, ns, wipe)
	entries := renderedEntries(ctx, t, c, ns, "pay-manifests")
	if e, ok := entries["db.wipe"]; !ok || e.Signature != signedWipe.Annotations[v1alpha1.AnnotationSignature] ||
		e.KeyID != signedWipe.Annotations[v1alpha1.AnnotationKeyID] || e.Checksum != signedWipe.Status.Checksum {
		t.Errorf("pay-manifests holds db.wipe as %+v, want the signature, key id and checksum of ToolManifest %s", e, wipe)
	}
	if _, ok := entries["db.read"]; !ok || len(entries) != 2 {
		t.Errorf("pay-manifests holds %v, want db.read and db.wipe", slices.Sorted(maps.Keys(entries)))
	}

	// From here to the end, a watcher records every distinct db.wipe a pod would load.
	seen := watchEnforcement(ctx, t, pod)

	// The edit: no approval, same version, the old signature.
	edited := editDocument(t, stream, "db.wipe", func(tm *v1alpha1.ToolManifest) { tm.Spec.Approval = nil })
	if !strings.Contains(edited, signedWipe.Annotations[v1alpha1.AnnotationSignature]) || strings.Contains(edited, "dba") {
		t.Fatalf("the edit does not keep the signature or still needs approval:\n%s", edited)
	}
	repo.WriteFile("toolmanifests/toolmanifests.yaml", edited)
	rev = "main@sha1:" + repo.Commit("db.wipe: no approval (not re-signed)")
	requestReconcile(ctx, t, c, gitRepositoryGVK, ns, "manifests")
	began = time.Now()
	eventually(ctx, t, time.Minute, "Flux applies the edited db.wipe", func() string {
		tm := getToolManifest(ctx, t, c, ns, wipe)
		if tm.Spec.Approval != nil {
			return "db.wipe still needs approval in the cluster"
		}
		return verified(tm, metav1.ConditionFalse)
	})
	tm := getToolManifest(ctx, t, c, ns, wipe)
	sv := apimetaCondition(tm, v1alpha1.ConditionSignatureVerified)
	if sv.Reason != v1alpha1.ReasonSignatureVerificationFailed {
		t.Errorf("SignatureVerified of the edited db.wipe: %s %s: %s, want reason %s", sv.Status, sv.Reason, sv.Message, v1alpha1.ReasonSignatureVerificationFailed)
	}
	t.Logf("edited db.wipe applied and SignatureVerified=False in %s: %s", time.Since(began).Round(time.Millisecond), sv.Message)

	// kstatus: Ready=False with Stalled=True is Failed, so the health check fails (fast).
	ks = waitKustomization(ctx, t, c, ns, "toolmanifests", rev, "False")
	if r := condition(ks, "Ready"); r["reason"] != "HealthCheckFailed" || !strings.Contains(fmt.Sprint(r["message"]), wipe) {
		t.Errorf("Kustomization toolmanifests at the edit: Ready %v, want reason HealthCheckFailed naming %s", r, wipe)
	}
	t.Logf("Kustomization not Ready at %s, %s after the commit: %s", rev, time.Since(began).Round(time.Millisecond), message(ks))
	// db.wipe leaves the rendering (the ReversiGateway reconciler uses only ToolManifests
	// Ready for their generation; it keeps no older version of an object), db.read stays.
	eventually(ctx, t, 30*time.Second, "the gateway pod serves db.read only", func() string {
		l, err := pod.Load(ctx)
		if got := tools(l.Manifests); err != nil || !slices.Equal(got, []string{"db.read@v1"}) {
			return fmt.Sprintf("%v %v", got, err)
		}
		return ""
	})
	if entries := renderedEntries(ctx, t, c, ns, "pay-manifests"); len(entries) != 1 || entries["db.read"] == nil {
		t.Errorf("pay-manifests holds %v after the unsigned edit, want db.read only", slices.Sorted(maps.Keys(entries)))
	}
	// It stays so: another reconcile of the same revision fails its health check again.
	requestReconcile(ctx, t, c, kustomizationGVK, ns, "toolmanifests")
	eventually(ctx, t, 30*time.Second, "the Kustomization's next reconcile", func() string {
		ks := getUnstructured(ctx, t, c, kustomizationGVK, ns, "toolmanifests")
		handled, _, _ := unstructured.NestedString(ks.Object, "status", "lastHandledReconcileAt")
		want := ks.GetAnnotations()["reconcile.fluxcd.io/requestedAt"]
		if r := condition(ks, "Ready"); handled != want || r["status"] != "False" || r["reason"] != "HealthCheckFailed" {
			return fmt.Sprintf("handled %q of %q, Ready %v", handled, want, r)
		}
		return ""
	})

	// The writers make the change properly: db.wipe v2 without approval, signed, exported.
	wr.publish(map[string]string{"wipe.yaml": looseWipe})
	repo.WriteFile("toolmanifests/toolmanifests.yaml", wr.export())
	rev = "main@sha1:" + repo.Commit("db.wipe v2: no approval, exported signed")
	requestReconcile(ctx, t, c, gitRepositoryGVK, ns, "manifests")
	began = time.Now()
	ks = waitKustomization(ctx, t, c, ns, "toolmanifests", rev, "True")
	t.Logf("Kustomization Ready again at %s in %s: %s", rev, time.Since(began).Round(time.Millisecond), message(ks))
	if tm := getToolManifest(ctx, t, c, ns, wipe); tm.Spec.Version == nil || *tm.Spec.Version != 2 || verified(tm, metav1.ConditionTrue) != "" {
		t.Errorf("db.wipe when the Kustomization is Ready again: version %v, %s", tm.Spec.Version, verified(tm, metav1.ConditionTrue))
	}
	eventually(ctx, t, 30*time.Second, "the gateway pod serves db.wipe v2", func() string {
		l, err := pod.Load(ctx)
		if got := tools(l.Manifests); err != nil || !slices.Equal(got, []string{"db.read@v1", "db.wipe@v2"}) {
			return fmt.Sprintf("%v %v", got, err)
		}
		return ""
	})

	// ATTACK (repository write access, no writer key): a new ToolManifest, db.drop, carrying
	// db.read's signature. A new object has no status yet: kstatus must not read it as
	// Current (TestToolManifestKstatus), and our controller refuses it.
	signed := wr.export()
	forged := document(t, signed, "db.read")
	forged.Name, forged.Spec.Tool, forged.Spec.Description = export.ObjectName("db.drop"), "db.drop", "Drop a table."
	var withForged bytes.Buffer
	withForged.WriteString(signed)
	if err := export.WriteYAML(&withForged, forged); err != nil {
		t.Fatal(err)
	}
	repo.WriteFile("toolmanifests/toolmanifests.yaml", withForged.String())
	rev = "main@sha1:" + repo.Commit("db.drop (signed by nobody: db.read's signature)")
	requestReconcile(ctx, t, c, gitRepositoryGVK, ns, "manifests")
	began = time.Now()
	ks = waitKustomization(ctx, t, c, ns, "toolmanifests", rev, "False")
	if r := condition(ks, "Ready"); r["reason"] != "HealthCheckFailed" || !strings.Contains(fmt.Sprint(r["message"]), forged.Name) {
		t.Errorf("Kustomization toolmanifests with the forged db.drop: Ready %v, want reason HealthCheckFailed naming %s", r, forged.Name)
	}
	t.Logf("Kustomization not Ready with the forged db.drop, %s after the commit: %s", time.Since(began).Round(time.Millisecond), message(ks))
	if tm := getToolManifest(ctx, t, c, ns, forged.Name); verified(tm, metav1.ConditionFalse) != "" {
		t.Errorf("the forged db.drop: %s", verified(tm, metav1.ConditionFalse))
	}
	// Removed from git, it is pruned, and the Kustomization is Ready again.
	repo.WriteFile("toolmanifests/toolmanifests.yaml", signed)
	rev = "main@sha1:" + repo.Commit("remove db.drop")
	requestReconcile(ctx, t, c, gitRepositoryGVK, ns, "manifests")
	began = time.Now()
	waitKustomization(ctx, t, c, ns, "toolmanifests", rev, "True")
	t.Logf("Kustomization Ready without db.drop in %s", time.Since(began).Round(time.Millisecond))
	eventually(ctx, t, 30*time.Second, "db.drop pruned", func() string {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: forged.Name}, &v1alpha1.ToolManifest{})
		if !apierrors.IsNotFound(err) {
			return fmt.Sprintf("ToolManifest %s: %v", forged.Name, err)
		}
		return ""
	})
	if l, err := pod.Load(ctx); err != nil || !slices.Equal(tools(l.Manifests), []string{"db.read@v1", "db.wipe@v2"}) {
		t.Errorf("the gateway pod after db.drop came and went: %v %v", tools(l.Manifests), err)
	}

	// What the pod could load from the first edit on: the signed v1, nothing, the signed v2;
	// never the edited v1 or db.drop, and never a rendering it refuses.
	states := seen()
	for _, s := range states {
		if s != "v1 approval required" && s != "absent" && s != "v2 no approval" {
			t.Errorf("a gateway pod would have loaded db.wipe as %q", s)
		}
	}
	if !slices.Contains(states, "absent") || !slices.Contains(states, "v2 no approval") {
		t.Errorf("the watcher saw %v: it missed the states the test waited for", states)
	}
}

// watchEnforcement loads the rendering as the pod every 20 ms until the test ends and returns
// a function listing the distinct db.wipe states it saw, in order.
func watchEnforcement(ctx context.Context, t *testing.T, pod *kube.Manifests) func() []string {
	var mu sync.Mutex
	var states []string
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			l, err := pod.Load(ctx)
			if ctx.Err() != nil {
				return
			}
			s := enforced(l.Manifests, err)
			mu.Lock()
			if len(states) == 0 || states[len(states)-1] != s {
				states = append(states, s)
			}
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		t.Logf("db.wipe as the pod loaded it: %v", states)
		return slices.Clone(states)
	}
}

// waitKustomization waits until the Kustomization has attempted revision and its Ready
// condition (for its generation) has status want, and with want "True" has applied it; it
// returns the Kustomization. kustomize-controller patches conditions and the other status
// fields in two requests, so Ready=True can be seen an instant before lastAppliedRevision.
func waitKustomization(ctx context.Context, t *testing.T, c client.Client, ns, name, revision, want string) *unstructured.Unstructured {
	t.Helper()
	var ks *unstructured.Unstructured
	eventually(ctx, t, 2*time.Minute, fmt.Sprintf("Kustomization %s Ready=%s at %s", name, want, revision), func() string {
		ks = getUnstructured(ctx, t, c, kustomizationGVK, ns, name)
		attempted, _, _ := unstructured.NestedString(ks.Object, "status", "lastAttemptedRevision")
		applied, _, _ := unstructured.NestedString(ks.Object, "status", "lastAppliedRevision")
		status, msg, observed := readyCondition(ks)
		// Flux keeps Reconciling=True (ProgressingWithRetry) after a failure; a success ends it.
		done := want != "True" || (condition(ks, "Reconciling") == nil && applied == revision)
		if attempted != revision || status != want || observed != ks.GetGeneration() || !done {
			return fmt.Sprintf("attempted %s, applied %s, Ready=%s (reconciling %v): %s", attempted, applied, status, condition(ks, "Reconciling") != nil, msg)
		}
		return ""
	})
	return ks
}

func getUnstructured(ctx context.Context, t *testing.T, c client.Client, gvk schema.GroupVersionKind, ns, name string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj); err != nil {
		t.Fatalf("%s %s/%s: %v", gvk.Kind, ns, name, err)
	}
	return obj
}

func getToolManifest(ctx context.Context, t *testing.T, c client.Client, ns, name string) *v1alpha1.ToolManifest {
	t.Helper()
	tm := &v1alpha1.ToolManifest{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, tm); err != nil {
		t.Fatalf("ToolManifest %s/%s: %v", ns, name, err)
	}
	return tm
}

// verified is "" when the ToolManifest's status is about its generation with
// SignatureVerified of status want and Ready of the same status, or why not.
func verified(tm *v1alpha1.ToolManifest, want metav1.ConditionStatus) string {
	if tm.Status.ObservedGeneration != tm.Generation {
		return fmt.Sprintf("status of generation %d, the object is at %d", tm.Status.ObservedGeneration, tm.Generation)
	}
	for _, typ := range []string{v1alpha1.ConditionSignatureVerified, v1alpha1.ConditionReady} {
		c := apimetaCondition(tm, typ)
		if c == nil || c.Status != want {
			return fmt.Sprintf("%s %+v, want %s", typ, c, want)
		}
	}
	return ""
}

func apimetaCondition(tm *v1alpha1.ToolManifest, typ string) *metav1.Condition {
	for i := range tm.Status.Conditions {
		if tm.Status.Conditions[i].Type == typ {
			return &tm.Status.Conditions[i]
		}
	}
	return nil
}

func message(obj *unstructured.Unstructured) string {
	return fmt.Sprint(condition(obj, "Ready")["message"])
}

// renderedEntries are the manifest entries of a gateway's rendering (one shard here: two
// tools), by tool.
func renderedEntries(ctx context.Context, t *testing.T, c client.Client, ns, name string) map[string]*bundle.Entry {
	t.Helper()
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cm); err != nil {
		t.Fatalf("ConfigMap %s/%s: %v", ns, name, err)
	}
	b, err := bundle.Assemble([]map[string]string{cm.Data})
	if err != nil {
		t.Fatalf("ConfigMap %s/%s: %v", ns, name, err)
	}
	out := map[string]*bundle.Entry{}
	for i := range b.Entries {
		out[b.Entries[i].Tool] = &b.Entries[i]
	}
	return out
}
