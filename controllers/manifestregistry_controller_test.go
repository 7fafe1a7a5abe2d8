package controllers

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/source"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// signedRegistryRepo is a git repository holding a registry of the seed's manifests at reg/,
// every version signed by k, committed (signed by sshKey when given).
func signedRegistryRepo(t *testing.T, k keyPair) *sourcetest.Repo {
	t.Helper()
	repo := sourcetest.NewRepo(t)
	publish(t, filepath.Join(repo.Dir, "reg"), k, fixtures(t)...)
	repo.Commit("publish the payments manifests")
	return repo
}

func newRegistry(ns, name, url string, mutate func(*v1alpha1.ManifestRegistry)) *v1alpha1.ManifestRegistry {
	reg := &v1alpha1.ManifestRegistry{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ManifestRegistrySpec{
			URL:      url,
			Ref:      &v1alpha1.GitRef{Branch: "main"},
			Path:     "reg",
			Interval: &metav1.Duration{Duration: time.Hour}, // only requestedAt and watches trigger reconciles
		},
	}
	if mutate != nil {
		mutate(reg)
	}
	return reg
}

// requestReconcile bumps reversi.dev/requestedAt, as `flux reconcile`-style tooling does.
func requestReconcile(t *testing.T, ns, name string) string {
	t.Helper()
	reg := getRegistry(t, ns, name)
	at := time.Now().Format(time.RFC3339Nano)
	patch := client.MergeFrom(reg.DeepCopy())
	if reg.Annotations == nil {
		reg.Annotations = map[string]string{}
	}
	reg.Annotations[v1alpha1.AnnotationRequestedAt] = at
	if err := k8s.Patch(t.Context(), reg, patch); err != nil {
		t.Fatal(err)
	}
	return at
}

func withKeys(secret string) func(*v1alpha1.ManifestRegistry) {
	return func(r *v1alpha1.ManifestRegistry) {
		r.Spec.Verify = &v1alpha1.RegistryVerification{ManifestKeysSecretRef: &v1alpha1.LocalObjectReference{Name: secret}}
	}
}

// 1. The first sync renders every approved version, Ready=True, with a NewArtifact event; and
// 2. a new commit is rendered once requestedAt is bumped.
func TestRegistryRendersAndFollowsNewCommits(t *testing.T) {
	ns := namespace(t)
	k := newKey(t)
	repo := signedRegistryRepo(t, k)
	createSecret(t, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	// No spec.ref: the controller follows the branch main (the API server defaults none, so
	// that a registry with sourceRef has none either).
	create(t, newRegistry(ns, "payments", repo.FileURL(), func(r *v1alpha1.ManifestRegistry) { withKeys("manifest-keys")(r); r.Spec.Ref = nil }))

	rev := "main@sha1:" + repo.Rev("HEAD")
	reg := waitReady(t, ns, "payments", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, rev)
	if a := reg.Status.Artifact; a == nil || a.Revision != rev || a.Tools != 3 || len(a.ConfigMaps) != 1 || a.ConfigMaps[0] != "payments-manifests" {
		t.Fatalf("artifact %+v", reg.Status.Artifact)
	}
	if c := condition(reg.Status.Conditions, v1alpha1.ConditionArtifactInStorage); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("ArtifactInStorage %+v", c)
	}
	if condition(reg.Status.Conditions, v1alpha1.ConditionReconciling) != nil || condition(reg.Status.Conditions, v1alpha1.ConditionStalled) != nil {
		t.Fatalf("Reconciling/Stalled left after success: %+v", reg.Status.Conditions)
	}
	cm := configMap(t, ns, "payments-manifests")
	if cm == nil || cm.Annotations[AnnotationRevision] != rev || !metav1.IsControlledBy(cm, reg) {
		t.Fatalf("ConfigMap %+v", cm)
	}
	b, ms := renderedBundle(t, ns, "payments", k.Trust)
	snap := b.Snapshots[0].Snapshot
	if snap.Revision != rev || snap.Source != "ManifestRegistry "+ns+"/payments" || snap.Kind != "Registry" || snap.Sequence != reg.Status.Artifact.Sequence ||
		snap.Index == nil || snap.Index.Sequence != reg.Status.Artifact.IndexSequence || len(ms) != 3 || reg.Status.Artifact.Digest != b.Digest() {
		t.Fatalf("rendered %+v with %d manifests (status %+v)", snap, len(ms), reg.Status.Artifact)
	}
	eventually(t, 10*time.Second, func() string {
		var evs eventsv1.EventList
		if err := k8s.List(t.Context(), &evs, client.InNamespace(ns)); err != nil {
			return err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == v1alpha1.EventNewArtifact && e.Regarding.Name == "payments" && strings.Contains(e.Note, rev) {
				return ""
			}
		}
		return fmt.Sprintf("no NewArtifact event naming %s among %d events", rev, len(evs.Items))
	})

	// A merged PR: stripe.refund gets an owner.
	refund := *fixtures(t)[2]
	refund.Owner = "payments-team@example.com"
	publish(t, filepath.Join(repo.Dir, "reg"), k, &refund)
	repo.Commit("stripe.refund: name the owner")
	rev2 := "main@sha1:" + repo.Rev("HEAD")
	began := time.Now()
	requestReconcile(t, ns, "payments")
	eventually(t, 10*time.Second, func() string {
		if cm := configMap(t, ns, "payments-manifests"); cm == nil || cm.Annotations[AnnotationRevision] != rev2 {
			return "ConfigMap not at the new revision yet"
		}
		return ""
	})
	t.Logf("new commit rendered %s after requestedAt", time.Since(began).Round(time.Millisecond))
	_, ms = renderedBundle(t, ns, "payments", k.Trust)
	if ms[2].Tool != "stripe.refund" || ms[2].Owner != "payments-team@example.com" || ms[2].Version != 2 {
		t.Fatalf("refund %+v", ms[2])
	}
	reg = waitReady(t, ns, "payments", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, rev2)
	// The controller's own new rendering is no drift.
	for _, e := range events(t, ns, "payments") {
		if strings.HasPrefix(e, v1alpha1.EventRenderingDrift) {
			t.Fatalf("a new commit's rendering was reported as drift: %s", e)
		}
	}
	if reg.Status.LastHandledReconcileAt == "" {
		t.Fatal("lastHandledReconcileAt not set")
	}
}

// 3. Each bad revision leaves the last good ConfigMap byte-for-byte as it was and says why.
func TestBadRevisionsLeaveTheLastGoodRendering(t *testing.T) {
	other := newKey(t)
	cases := []struct {
		name   string
		plain  bool
		commit bool   // verify.commit is set (HEAD, the test's SSH key)
		mode   string // verify.commit.mode when not HEAD
		break_ func(t *testing.T, repo *sourcetest.Repo, k keyPair, signer *sourcetest.SSHKey)
		reason string
		want   string
	}{
		{name: "file over the limit in spec.path", plain: true, break_: func(t *testing.T, repo *sourcetest.Repo, k keyPair, signer *sourcetest.SSHKey) {
			repo.WriteZeros("reg/big.bin", testMaxFileBytes+1<<20)
			repo.Commit("a big file")
		}, reason: v1alpha1.ReasonSourceTooLarge, want: "reg/big.bin is larger than the 16 MiB limit (--source-max-file-bytes)"},
		{name: "unsigned commit under a signed head", commit: true, mode: v1alpha1.CommitVerifyChain, break_: func(t *testing.T, repo *sourcetest.Repo, k keyPair, signer *sourcetest.SSHKey) {
			repo.WriteFile("README", "unsigned change\n")
			repo.Commit("sneak in a change")
			repo.WriteFile("README", "signed on top\n")
			repo.CommitSigned("looks fine", signer)
		}, reason: v1alpha1.ReasonCommitVerificationFailed, want: `"sneak in a change": signature verification failed: not signed`},
		{name: "forged manifest signature", break_: func(t *testing.T, repo *sourcetest.Repo, k keyPair, signer *sourcetest.SSHKey) {
			refund := *fixtures(t)[2]
			refund.Owner = "mallory"
			publish(t, filepath.Join(repo.Dir, "reg"), other, &refund) // signed by a key nobody trusts
			repo.Commit("mallory's refund")
		}, reason: v1alpha1.ReasonSignatureVerificationFailed, want: "not trusted"},
		{name: "manifest signature copied from another tool", break_: func(t *testing.T, repo *sourcetest.Repo, k keyPair, signer *sourcetest.SSHKey) {
			dir := filepath.Join(repo.Dir, "reg")
			sig := versionField(t, dir, "stripe.get_charge", 1, "signature")
			editVersion(t, dir, "stripe.refund", 1, func(m map[string]any) { m["signature"] = sig })
			editIndex(t, dir, func(m map[string]any) { entryOf(m, "stripe.refund", 1)["signature"] = sig })
			repo.Commit("swap a signature")
		}, reason: v1alpha1.ReasonSignatureVerificationFailed, want: "the signature does not verify with key"},
		{name: "damaged version file that mentions signatures", break_: func(t *testing.T, repo *sourcetest.Repo, k keyPair, signer *sourcetest.SSHKey) {
			editVersion(t, filepath.Join(repo.Dir, "reg"), "stripe.refund", 1, func(m map[string]any) { m["signatures"] = []string{} })
			repo.Commit("an unknown field")
		}, reason: v1alpha1.ReasonValidationFailed, want: `json: unknown field "signatures"`},
		{name: "unsigned commit", commit: true, break_: func(t *testing.T, repo *sourcetest.Repo, k keyPair, signer *sourcetest.SSHKey) {
			repo.WriteFile("README", "unsigned change\n")
			repo.Commit("unsigned")
		}, reason: v1alpha1.ReasonCommitVerificationFailed, want: "not signed"},
		{name: "invalid YAML", plain: true, break_: func(t *testing.T, repo *sourcetest.Repo, k keyPair, signer *sourcetest.SSHKey) {
			repo.WriteFile("reg/broken.yaml", "tool: x\n  effect: [\n")
			repo.Commit("broken")
		}, reason: v1alpha1.ReasonValidationFailed, want: "reg/broken.yaml:2: invalid YAML"},
		{name: "cross-manifest error", plain: true, break_: func(t *testing.T, repo *sourcetest.Repo, k keyPair, signer *sourcetest.SSHKey) {
			repo.WriteFile("reg/orphan.yaml", "tool: x.write\neffect: reversible\npermission: x:write\ncompensation: {tool: x.undo, argument_map: {id: $result.id}}\n")
			repo.Commit("orphan")
		}, reason: v1alpha1.ReasonValidationFailed, want: `reg/orphan.yaml:4: x.write: compensation.tool: tool "x.undo" has no manifest`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ns := namespace(t)
			k := newKey(t)
			sshKey := sourcetest.NewSSHKey(t)
			repo := sourcetest.NewRepo(t)
			mutate := withKeys("manifest-keys")
			if c.plain {
				repo.WriteFile("reg/payments.yaml", mustRead(t, filepath.Join("..", "test", "fixtures", "manifests", "payments.yaml")))
				mutate = func(r *v1alpha1.ManifestRegistry) {
					r.Spec.Format = v1alpha1.FormatPlain
					r.Spec.Verify = &v1alpha1.RegistryVerification{}
				}
			} else {
				publish(t, filepath.Join(repo.Dir, "reg"), k, fixtures(t)...)
			}
			repo.CommitSigned("good", sshKey)
			createSecret(t, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
			createSecret(t, ns, "commit-keys", map[string][]byte{"ci.sshpub": sshKey.AuthorizedKey})
			create(t, newRegistry(ns, "reg", repo.FileURL(), func(r *v1alpha1.ManifestRegistry) {
				mutate(r)
				if c.commit {
					mode := v1alpha1.CommitVerifyHEAD
					if c.mode != "" {
						mode = c.mode
					}
					r.Spec.Verify.Commit = &v1alpha1.CommitVerification{Mode: mode, SecretRef: v1alpha1.LocalObjectReference{Name: "commit-keys"}}
				}
			}))
			good := "main@sha1:" + repo.Rev("HEAD")
			waitReady(t, ns, "reg", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, good)
			before := configMap(t, ns, "reg-manifests")

			c.break_(t, repo, k, sshKey)
			bad := "main@sha1:" + repo.Rev("HEAD")
			requestReconcile(t, ns, "reg")
			reg := waitReady(t, ns, "reg", metav1.ConditionFalse, c.reason, bad)
			ready := condition(reg.Status.Conditions, v1alpha1.ConditionReady)
			if !strings.Contains(ready.Message, c.want) {
				t.Errorf("Ready message %q lacks %q", ready.Message, c.want)
			}
			if reg.Status.Artifact == nil || reg.Status.Artifact.Revision != good {
				t.Errorf("artifact %+v, want the last good revision %s", reg.Status.Artifact, good)
			}
			after := configMap(t, ns, "reg-manifests")
			if after == nil || after.ResourceVersion != before.ResourceVersion || !equalData(after.Data, before.Data) {
				t.Fatal("the last good ConfigMap was changed")
			}
			if c.reason == v1alpha1.ReasonValidationFailed && len(reg.Status.InvalidTools) == 0 {
				t.Error("no invalid tools listed")
			}
			if c.commit {
				if sv := condition(reg.Status.Conditions, v1alpha1.ConditionSourceVerified); sv == nil || sv.Status != metav1.ConditionFalse {
					t.Errorf("SourceVerified %+v", sv)
				}
			}
			// A refused manifest signature is SourceVerified=False with the same reason; other
			// problems leave SourceVerified alone (the commit did verify).
			sv := condition(reg.Status.Conditions, v1alpha1.ConditionSourceVerified)
			switch {
			case c.reason == v1alpha1.ReasonSignatureVerificationFailed && (sv == nil || sv.Status != metav1.ConditionFalse || sv.Reason != c.reason || !strings.Contains(sv.Message, c.want)):
				t.Errorf("SourceVerified %+v, want False %s saying %q", sv, c.reason, c.want)
			case c.reason == v1alpha1.ReasonValidationFailed && !c.plain && sv != nil && sv.Status == metav1.ConditionFalse:
				t.Errorf("SourceVerified %+v after a validation problem", sv)
			}
		})
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func equalData(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// 4. Wrong credentials, an unreachable URL and a missing Secret give clear conditions, and
// the reconciler keeps retrying: once the Secret exists, the registry becomes Ready.
func TestSourceFailuresAndRetries(t *testing.T) {
	ns := namespace(t)
	k := newKey(t)
	repo := signedRegistryRepo(t, k)
	srv := sourcetest.ServeHTTP(t, filepath.Dir(repo.Dir), sourcetest.HTTPAuth{Username: "git", Password: "s3cret"})
	url := srv.RepoURL(t, repo.Dir)
	createSecret(t, ns, "wrong", map[string][]byte{"username": []byte("git"), "password": []byte("nope")})

	createSecret(t, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	create(t, newRegistry(ns, "wrong-password", url, func(r *v1alpha1.ManifestRegistry) {
		withKeys("manifest-keys")(r)
		r.Spec.SecretRef = &v1alpha1.LocalObjectReference{Name: "wrong"}
	}))
	create(t, newRegistry(ns, "unreachable", sourcetest.ClosedPortURL(t), withKeys("manifest-keys")))
	create(t, newRegistry(ns, "missing-secret", url, func(r *v1alpha1.ManifestRegistry) {
		withKeys("manifest-keys")(r)
		r.Spec.SecretRef = &v1alpha1.LocalObjectReference{Name: "later"}
		r.Spec.Interval = &metav1.Duration{Duration: 10 * time.Second} // retries every ~2 s
	}))

	reg := waitReady(t, ns, "wrong-password", metav1.ConditionFalse, v1alpha1.ReasonAuthenticationFailed, "")
	if m := condition(reg.Status.Conditions, v1alpha1.ConditionReady).Message; strings.Contains(m, "s3cret") || strings.Contains(m, "nope") {
		t.Fatalf("a password leaked into the condition: %q", m)
	}
	waitReady(t, ns, "unreachable", metav1.ConditionFalse, v1alpha1.ReasonFetchFailed, "")
	reg = waitReady(t, ns, "missing-secret", metav1.ConditionFalse, v1alpha1.ReasonSecretNotFound, "")
	if m := condition(reg.Status.Conditions, v1alpha1.ConditionReady).Message; !strings.Contains(m, "later") {
		t.Fatalf("message %q does not name the Secret", m)
	}
	for _, name := range []string{"wrong-password", "unreachable", "missing-secret"} {
		if configMap(t, ns, name+"-manifests") != nil {
			t.Fatalf("%s rendered a ConfigMap", name)
		}
	}
	createSecret(t, ns, "later", map[string][]byte{"username": []byte("git"), "password": []byte("s3cret")})
	waitReady(t, ns, "missing-secret", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, "main@sha1:"+repo.Rev("HEAD"))
	if srv.Fetches() == 0 {
		t.Fatal("nothing was fetched over HTTP")
	}
}

// An unchanged remote revision with unchanged keys is not cloned again; a key removed from the
// keys Secret re-verifies the current revision at once (no stale SourceVerified), and the last
// good rendering stays.
func TestUnchangedRevisionSkipsCloneAndKeyRemovalReverifies(t *testing.T) {
	ns := namespace(t)
	k := newKey(t)
	repo := signedRegistryRepo(t, k)
	srv := sourcetest.ServeHTTP(t, filepath.Dir(repo.Dir), sourcetest.HTTPAuth{})
	createSecret(t, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	create(t, newRegistry(ns, "reg", srv.RepoURL(t, repo.Dir), withKeys("manifest-keys")))
	rev := "main@sha1:" + repo.Rev("HEAD")
	waitReady(t, ns, "reg", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, rev)
	fetches := srv.Fetches()

	at := requestReconcile(t, ns, "reg")
	eventually(t, 10*time.Second, func() string {
		if getRegistry(t, ns, "reg").Status.LastHandledReconcileAt != at {
			return "requestedAt not handled yet"
		}
		return ""
	})
	if srv.Fetches() != fetches {
		t.Fatalf("an unchanged revision was cloned again (%d → %d fetches)", fetches, srv.Fetches())
	}

	before := configMap(t, ns, "reg-manifests")
	other := newKey(t)
	var s corev1.Secret
	if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "manifest-keys"}, &s); err != nil {
		t.Fatal(err)
	}
	s.Data = map[string][]byte{"rotated.PublicPEM": other.PublicPEM}
	if err := k8s.Update(t.Context(), &s); err != nil {
		t.Fatal(err)
	}
	reg := waitReady(t, ns, "reg", metav1.ConditionFalse, v1alpha1.ReasonSignatureVerificationFailed, rev)
	if sv := condition(reg.Status.Conditions, v1alpha1.ConditionSourceVerified); sv == nil || sv.Status != metav1.ConditionFalse {
		t.Fatalf("SourceVerified %+v", sv)
	}
	if after := configMap(t, ns, "reg-manifests"); after.ResourceVersion != before.ResourceVersion {
		t.Fatal("the last good rendering was replaced")
	}
}

// Large registries shard across ConfigMaps; shards no longer needed are deleted; 5. deleting the
// registry deletes its ConfigMaps.
func TestShardingAndDeletion(t *testing.T) {
	ns := namespace(t)
	k := newKey(t)
	repo := sourcetest.NewRepo(t)
	ms := fixtures(t)
	for i := 0; i < 400; i++ {
		m := *ms[0]
		m.Tool = fmt.Sprintf("svc%03d.read", i)
		m.Description = strings.Repeat("Reads one item of the service. ", 10)
		ms = append(ms, &m)
	}
	publish(t, filepath.Join(repo.Dir, "reg"), k, ms...)
	repo.Commit("many tools")
	createSecret(t, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	create(t, newRegistry(ns, "big", repo.FileURL(), withKeys("manifest-keys")))
	reg := waitReady(t, ns, "big", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, "main@sha1:"+repo.Rev("HEAD"))
	shards := reg.Status.Artifact.ConfigMaps
	if len(shards) < 3 {
		t.Fatalf("%d shards for ~200 KiB at %d bytes each", len(shards), testShardBytes)
	}
	if _, got := renderedBundle(t, ns, "big", k.Trust); len(got) != 403 {
		t.Fatalf("%d manifests rendered", len(got))
	}

	// Deprecating every svc tool but the first few is not possible in one publish, so move the
	// registry to a smaller one: a new folder with only the seed's manifests. Another registry
	// (another id) is applied only when the annotation names the revision.
	publish(t, filepath.Join(repo.Dir, "small"), k, fixtures(t)...)
	repo.Commit("small registry")
	patch := client.MergeFrom(reg.DeepCopy())
	reg.Spec.Path = "small"
	reg.Annotations = map[string]string{v1alpha1.AnnotationAcceptRevision: "main@sha1:" + repo.Rev("HEAD")}
	if err := k8s.Patch(t.Context(), reg, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() string {
		r := getRegistry(t, ns, "big")
		if r.Status.Artifact == nil || r.Status.Artifact.Tools != 3 {
			return "not re-rendered yet"
		}
		for _, name := range shards[1:] {
			if configMap(t, ns, name) != nil {
				return name + " still exists"
			}
		}
		return ""
	})

	if err := k8s.Delete(t.Context(), getRegistry(t, ns, "big")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() string {
		var cms corev1.ConfigMapList
		if err := k8s.List(t.Context(), &cms, client.InNamespace(ns), client.MatchingLabels{LabelRegistry: "big"}); err != nil {
			return err.Error()
		}
		if len(cms.Items) > 0 {
			return fmt.Sprintf("%d ConfigMaps left", len(cms.Items))
		}
		return ""
	})
}

// twoVersions is a registry "reg" applied at its second signed commit (stripe.refund v2, the
// index at sequence 2); old is the first commit.
func twoVersions(t *testing.T) (ns string, k keyPair, repo *sourcetest.Repo, old string, applied *v1alpha1.ManifestRegistry) {
	t.Helper()
	ns = namespace(t)
	k = newKey(t)
	repo = signedRegistryRepo(t, k)
	old = repo.Rev("HEAD")
	refund := *fixtures(t)[2]
	refund.Owner = "payments-team@example.com"
	publish(t, filepath.Join(repo.Dir, "reg"), k, &refund)
	repo.Commit("refund v2")
	createSecret(t, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	create(t, newRegistry(ns, "reg", repo.FileURL(), withKeys("manifest-keys")))
	return ns, k, repo, old, waitReady(t, ns, "reg", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, "main@sha1:"+repo.Rev("HEAD"))
}

// A branch reset to an older signed commit would bring back replaced manifests: refused, the
// last good rendering stays, also after a spec change; the annotation naming exactly that
// revision accepts it, echoed in status and a Warning event.
func TestBranchResetToAnOldCommitIsRefused(t *testing.T) {
	ns, k, repo, old, good := twoVersions(t)
	before := configMap(t, ns, "reg-manifests")

	repo.Git("reset", "-q", "--hard", old)
	oldRev := "main@sha1:" + old
	requestReconcile(t, ns, "reg")
	reg := waitReady(t, ns, "reg", metav1.ConditionFalse, v1alpha1.ReasonRevisionNotDescendant, oldRev)
	if m := condition(reg.Status.Conditions, v1alpha1.ConditionReady).Message; !strings.Contains(m, "does not descend from commit "+short(repo.Rev("ORIG_HEAD"))) || !strings.Contains(m, v1alpha1.AnnotationAcceptRevision+"="+oldRev) {
		t.Fatalf("message %q", m)
	}
	// Whatever changes in the spec (here the interval), the downgrade stays refused.
	patch := client.MergeFrom(reg.DeepCopy())
	reg.Spec.Interval = &metav1.Duration{Duration: 2 * time.Hour}
	if err := k8s.Patch(t.Context(), reg, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() string {
		if r := getRegistry(t, ns, "reg"); r.Status.ObservedGeneration != r.Generation {
			return "the spec change is not reconciled yet"
		}
		return ""
	})
	waitReady(t, ns, "reg", metav1.ConditionFalse, v1alpha1.ReasonRevisionNotDescendant, oldRev)
	if after := configMap(t, ns, "reg-manifests"); after.ResourceVersion != before.ResourceVersion {
		t.Fatal("the last good rendering was replaced")
	}

	reg = getRegistry(t, ns, "reg")
	patch = client.MergeFrom(reg.DeepCopy())
	reg.Annotations[v1alpha1.AnnotationAcceptRevision] = oldRev
	if err := k8s.Patch(t.Context(), reg, patch); err != nil {
		t.Fatal(err)
	}
	reg = waitReady(t, ns, "reg", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, oldRev)
	if reg.Status.AcceptedRevision != oldRev || reg.Status.Artifact.Sequence <= good.Status.Artifact.Sequence {
		t.Fatalf("accepted %q, sequence %d after %d", reg.Status.AcceptedRevision, reg.Status.Artifact.Sequence, good.Status.Artifact.Sequence)
	}
	b, _ := renderedBundle(t, ns, "reg", k.Trust)
	if s := b.Snapshots[0].Snapshot; s.AcceptedRevision != oldRev || s.Revision != oldRev {
		t.Fatalf("snapshot %+v", s)
	}
	waitEvent(t, ns, "reg", v1alpha1.EventRevisionOverrideAccepted+": applied because the annotation")
}

// A new commit on top that puts an older signed registry back (the folder of an old commit,
// committed again) descends from the applied commit, but its index sequence is lower: refused.
func TestRestoredOlderIndexIsRefused(t *testing.T) {
	ns, _, repo, old, _ := twoVersions(t)

	repo.Git("rm", "-q", "-r", "reg")
	repo.Git("checkout", old, "--", "reg")
	repo.Commit("bring back the old rules")
	rev := "main@sha1:" + repo.Rev("HEAD")
	requestReconcile(t, ns, "reg")
	reg := waitReady(t, ns, "reg", metav1.ConditionFalse, v1alpha1.ReasonVersionDowngrade, rev)
	if m := condition(reg.Status.Conditions, v1alpha1.ConditionReady).Message; !strings.Contains(m, "index.json sequence 1, older than sequence 2") {
		t.Fatalf("message %q", m)
	}
}

// Options that cannot work until the spec changes stall the registry (no retries); suspending
// it then says so and clears Stalled, since nothing is attempted.
func TestStalledThenSuspended(t *testing.T) {
	ns := namespace(t)
	k := newKey(t)
	createSecret(t, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	createSecret(t, ns, "ssh", map[string][]byte{"identity": newSSHIdentity(t)})
	create(t, newRegistry(ns, "reg", "ssh://git@127.0.0.1:1/repo.git", func(r *v1alpha1.ManifestRegistry) {
		withKeys("manifest-keys")(r)
		r.Spec.SecretRef = &v1alpha1.LocalObjectReference{Name: "ssh"} // no known_hosts: refused
	}))
	reg := waitReady(t, ns, "reg", metav1.ConditionFalse, v1alpha1.ReasonInvalidSpec, "")
	if c := condition(reg.Status.Conditions, v1alpha1.ConditionStalled); c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "known_hosts") {
		t.Fatalf("Stalled %+v", c)
	}
	patch := client.MergeFrom(reg.DeepCopy())
	reg.Spec.Suspend = true
	if err := k8s.Patch(t.Context(), reg, patch); err != nil {
		t.Fatal(err)
	}
	reg = waitReady(t, ns, "reg", metav1.ConditionFalse, v1alpha1.ReasonSuspended, "")
	if condition(reg.Status.Conditions, v1alpha1.ConditionStalled) != nil {
		t.Fatalf("Stalled left while suspended: %+v", reg.Status.Conditions)
	}
}

func newSSHIdentity(t *testing.T) []byte {
	t.Helper()
	return sourcetest.NewSSHKey(t).PrivateKey
}

// Someone who may edit ConfigMaps changes the rendering: the controller restores exactly what
// it rendered (the data, not only its annotations), names the field manager that changed it in
// a Warning event, and then leaves the restored rendering alone.
func TestEditedRenderingIsRestored(t *testing.T) {
	ns := namespace(t)
	k := newKey(t)
	repo := signedRegistryRepo(t, k)
	createSecret(t, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	create(t, newRegistry(ns, "reg", repo.FileURL(), withKeys("manifest-keys")))
	waitReady(t, ns, "reg", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, "main@sha1:"+repo.Rev("HEAD"))
	want := configMap(t, ns, "reg-manifests").Data

	cm := configMap(t, ns, "reg-manifests")
	cm.Data[bundle.KeyManifests] = strings.Replace(cm.Data[bundle.KeyManifests], `"approval"`, `"approval_was"`, 1)
	cm.Data["revision"] = "main@sha1:ffffffffffffffffffffffffffffffffffffffff"
	if err := k8s.Update(t.Context(), cm, client.FieldOwner("mallory-edit")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() string {
		if got := configMap(t, ns, "reg-manifests").Data; !reflect.DeepEqual(got, want) {
			return "the edited rendering is not restored yet"
		}
		return ""
	})
	waitEvent(t, ns, "reg", v1alpha1.EventRenderingDrift+": ConfigMap "+ns+"/reg-manifests was changed by mallory-edit (data: manifests.json, revision)")
	restored := configMap(t, ns, "reg-manifests")
	at := requestReconcile(t, ns, "reg")
	eventually(t, 10*time.Second, func() string {
		if getRegistry(t, ns, "reg").Status.LastHandledReconcileAt != at {
			return "requestedAt not handled yet"
		}
		return ""
	})
	if again := configMap(t, ns, "reg-manifests"); again.ResourceVersion != restored.ResourceVersion {
		t.Fatal("the restored rendering was written again without a change")
	}
}

// With verify.commit mode Tag a semver ref takes the highest tag whose signature verifies; a
// higher tag by an untrusted key is skipped and named in a TagSkipped event.
func TestSemverSkipsAnUntrustedTag(t *testing.T) {
	ns := namespace(t)
	k := newKey(t)
	trusted, stranger := sourcetest.NewSSHKey(t), sourcetest.NewSSHKey(t)
	repo := signedRegistryRepo(t, k)
	repo.TagSigned("v1.0.0", "release 1.0.0", trusted)
	good := repo.Rev("HEAD")
	refund := *fixtures(t)[2]
	refund.Owner = "mallory"
	publish(t, filepath.Join(repo.Dir, "reg"), k, &refund)
	repo.Commit("a change nobody released")
	repo.TagSigned("v1.1.0", "release 1.1.0", stranger)
	createSecret(t, ns, "manifest-keys", map[string][]byte{"mf.PublicPEM": k.PublicPEM})
	createSecret(t, ns, "release-keys", map[string][]byte{"release.sshpub": trusted.AuthorizedKey})
	create(t, newRegistry(ns, "reg", repo.FileURL(), func(r *v1alpha1.ManifestRegistry) {
		withKeys("manifest-keys")(r)
		r.Spec.Ref = &v1alpha1.GitRef{SemVer: ">=1.0.0"}
		r.Spec.Verify.Commit = &v1alpha1.CommitVerification{Mode: v1alpha1.CommitVerifyTag, SecretRef: v1alpha1.LocalObjectReference{Name: "release-keys"}}
	}))
	waitReady(t, ns, "reg", metav1.ConditionTrue, v1alpha1.ReasonSucceeded, "v1.0.0@sha1:"+good)
	eventually(t, 10*time.Second, func() string {
		var evs eventsv1.EventList
		if err := k8s.List(t.Context(), &evs, client.InNamespace(ns)); err != nil {
			return err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == v1alpha1.EventTagSkipped && e.Type == corev1.EventTypeWarning && strings.Contains(e.Note, "tag v1.1.0 skipped") &&
				strings.Contains(e.Note, stranger.Fingerprint) {
				return ""
			}
		}
		return fmt.Sprintf("no TagSkipped event naming v1.1.0 among %d events", len(evs.Items))
	})
}

// file:// needs --allow-file-urls: without it the registry is InvalidSpec (stalled), and the
// message says so.
func TestFileURLsNeedTheFlag(t *testing.T) {
	repo := sourcetest.NewRepo(t)
	repo.Commit("empty")
	r := &ManifestRegistryReconciler{}
	o, serr := r.sourceOptions(t.Context(), newRegistry("ns", "reg", repo.FileURL(), nil))
	if serr != nil {
		t.Fatal(serr)
	}
	_, err := source.RemoteRevision(t.Context(), o)
	e := sourceFailure(err)
	if e.reason != v1alpha1.ReasonInvalidSpec || !e.stalled || !strings.Contains(e.msg, "--allow-file-urls") {
		t.Fatalf("%+v", e)
	}
}

func TestRevisionCommit(t *testing.T) {
	h := strings.Repeat("ab", 20)
	for rev, want := range map[string]string{
		"main@sha1:" + h: h, "sha1:" + h: h, "v1.0.0@sha1:" + h: h, "feature/x@sha1:" + h: h,
		"": "", "main@sha1:abc": "", "main@" + h: "", "mainsha1:" + h: "", "sha256:" + h: "",
	} {
		if got := revisionCommit(rev); got != want {
			t.Errorf("revisionCommit(%q) = %q, want %q", rev, got, want)
		}
	}
}

// spec.timeout is capped by the controller's --source-max-timeout: a registry whose server never
// answers holds a worker for at most that long.
func TestSourceTimeoutIsCapped(t *testing.T) {
	r := &ManifestRegistryReconciler{SourceMaxTimeout: time.Minute}
	for spec, want := range map[time.Duration]time.Duration{0: source.DefaultTimeout, 30 * time.Second: 30 * time.Second, 10 * time.Minute: time.Minute} {
		reg := newRegistry("ns", "reg", "https://git.invalid/repo.git", nil)
		if spec > 0 {
			reg.Spec.Timeout = &metav1.Duration{Duration: spec}
		}
		o, serr := r.sourceOptions(t.Context(), reg)
		if serr != nil || o.Timeout != want {
			t.Errorf("spec.timeout %s: fetch timeout %s (%v), want %s", spec, o.Timeout, serr, want)
		}
	}
	if o, _ := (&ManifestRegistryReconciler{}).sourceOptions(t.Context(), newRegistry("ns", "reg", "https://git.invalid/repo.git", func(r *v1alpha1.ManifestRegistry) {
		r.Spec.Timeout = &metav1.Duration{Duration: time.Hour}
	})); o.Timeout != DefaultSourceMaxTimeout {
		t.Errorf("default cap: %s", o.Timeout)
	}
}
