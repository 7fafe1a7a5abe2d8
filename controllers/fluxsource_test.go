package controllers

import (
	"fmt"
	"strings"
	"testing"

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
