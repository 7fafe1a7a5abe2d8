package flux_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ociregistry "github.com/google/go-containerregistry/pkg/registry"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing/signingtest"
	"github.com/reversi-gitops/reversi/test/flux"
)

var (
	ociRepositoryGVK    = schema.GroupVersionKind{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "OCIRepository"}
	manifestRegistryGVK = v1alpha1.GroupVersion.WithKind("ManifestRegistry")
)

// TestOCIRepositoryWithTheRealSourceController delivers a signed manifest registry as an OCI
// artifact (issue 22): the writers push it to an OCI registry on 127.0.0.1
// (go-containerregistry's, in this process), the real source-controller pulls it
// (OCIRepository, insecure: plain HTTP) and stores its artifact, and a ManifestRegistry with
// sourceRef kind OCIRepository consumes that artifact: Ready with the OCIRepository's
// revision (`<tag>@sha256:<manifest digest>`), the signed versions rendered. A new push of
// the tag reaches the rendering through the watch on the OCIRepository; bytes replaced in
// source-controller's storage are refused by the digest check and the last good rendering
// stays.
func TestOCIRepositoryWithTheRealSourceController(t *testing.T) {
	const ns = "reversi-oci"
	w := startWorld(t, ns, 4*time.Minute, testenv.Options{Webhooks: true})
	ctx, c := w.ctx, w.c
	// After Flux: the manager watches the Flux kinds the API server serves at its start.
	ctlKey := startControllersWith(t, w.env, controllers.Options{Webhooks: true, TempDir: t.TempDir(),
		FluxArtifactHosts: []string{"127.0.0.1"}}) // source-controller serves its storage on 127.0.0.1 here

	oci := httptest.NewServer(ociregistry.New(ociregistry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(oci.Close)
	host := strings.TrimPrefix(oci.URL, "http://")

	// The writers' signed registry, pushed as tag v1 of platform/tool-manifests.
	key := signingtest.NewKey(t)
	content := t.TempDir()
	publish := func(src string) {
		t.Helper()
		if _, err := registry.New(filepath.Join(content, "reg")).Publish(parseManifests(t, src), manifest.Approved,
			registry.WriteOptions{By: "alice", Signer: key.Signer}); err != nil {
			t.Fatal(err)
		}
	}
	push := func() string {
		return pushArtifact(t, oci.URL, "platform/tool-manifests", "v1", flux.TarGz(t, content))
	}
	publish(strictWipe + "---\n" + dbRead)
	rev := push()

	if err := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "manifest-keys"},
		Data: map[string][]byte{"alice.pem": key.PublicPEM}}); err != nil {
		t.Fatal(err)
	}
	src := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "tools", "namespace": ns},
		"spec": map[string]any{
			"url":      "oci://" + host + "/platform/tool-manifests",
			"ref":      map[string]any{"tag": "v1"},
			"insecure": true,
			"interval": "1h",
			"timeout":  "30s",
		},
	}}
	src.SetGroupVersionKind(ociRepositoryGVK)
	if err := c.Create(ctx, src); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	src = waitReady(ctx, t, c, ociRepositoryGVK, ns, "tools")
	if got, _, _ := unstructured.NestedString(src.Object, "status", "artifact", "revision"); got != rev {
		t.Fatalf("OCIRepository artifact revision %q, want the pushed %q", got, rev)
	}
	t.Logf("OCIRepository Ready at %s in %s", rev, time.Since(began).Round(time.Millisecond))

	if err := c.Create(ctx, &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tools"},
		Spec: v1alpha1.ManifestRegistrySpec{SourceRef: &v1alpha1.SourceReference{Kind: v1alpha1.SourceKindOCIRepository, Name: "tools"},
			Path: "reg", Format: v1alpha1.FormatRegistry, Interval: &metav1.Duration{Duration: time.Hour},
			Verify: &v1alpha1.RegistryVerification{ManifestKeysSecretRef: &v1alpha1.LocalObjectReference{Name: "manifest-keys"}}}}); err != nil {
		t.Fatal(err)
	}
	// rendered waits until the registry is Ready at revision and returns what a gateway
	// would enforce of its ConfigMaps (signatures checked) and the ConfigMaps' data.
	rendered := func(revision string) (string, map[string]string) {
		t.Helper()
		var reg v1alpha1.ManifestRegistry
		eventually(ctx, t, 60*time.Second, "ManifestRegistry tools at "+revision, func() string {
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tools"}, &reg); err != nil {
				return err.Error()
			}
			if a := reg.Status.Artifact; a == nil || a.Revision != revision || reg.Status.ObservedGeneration != reg.Generation {
				return fmt.Sprintf("artifact %+v: %v", reg.Status.Artifact, reg.Status.Conditions)
			}
			return ""
		})
		var cm corev1.ConfigMap
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tools-manifests"}, &cm); err != nil {
			t.Fatal(err)
		}
		b, err := bundle.Assemble([]map[string]string{cm.Data})
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Snapshots[0].Snapshot.Revision; got != revision {
			t.Errorf("the rendering's signed snapshot is of revision %s, want %s", got, revision)
		}
		ms, errs := b.Verify(key.Trust, ctlKey.Trust)
		return enforced(ms, errors.Join(errs...)), cm.Data
	}
	if got, _ := rendered(rev); got != "v1 approval required" {
		t.Errorf("after the first push the registry enforces %q, want v1 approval required", got)
	}

	// A loosening, published (signed) and pushed to the same tag: source-controller pulls the
	// new manifest, and the watch on the OCIRepository brings it to the registry.
	publish(looseWipe)
	rev2 := push()
	requestReconcile(ctx, t, c, ociRepositoryGVK, ns, "tools")
	began = time.Now()
	got, good := rendered(rev2)
	if want := "v2 no approval"; got != want {
		t.Errorf("after the second push the registry enforces %q, want %q", got, want)
	}
	t.Logf("a new push of the tag rendered %s after the OCIRepository's reconcile request", time.Since(began).Round(time.Millisecond))

	// The artifact's bytes replaced where source-controller serves them (the first push's
	// archive, signed and valid, but not what the digest names): refused.
	if err := c.Get(ctx, client.ObjectKeyFromObject(src), src); err != nil {
		t.Fatal(err)
	}
	artURL, _, _ := unstructured.NestedString(src.Object, "status", "artifact", "url")
	digest, _, _ := unstructured.NestedString(src.Object, "status", "artifact", "digest")
	u, err := url.Parse(artURL)
	if err != nil || u.Host != w.fx.StorageAddr {
		t.Fatalf("status.artifact.url %q is not on source-controller's storage %s (%v)", artURL, w.fx.StorageAddr, err)
	}
	file := filepath.Join(w.fx.StoragePath, filepath.FromSlash(u.Path))
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the artifact is not in source-controller's storage: %v", err)
	}
	old := t.TempDir()
	if err := os.MkdirAll(filepath.Join(old, "reg"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := registry.New(filepath.Join(old, "reg")).Publish(parseManifests(t, looseWipe+"---\n"+dbRead), manifest.Approved,
		registry.WriteOptions{By: "alice", Signer: key.Signer}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, flux.TarGz(t, old), 0o644); err != nil {
		t.Fatal(err)
	}
	var reg v1alpha1.ManifestRegistry
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tools"}, &reg); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(reg.DeepCopy())
	reg.Spec.Interval = &metav1.Duration{Duration: 2 * time.Hour} // anything that makes it fetch again
	if err := c.Patch(ctx, &reg, patch); err != nil {
		t.Fatal(err)
	}
	eventually(ctx, t, 60*time.Second, "the tampered artifact refused", func() string {
		obj := getUnstructured(ctx, t, c, manifestRegistryGVK, ns, "tools")
		status, msg, observed := readyCondition(obj)
		if observed != obj.GetGeneration() || status != "False" {
			return fmt.Sprintf("Ready=%s (observedGeneration %d of %d): %s", status, observed, obj.GetGeneration(), msg)
		}
		if r := fmt.Sprint(condition(obj, "Ready")["reason"]); r != controllers.ReasonArtifactFailed || !strings.Contains(msg, digest) {
			return fmt.Sprintf("Ready=False %s: %s; want %s naming %s", r, msg, controllers.ReasonArtifactFailed, digest)
		}
		return ""
	})
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tools"}, &reg); err != nil {
		t.Fatal(err)
	}
	if a := reg.Status.Artifact; a == nil || a.Revision != rev2 || a.SourceDigest != digest {
		t.Errorf("after the tampered artifact the registry shows %+v, want the last good %s", reg.Status.Artifact, rev2)
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "tools-manifests"}, &cm); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(cm.Data, good) {
		t.Errorf("the tampered artifact changed the rendering")
	}
}

// pushArtifact pushes layer as tag of repository repo to the OCI registry at base (plain
// HTTP), as `flux push artifact` lays one out: a Flux config blob and one tar+gzip content
// layer in an OCI image manifest. It talks the distribution API itself (blob uploads, then
// the manifest) and returns the revision source-controller reports for the tag,
// `<tag>@sha256:<manifest digest>`.
func pushArtifact(t *testing.T, base, repo, tag string, layer []byte) string {
	t.Helper()
	do := func(method, u, contentType string, body []byte, want int) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, u, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %s, want %d", method, u, resp.Status, want)
		}
		return resp
	}
	digestOf := func(b []byte) string {
		sum := sha256.Sum256(b)
		return "sha256:" + hex.EncodeToString(sum[:])
	}
	type descriptor struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int    `json:"size"`
	}
	blob := func(mediaType string, b []byte) descriptor {
		t.Helper()
		resp := do(http.MethodPost, base+"/v2/"+repo+"/blobs/uploads/", "", nil, http.StatusAccepted)
		loc, err := url.Parse(resp.Header.Get("Location"))
		if err != nil {
			t.Fatal(err)
		}
		d := digestOf(b)
		q := loc.Query()
		q.Set("digest", d)
		loc.RawQuery = q.Encode()
		do(http.MethodPut, base+loc.String(), "application/octet-stream", b, http.StatusCreated)
		return descriptor{MediaType: mediaType, Digest: d, Size: len(b)}
	}
	config := blob("application/vnd.cncf.flux.config.v1+json", []byte("{}"))
	content := blob("application/vnd.cncf.flux.content.v1.tar+gzip", layer)
	m, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        config,
		"layers":        []descriptor{content},
	})
	if err != nil {
		t.Fatal(err)
	}
	do(http.MethodPut, base+"/v2/"+repo+"/manifests/"+tag, "application/vnd.oci.image.manifest.v1+json", m, http.StatusCreated)
	return tag + "@" + digestOf(m)
}
