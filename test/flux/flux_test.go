package flux_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
	"github.com/reversi-gitops/reversi/test/flux"
)

var (
	gitRepositoryGVK = schema.GroupVersionKind{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "GitRepository"}
	kustomizationGVK = schema.GroupVersionKind{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Kind: "Kustomization"}
)

// TestFluxSmoke runs the real source-controller and kustomize-controller against envtest: a
// GitRepository over `git http-backend` on 127.0.0.1 becomes an artifact whose bytes match
// its advertised digest, and a Kustomization applies a ConfigMap from it.
func TestFluxSmoke(t *testing.T) {
	const ns = "flux-smoke"
	w := startWorld(t, ns, 3*time.Minute, testenv.Options{})
	ctx, c, fx := w.ctx, w.c, w.fx

	// A repository with a ConfigMap manifest, served over smart HTTP.
	repo := sourcetest.NewRepo(t)
	repo.WriteFile("deploy/configmap.yaml", `apiVersion: v1
kind: ConfigMap
metadata:
  name: from-git
  namespace: flux-smoke
data:
  greeting: hello from flux
`)
	commit := repo.Commit("a ConfigMap for Flux")
	srv := sourcetest.ServeHTTP(t, parentDir(repo.Dir), sourcetest.HTTPAuth{})

	createGitRepository(ctx, t, c, ns, "manifests", srv.RepoURL(t, repo.Dir))
	began := time.Now()
	gr := waitReady(ctx, t, c, gitRepositoryGVK, ns, "manifests")
	t.Logf("GitRepository Ready in %s", time.Since(began).Round(time.Millisecond))

	artURL, _, _ := unstructured.NestedString(gr.Object, "status", "artifact", "url")
	digest, _, _ := unstructured.NestedString(gr.Object, "status", "artifact", "digest")
	revision, _, _ := unstructured.NestedString(gr.Object, "status", "artifact", "revision")
	if want := "main@sha1:" + commit; revision != want {
		t.Errorf("status.artifact.revision = %q, want %q", revision, want)
	}
	u, err := url.Parse(artURL)
	if err != nil || u.Host != fx.StorageAddr {
		t.Fatalf("status.artifact.url = %q: want a URL on %s (%v)", artURL, fx.StorageAddr, err)
	}
	algo, want, ok := strings.Cut(digest, ":")
	if !ok || algo != "sha256" || len(want) != 64 {
		t.Fatalf("status.artifact.digest = %q, want sha256:<64 hex>", digest)
	}
	body := fetch(t, artURL)
	sum := sha256.Sum256(body)
	if got := hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("the artifact at %s has sha256 %s, status says %s", artURL, got, want)
	}
	if got := tarFile(t, body, "deploy/configmap.yaml"); !strings.Contains(got, "hello from flux") {
		t.Fatalf("the artifact's deploy/configmap.yaml is %q", got)
	}
	t.Logf("artifact %s: %d bytes, %s, revision %s", artURL, len(body), digest, revision)

	createKustomization(ctx, t, c, ns, "configmaps", "./deploy", true, nil)
	began = time.Now()
	waitKustomization(ctx, t, c, ns, "configmaps", revision, "True") // its lastAppliedRevision too
	t.Logf("Kustomization Ready in %s", time.Since(began).Round(time.Millisecond))

	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "from-git"}, &cm); err != nil {
		t.Fatalf("the ConfigMap from git: %v", err)
	}
	if cm.Data["greeting"] != "hello from flux" {
		t.Errorf("ConfigMap data = %v", cm.Data)
	}
	if cm.Labels["kustomize.toolkit.fluxcd.io/name"] != "configmaps" {
		t.Errorf("ConfigMap labels = %v: not applied by the Kustomization", cm.Labels)
	}
}

// world is a control plane with the project's CRDs, one namespace, and the real Flux
// controllers watching that namespace.
type world struct {
	ctx context.Context
	env *testenv.Env
	c   client.Client
	fx  *flux.Flux
	ns  string
}

// startWorld starts the control plane (with opts), creates the namespace ns and starts Flux
// watching it; ctx ends after timeout or with the test.
func startWorld(t *testing.T, ns string, timeout time.Duration, opts testenv.Options) *world {
	t.Helper()
	began := time.Now()
	dir, err := flux.Dir()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Flux controllers in %s (%s)", dir, time.Since(began).Round(time.Millisecond))

	env, err := testenv.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	t.Logf("control plane up in %s", env.Took.Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	fx := flux.Start(t, env.Environment, flux.Options{Namespace: ns})
	t.Logf("controllers ready in %s (storage %s)", time.Since(began).Round(time.Millisecond), fx.StorageAddr)
	return &world{ctx: ctx, env: env, c: env.Client, fx: fx, ns: ns}
}

// createGitRepository creates a GitRepository of branch main of url (interval 1m: the tests
// ask for reconciles with requestReconcile rather than waiting).
func createGitRepository(ctx context.Context, t *testing.T, c client.Client, ns, name, url string) {
	t.Helper()
	gr := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"url":      url,
			"ref":      map[string]any{"branch": "main"},
			"interval": "1m",
			"timeout":  "30s",
		},
	}}
	gr.SetGroupVersionKind(gitRepositoryGVK)
	if err := c.Create(ctx, gr); err != nil {
		t.Fatal(err)
	}
}

// createKustomization creates a pruning Kustomization of path in the GitRepository
// "manifests", with wait as given; spec adds or overrides fields of its spec.
func createKustomization(ctx context.Context, t *testing.T, c client.Client, ns, name, path string, wait bool, spec map[string]any) {
	t.Helper()
	s := map[string]any{
		"interval":  "1m",
		"timeout":   "1m",
		"path":      path,
		"prune":     true,
		"wait":      wait,
		"sourceRef": map[string]any{"kind": "GitRepository", "name": "manifests"},
	}
	for k, v := range spec {
		s[k] = v
	}
	ks := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     s,
	}}
	ks.SetGroupVersionKind(kustomizationGVK)
	if err := c.Create(ctx, ks); err != nil {
		t.Fatal(err)
	}
}

// requestReconcile sets reconcile.fluxcd.io/requestedAt on a Flux object, as
// `flux reconcile` does, so its controller reconciles it now.
func requestReconcile(ctx context.Context, t *testing.T, c client.Client, gvk schema.GroupVersionKind, ns, name string) {
	t.Helper()
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	obj.SetNamespace(ns)
	obj.SetName(name)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{"reconcile.fluxcd.io/requestedAt":%q}}}`, time.Now().Format(time.RFC3339Nano))
	if err := c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatalf("requesting a reconcile of %s %s/%s: %v", gvk.Kind, ns, name, err)
	}
}

// eventually polls cond every 100 ms until it returns "" and fails the test with cond's last
// answer when ctx ends or timeout passes first.
func eventually(ctx context.Context, t *testing.T, timeout time.Duration, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		why := cond()
		if why == "" {
			return
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			t.Fatalf("%s: not after %s: %s", what, timeout, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// condition is the condition typ of obj's status.conditions (nil when absent).
func condition(obj *unstructured.Unstructured, typ string) map[string]any {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == typ {
			return m
		}
	}
	return nil
}

// waitReady polls the object until its Ready condition is True for its current generation
// and returns it; a Ready=False that persists is reported with its message at the deadline.
func waitReady(ctx context.Context, t *testing.T, c client.Client, gvk schema.GroupVersionKind, ns, name string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	last := "not observed"
	for {
		err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj)
		switch {
		case err == nil:
			status, msg, observed := readyCondition(obj)
			if status == "True" && observed == obj.GetGeneration() {
				return obj
			}
			last = fmt.Sprintf("Ready=%s (observedGeneration %d of %d): %s", status, observed, obj.GetGeneration(), msg)
		case !apierrors.IsNotFound(err):
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s %s/%s not Ready: %s", gvk.Kind, ns, name, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// readyCondition is the Ready condition's status and message, and status.observedGeneration.
func readyCondition(obj *unstructured.Unstructured) (status, message string, observed int64) {
	observed, _, _ = unstructured.NestedInt64(obj.Object, "status", "observedGeneration")
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" {
			s, _ := m["status"].(string)
			msg, _ := m["message"].(string)
			return s, msg, observed
		}
	}
	return "Unknown", "no Ready condition", observed
}

func fetch(t *testing.T, u string) []byte {
	t.Helper()
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", u, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tarFile is the content of the file name in the gzipped tarball b (failing when absent).
func tarFile(t *testing.T, b []byte, name string) string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("the artifact is not gzip: %v", err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatalf("the artifact has no %s (it has %v)", name, names)
		}
		if err != nil {
			t.Fatalf("reading the artifact: %v", err)
		}
		names = append(names, h.Name)
		if path.Clean(h.Name) == name {
			content, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return string(content)
		}
	}
}

func parentDir(dir string) string { return filepath.Dir(dir) }
