package controllers

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	fluxmeta "github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/source"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// fluxRegistry is a registry of the GitRepository ns/name with verify.commit (mode HEAD,
// Secret committers).
func fluxRegistry(kind string) *v1alpha1.ManifestRegistry {
	return &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "reg"},
		Spec: v1alpha1.ManifestRegistrySpec{SourceRef: &v1alpha1.SourceReference{Kind: kind, Name: "src"}, Path: "tools", Format: v1alpha1.FormatPlain,
			Verify: &v1alpha1.RegistryVerification{Commit: &v1alpha1.CommitVerification{Mode: v1alpha1.CommitVerifyHEAD, SecretRef: v1alpha1.LocalObjectReference{Name: "committers"}}}}}
}

// TestFluxVerificationBound checks, on forged source statuses, what ties a source's
// SourceVerified to the artifact and to the registry's keys (the real source-controller
// runs in test/redteam TestFluxVerificationBinding).
func TestFluxVerificationBound(t *testing.T) {
	alice, mallory := sourcetest.NewSSHKey(t), sourcetest.NewSSHKey(t)
	commit, other := strings.Repeat("ab", 20), strings.Repeat("cd", 20)
	rev := "main@sha1:" + commit
	keys, err := source.ParseKeys(map[string][]byte{"alice.sshpub": alice.AuthorizedKey})
	if err != nil {
		t.Fatal(err)
	}
	line := func(what, obj, key string) string { return fmt.Sprintf("\n\t- %s '%s' with key '%s'", what, obj, key) }
	for _, c := range []struct {
		name, msg, mode, want string
	}{
		{"the artifact's commit by our key", "verified signature of" + line("commit", commit, alice.Fingerprint), "HEAD", ""},
		{"tag and commit", "verified signature of" + line("tag", "v1@"+other, alice.Fingerprint) + line("commit", commit, alice.Fingerprint), "TAGANDHEAD", ""},
		{"another key", "verified signature of" + line("commit", commit, mallory.Fingerprint), "HEAD", "does not list"},
		{"another commit", "verified signature of" + line("commit", other, alice.Fingerprint), "HEAD", "but the artifact is revision"},
		{"no commit for HEAD", "verified signature of" + line("tag", "v1@"+other, alice.Fingerprint), "HEAD", "reports no commit"},
		{"no tag for Tag", "verified signature of" + line("commit", commit, alice.Fingerprint), "TAG", "reports no tag"},
		{"a line more", "verified signature of" + line("commit", commit, alice.Fingerprint) + "\n\tand trust me", "HEAD", "is not a verified object"},
		{"not a report", "all good", "HEAD", "not source-controller's report"},
		{"nothing verified", "verified signature of", "HEAD", "not source-controller's report"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := bindGitVerification(c.msg, c.mode, rev, keys)
			if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
				t.Errorf("bindGitVerification: %q, want %q", got, c.want)
			}
		})
	}
	if got := bindGitVerification("verified signature of"+line("commit", commit, alice.Fingerprint), "HEAD", "main@sha256:"+commit, keys); !strings.Contains(got, "names no sha1 commit") {
		t.Errorf("a revision without a sha1 commit: %q", got)
	}

	// Through checkFluxVerification, with the Secrets in a fake API server.
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	secrets := []runtime.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "committers"}, Data: map[string][]byte{"alice.sshpub": alice.AuthorizedKey}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "copy"}, Data: map[string][]byte{"alice.sshpub": alice.AuthorizedKey}},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithRuntimeObjects(secrets...).Build()
	r := &ManifestRegistryReconciler{Client: c, APIReader: c}
	verified := func(gen int64, msg string) []metav1.Condition {
		return []metav1.Condition{{Type: sourcev1.SourceVerifiedCondition, Status: metav1.ConditionTrue, ObservedGeneration: gen, Reason: "Succeeded", Message: msg}}
	}
	gitRepo := func(mut func(*sourcev1.GitRepository)) *sourcev1.GitRepository {
		g := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "src", Generation: 3},
			Spec: sourcev1.GitRepositorySpec{Verification: &sourcev1.GitRepositoryVerification{Mode: sourcev1.ModeGitHEAD, SecretRef: fluxmeta.LocalObjectReference{Name: "committers"}}},
			Status: sourcev1.GitRepositoryStatus{Artifact: &fluxmeta.Artifact{Revision: rev, Digest: "sha256:00", URL: "http://x/"},
				Conditions: verified(2, "verified signature of"+line("commit", commit, alice.Fingerprint))}}
		if mut != nil {
			mut(g)
		}
		return g
	}
	ignore := "/*\n!/tools/\n"
	for _, c := range []struct {
		name string
		src  fluxSource
		want string
	}{
		// source-controller keeps SourceVerified of a commit it verified at an earlier
		// generation: an edit of the GitRepository that needs no new verification keeps it.
		{"verified at an earlier generation", gitRepo(nil), ""},
		{"include", gitRepo(func(g *sourcev1.GitRepository) {
			g.Spec.Include = []sourcev1.GitRepositoryInclude{{GitRepositoryRef: fluxmeta.LocalObjectReference{Name: "unverified"}, ToPath: "tools"}}
		}), "spec.include"},
		{"included artifacts", gitRepo(func(g *sourcev1.GitRepository) { g.Status.IncludedArtifacts = []*fluxmeta.Artifact{{Revision: "x"}} }), "spec.include"},
		{"ignore", gitRepo(func(g *sourcev1.GitRepository) { g.Spec.Ignore = &ignore }), "spec.ignore"},
		{"sparse checkout", gitRepo(func(g *sourcev1.GitRepository) { g.Spec.SparseCheckout = []string{"tools/a"} }), "spec.sparseCheckout"},
		{"oci with the registry's Secret", &sourcev1.OCIRepository{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "src", Generation: 3},
			Spec:   sourcev1.OCIRepositorySpec{Verify: &sourcev1.OCIRepositoryVerification{Provider: "cosign", SecretRef: &fluxmeta.LocalObjectReference{Name: "committers"}}},
			Status: sourcev1.OCIRepositoryStatus{Artifact: &fluxmeta.Artifact{Revision: "v1@sha256:" + commit}, Conditions: verified(3, "verified signature of revision v1@sha256:"+commit)}}, ""},
		// A copy of the keys would pass checkFluxKeys, but its content may change after the
		// verification without source-controller verifying again, and the report names no key.
		{"oci with a copy of the keys", &sourcev1.OCIRepository{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "src", Generation: 3},
			Spec:   sourcev1.OCIRepositorySpec{Verify: &sourcev1.OCIRepositoryVerification{Provider: "cosign", SecretRef: &fluxmeta.LocalObjectReference{Name: "copy"}}},
			Status: sourcev1.OCIRepositoryStatus{Artifact: &fluxmeta.Artifact{Revision: "v1@sha256:" + commit}, Conditions: verified(3, "verified signature of revision v1@sha256:"+commit)}}, "must verify with spec.verify.commit.secretRef"},
		{"oci verified for another revision", &sourcev1.OCIRepository{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "src", Generation: 3},
			Spec:   sourcev1.OCIRepositorySpec{Verify: &sourcev1.OCIRepositoryVerification{Provider: "cosign", SecretRef: &fluxmeta.LocalObjectReference{Name: "committers"}}},
			Status: sourcev1.OCIRepositoryStatus{Artifact: &fluxmeta.Artifact{Revision: "v1@sha256:" + commit}, Conditions: verified(3, "verified signature of revision v0@sha256:"+other)}}, "its SourceVerified says"},
		{"oci verified at an earlier generation", &sourcev1.OCIRepository{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "src", Generation: 3},
			Spec:   sourcev1.OCIRepositorySpec{Verify: &sourcev1.OCIRepositoryVerification{Provider: "cosign", SecretRef: &fluxmeta.LocalObjectReference{Name: "committers"}}},
			Status: sourcev1.OCIRepositoryStatus{Artifact: &fluxmeta.Artifact{Revision: "v1@sha256:" + commit}, Conditions: verified(2, "verified signature of revision v1@sha256:"+commit)}}, "generation 2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			kind := v1alpha1.SourceKindGitRepository
			if _, ok := c.src.(*sourcev1.OCIRepository); ok {
				kind = v1alpha1.SourceKindOCIRepository
			}
			serr := r.checkFluxVerification(t.Context(), fluxRegistry(kind), c.src)
			switch {
			case c.want == "" && serr != nil:
				t.Errorf("refused: %v", serr)
			case c.want != "" && (serr == nil || !strings.Contains(serr.msg, c.want)):
				t.Errorf("got %v, want refused naming %q", serr, c.want)
			}
		})
	}
}

// TestFluxArtifactURLBound checks which status.artifact.url the controller downloads: only
// from --flux-artifact-hosts, only the source's own folder of source-controller's storage.
func TestFluxArtifactURLBound(t *testing.T) {
	src := func(u string) fluxSource {
		return &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "src"},
			Status: sourcev1.GitRepositoryStatus{Artifact: &fluxmeta.Artifact{URL: u}}}
	}
	const file = "/gitrepository/agents/src/0123abcd.tar.gz"
	for _, c := range []struct {
		hosts []string
		url   string
		ok    bool
	}{
		{nil, "http://source-controller.flux-system.svc.cluster.local." + file, true},
		{nil, "http://SOURCE-controller.flux-system.svc.cluster.local" + file, true},
		{nil, "http://source-controller.flux-system.svc.cluster.local.:9090" + file, true},
		{nil, "http://127.0.0.1:9090" + file, false},
		{nil, "http://169.254.169.254/latest/meta-data/", false},
		{nil, "http://source-controller.flux-system.svc.cluster.local.evil.example" + file, false},
		{[]string{"127.0.0.1"}, "http://127.0.0.1:9090" + file, true},
		{[]string{"127.0.0.1:9090"}, "http://127.0.0.1:9090" + file, true},
		{[]string{"127.0.0.1:9090"}, "http://127.0.0.1:9091" + file, false},
		{[]string{"[::1]"}, "http://[::1]:9090" + file, true},
		{[]string{"*"}, "https://anywhere.example" + file, true},
		{[]string{"*"}, "file:///etc/passwd", false},
		{[]string{"*"}, "ftp://anywhere.example" + file, false},
		{[]string{"127.0.0.1"}, "http://user:pw@127.0.0.1" + file, false},
		{[]string{"127.0.0.1"}, "http://127.0.0.1" + file + "?x=1", false},
		{[]string{"127.0.0.1"}, "http://127.0.0.1" + file + "#x", false},
		// Another source's artifact in the same storage, or a path out of the folder.
		{[]string{"127.0.0.1"}, "http://127.0.0.1/gitrepository/team-b/evil/0123abcd.tar.gz", false},
		{[]string{"127.0.0.1"}, "http://127.0.0.1/ocirepository/agents/src/0123abcd.tar.gz", false},
		{[]string{"127.0.0.1"}, "http://127.0.0.1/gitrepository/agents/src/../../team-b/evil/x.tar.gz", false},
		{[]string{"127.0.0.1"}, "http://127.0.0.1/gitrepository/agents/src/%2e%2e/x.tar.gz", false},
		{[]string{"127.0.0.1"}, "http://127.0.0.1/gitrepository/agents/src/sub/x.tar.gz", false},
		{[]string{"127.0.0.1"}, "http://127.0.0.1/gitrepository/agents/src/", false},
		{[]string{"127.0.0.1"}, "http://127.0.0.1/gitrepository/agents/srcx/x.tar.gz", false},
	} {
		r := &ManifestRegistryReconciler{FluxArtifactHosts: c.hosts}
		reg := fluxRegistry(v1alpha1.SourceKindGitRepository)
		serr := r.checkArtifactURL(reg, src(c.url))
		if (serr == nil) != c.ok {
			t.Errorf("hosts %v, url %s: %v, want allowed %t", c.hosts, c.url, serr, c.ok)
		}
	}
}

// TestFluxArtifactBombs serves hostile artifacts (digests matching) and checks that each is
// refused within its bounds, with the last good rendering untouched (nothing returned).
func TestFluxArtifactBombs(t *testing.T) {
	var served atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(served.Load().([]byte)) }))
	t.Cleanup(srv.Close)
	header := func(h *tar.Header) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Flush()
		return b.Bytes()
	}
	gz := func(chunks ...[]byte) []byte {
		var b bytes.Buffer
		z := gzip.NewWriter(&b)
		for _, c := range chunks {
			z.Write(c)
		}
		z.Close()
		return b.Bytes()
	}
	// headerBomb: about 4 GiB of empty-file headers (8 million entries) in a few MiB: gzip
	// members of 16 MiB of headers each, concatenated (gzip readers read them as one stream).
	headerBomb := func() []byte {
		one := bytes.Repeat(header(&tar.Header{Name: "tools/x.yaml", Mode: 0o644, Typeflag: tar.TypeReg}), 32<<10)
		member := gz(one)
		return bytes.Repeat(member, 256)
	}
	file := func(name string, size int64, typ byte) []byte {
		b := header(&tar.Header{Name: name, Mode: 0o644, Size: size, Typeflag: typ, Linkname: "/etc/passwd"})
		if size > 0 {
			b = append(b, make([]byte, (size+511)/512*512)...)
		}
		return b
	}
	for _, c := range []struct {
		name    string
		archive []byte
		reason  string
		want    string
	}{
		{"many empty entries", headerBomb(), v1alpha1.ReasonSourceTooLarge, "more than 1000 entries"},
		{"a file over the limit", gz(file("tools/big.yaml", 2<<20, tar.TypeReg)), v1alpha1.ReasonSourceTooLarge, "more than 1048576"},
		{"zip bomb over the total", gz(file("tools/a.yaml", 1<<20, tar.TypeReg), file("tools/b.yaml", 1<<20, tar.TypeReg), file("tools/c.yaml", 1<<20, tar.TypeReg)), ReasonArtifactFailed, "bigger than max archive size"},
		{"path traversal", gz(file("tools/../../evil.yaml", 10, tar.TypeReg)), ReasonArtifactFailed, "invalid name"},
		{"absolute path", gz(file("/tmp/evil.yaml", 10, tar.TypeReg)), ReasonArtifactFailed, "invalid name"},
		{"device file", gz(file("tools/dev", 0, tar.TypeChar)), ReasonArtifactFailed, "unsupported file type"},
		{"not gzip", []byte("plain text"), ReasonArtifactFailed, "gzip"},
	} {
		t.Run(c.name, func(t *testing.T) {
			served.Store(c.archive)
			sum := sha256.Sum256(c.archive)
			r := &ManifestRegistryReconciler{TempDir: t.TempDir(), FluxArtifactHosts: []string{"127.0.0.1"},
				SourceMaxFiles: 1000, SourceMaxFileBytes: 1 << 20, SourceMaxTotalBytes: 2<<20 + 4096}
			if c.name == "many empty entries" {
				r.SourceMaxTotalBytes = 64 << 20
			}
			src := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Namespace: "agents", Name: "src"},
				Status: sourcev1.GitRepositoryStatus{Artifact: &fluxmeta.Artifact{URL: srv.URL + "/gitrepository/agents/src/a.tar.gz",
					Digest: "sha256:" + hex.EncodeToString(sum[:]), Revision: "main@sha1:" + strings.Repeat("ab", 20)}}}
			start := time.Now()
			fa, serr := r.fetchFluxArtifact(t.Context(), fluxRegistry(v1alpha1.SourceKindGitRepository), src)
			took := time.Since(start)
			if fa != nil {
				fa.cleanup()
				t.Fatalf("accepted")
			}
			if serr.reason != c.reason || !strings.Contains(serr.msg, c.want) {
				t.Errorf("%s: %s, want %s naming %q", serr.reason, serr.msg, c.reason, c.want)
			}
			if took > 5*time.Second {
				t.Errorf("took %s: the unpacking did not stop at the first entry over a bound", took)
			}
		})
	}
}

// TestFluxOddRevision: a revision no source-controller writes (a new line, a space, very
// long) is refused before it reaches the status, the snapshot or the gateways.
func TestFluxOddRevision(t *testing.T) {
	for rev, ok := range map[string]bool{
		"main@sha1:" + strings.Repeat("ab", 20):      true,
		"v1.2.3@sha256:" + strings.Repeat("ab", 32):  true,
		"main@sha1:abc\nlevel=info msg=forged":       false,
		"main@sha1:abc def":                          false,
		"main@sha1:abc\x00":                          false,
		"main@sha1:é":                                false,
		strings.Repeat("a", MaxFluxRevisionLength+1): false,
		strings.Repeat("a", MaxFluxRevisionLength):   true,
	} {
		if got := oddRevision(rev); (got == "") != ok {
			t.Errorf("oddRevision(%.40q) = %q, want ok %t", rev, got, ok)
		}
	}
}
