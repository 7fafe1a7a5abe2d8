package redteam

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	fluxmeta "github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/podrun"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
	"github.com/reversi-gitops/reversi/test/flux"
)

// fluxTool is the Plain manifest the Flux registries serve; fluxLoose is the same tool made
// irreversible without approval, what an attacker wants enforced.
const (
	fluxTool = `tool: memory.delete_entities
description: Delete entities.
effect: irreversible
permission: memory:write
approval:
  roles: [sre]
`
	fluxLoose = `tool: memory.delete_entities
description: Delete entities.
effect: read_only
permission: memory:read
`
)

// TestFluxSourceRefAttacks attacks ManifestRegistry spec.sourceRef (issue 22) with a real
// source-controller: the registry trusts a Flux source only as far as its own spec says.
//   - swapped keys: whoever may edit a GitRepository points its spec.verify at their own key
//     Secret and signs with that key; Flux says SourceVerified=True, but the registry's
//     verify.commit keys do not list the key, so it is refused.
//   - verification removed: a GitRepository that verifies nothing is refused when the registry
//     asks for verify.commit.
//   - tampered storage: the artifact's bytes are replaced where source-controller serves them;
//     the digest check refuses them and the last good rendering stays.
//   - another namespace: refused by a controller run with --no-cross-namespace-refs.
//   - an author who may not read the source: refused at admission.
//
// The honest registry next to them is Ready with the source's revision.
func TestFluxSourceRefAttacks(t *testing.T) {
	w := newControlPlane(t, testenv.Options{Webhooks: true})
	fx := flux.Start(t, w.env.Environment, flux.Options{SkipKustomize: true})
	must(t, sourcev1.AddToScheme(w.env.Scheme))
	const other = "team-b"
	must(t, w.k8s.Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}))

	alice, mallory := sourcetest.NewSSHKey(t), sourcetest.NewSSHKey(t)
	for _, n := range []string{ns, other} {
		must(t, w.k8s.Create(w.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "committers"},
			Data: map[string][]byte{"alice.sshpub": alice.AuthorizedKey}}))
	}
	must(t, w.k8s.Create(w.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mallory-keys"},
		Data: map[string][]byte{"mallory.sshpub": mallory.AuthorizedKey}}))

	honest := sourcetest.NewRepo(t)
	honest.WriteFile("tools/delete.yaml", fluxTool)
	head := honest.CommitSigned("delete needs sre", alice)
	evil := sourcetest.NewRepo(t)
	evil.WriteFile("tools/delete.yaml", fluxLoose)
	evil.CommitSigned("delete is a read", mallory)
	honestURL := sourcetest.ServeHTTP(t, filepath.Dir(honest.Dir), sourcetest.HTTPAuth{}).RepoURL(t, honest.Dir)
	evilURL := sourcetest.ServeHTTP(t, filepath.Dir(evil.Dir), sourcetest.HTTPAuth{}).RepoURL(t, evil.Dir)

	gitRepo := func(namespace, name, url, keys string) {
		gr := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec: sourcev1.GitRepositorySpec{URL: url, Reference: &sourcev1.GitRepositoryRef{Branch: "main"},
				Interval: metav1.Duration{Duration: time.Hour}, Timeout: &metav1.Duration{Duration: 30 * time.Second}}}
		if keys != "" {
			gr.Spec.Verification = &sourcev1.GitRepositoryVerification{Mode: sourcev1.ModeGitHEAD, SecretRef: fluxmeta.LocalObjectReference{Name: keys}}
		}
		must(t, w.k8s.Create(w.ctx, gr))
	}
	gitRepo(ns, "honest", honestURL, "committers")
	gitRepo(ns, "swapped", evilURL, "mallory-keys") // Flux verifies it: mallory signed it
	gitRepo(ns, "unverified", honestURL, "")
	gitRepo(other, "honest", honestURL, "committers")
	for _, src := range []types.NamespacedName{{Namespace: ns, Name: "honest"}, {Namespace: ns, Name: "swapped"}, {Namespace: ns, Name: "unverified"}, {Namespace: other, Name: "honest"}} {
		fluxSourceReady(t, w, src)
	}

	wh := w.env.WebhookInstallOptions
	w.controllerFlags = []string{"--webhooks=true", "--webhook-port", strconv.Itoa(wh.LocalServingPort), "--webhook-cert-dir", wh.LocalServingCertDir,
		"--no-cross-namespace-refs", "--flux-artifact-hosts", "127.0.0.1"}
	w.ctrlTemp = filepath.Join(w.dir, "checkouts")
	must(t, os.MkdirAll(w.ctrlTemp, 0o700))
	w.startController(t)
	t.Cleanup(func() { w.controller.Stop() })
	(&approvalsWorld{world: w}).waitWebhookServing(t)

	registry := func(name string, ref v1alpha1.SourceReference, verify bool) *v1alpha1.ManifestRegistry {
		r := &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.ManifestRegistrySpec{SourceRef: &ref, Path: "tools", Format: v1alpha1.FormatPlain, Interval: &metav1.Duration{Duration: time.Hour}}}
		if verify {
			r.Spec.Verify = &v1alpha1.RegistryVerification{Commit: &v1alpha1.CommitVerification{Mode: v1alpha1.CommitVerifyHEAD, SecretRef: v1alpha1.LocalObjectReference{Name: "committers"}}}
		}
		return r
	}
	gr := func(name string) v1alpha1.SourceReference {
		return v1alpha1.SourceReference{Kind: v1alpha1.SourceKindGitRepository, Name: name}
	}
	crossRef := gr("honest")
	crossRef.Namespace = other
	for _, r := range []*v1alpha1.ManifestRegistry{
		registry("honest", gr("honest"), true),
		registry("swapped", gr("swapped"), true),
		registry("unverified", gr("unverified"), true),
		registry("cross", crossRef, false),
	} {
		must(t, w.k8s.Create(w.ctx, r))
	}

	good := w.waitReady(t, "honest", 60*time.Second)
	if got := artifactRevision(good); got != "main@sha1:"+head {
		t.Errorf("honest registry revision %s, want the source's main@sha1:%s", got, head)
	}
	goodData := w.configMap(t, "honest-manifests").Data
	if !strings.Contains(strings.Join(slices.Collect(maps.Values(goodData)), "\n"), "sre") {
		t.Fatalf("the honest rendering does not carry the approval rule: %v", goodData)
	}

	settle := func(name, reason string, contains ...string) {
		t.Helper()
		if err := podrun.Poll(w.ctx, 60*time.Second, func() string {
			if c := ready(w.registry(t, name)); c.Reason != reason {
				return fmt.Sprintf("ManifestRegistry %s: %s", name, conditionText(w.registry(t, name).Status.Conditions))
			}
			return ""
		}); err != nil {
			t.Error(err)
			return
		}
		r := w.registry(t, name)
		wantNotReady(t, r, reason, contains...)
		if r.Status.Artifact != nil {
			t.Errorf("ManifestRegistry %s rendered %s", name, r.Status.Artifact.Revision)
		}
		if cm := (&corev1.ConfigMap{}); w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: name + "-manifests"}, cm) == nil {
			t.Errorf("ManifestRegistry %s rendered ConfigMap %s: %v", name, cm.Name, cm.Data)
		}
	}
	t.Run("swapped keys", func(t *testing.T) {
		settle("swapped", v1alpha1.ReasonCommitVerificationFailed, "mallory-keys", "mallory.sshpub", "does not list")
	})
	t.Run("verification removed", func(t *testing.T) {
		settle("unverified", v1alpha1.ReasonCommitVerificationFailed, "verifies no signature")
	})
	t.Run("another namespace", func(t *testing.T) {
		settle("cross", "AccessDenied", "--no-cross-namespace-refs", other)
	})

	t.Run("tampered storage", func(t *testing.T) {
		src := &sourcev1.GitRepository{}
		must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: "honest"}, src))
		u, err := url.Parse(src.Status.Artifact.URL)
		must(t, err)
		file := filepath.Join(fx.StoragePath, filepath.FromSlash(u.Path))
		if _, err := os.Stat(file); err != nil {
			t.Fatalf("the artifact of %s is not in source-controller's storage: %v", src.Status.Artifact.URL, err)
		}
		must(t, os.WriteFile(file, tarball(t, map[string]string{"tools/delete.yaml": fluxLoose}), 0o644))
		// Anything that makes the registry fetch again: its spec changes.
		r := w.registry(t, "honest")
		patch := client.MergeFrom(r.DeepCopy())
		r.Spec.Interval = &metav1.Duration{Duration: 2 * time.Hour}
		must(t, w.k8s.Patch(w.ctx, r, patch))
		if err := podrun.Poll(w.ctx, 60*time.Second, func() string {
			if r := w.registry(t, "honest"); r.Status.ObservedGeneration != r.Generation || ready(r).Status != metav1.ConditionFalse {
				return "honest: " + conditionText(r.Status.Conditions)
			}
			return ""
		}); err != nil {
			t.Fatal(err)
		}
		r = w.registry(t, "honest")
		wantNotReady(t, r, "ArtifactFailed", "digest", src.Status.Artifact.Digest, "the last good rendering stays")
		if got := artifactRevision(r); got != "main@sha1:"+head || r.Status.Artifact.SourceDigest != src.Status.Artifact.Digest {
			t.Errorf("after the tampered download the registry shows %s / %s", got, r.Status.Artifact.SourceDigest)
		}
		if got := w.configMap(t, "honest-manifests").Data; !maps.Equal(got, goodData) {
			t.Errorf("the tampered artifact changed the rendering:\n%v\nwas\n%v", got, goodData)
		}
	})

	t.Run("author who may not read the source", func(t *testing.T) {
		const author = "rg-flux-author"
		kc, err := w.env.UserKubeconfig(w.dir, author)
		must(t, err)
		cfg, err := clientcmd.BuildConfigFromFlags("", kc)
		must(t, err)
		as, err := client.New(cfg, client.Options{Scheme: w.env.Scheme})
		must(t, err)
		for _, n := range []string{ns, other} {
			must(t, w.k8s.Create(w.ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "flux-registry-author"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"manifestregistries"}, Verbs: []string{"get", "create", "update", "patch"}},
					{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"committers"}, Verbs: []string{"get"}}}}))
			must(t, w.k8s.Create(w.ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: "flux-registry-author"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "flux-registry-author"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: author}}}))
		}
		// Another team's GitRepository, which the author cannot read: its files would be
		// rendered into a ConfigMap of the author's namespace.
		theirs := v1alpha1.SourceReference{Kind: v1alpha1.SourceKindGitRepository, Name: "honest", Namespace: other}
		err = as.Create(w.ctx, registry("borrowed", theirs, true))
		if err == nil || !strings.Contains(err.Error(), "spec.sourceRef") || !strings.Contains(err.Error(), "gitrepositories.source.toolkit.fluxcd.io") {
			t.Fatalf("a registry of a source its author may not read: %v, want refused naming spec.sourceRef", err)
		}
		t.Logf("refused: %v", err)
		// Allowed to read it, the same author may create it (the controller then applies its
		// own namespace rule).
		must(t, w.k8s.Create(w.ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "flux-source-reader"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{sourcev1.GroupVersion.Group}, Resources: []string{"gitrepositories"}, ResourceNames: []string{"honest"}, Verbs: []string{"get"}}}}))
		must(t, w.k8s.Create(w.ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "flux-source-reader"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "flux-source-reader"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: author}}}))
		if err := podrun.Poll(w.ctx, 20*time.Second, func() string {
			if err := as.Create(w.ctx, registry("borrowed", theirs, true)); err != nil {
				return err.Error() // RBAC changes take a moment to reach the authorizer
			}
			return ""
		}); err != nil {
			t.Fatalf("an author who may read the source: %v", err)
		}
		// An update that changes only sourceRef.namespace, to a source of the same name the
		// author may not read (agents/honest), is reviewed again and refused, whether the
		// namespace is named or left to default to the registry's.
		for _, target := range []string{ns, ""} {
			b := &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "borrowed"}}
			patch := fmt.Sprintf(`{"spec":{"sourceRef":{"namespace":%q}}}`, target)
			if target == "" {
				patch = `{"spec":{"sourceRef":{"namespace":null}}}`
			}
			err := as.Patch(w.ctx, b, client.RawPatch(types.MergePatchType, []byte(patch)))
			if err == nil || !strings.Contains(err.Error(), "spec.sourceRef") || !strings.Contains(err.Error(), `in namespace "`+ns+`"`) {
				t.Errorf("moving the registry's source to namespace %q, which its author may not read: %v, want refused", target, err)
			}
		}
	})
}

// fluxSourceReady waits until source-controller has an artifact for the GitRepository.
func fluxSourceReady(t *testing.T, w *world, key types.NamespacedName) {
	t.Helper()
	if err := podrun.Poll(w.ctx, 60*time.Second, func() string {
		gr := &sourcev1.GitRepository{}
		must(t, w.k8s.Get(w.ctx, key, gr))
		if gr.Status.Artifact == nil {
			return fmt.Sprintf("GitRepository %s has no artifact: %v", key, gr.Status.Conditions)
		}
		return ""
	}); err != nil {
		t.Fatal(err)
	}
}

// tarball is a gzipped tar of files, as source-controller stores artifacts.
func tarball(t *testing.T, files map[string]string) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, body := range files {
		must(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(body))
		must(t, err)
	}
	must(t, tw.Close())
	must(t, gz.Close())
	return buf.Bytes()
}
