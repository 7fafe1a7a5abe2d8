package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	fluxmeta "github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/test/flux"
)

// artifactServer is an HTTP server on 127.0.0.1 laid out as source-controller's storage
// (`<kind>/<namespace>/<name>/<file>`): it serves the files a test puts and counts the
// requests for each.
type artifactServer struct {
	*httptest.Server
	mu    sync.Mutex
	files map[string][]byte
	hits  map[string]int
}

func newArtifactServer(t *testing.T) *artifactServer {
	s := &artifactServer{files: map[string][]byte{}, hits: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		b, ok := s.files[r.URL.Path]
		s.hits[r.URL.Path]++
		s.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	}))
	t.Cleanup(s.Close)
	return s
}

// put serves b at path and returns its URL.
func (s *artifactServer) put(path string, b []byte) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.files[path] = b
	return s.URL + path
}

func (s *artifactServer) requests(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[path]
}

func sha256Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// TestFluxOCIRepositoryAndBucketArtifacts consumes the artifact of an OCIRepository and of a
// Bucket (issue 22; the GitRepository path runs with the real source-controller in
// test/e2e/kubegateway and test/redteam). The Flux CRDs are installed into the suite's API
// server; the test writes each source's status as source-controller would, with its
// artifact on an HTTP server on 127.0.0.1 laid out as source-controller's storage, holding
// a tar.gz of a signed registry. A ManifestRegistry with sourceRef to each becomes Ready with
// the source's revision and renders the registry; a new artifact whose bytes do not match
// its digest is downloaded and refused (Ready=False ArtifactFailed, the last good rendering
// and status kept); the same bytes with their right digest are then rendered.
func TestFluxOCIRepositoryAndBucketArtifacts(t *testing.T) {
	requireEnv(t)
	dir, err := flux.Dir()
	if err != nil {
		t.Fatal(err)
	}
	// Before the test's managers start: they watch the Flux kinds served at their start.
	if err := flux.InstallCRDs(testEnv.Environment, dir); err != nil {
		t.Fatal(err)
	}
	storage := newArtifactServer(t)

	for _, c := range []struct {
		kind string
		// source is the Flux object (spec only), revision the artifact revision for a digest.
		source   func(ns string) fluxSource
		revision func(digest string) string
	}{
		{v1alpha1.SourceKindOCIRepository, func(ns string) fluxSource {
			return &sourcev1.OCIRepository{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tools"},
				Spec: sourcev1.OCIRepositorySpec{URL: "oci://127.0.0.1:5000/platform/tool-manifests", Reference: &sourcev1.OCIRepositoryRef{Tag: "v1"},
					Interval: metav1.Duration{Duration: time.Hour}, Insecure: true}}
		}, func(digest string) string { return "v1@" + digest }},
		{v1alpha1.SourceKindBucket, func(ns string) fluxSource {
			return &sourcev1.Bucket{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tools"},
				Spec: sourcev1.BucketSpec{BucketName: "tool-manifests", Endpoint: "127.0.0.1:9000", Insecure: true,
					Interval: metav1.Duration{Duration: time.Hour}}}
		}, func(digest string) string { return digest }},
	} {
		t.Run(c.kind, func(t *testing.T) {
			ns := namespace(t)
			ownManagerWith(t, ns, func(r *ManifestRegistryReconciler) { r.FluxArtifactHosts = []string{"127.0.0.1"} })

			// The signed registry (the seed's three manifests, signed by k) and its archive.
			k := newKey(t)
			content := t.TempDir()
			publish(t, filepath.Join(content, "reg"), k, fixtures(t)...)
			archive := flux.TarGz(t, content)
			createSecret(t, ns, "manifest-keys", map[string][]byte{"writer.pem": k.PublicPEM})

			src := c.source(ns)
			create(t, src)
			folder := "/" + strings.ToLower(c.kind) + "/" + ns + "/tools/"
			// setArtifact writes the source's status as source-controller does once it has
			// stored an artifact: Ready=True for its generation, and status.artifact.
			setArtifact := func(file, digest, revision string, served []byte) {
				t.Helper()
				u := storage.put(folder+file, served)
				if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(src), src); err != nil {
					t.Fatal(err)
				}
				size := int64(len(served))
				art := &fluxmeta.Artifact{Path: strings.TrimPrefix(folder, "/") + file, URL: u, Revision: revision, Digest: digest,
					LastUpdateTime: metav1.Now(), Size: &size}
				conds := []metav1.Condition{{Type: fluxmeta.ReadyCondition, Status: metav1.ConditionTrue, ObservedGeneration: src.GetGeneration(),
					LastTransitionTime: metav1.Now(), Reason: fluxmeta.SucceededReason, Message: "stored artifact for revision '" + revision + "'"}}
				switch s := src.(type) {
				case *sourcev1.OCIRepository:
					s.Status = sourcev1.OCIRepositoryStatus{ObservedGeneration: s.Generation, Conditions: conds, Artifact: art, URL: u}
				case *sourcev1.Bucket:
					s.Status = sourcev1.BucketStatus{ObservedGeneration: s.Generation, Conditions: conds, Artifact: art, URL: u}
				}
				if err := k8s.Status().Update(t.Context(), src); err != nil {
					t.Fatalf("writing the %s status: %v", c.kind, err)
				}
			}
			digest := sha256Digest(archive)
			rev := c.revision(digest)
			setArtifact(strings.TrimPrefix(digest, "sha256:")+".tar.gz", digest, rev, archive)

			create(t, &v1alpha1.ManifestRegistry{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ownManagerRegistry, Labels: map[string]string{ownManagerLabel: "true"}},
				Spec: v1alpha1.ManifestRegistrySpec{SourceRef: &v1alpha1.SourceReference{Kind: c.kind, Name: "tools"}, Path: "reg",
					Format: v1alpha1.FormatRegistry, Interval: &metav1.Duration{Duration: time.Hour},
					Verify: &v1alpha1.RegistryVerification{ManifestKeysSecretRef: &v1alpha1.LocalObjectReference{Name: "manifest-keys"}}}})

			reg := waitReady(t, ns, ownManagerRegistry, metav1.ConditionTrue, v1alpha1.ReasonSucceeded, rev)
			if a := reg.Status.Artifact; a == nil || a.Revision != rev || a.SourceDigest != digest || a.Tools != 3 ||
				len(a.ConfigMaps) != 1 || a.ConfigMaps[0] != ownManagerRegistry+"-manifests" {
				t.Fatalf("status.artifact %+v, want revision %s, sourceDigest %s, 3 tools in %s-manifests", reg.Status.Artifact, rev, digest, ownManagerRegistry)
			}
			cm := configMap(t, ns, ownManagerRegistry+"-manifests")
			if cm == nil || cm.Annotations[AnnotationRevision] != rev || !metav1.IsControlledBy(cm, reg) {
				t.Fatalf("rendered ConfigMap %+v, want revision %s, controlled by the registry", cm, rev)
			}
			b, ms := renderedBundle(t, ns, ownManagerRegistry, k.Trust)
			if snap := b.Snapshots[0].Snapshot; snap.Revision != rev || snap.Kind != "Registry" || len(ms) != 3 {
				t.Fatalf("rendered snapshot of revision %s, kind %s, with %d manifests; want %s, Registry, 3", snap.Revision, snap.Kind, len(ms), rev)
			}
			good := cm.Data

			// A new version (stripe.refund gets an owner) announced as a new artifact, but the
			// file served is another valid signed archive (the first one), not the bytes its
			// digest names: refused after the download, nothing changes.
			refund := *fixtures(t)[2]
			refund.Owner = "payments-team@example.com"
			publish(t, filepath.Join(content, "reg"), k, &refund)
			archive2 := flux.TarGz(t, content)
			digest2 := sha256Digest(archive2)
			rev2 := c.revision(digest2)
			file2 := strings.TrimPrefix(digest2, "sha256:") + ".tar.gz"
			setArtifact(file2, digest2, rev2, archive)
			reg = waitReady(t, ns, ownManagerRegistry, metav1.ConditionFalse, ReasonArtifactFailed, rev2)
			if msg := condition(reg.Status.Conditions, v1alpha1.ConditionReady).Message; !strings.Contains(msg, digest2) || !strings.Contains(msg, "digest") ||
				!strings.Contains(msg, "the last good rendering stays") {
				t.Errorf("Ready message %q: want the digest mismatch of %s named", msg, digest2)
			}
			if n := storage.requests(folder + file2); n == 0 {
				t.Errorf("the tampered artifact was never downloaded: refused for another reason than its digest")
			}
			if a := reg.Status.Artifact; a == nil || a.Revision != rev || a.SourceDigest != digest {
				t.Errorf("after the refused artifact, status.artifact %+v; want the last good revision %s", reg.Status.Artifact, rev)
			}
			cm = configMap(t, ns, ownManagerRegistry+"-manifests")
			if cm == nil || cm.Annotations[AnnotationRevision] != rev || !equalData(cm.Data, good) {
				t.Errorf("the refused artifact changed the rendering")
			}

			// The same new version with its real bytes: rendered (the digest was all that was wrong).
			setArtifact(file2, digest2, rev2, archive2)
			requestReconcile(t, ns, ownManagerRegistry) // the source's status did not change
			reg = waitReady(t, ns, ownManagerRegistry, metav1.ConditionTrue, v1alpha1.ReasonSucceeded, rev2)
			if a := reg.Status.Artifact; a == nil || a.Revision != rev2 || a.SourceDigest != digest2 {
				t.Fatalf("status.artifact %+v, want revision %s", reg.Status.Artifact, rev2)
			}
			_, ms = renderedBundle(t, ns, ownManagerRegistry, k.Trust)
			if ms[2].Tool != "stripe.refund" || ms[2].Owner != "payments-team@example.com" || ms[2].Version != 2 {
				t.Errorf("rendered refund %s v%d owner %q, want v2 with the owner", ms[2].Tool, ms[2].Version, ms[2].Owner)
			}
			if cm := configMap(t, ns, ownManagerRegistry+"-manifests"); cm == nil || cm.Annotations[AnnotationRevision] != rev2 {
				t.Errorf("the ConfigMap is not at revision %s", rev2)
			}
		})
	}
}
