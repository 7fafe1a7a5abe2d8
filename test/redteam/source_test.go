package redteam

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/podrun"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// memoryV2Plain is v2 as one plain manifest file (format Plain): create_entities needs
// finance's approval.
var memoryV2Plain = strings.SplitAfter(memoryV1, "  permission: memory:read\n")[0] + createEntitiesV2

func (w *world) commitVerification(mode string) *v1alpha1.RegistryVerification {
	return &v1alpha1.RegistryVerification{Commit: &v1alpha1.CommitVerification{Mode: mode, SecretRef: v1alpha1.LocalObjectReference{Name: "committers"}}}
}

// patchRegistry merge-patches a ManifestRegistry with a reconcile request added, and returns
// the request's token.
func (w *world) patchRegistry(t testing.TB, name string, spec map[string]any, annotations map[string]any) string {
	t.Helper()
	token := time.Now().UTC().Format(time.RFC3339Nano)
	if annotations == nil {
		annotations = map[string]any{}
	}
	annotations[v1alpha1.AnnotationRequestedAt] = token
	body := map[string]any{"metadata": map[string]any{"annotations": annotations}}
	if spec != nil {
		body["spec"] = spec
	}
	patch, err := json.Marshal(body)
	must(t, err)
	must(t, w.k8s.Patch(w.ctx, &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}, client.RawPatch(types.MergePatchType, patch)))
	return token
}

// forcePush is the force-push attack on one registry: the branch goes back to the older
// signed commit old (v1: create_entities without approval) from a head with v2's rules.
type forcePush struct {
	reg *gitRegistry
	gw  *gateway
	old string
	// republish commits v2's rules again on top of old, signed (a legitimate new publish).
	republish func(t *testing.T)
}

// testForcePush: refused (Ready=False RevisionNotDescendant) and create_entities still held,
// also after spec.interval changes and with an override naming another revision; accepted
// only with reversi.dev/accept-revision naming exactly the older revision (Ready=True,
// status.acceptedRevision, Warning RevisionOverrideAccepted; the gateway serves v1). A new
// signed publish on top brings v2's rules back.
func (w *world) testForcePush(t *testing.T, fp forcePush) {
	name, g := fp.reg.name, fp.gw
	g.requireHeld(t, "memory.create_entities", createArgs)
	head := fp.reg.repo.Rev("HEAD")
	oldRev := "main@sha1:" + fp.old
	refused := func(step string) {
		t.Helper()
		r := w.registry(t, name)
		if !wantNotReady(t, r, reasonRevisionNotDescendant) {
			t.Logf("(%s)", step)
		}
		if err := g.settled(t, name); err != nil {
			t.Logf("%s: %v", step, err)
		}
		if !g.requireHeld(t, "memory.create_entities", createArgs) {
			t.Logf("(%s: the gateway serves %s)", step, artifactRevision(r))
		}
	}

	// The branch is force-pushed back to the older signed commit.
	fp.reg.repo.Git("reset", "-q", "--hard", fp.old)
	w.reconciled(t, name, w.reconcile(t, name), 60*time.Second)
	refused("after the force-push")

	// A change of the spec does not make the older commit acceptable.
	w.reconciled(t, name, w.patchRegistry(t, name, map[string]any{"interval": "50m"}, nil), 60*time.Second)
	refused("after spec.interval changed")

	// Nor does an override that names another revision.
	w.reconciled(t, name, w.patchRegistry(t, name, nil, map[string]any{annotationAcceptRevision: "main@sha1:" + head}), 60*time.Second)
	refused("with an override naming " + short(head))

	// The audited override for exactly this revision is accepted.
	since := time.Now()
	r := w.reconciled(t, name, w.patchRegistry(t, name, nil, map[string]any{annotationAcceptRevision: oldRev}), 60*time.Second)
	if c := ready(r); c.Status != metav1.ConditionTrue || artifactRevision(r) != oldRev {
		t.Errorf("with %s=%s: Ready=%s (%s) %q at %s, want Ready=True at %s", annotationAcceptRevision, oldRev, c.Status, c.Reason, c.Message, artifactRevision(r), oldRev)
	}
	if got := w.registryStatus(t, name, "acceptedRevision"); got != oldRev {
		t.Errorf("status.acceptedRevision = %q, want %s", got, oldRev)
	}
	w.wantEvent(t, "ManifestRegistry", name, since, corev1.EventTypeWarning, eventRevisionOverrideAccepted, oldRev)
	must(t, g.settled(t, name))
	g.requireAllowed(t, "memory.create_entities", createArgs)

	// A new signed publish on top of it is an ordinary descendant.
	fp.republish(t)
	newHead := fp.reg.repo.Rev("HEAD")
	w.reconciled(t, name, w.patchRegistry(t, name, map[string]any{"interval": "1h"}, map[string]any{annotationAcceptRevision: nil}), 60*time.Second)
	r = w.waitReady(t, name, 30*time.Second)
	if artifactRevision(r) != "main@sha1:"+newHead {
		t.Errorf("after a new publish on top: revision %s, want main@sha1:%s", artifactRevision(r), newHead)
	}
	must(t, g.settled(t, name))
	g.requireHeld(t, "memory.create_entities", createArgs)
}

func short(hash string) string { return hash[:12] }

// testForcePushRegistry runs the force-push attack on the gateway's registry (format Registry).
func (w *world) testForcePushRegistry(t *testing.T) {
	w.testForcePush(t, forcePush{reg: w.memory, gw: w.pay, old: w.memory.v1, republish: func(t *testing.T) {
		w.publish(t, w.memory, createEntitiesV2, "approved")
		w.memory.repo.CommitSigned("memory.create_entities: finance approves each call, again", w.committer)
	}})
}

// testForcePushPlain runs it on a registry of plain manifest files (format Plain) behind a
// gateway of its own. Plain manifests carry no writer signature: before issue 15 a gateway
// with trusted keys refuses them, so this gateway has none; once the controller signs its
// snapshots (it has --signing-key-secret) the gateway trusts the writer keys too and accepts
// the plain entries on the controller's signature.
func (w *world) testForcePushPlain(t *testing.T) {
	r := w.newGitRegistry(t, "plain", "manifests")
	r.repo.WriteFile("manifests/memory.yaml", memoryV1)
	r.v1 = r.repo.CommitSigned("memory tools", w.committer)
	w.createRegistry(t, r, v1alpha1.FormatPlain, &v1alpha1.GitRef{Branch: "main"}, w.commitVerification("HEAD"))
	t.Cleanup(func() { w.deleteRegistry(t, r.name) })
	w.waitReady(t, r.name, 60*time.Second)
	// Not named like the registry: a gateway's `<name>-manifests` would be the registry's.
	var trusted *v1alpha1.LocalObjectReference
	if controllerHasFlag("--signing-key-secret") {
		trusted = &v1alpha1.LocalObjectReference{Name: "manifest-keys"}
	}
	g := w.startGateway(t, "plain-gw", r.name, trusted)
	t.Cleanup(func() {
		_ = w.k8s.Delete(w.ctx, &v1alpha1.ReversiGateway{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: g.name}})
	})
	g.requireAllowed(t, "memory.create_entities", createArgs)
	r.repo.WriteFile("manifests/memory.yaml", memoryV2Plain)
	r.repo.CommitSigned("memory.create_entities: finance approves each call", w.committer)
	w.reconciled(t, r.name, w.reconcile(t, r.name), 60*time.Second)
	must(t, g.settled(t, r.name))
	w.testForcePush(t, forcePush{reg: r, gw: g, old: r.v1, republish: func(t *testing.T) {
		r.repo.WriteFile("manifests/memory.yaml", memoryV2Plain)
		r.repo.CommitSigned("memory.create_entities: finance approves each call, again", w.committer)
	}})
}

func (w *world) deleteRegistry(t testing.TB, name string) {
	_ = w.k8s.Delete(w.ctx, &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
}

// testChain: with verify.commit.mode Chain, an unsigned commit under a signed head is refused
// and named; mode HEAD accepts the same history (Flux's behaviour).
func (w *world) testChain(t *testing.T) {
	r := w.newGitRegistry(t, "chain", "manifests")
	r.repo.WriteFile("manifests/memory.yaml", memoryV2Plain)
	first := r.repo.CommitSigned("memory tools", w.committer)
	err := w.k8s.Create(w.ctx, &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: r.name},
		Spec: v1alpha1.ManifestRegistrySpec{URL: r.url, Ref: &v1alpha1.GitRef{Branch: "main"}, Path: r.path, Format: v1alpha1.FormatPlain,
			Interval: &metav1.Duration{Duration: time.Hour}, Verify: w.commitVerification("Chain")}})
	if err != nil {
		t.Fatalf("a ManifestRegistry with verify.commit.mode Chain: %v", err)
	}
	t.Cleanup(func() { w.deleteRegistry(t, r.name) })
	if reg := w.waitReady(t, r.name, 60*time.Second); artifactRevision(reg) != "main@sha1:"+first {
		t.Fatalf("the first apply: %s, want main@sha1:%s", artifactRevision(reg), first)
	}

	// Someone pushes an unsigned commit that drops the approval, and a signed one on top.
	r.repo.WriteFile("manifests/memory.yaml", memoryV1)
	unsigned := r.repo.Commit("drop the approval (unsigned)")
	r.repo.WriteFile("notes/README", "signed on top\n")
	head := r.repo.CommitSigned("a signed commit on top", w.committer)
	reg := w.reconciled(t, r.name, w.reconcile(t, r.name), 60*time.Second)
	wantNotReady(t, reg, reasonCommitVerificationFailed, unsigned[:7])
	if artifactRevision(reg) != "main@sha1:"+first {
		t.Errorf("the rendering moved to %s, want it kept at main@sha1:%s", artifactRevision(reg), first)
	}

	// mode HEAD verifies only the head, which is signed.
	w.reconciled(t, r.name, w.patchRegistry(t, r.name, map[string]any{"verify": map[string]any{"commit": map[string]any{"mode": "HEAD"}}}, nil), 60*time.Second)
	if reg := w.waitReady(t, r.name, 30*time.Second); artifactRevision(reg) != "main@sha1:"+head {
		t.Errorf("mode HEAD: %s, want main@sha1:%s", artifactRevision(reg), head)
	}
}

// testSemverTags: ref.semver with verify.commit.mode Tag skips a higher tag signed by an
// untrusted key (an event TagSkipped names it) and applies the highest trusted tag.
func (w *world) testSemverTags(t *testing.T) {
	r := w.newGitRegistry(t, "tags", "manifests")
	stranger := sourcetest.NewSSHKey(t)
	r.repo.WriteFile("manifests/memory.yaml", memoryV2Plain)
	r.repo.Commit("memory tools")
	r.repo.TagSigned("v1.0.0", "v1.0.0", w.committer)
	r.repo.WriteFile("notes/README", "1.1\n")
	trusted := r.repo.Commit("1.1")
	r.repo.TagSigned("v1.1.0", "v1.1.0", w.committer)
	r.repo.WriteFile("manifests/memory.yaml", memoryV1)
	r.repo.Commit("drop the approval")
	r.repo.TagSigned("v1.2.0", "v1.2.0", stranger)

	since := time.Now()
	w.createRegistry(t, r, v1alpha1.FormatPlain, &v1alpha1.GitRef{SemVer: ">=1.0.0"}, w.commitVerification("Tag"))
	t.Cleanup(func() { w.deleteRegistry(t, r.name) })
	want := "v1.1.0@sha1:" + trusted
	var reg *v1alpha1.ManifestRegistry
	err := podrun.Poll(w.ctx, 30*time.Second, func() string {
		reg = w.registry(t, r.name)
		if c := ready(reg); c.Status != metav1.ConditionTrue || artifactRevision(reg) != want {
			return fmt.Sprintf("Ready=%s (%s) %q at %q", c.Status, c.Reason, c.Message, artifactRevision(reg))
		}
		return ""
	})
	if err != nil {
		t.Errorf("semver >=1.0.0 with an untrusted v1.2.0: want Ready=True at %s; %v", want, err)
	}
	w.wantEvent(t, "ManifestRegistry", r.name, since, "", eventTagSkipped, "v1.2.0")
}

// Sizes of the large-blob attack.
const (
	blobBytes    = 300 << 20 // 300 MiB of zeros: about 300 KiB in a pack
	maxRSSGrowth = 64 << 20
)

// testLargeBlob: 300 MiB of zeros committed outside spec.path must not raise the
// controller's peak memory by 64 MiB or more, and the commit renders; the same blob inside
// spec.path is Ready=False SourceTooLarge naming the limit.
func (w *world) testLargeBlob(t *testing.T) {
	r := w.newGitRegistry(t, "bulk", "manifests")
	r.repo.WriteFile("manifests/memory.yaml", memoryV2Plain)
	first := r.repo.Commit("memory tools")
	w.createRegistry(t, r, v1alpha1.FormatPlain, &v1alpha1.GitRef{Branch: "main"}, nil)
	t.Cleanup(func() { w.deleteRegistry(t, r.name) })
	if reg := w.waitReady(t, r.name, 60*time.Second); artifactRevision(reg) != "main@sha1:"+first {
		t.Fatalf("first revision %s", artifactRevision(reg))
	}

	blob := filepath.Join(r.repo.Dir, "assets", "zeros.bin")
	must(t, os.MkdirAll(filepath.Dir(blob), 0o755))
	f, err := os.Create(blob)
	must(t, err)
	head := exec.CommandContext(w.ctx, "head", "-c", fmt.Sprint(blobBytes), "/dev/zero")
	head.Stdout = f
	must(t, head.Run())
	must(t, f.Close())
	outside := r.repo.Commit("300 MiB of zeros outside the manifests")

	before, err := w.controller.PeakRSS()
	must(t, err)
	reg := w.reconciled(t, r.name, w.reconcile(t, r.name), 120*time.Second)
	after, err := w.controller.PeakRSS()
	must(t, err)
	t.Logf("controller peak RSS: %d MiB before, %d MiB after the commit outside spec.path", before>>20, after>>20)
	if after-before >= maxRSSGrowth {
		t.Errorf("a %d MiB blob outside spec.path raised the controller's peak RSS by %d MiB (from %d to %d MiB), want less than %d MiB",
			blobBytes>>20, (after-before)>>20, before>>20, after>>20, maxRSSGrowth>>20)
	}
	if c := ready(reg); c.Status != metav1.ConditionTrue || artifactRevision(reg) != "main@sha1:"+outside {
		t.Errorf("the commit with the blob outside spec.path was not rendered: Ready=%s (%s) %q at %s", c.Status, c.Reason, c.Message, artifactRevision(reg))
	}

	r.repo.Git("mv", "assets/zeros.bin", "manifests/zeros.bin")
	r.repo.Commit("the same blob inside the manifests")
	reg = w.reconciled(t, r.name, w.reconcile(t, r.name), 120*time.Second)
	c := ready(reg)
	if c.Status != metav1.ConditionFalse || c.Reason != reasonSourceTooLarge || !(strings.Contains(c.Message, "MiB") || strings.Contains(c.Message, "bytes")) {
		t.Errorf("a %d MiB blob inside spec.path: Ready=%s reason %s %q, want Ready=False reason %s naming the limit", blobBytes>>20, c.Status, c.Reason, c.Message, reasonSourceTooLarge)
	}
	if artifactRevision(reg) != "main@sha1:"+outside {
		t.Errorf("the rendering moved to %s, want it kept at main@sha1:%s", artifactRevision(reg), outside)
	}
	w.patchRegistry(t, r.name, map[string]any{"suspend": true}, nil) // no more fetches of it
}

// testFileURL: a file:// URL is refused when the controller runs without --allow-file-urls.
func (w *world) testFileURL(t *testing.T) {
	repo := sourcetest.NewRepo(t)
	repo.WriteFile("manifests/memory.yaml", memoryV2Plain)
	repo.Commit("memory tools")
	r := &gitRegistry{name: "local", repo: repo, url: repo.FileURL(), path: "manifests"}
	w.createRegistry(t, r, v1alpha1.FormatPlain, &v1alpha1.GitRef{Branch: "main"}, nil)
	t.Cleanup(func() { w.deleteRegistry(t, r.name) })
	var reg *v1alpha1.ManifestRegistry
	if err := podrun.Poll(w.ctx, 30*time.Second, func() string {
		reg = w.registry(t, r.name)
		if reg.Status.ObservedGeneration != reg.Generation || ready(reg).Status == metav1.ConditionUnknown {
			return "not reconciled yet: " + conditionText(reg.Status.Conditions)
		}
		return ""
	}); err != nil {
		t.Fatal(err)
	}
	wantNotReady(t, reg, reasonInvalidSpec, "--allow-file-urls")
}
