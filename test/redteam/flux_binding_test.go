package redteam

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	fluxmeta "github.com/fluxcd/pkg/apis/meta"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/internal/podrun"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
	"github.com/reversi-gitops/reversi/test/flux"
)

// TestFluxVerificationBinding attacks what ties a Flux source's SourceVerified=True to the
// keys of the registry's verify.commit, with a real source-controller:
//   - keys swapped after verification: whoever may edit a GitRepository and its own key Secret
//     (but neither the registry nor its key Secret) points the GitRepository at a commit signed
//     by their own key and at a Secret holding that key; Flux verifies it; then they rewrite
//     their Secret to hold only the registry's keys. Flux does not verify again (it verifies a
//     commit once), so SourceVerified=True still stands for their key: the registry must not
//     apply the commit.
//   - the artifact URL elsewhere: whoever may write a source's status (here a suspended
//     GitRepository, which source-controller leaves alone) points status.artifact.url at their
//     own server with a matching digest, or at another source's artifact in
//     source-controller's storage: the controller requests neither (--flux-artifact-hosts,
//     the source's own storage folder).
//   - an honest edit of the GitRepository (its interval) that Flux does not verify again for
//     (same commit): the registry stays Ready, since the verification it relies on is still
//     the one of the artifact it serves.
func TestFluxVerificationBinding(t *testing.T) {
	w := newControlPlane(t, testenv.Options{})
	fx := flux.Start(t, w.env.Environment, flux.Options{SkipKustomize: true})
	must(t, sourcev1.AddToScheme(w.env.Scheme))

	alice, mallory := sourcetest.NewSSHKey(t), sourcetest.NewSSHKey(t)
	must(t, w.k8s.Create(w.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "committers"},
		Data: map[string][]byte{"alice.sshpub": alice.AuthorizedKey}}))
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

	for name, src := range map[string]struct{ url, keys string }{"honest": {honestURL, "committers"}, "swap": {evilURL, "mallory-keys"}} {
		must(t, w.k8s.Create(w.ctx, &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: sourcev1.GitRepositorySpec{URL: src.url, Reference: &sourcev1.GitRepositoryRef{Branch: "main"},
				Interval: metav1.Duration{Duration: time.Hour}, Timeout: &metav1.Duration{Duration: 30 * time.Second},
				Verification: &sourcev1.GitRepositoryVerification{Mode: sourcev1.ModeGitHEAD, SecretRef: fluxmeta.LocalObjectReference{Name: src.keys}}}}))
	}
	for _, n := range []string{"honest", "swap"} {
		fluxSourceVerified(t, w, n)
	}

	w.ctrlTemp = filepath.Join(w.dir, "checkouts")
	must(t, os.MkdirAll(w.ctrlTemp, 0o700))
	w.controllerFlags = append(w.controllerFlags, "--flux-artifact-hosts", fx.StorageAddr) // exactly source-controller's storage
	w.startController(t)
	t.Cleanup(func() { w.controller.Stop() })

	for _, n := range []string{"honest", "swap"} {
		must(t, w.k8s.Create(w.ctx, &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: n},
			Spec: v1alpha1.ManifestRegistrySpec{SourceRef: &v1alpha1.SourceReference{Kind: v1alpha1.SourceKindGitRepository, Name: n},
				Path: "tools", Format: v1alpha1.FormatPlain, Interval: &metav1.Duration{Duration: time.Hour},
				Verify: &v1alpha1.RegistryVerification{Commit: &v1alpha1.CommitVerification{Mode: v1alpha1.CommitVerifyHEAD,
					SecretRef: v1alpha1.LocalObjectReference{Name: "committers"}}}}}))
	}
	good := w.waitReady(t, "honest", 60*time.Second)
	if got := artifactRevision(good); got != "main@sha1:"+head {
		t.Fatalf("honest registry revision %s, want main@sha1:%s", got, head)
	}
	goodData := w.configMap(t, "honest-manifests").Data

	t.Run("keys swapped after verification", func(t *testing.T) {
		if err := podrun.Poll(w.ctx, 60*time.Second, func() string {
			if r := w.registry(t, "swap"); ready(r).Reason != v1alpha1.ReasonCommitVerificationFailed {
				return "swap: " + conditionText(r.Status.Conditions)
			}
			return ""
		}); err != nil {
			t.Fatal(err)
		}
		// Mallory's Secret now lists only alice's key; the GitRepository is not touched, so
		// source-controller keeps SourceVerified=True (verified with mallory's key).
		s := &corev1.Secret{}
		must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: "mallory-keys"}, s))
		s.Data = map[string][]byte{"mallory.sshpub": alice.AuthorizedKey}
		must(t, w.k8s.Update(w.ctx, s))
		for range 3 {
			r := w.reconciled(t, "swap", w.reconcile(t, "swap"), 60*time.Second)
			if r.Status.Artifact != nil {
				t.Fatalf("the registry applied %s, a commit signed by mallory's key: %s", r.Status.Artifact.Revision, conditionText(r.Status.Conditions))
			}
			wantNotReady(t, r, v1alpha1.ReasonCommitVerificationFailed, mallory.Fingerprint)
		}
		if cm := (&corev1.ConfigMap{}); w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: "swap-manifests"}, cm) == nil {
			t.Errorf("rendered %s: %v", cm.Name, cm.Data)
		}
	})

	t.Run("artifact URL elsewhere", func(t *testing.T) {
		evilTar := tarball(t, map[string]string{"tools/delete.yaml": fluxLoose})
		var hits atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { hits.Add(1); rw.Write(evilTar) }))
		t.Cleanup(srv.Close)
		sum := sha256.Sum256(evilTar)
		swap := &sourcev1.GitRepository{}
		must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: "swap"}, swap))
		for name, c := range map[string]struct{ url, digest, want string }{
			"forged-host": {srv.URL + "/gitrepository/" + ns + "/forged-host/x.tar.gz", "sha256:" + hex.EncodeToString(sum[:]), "--flux-artifact-hosts"},
			"forged-path": {swap.Status.Artifact.URL, swap.Status.Artifact.Digest, "not a file of the source's folder"},
		} {
			gr := &sourcev1.GitRepository{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec: sourcev1.GitRepositorySpec{URL: honestURL, Interval: metav1.Duration{Duration: time.Hour}, Suspend: true}}
			must(t, w.k8s.Create(w.ctx, gr))
			// source-controller notes the suspended source in its status meanwhile: retry on a
			// conflict with the newest copy.
			must(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
				if err := w.k8s.Get(w.ctx, client.ObjectKeyFromObject(gr), gr); err != nil {
					return err
				}
				gr.Status = sourcev1.GitRepositoryStatus{ObservedGeneration: gr.Generation,
					Conditions: []metav1.Condition{{Type: fluxmeta.ReadyCondition, Status: metav1.ConditionTrue, ObservedGeneration: gr.Generation,
						Reason: "Succeeded", Message: "stored", LastTransitionTime: metav1.Now()}},
					Artifact: &fluxmeta.Artifact{URL: c.url, Digest: c.digest, Revision: "main@sha1:" + head, Path: "x", LastUpdateTime: metav1.Now()}}
				return w.k8s.Status().Update(w.ctx, gr)
			}))
			must(t, w.k8s.Create(w.ctx, &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
				Spec: v1alpha1.ManifestRegistrySpec{SourceRef: &v1alpha1.SourceReference{Kind: v1alpha1.SourceKindGitRepository, Name: name},
					Path: "tools", Format: v1alpha1.FormatPlain, Interval: &metav1.Duration{Duration: time.Hour}}}))
			if err := podrun.Poll(w.ctx, 60*time.Second, func() string {
				if r := w.registry(t, name); ready(r).Reason != controllers.ReasonArtifactFailed {
					return name + ": " + conditionText(r.Status.Conditions)
				}
				return ""
			}); err != nil {
				t.Fatal(err)
			}
			r := w.registry(t, name)
			wantNotReady(t, r, controllers.ReasonArtifactFailed, c.want)
			if r.Status.Artifact != nil {
				t.Errorf("%s rendered %s", name, r.Status.Artifact.Revision)
			}
		}
		if n := hits.Load(); n != 0 {
			t.Errorf("the controller requested the status writer's URL %d times", n)
		}
	})

	t.Run("honest edit without a new verification", func(t *testing.T) {
		gr := &sourcev1.GitRepository{}
		must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: "honest"}, gr))
		patch := client.MergeFrom(gr.DeepCopy())
		gr.Spec.Interval = metav1.Duration{Duration: 2 * time.Hour}
		must(t, w.k8s.Patch(w.ctx, gr, patch))
		if err := podrun.Poll(w.ctx, 60*time.Second, func() string {
			must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: "honest"}, gr))
			if c := apimeta.FindStatusCondition(gr.Status.Conditions, fluxmeta.ReadyCondition); c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != gr.Generation {
				return fmt.Sprintf("GitRepository honest generation %d not Ready: %v", gr.Generation, gr.Status.Conditions)
			}
			return ""
		}); err != nil {
			t.Fatal(err)
		}
		if c := apimeta.FindStatusCondition(gr.Status.Conditions, sourcev1.SourceVerifiedCondition); c != nil {
			t.Logf("GitRepository honest at generation %d: SourceVerified %s for generation %d: %q", gr.Generation, c.Status, c.ObservedGeneration, c.Message)
		}
		r := w.reconciled(t, "honest", w.reconcile(t, "honest"), 60*time.Second)
		if c := ready(r); c.Status != metav1.ConditionTrue {
			t.Errorf("after an honest edit of the GitRepository the registry is %s: %s", c.Status, conditionText(r.Status.Conditions))
		}
		if got := w.configMap(t, "honest-manifests").Data; !maps.Equal(got, goodData) {
			t.Errorf("the rendering changed")
		}
		if !strings.Contains(strings.Join(slices.Collect(maps.Values(goodData)), "\n"), "sre") {
			t.Errorf("the honest rendering lost its approval rule")
		}
	})
}

// fluxSourceVerified waits until source-controller has an artifact and SourceVerified=True for
// the GitRepository.
func fluxSourceVerified(t *testing.T, w *world, name string) {
	t.Helper()
	if err := podrun.Poll(w.ctx, 60*time.Second, func() string {
		gr := &sourcev1.GitRepository{}
		must(t, w.k8s.Get(w.ctx, types.NamespacedName{Namespace: ns, Name: name}, gr))
		if gr.Status.Artifact == nil || !apimeta.IsStatusConditionTrue(gr.Status.Conditions, sourcev1.SourceVerifiedCondition) {
			return fmt.Sprintf("GitRepository %s is not verified: %v", name, gr.Status.Conditions)
		}
		return ""
	}); err != nil {
		t.Fatal(err)
	}
}
