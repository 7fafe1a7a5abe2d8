package controllers

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/bundle"
	"github.com/reversi-gitops/reversi/pkg/policy"
	"github.com/reversi-gitops/reversi/pkg/registry"
	"github.com/reversi-gitops/reversi/pkg/signing"
	"github.com/reversi-gitops/reversi/pkg/source"
)

// Labels and annotations of rendered ConfigMaps.
const (
	LabelRegistry      = "reversi.dev/registry"
	LabelManagedBy     = "app.kubernetes.io/managed-by"
	ManagedBy          = "reversi"
	AnnotationRevision = "reversi.dev/revision"
	// AnnotationInputs records a digest of what the rendering was verified with (the spec's
	// generation and the key Secrets' data): a change forces a full reconcile even when the
	// remote revision is the same.
	AnnotationInputs = "reversi.dev/inputs"
)

// ManifestRegistryReconciler turns a git repository of signed manifests into verified
// ConfigMaps: fetch, verify the commit, load and verify the manifests, render, in that order.
// A revision that fails any step leaves the last good ConfigMaps exactly as they were.
type ManifestRegistryReconciler struct {
	client.Client
	Recorder recorder.EventRecorder
	// TempDir holds checkouts while a reconcile runs (os.TempDir when empty).
	TempDir string
	// MaxShardBytes is the manifest bytes per ConfigMap (bundle.MaxShardBytes when 0).
	MaxShardBytes int
	// Key signs the snapshot of every rendering. Required.
	Key *SigningKey
	// APIReader reads the registry from the API server, not the cache: the sequence depends on
	// the newest status (mgr.GetAPIReader()).
	APIReader client.Reader
	// AllowFileURLs lets registries use file:// URLs, which read repositories on the
	// controller's own disk; without it such a registry is Ready=False InvalidSpec.
	AllowFileURLs bool
	// SourceMaxFileBytes bounds one file under spec.path (and one object the git server
	// sends), SourceMaxTotalBytes the files under spec.path (and the objects of one pack);
	// 0 means source.DefaultMaxFileBytes (4 MiB) and source.DefaultMaxTotalBytes (64 MiB).
	SourceMaxFileBytes, SourceMaxTotalBytes int64
	// SourceMaxFiles bounds the entries under spec.path, SourceMaxRefs the refs a git server
	// may advertise; 0 means source.DefaultMaxFiles and source.DefaultMaxRefs.
	SourceMaxFiles, SourceMaxRefs int
	// SourceMaxTimeout caps spec.timeout (DefaultSourceMaxTimeout when 0), and Concurrent is
	// how many registries reconcile at once (DefaultConcurrent when 0): a registry whose git
	// server never answers holds one worker for at most that long.
	SourceMaxTimeout time.Duration
	Concurrent       int
	// NoCrossNamespaceRefs refuses a spec.sourceRef to another namespace (Ready=False,
	// AccessDenied), as Flux's --no-cross-namespace-refs does for its own references.
	NoCrossNamespaceRefs bool
	// FluxArtifactHosts are the hosts a Flux source's status.artifact.url may name
	// (DefaultFluxArtifactHosts when empty; see checkArtifactURL).
	FluxArtifactHosts []string
	// Alerts sends alert.rendering_refused to the receivers of --notifications-config when a
	// revision is refused for a security reason or a rendered ConfigMap drifted (issue 24;
	// manifestregistry_alerts.go). Nil: no alerts.
	Alerts *AlertOptions

	// alertsMu guards finished: the alerts this process delivered or dead-lettered (by
	// registry uid, receiver and key), so that an entry reset to Pending, or removed and
	// recorded again, is not sent again while the controller runs.
	alertsMu sync.Mutex
	finished map[string]v1alpha1.NotificationState
}

// stepError is a failed step: the Ready reason, a message saying what to do, and whether
// retrying can help before the spec or a referenced object changes.
type stepError struct {
	reason  string
	msg     string
	stalled bool
	invalid []v1alpha1.InvalidTool
}

func (e *stepError) Error() string { return e.msg }

func fail(reason string, stalled bool, format string, args ...any) *stepError {
	return &stepError{reason: reason, msg: fmt.Sprintf(format, args...), stalled: stalled}
}

// SetupWithManager registers the reconciler: registries, the ConfigMaps they own, and the
// Secrets they reference (a changed key re-verifies at once).
func (r *ManifestRegistryReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Alerts != nil {
		o := *r.Alerts
		o.defaults()
		r.Alerts = &o
	}
	b := ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.ManifestRegistry{}, builder.WithPredicates(predicate.Or(
			predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}, deleting))).
		Owns(&corev1.ConfigMap{}).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.registriesForSecret)).
		WithOptions(controller.Options{MaxConcurrentReconciles: cmp.Or(r.Concurrent, DefaultConcurrent)}).
		Named("manifestregistry")
	if err := r.watchFluxSources(mgr, b); err != nil {
		return err
	}
	return b.Complete(r)
}

// deleting passes the update that marks an object for deletion.
var deleting = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	return !e.ObjectNew.GetDeletionTimestamp().IsZero()
}}

func (r *ManifestRegistryReconciler) registriesForSecret(ctx context.Context, obj client.Object) []reconcile.Request {
	var list v1alpha1.ManifestRegistryList
	if err := r.List(ctx, &list, client.InNamespace(obj.GetNamespace())); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, reg := range list.Items {
		for _, name := range secretNames(&reg) {
			if name == obj.GetName() {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: reg.Namespace, Name: reg.Name}})
				break
			}
		}
	}
	return out
}

// secretNames lists the Secrets a registry reads.
func secretNames(reg *v1alpha1.ManifestRegistry) []string {
	var names []string
	if reg.Spec.SecretRef != nil {
		names = append(names, reg.Spec.SecretRef.Name)
	}
	if v := reg.Spec.Verify; v != nil {
		if v.ManifestKeysSecretRef != nil {
			names = append(names, v.ManifestKeysSecretRef.Name)
		}
		if v.Commit != nil {
			names = append(names, v.Commit.SecretRef.Name)
		}
	}
	return names
}

// Reconcile runs one reconcile of a ManifestRegistry and patches its status.
func (r *ManifestRegistryReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	reg := &v1alpha1.ManifestRegistry{}
	if err := r.APIReader.Get(ctx, req.NamespacedName, reg); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !reg.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, reg)
	}
	if controllerutil.AddFinalizer(reg, Finalizer) {
		if err := r.Update(ctx, reg); err != nil {
			return ctrl.Result{}, err
		}
	}
	base := reg.DeepCopy()
	if at, ok := reg.Annotations[v1alpha1.AnnotationRequestedAt]; ok {
		reg.Status.LastHandledReconcileAt = at
	}
	if reg.Spec.Suspend {
		setCondition(reg, v1alpha1.ConditionReady, readyStatus(reg), v1alpha1.ReasonSuspended, "reconciliation is suspended: set spec.suspend to false to resume")
		removeCondition(reg, v1alpha1.ConditionReconciling)
		removeCondition(reg, v1alpha1.ConditionStalled) // nothing is being attempted
		reg.Status.ObservedGeneration = reg.Generation
		r.syncAlerts(reg)
		if err := r.patchStatus(ctx, reg, base); err != nil {
			return ctrl.Result{}, err
		}
		return r.withAlerts(ctx, reg, ctrl.Result{})
	}

	res, stepErr := r.reconcile(ctx, reg)
	reg.Status.ObservedGeneration = reg.Generation
	if stepErr != nil {
		markFailed(reg, stepErr.reason, stepErr.msg, stepErr.stalled)
		if stepErr.invalid != nil {
			reg.Status.InvalidTools, reg.Status.InvalidToolCount = boundInvalid(stepErr.invalid)
		}
		r.event(reg, corev1.EventTypeWarning, stepErr.reason, reg.Status.LastAttemptedRevision, stepErr.msg)
		if alertReason(reg, stepErr) {
			// The outbox entry goes out in the status write that records the refusal.
			r.recordAlert(reg, stepErr.reason, reg.Status.LastAttemptedRevision, stepErr.msg)
		}
		r.syncAlerts(reg)
		if err := r.patchStatus(ctx, reg, base); err != nil {
			return ctrl.Result{}, err
		}
		if stepErr.stalled {
			return r.withAlerts(ctx, reg, ctrl.Result{}) // a spec or Secret change triggers the next attempt
		}
		return r.withAlerts(ctx, reg, ctrl.Result{RequeueAfter: retryAfter(reg)})
	}
	r.syncAlerts(reg)
	if err := r.patchStatus(ctx, reg, base); err != nil {
		return ctrl.Result{}, err
	}
	// Alerts first: the annotation's removal below changes the resourceVersion their status
	// write is locked to.
	res, err := r.withAlerts(ctx, reg, res)
	if err != nil {
		return ctrl.Result{}, err
	}
	// The override is spent once applied: the annotation goes, so the same revision is not
	// accepted again later (after a fix-forward) without someone annotating it again.
	if v := reg.Annotations[v1alpha1.AnnotationAcceptRevision]; v != "" && reg.Status.AcceptedRevision == v &&
		reg.Status.Artifact != nil && reg.Status.Artifact.Revision == v {
		if err := r.removeAcceptAnnotation(ctx, reg); err != nil {
			return ctrl.Result{}, err
		}
	}
	return res, nil
}

// withAlerts delivers the due alerts of reg (deliverAlerts) after its status was written and
// requeues for the next one due, if sooner than res does.
func (r *ManifestRegistryReconciler) withAlerts(ctx context.Context, reg *v1alpha1.ManifestRegistry, res ctrl.Result) (ctrl.Result, error) {
	due, err := r.deliverAlerts(ctx, reg)
	if err != nil {
		return ctrl.Result{}, err
	}
	if due > 0 && (res.RequeueAfter == 0 || due < res.RequeueAfter) {
		res.RequeueAfter = due
	}
	return res, nil
}

// Defaults of the registry reconciler's bounds (see ManifestRegistryReconciler).
const (
	// DefaultBranch is the branch of a registry without spec.ref.
	DefaultBranch           = "main"
	DefaultSourceMaxTimeout = 2 * time.Minute
	DefaultConcurrent       = 4
)

// Finalizer makes the controller delete a registry's ConfigMaps before the registry goes:
// the owner references would too, but only where a garbage collector runs, and a gateway must
// not keep enforcing a rendering whose registry was deleted.
const Finalizer = "reversi.dev/finalizer"

func (r *ManifestRegistryReconciler) finalize(ctx context.Context, reg *v1alpha1.ManifestRegistry) error {
	if !controllerutil.ContainsFinalizer(reg, Finalizer) {
		return nil
	}
	var cms corev1.ConfigMapList
	if err := r.List(ctx, &cms, client.InNamespace(reg.Namespace), client.MatchingLabels{LabelRegistry: reg.Name}); err != nil {
		return err
	}
	for i := range cms.Items {
		if metav1.IsControlledBy(&cms.Items[i], reg) {
			if err := r.Delete(ctx, &cms.Items[i]); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	controllerutil.RemoveFinalizer(reg, Finalizer)
	return client.IgnoreNotFound(r.Update(ctx, reg))
}

func readyStatus(reg *v1alpha1.ManifestRegistry) metav1.ConditionStatus {
	for _, c := range reg.Status.Conditions {
		if c.Type == v1alpha1.ConditionReady {
			return c.Status
		}
	}
	return metav1.ConditionUnknown
}

// patchStatus patches the status with an optimistic lock: a reconcile that started from a
// stale cached copy gets a conflict (and is retried) instead of overwriting newer conditions.
func (r *ManifestRegistryReconciler) patchStatus(ctx context.Context, reg, base *v1alpha1.ManifestRegistry) error {
	return client.IgnoreNotFound(r.Status().Patch(ctx, reg, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})))
}

func (r *ManifestRegistryReconciler) event(reg *v1alpha1.ManifestRegistry, typ, reason, revision, note string) {
	if r.Recorder == nil {
		return
	}
	if revision != "" {
		note = fmt.Sprintf("%s (revision %s)", note, revision)
	}
	r.Recorder.Eventf(reg, nil, typ, reason, "Reconcile", "%s", note)
}

// interval is the spec's interval with up to 10% jitter, so registries do not fetch in step.
func interval(reg *v1alpha1.ManifestRegistry) time.Duration {
	d := v1alpha1.DefaultRegistryInterval
	if reg.Spec.Interval != nil && reg.Spec.Interval.Duration > 0 {
		d = reg.Spec.Interval.Duration
	}
	return d + time.Duration(rand.Int64N(int64(d)/10+1))
}

// retryAfter spaces retries of a failing registry: a tenth of the interval, at most a minute.
func retryAfter(reg *v1alpha1.ManifestRegistry) time.Duration {
	return min(interval(reg)/10+time.Second, time.Minute)
}

// reconcile is the sequence of steps; each returns a *stepError that names its reason:
// source (fetch, commit verification), ancestry (the new commit descends from the applied one),
// load (manifests, signatures, the seed's rules), index sequence (never lower), attest (the
// signed snapshot), render (ConfigMaps, restoring any edited one).
func (r *ManifestRegistryReconciler) reconcile(ctx context.Context, reg *v1alpha1.ManifestRegistry) (ctrl.Result, *stepError) {
	last := r.lastApplied(ctx, reg)
	inputs, err := r.inputsDigest(ctx, reg)
	if err != nil {
		return ctrl.Result{}, err
	}
	fetchStep := r.fetchGit
	if reg.Spec.SourceRef != nil {
		fetchStep = r.fetchFlux
	}
	rev, err := fetchStep(ctx, reg, last, inputs)
	if err != nil {
		return ctrl.Result{}, err
	}
	if rev == nil { // unchanged
		return ctrl.Result{RequeueAfter: interval(reg)}, nil
	}
	defer rev.cleanup()
	accepted := reg.Annotations[v1alpha1.AnnotationAcceptRevision] == rev.revision
	if rev.git != nil {
		// A Flux artifact has no history: its ancestry is the source's (see docs/flux.md).
		if serr := last.checkAncestry(rev.git, accepted); serr != nil {
			return ctrl.Result{}, serr
		}
	}
	b, kind, index, lerr := r.load(ctx, reg, rev.revision, rev.files)
	if lerr != nil {
		return ctrl.Result{}, lerr
	}
	if serr := last.checkIndex(rev.revision, index, accepted); serr != nil {
		return ctrl.Result{}, serr
	}
	if serr := r.attest(reg, &b, kind, rev.revision, rev.signer, index, accepted, last); serr != nil {
		return ctrl.Result{}, serr
	}
	names, renderingDigest, werr := r.render(ctx, reg, b, inputs)
	if werr != nil {
		return ctrl.Result{}, werr
	}

	snap := b.Snapshots[0].Snapshot
	prev := reg.Status.Artifact
	changed := prev == nil || prev.Revision != rev.revision || prev.Digest != snap.Digest || prev.Policies != int32(len(b.Policies)) || prev.SourceDigest != rev.sourceDigest
	if changed {
		reg.Status.Artifact = &v1alpha1.RegistryArtifact{LastUpdateTime: metav1.Now()}
	}
	a := reg.Status.Artifact
	a.Revision, a.Digest, a.Tools, a.ConfigMaps = rev.revision, snap.Digest, int32(len(b.Entries)), names
	a.Policies = int32(len(b.Policies))
	a.Sequence, a.RenderingDigest, a.SourceDigest = snap.Sequence, renderingDigest, rev.sourceDigest
	if index != nil {
		a.IndexSequence, a.RegistryID = index.Sequence, index.ID
	}
	if accepted {
		reg.Status.AcceptedRevision = rev.revision
		r.event(reg, corev1.EventTypeWarning, v1alpha1.EventRevisionOverrideAccepted, rev.revision,
			fmt.Sprintf("applied because the annotation %s named it, although the ancestry, sequence or registry checks refuse it; the annotation was removed", v1alpha1.AnnotationAcceptRevision))
	}
	reg.Status.InvalidTools, reg.Status.InvalidToolCount = nil, 0
	msg := fmt.Sprintf("stored artifact for revision %s: %d tools", rev.revision, len(b.Entries))
	if len(b.Policies) > 0 {
		msg += fmt.Sprintf(", %d policies", len(b.Policies))
	}
	setCondition(reg, v1alpha1.ConditionArtifactInStorage, metav1.ConditionTrue, v1alpha1.ReasonSucceeded, msg)
	markReady(reg, v1alpha1.ReasonSucceeded, msg)
	if changed {
		r.event(reg, corev1.EventTypeNormal, v1alpha1.EventNewArtifact, rev.revision, fmt.Sprintf("stored %d tools in %s, digest %s, sequence %d", len(b.Entries), strings.Join(names, ", "), snap.Digest, snap.Sequence))
	}
	return ctrl.Result{RequeueAfter: interval(reg)}, nil
}

// fetchedRevision is what the fetch step hands to the others: a verified revision and its
// files. git is the fetched repository (nil for a Flux artifact, which has no history).
type fetchedRevision struct {
	revision     string
	files        fs.FS
	signer       string // who the commit verification found signed it, "" for none
	sourceDigest string // the Flux artifact's digest, "" for git
	git          *source.Artifact
	cleanup      func()
}

// fetchGit is the fetch step of a registry with spec.url: the remote's revision, nil when it
// and the inputs are what is rendered (and the ConfigMaps hold exactly that), else the fetched
// commit with its signature verified (spec.verify.commit).
func (r *ManifestRegistryReconciler) fetchGit(ctx context.Context, reg *v1alpha1.ManifestRegistry, last applied, inputs string) (*fetchedRevision, *stepError) {
	setCondition(reg, v1alpha1.ConditionReconciling, metav1.ConditionTrue, v1alpha1.ReasonProgressing, "fetching "+reg.Spec.URL)
	opts, err := r.sourceOptions(ctx, reg)
	if err != nil {
		return nil, err
	}
	opts.Since = last.since() // the history back to what was applied: ancestry and Chain
	remote, rerr := source.RemoteRevision(ctx, opts)
	if rerr != nil {
		return nil, sourceFailure(rerr)
	}
	reg.Status.LastAttemptedRevision = remote
	if r.unchanged(ctx, reg, last, remote, "", inputs) {
		return nil, nil
	}
	art, ferr := source.Fetch(ctx, opts)
	if ferr != nil {
		return nil, sourceFailure(ferr)
	}
	reg.Status.LastAttemptedRevision = art.Revision
	signer, serr := r.verifyCommit(ctx, reg, art)
	if serr != nil {
		art.Cleanup()
		return nil, serr
	}
	files, ferr := art.FS()
	if ferr != nil {
		art.Cleanup()
		if errors.Is(ferr, source.ErrTooLarge) {
			return nil, sourceFailure(ferr)
		}
		return nil, fail(v1alpha1.ReasonLoadFailed, false, "reading revision %s: %v", art.Revision, ferr)
	}
	return &fetchedRevision{revision: art.Revision, files: files, signer: signer, git: art, cleanup: func() { art.Cleanup() }}, nil
}

// fetchFlux is the fetch step of a registry with spec.sourceRef: the Flux source's artifact
// (checked by readFluxSource), nil when it and the inputs are what is rendered, else
// downloaded with its digest checked.
func (r *ManifestRegistryReconciler) fetchFlux(ctx context.Context, reg *v1alpha1.ManifestRegistry, last applied, inputs string) (*fetchedRevision, *stepError) {
	setCondition(reg, v1alpha1.ConditionReconciling, metav1.ConditionTrue, v1alpha1.ReasonProgressing, "fetching the artifact of "+sourceName(reg))
	src, serr := r.readFluxSource(ctx, reg)
	if serr != nil {
		return nil, serr
	}
	a := src.GetArtifact()
	reg.Status.LastAttemptedRevision = a.Revision
	if r.unchanged(ctx, reg, last, a.Revision, a.Digest, inputs) {
		return nil, nil
	}
	fa, serr := r.fetchFluxArtifact(ctx, reg, src)
	if serr != nil {
		return nil, serr
	}
	signer := ""
	if v := reg.Spec.Verify; v != nil && v.Commit != nil {
		signer = sourceName(reg) + " (SourceVerified)"
	}
	return &fetchedRevision{revision: fa.revision, files: fa.files(), signer: signer, sourceDigest: fa.digest, cleanup: fa.cleanup}, nil
}

// unchanged says whether revision (and, for a Flux artifact, its digest) and the inputs are
// what was rendered, and the ConfigMaps still hold exactly that rendering (any edit is
// rendered again at once); it then marks the registry Ready.
func (r *ManifestRegistryReconciler) unchanged(ctx context.Context, reg *v1alpha1.ManifestRegistry, last applied, revision, sourceDigest, inputs string) bool {
	a := reg.Status.Artifact
	if a == nil || a.Revision != revision || a.SourceDigest != sourceDigest || r.renderedInputs(ctx, reg) != inputs ||
		a.RenderingDigest == "" || liveRenderingDigest(ctx, r.Client, reg, a.ConfigMaps) != a.RenderingDigest ||
		!slices.Equal(r.ownedShards(ctx, reg), a.ConfigMaps) || last.snap == nil || last.snap.Revision != revision {
		return false
	}
	msg := fmt.Sprintf("stored artifact for revision %s (unchanged)", revision)
	setCondition(reg, v1alpha1.ConditionArtifactInStorage, metav1.ConditionTrue, v1alpha1.ReasonSucceeded, msg)
	markReady(reg, v1alpha1.ReasonSucceeded, msg)
	return true
}

// registrySource is how snapshots name a registry.
func registrySource(reg *v1alpha1.ManifestRegistry) string {
	return "ManifestRegistry " + reg.Namespace + "/" + reg.Name
}

// applied is what the registry applied last. The controller keeps no state of its own, and
// neither its status (which a user with status rights can write) nor its ConfigMaps (which a
// user with ConfigMap rights can write) is trusted alone: both are read — the rendering only as
// far as its snapshot verifies with the controller's key — and a new revision must pass the
// checks against each. So tampering with one can only make the checks stricter.
type applied struct {
	reg      *v1alpha1.ManifestRegistry
	snap     *bundle.Snapshot // the verified snapshot of the current rendering, nil when none
	status   *v1alpha1.RegistryArtifact
	sequence int64 // the larger recorded sequence
}

// lastApplied reads what the registry applied last, from its status and its rendering.
func (r *ManifestRegistryReconciler) lastApplied(ctx context.Context, reg *v1alpha1.ManifestRegistry) applied {
	a := applied{reg: reg, status: reg.Status.Artifact}
	prev := readPrevious(ctx, r.Client, reg, shardsOf(ctx, r.Client, reg.Namespace, shardName(reg.Name, 0)), r.Key.Trust)
	if s, ok := prev.snapshots[registrySource(reg)]; ok {
		a.snap = &s
		a.sequence = s.Sequence
	}
	if a.status != nil {
		a.sequence = max(a.sequence, a.status.Sequence)
	}
	return a
}

// commits are the commits recorded as applied (status and rendering), without repeats.
func (a applied) commits() []string {
	var out []string
	add := func(rev string) {
		if c := revisionCommit(rev); c != "" && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	if a.snap != nil {
		add(a.snap.Revision)
	}
	if a.status != nil {
		add(a.status.Revision)
	}
	return out
}

// since is the commit the history is fetched back to: the rendering's (verified), else the
// status's.
func (a applied) since() string {
	if c := a.commits(); len(c) > 0 {
		return c[0]
	}
	return ""
}

// checkAncestry refuses a commit that does not descend from every commit recorded as applied
// (a force-push, a ref moved back, a pinned older commit, another repository), whatever changed
// in the spec, unless the revision is accepted by annotation. A history too long to search is
// refused too (fail closed).
func (a applied) checkAncestry(art *source.Artifact, accepted bool) *stepError {
	if accepted {
		return nil
	}
	for _, c := range a.commits() {
		ok, err := art.Descends(c)
		if ok {
			continue
		}
		why := "does not descend from"
		if err != nil {
			why = fmt.Sprintf("could not be shown to descend from (%v)", err)
		}
		return fail(v1alpha1.ReasonRevisionNotDescendant, false, "revision %s %s commit %s applied before: the branch was probably force-pushed or the ref moved back; push a new commit on top instead, or accept exactly this revision with the annotation %s=%s",
			art.Revision, why, short(c), v1alpha1.AnnotationAcceptRevision, art.Revision)
	}
	return nil
}

// checkIndex refuses a registry whose signed index is older than the one applied (a branch
// reset to an old signed commit, or an old index committed again) or belongs to another
// registry (another registry's signed folder copied over spec.path), unless the revision is
// accepted by annotation. A legitimate rollback is a new publish (manifests rollback), so the
// sequence never goes back.
func (a applied) checkIndex(revision string, index *registry.IndexProof, accepted bool) *stepError {
	if index == nil || accepted {
		return nil
	}
	var seq int64
	var ids []string
	if a.snap != nil && a.snap.Index != nil {
		seq, ids = a.snap.Index.Sequence, append(ids, a.snap.Index.ID)
	}
	if a.status != nil {
		seq = max(seq, a.status.IndexSequence)
		if a.status.RegistryID != "" {
			ids = append(ids, a.status.RegistryID)
		}
	}
	for _, id := range ids {
		if id != "" && id != index.ID {
			return fail(v1alpha1.ReasonRegistryMismatch, false, "revision %s holds the registry %s in spec.path, but %s applied registry %s: another registry's signed folder was put in its place; restore it, or accept exactly this revision with the annotation %s=%s",
				revision, index.ID, registrySource(a.reg), id, v1alpha1.AnnotationAcceptRevision, revision)
		}
	}
	if index.Sequence < seq {
		return fail(v1alpha1.ReasonVersionDowngrade, false, "revision %s holds index.json sequence %d, older than sequence %d applied before: the branch was probably reset to an old commit; publish a new version instead (reversi manifests rollback), or accept exactly this revision with the annotation %s=%s",
			revision, index.Sequence, seq, v1alpha1.AnnotationAcceptRevision, revision)
	}
	return nil
}

// removeAcceptAnnotation drops the override annotation (a merge patch of metadata only).
func (r *ManifestRegistryReconciler) removeAcceptAnnotation(ctx context.Context, reg *v1alpha1.ManifestRegistry) error {
	patch := []byte(`{"metadata":{"annotations":{"` + v1alpha1.AnnotationAcceptRevision + `":null}}}`)
	obj := &v1alpha1.ManifestRegistry{ObjectMeta: metav1.ObjectMeta{Namespace: reg.Namespace, Name: reg.Name}}
	return client.IgnoreNotFound(r.Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch)))
}

// ownedShards are the ConfigMaps labelled as the registry's and controlled by it, sorted as
// shards are (`-manifests`, `-manifests-1`, …): the rendering is exactly these.
func (r *ManifestRegistryReconciler) ownedShards(ctx context.Context, reg *v1alpha1.ManifestRegistry) []string {
	var cms corev1.ConfigMapList
	if err := r.List(ctx, &cms, client.InNamespace(reg.Namespace), client.MatchingLabels{LabelRegistry: reg.Name}); err != nil {
		return nil
	}
	var names []string
	for i := range cms.Items {
		if metav1.IsControlledBy(&cms.Items[i], reg) {
			names = append(names, cms.Items[i].Name)
		}
	}
	want := shardNames(shardName(reg.Name, 0), len(names))
	slices.SortFunc(names, func(x, y string) int { return slices.Index(want, x) - slices.Index(want, y) })
	return names
}

// attest signs the snapshot of b. The sequence stays when the same revision renders the same
// set again (the same bytes: drift checks compare them) and grows otherwise.
func (r *ManifestRegistryReconciler) attest(reg *v1alpha1.ManifestRegistry, b *bundle.Bundle, kind, revision, signer string, index *registry.IndexProof, accepted bool, last applied) *stepError {
	s := bundle.Snapshot{Format: bundle.SnapshotFormat, Source: registrySource(reg), Kind: kind, Revision: revision, CommitSigner: signer, Index: index}
	// The revision the latest override accepted, carried by every snapshot after it: gateways
	// keep the writer's index sequence as a mark per registry and accepted revision, so an
	// override starts that mark anew and nothing else does (not even recreating the object).
	switch {
	case accepted:
		s.AcceptedRevision = revision
	case last.snap != nil:
		s.AcceptedRevision = last.snap.AcceptedRevision
	default:
		s.AcceptedRevision = reg.Status.AcceptedRevision
	}
	s.Digest, s.Policies = b.SourceDigest(s.Source), b.SourcePolicyDigest(s.Source)
	var recorded []bundle.Snapshot
	if last.snap != nil {
		recorded = append(recorded, *last.snap)
	}
	if a := last.status; a != nil { // what status says, in the shape of s
		st := s
		st.Revision, st.Digest, st.Sequence = a.Revision, a.Digest, a.Sequence
		recorded = append(recorded, st)
	}
	s.Sequence = sequenceFor(s, recorded...)
	if _, err := b.Attest(s, r.Key.Signer); err != nil {
		return fail(v1alpha1.ReasonStorageFailed, false, "signing the snapshot: %v", err)
	}
	return nil
}

// secretData reads a referenced Secret in the registry's namespace.
func (r *ManifestRegistryReconciler) secretData(ctx context.Context, reg *v1alpha1.ManifestRegistry, name, what string) (map[string][]byte, *stepError) {
	var s corev1.Secret
	err := r.Get(ctx, types.NamespacedName{Namespace: reg.Namespace, Name: name}, &s)
	if apierrors.IsNotFound(err) {
		return nil, fail(v1alpha1.ReasonSecretNotFound, false, "%s Secret %s/%s not found: create it, or fix the reference", what, reg.Namespace, name)
	}
	if err != nil {
		return nil, fail(v1alpha1.ReasonSecretNotFound, false, "reading %s Secret %s/%s: %v", what, reg.Namespace, name, err)
	}
	return s.Data, nil
}

// sourceOptions are the fetch options of a registry: the spec, the controller's limits, the
// commit applied last (for the ancestry check and mode Chain) and, for a semver ref whose
// tags are verified, the keys (Fetch picks the highest tag that verifies).
func (r *ManifestRegistryReconciler) sourceOptions(ctx context.Context, reg *v1alpha1.ManifestRegistry) (source.Options, *stepError) {
	// Only the objects are fetched and only spec.path is read from them (no checkout), so
	// links in the repository are never followed and files elsewhere are never read.
	o := source.Options{URL: reg.Spec.URL, TempDir: r.TempDir, Path: reg.Spec.Path, AllowFileURLs: r.AllowFileURLs,
		MaxFileBytes: r.SourceMaxFileBytes, MaxTotalBytes: r.SourceMaxTotalBytes, MaxFiles: r.SourceMaxFiles, MaxRefs: r.SourceMaxRefs}
	o.Ref = source.Ref{Branch: DefaultBranch}
	if ref := reg.Spec.Ref; ref != nil {
		o.Ref = source.Ref{Branch: ref.Branch, Tag: ref.Tag, SemVer: ref.SemVer, Commit: ref.Commit}
	}
	o.Timeout = r.fetchTimeout(reg)
	if reg.Spec.SecretRef != nil {
		data, err := r.secretData(ctx, reg, reg.Spec.SecretRef.Name, "git credentials")
		if err != nil {
			return o, err
		}
		o.Auth = source.AuthFromSecret(data)
	}
	if v := reg.Spec.Verify; v != nil && v.Commit != nil && o.Ref.SemVer != "" {
		if mode := source.Mode(v.Commit.Mode); mode == source.ModeTag || mode == source.ModeTagAndHEAD {
			keys, err := r.commitKeys(ctx, reg)
			if err != nil {
				return o, err
			}
			o.Verify = &source.VerifyOptions{Mode: mode, Keys: keys}
		}
	}
	return o, nil
}

// fetchTimeout is spec.timeout (source.DefaultTimeout when unset) capped at SourceMaxTimeout.
func (r *ManifestRegistryReconciler) fetchTimeout(reg *v1alpha1.ManifestRegistry) time.Duration {
	t := source.DefaultTimeout
	if reg.Spec.Timeout != nil && reg.Spec.Timeout.Duration > 0 {
		t = reg.Spec.Timeout.Duration
	}
	return min(t, cmp.Or(max(r.SourceMaxTimeout, 0), DefaultSourceMaxTimeout))
}

// revisionCommit is the commit of a revision `<name>@sha1:<40 hex>` or `sha1:<40 hex>`, or
// "" when it has another form.
func revisionCommit(revision string) string {
	i := strings.LastIndex(revision, "sha1:")
	if i < 0 || (i > 0 && revision[i-1] != '@') {
		return ""
	}
	h := revision[i+len("sha1:"):]
	if _, err := hex.DecodeString(h); err != nil || len(h) != 40 {
		return ""
	}
	return h
}

// commitKeys reads and parses verify.commit.secretRef; a Secret without usable keys is
// InvalidSecret (stalled) and sets SourceVerified=False.
func (r *ManifestRegistryReconciler) commitKeys(ctx context.Context, reg *v1alpha1.ManifestRegistry) (*source.KeyRing, *stepError) {
	name := reg.Spec.Verify.Commit.SecretRef.Name
	data, serr := r.secretData(ctx, reg, name, "commit verification keys")
	if serr != nil {
		return nil, serr
	}
	keys, err := source.ParseKeys(data)
	if err != nil {
		e := fail(v1alpha1.ReasonInvalidSecret, true, "commit verification keys %s: %v", name, err)
		setCondition(reg, v1alpha1.ConditionSourceVerified, metav1.ConditionFalse, e.reason, e.msg)
		return nil, e
	}
	return keys, nil
}

// inputsDigest hashes what a rendering is verified with besides the revision: the spec's
// generation and the data of the key Secrets.
func (r *ManifestRegistryReconciler) inputsDigest(ctx context.Context, reg *v1alpha1.ManifestRegistry) (string, *stepError) {
	h := sha256.New()
	fmt.Fprintf(h, "generation %d\nsnapshot key %s\n", reg.Generation, r.Key.Signer.KeyID)
	if v := reg.Spec.Verify; v != nil {
		for _, ref := range []*v1alpha1.LocalObjectReference{v.ManifestKeysSecretRef, commitSecret(v)} {
			if ref == nil {
				continue
			}
			data, err := r.secretData(ctx, reg, ref.Name, "keys")
			if err != nil {
				return "", err
			}
			keys := make([]string, 0, len(data))
			for k := range data {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				fmt.Fprintf(h, "%s/%s %x\n", ref.Name, k, sha256.Sum256(data[k]))
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func commitSecret(v *v1alpha1.RegistryVerification) *v1alpha1.LocalObjectReference {
	if v.Commit == nil {
		return nil
	}
	return &v.Commit.SecretRef
}

// sourceFailure maps a fetch error to its reason; bad options cannot be retried.
func sourceFailure(err error) *stepError {
	switch {
	case errors.Is(err, source.ErrInvalidOptions):
		return fail(v1alpha1.ReasonInvalidSpec, true, "%v", err)
	case errors.Is(err, source.ErrAuthFailed), errors.Is(err, source.ErrHostKey):
		return fail(v1alpha1.ReasonAuthenticationFailed, false, "%v", err)
	case errors.Is(err, source.ErrRefNotFound):
		return fail(v1alpha1.ReasonRefNotFound, false, "%v", err)
	case errors.Is(err, source.ErrTooLarge):
		return fail(v1alpha1.ReasonSourceTooLarge, false, "%v", err)
	case errors.Is(err, source.ErrVerification), errors.Is(err, source.ErrInvalidKeys):
		// A semver ref with verified tags where no candidate tag verifies.
		return fail(v1alpha1.ReasonCommitVerificationFailed, false, "%v", err)
	default:
		return fail(v1alpha1.ReasonFetchFailed, false, "%v", err)
	}
}

// verifyCommit checks verify.commit on the fetched revision (mode Chain: every commit since
// the last applied one) and names, in TagSkipped events, the higher semver tags Fetch
// skipped because they do not verify.
// verifyCommit checks the commit (and tag) signatures as spec.verify.commit says, and returns
// the fingerprint of the key that signed the commit (else the tag); "" when nothing is verified.
func (r *ManifestRegistryReconciler) verifyCommit(ctx context.Context, reg *v1alpha1.ManifestRegistry, art *source.Artifact) (string, *stepError) {
	for _, t := range art.SkippedTags {
		r.event(reg, corev1.EventTypeWarning, v1alpha1.EventTagSkipped, art.Revision,
			fmt.Sprintf("tag %s skipped, its signature does not verify: %s", t.Tag, t.Reason))
	}
	if n := art.SkippedTagsOmitted; n > 0 {
		r.event(reg, corev1.EventTypeWarning, v1alpha1.EventTagSkipped, art.Revision,
			fmt.Sprintf("%d more tags above it skipped, their signatures do not verify (not listed one by one)", n))
	}
	v := reg.Spec.Verify
	if v == nil || v.Commit == nil {
		removeCondition(reg, v1alpha1.ConditionSourceVerified)
		return "", nil
	}
	keys, serr := r.commitKeys(ctx, reg)
	if serr != nil {
		return "", serr
	}
	mode := source.Mode(v.Commit.Mode)
	res, err := source.Verify(art, mode, keys)
	if err != nil {
		e := fail(v1alpha1.ReasonCommitVerificationFailed, false, "%v", err)
		setCondition(reg, v1alpha1.ConditionSourceVerified, metav1.ConditionFalse, e.reason, e.msg)
		return "", e
	}
	var who []string
	signer := ""
	if res.Tag != nil {
		signer = res.Tag.Fingerprint
	}
	if res.Commit != nil {
		signer = res.Commit.Fingerprint
		who = append(who, fmt.Sprintf("commit %s by %s", short(art.Commit), res.Commit.Fingerprint))
	}
	if res.Tag != nil {
		who = append(who, fmt.Sprintf("tag %s by %s", art.Tag, res.Tag.Fingerprint))
	}
	if mode == source.ModeChain {
		if art.Since == "" || art.Since == art.Commit {
			who = append(who, "no earlier commits (first apply: the history is trusted on first use)")
		} else {
			who = append(who, fmt.Sprintf("all %d commits since %s", res.Chain, short(art.Since)))
		}
	}
	setCondition(reg, v1alpha1.ConditionSourceVerified, metav1.ConditionTrue, v1alpha1.ReasonVerified, "verified "+strings.Join(who, " and "))
	return signer, nil
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// load reads spec.path of the fetched commit as a signed registry or as plain manifest files
// and returns the verified (not yet attested) bundle, the snapshot kind and, for a registry,
// its index proof. Every problem is reported, with the invalid tools listed.
func (r *ManifestRegistryReconciler) load(ctx context.Context, reg *v1alpha1.ManifestRegistry, revision string, files fs.FS) (bundle.Bundle, string, *registry.IndexProof, *stepError) {
	b, index, serr := r.loadBundle(ctx, reg, revision, files)
	if serr != nil {
		return bundle.Bundle{}, "", nil, serr
	}
	if reg.Spec.Format == v1alpha1.FormatPlain {
		return b, bundle.KindPlain, nil, nil
	}
	return b, bundle.KindRegistry, index, nil
}

func (r *ManifestRegistryReconciler) loadBundle(ctx context.Context, reg *v1alpha1.ManifestRegistry, revision string, files fs.FS) (bundle.Bundle, *registry.IndexProof, *stepError) {
	dir := path.Clean(strings.TrimPrefix(reg.Spec.Path, "./"))
	if dir == "" || !fs.ValidPath(dir) {
		return bundle.Bundle{}, nil, fail(v1alpha1.ReasonInvalidSpec, true, "spec.path %q must be a folder inside the repository", reg.Spec.Path)
	}
	if fi, err := fs.Stat(files, dir); err != nil || !fi.IsDir() {
		return bundle.Bundle{}, nil, fail(v1alpha1.ReasonLoadFailed, false, "spec.path %q is not a folder at revision %s: fix the path or the repository", reg.Spec.Path, revision)
	}
	sub, err := fs.Sub(files, dir)
	if err != nil {
		return bundle.Bundle{}, nil, fail(v1alpha1.ReasonInvalidSpec, true, "spec.path: %v", err)
	}
	if reg.Spec.Format == v1alpha1.FormatPlain {
		if v := reg.Spec.Verify; v != nil && v.ManifestKeysSecretRef != nil {
			// Plain files carry no signatures: the keys would check nothing (seed: "Setting it
			// for manifests that are not in a registry is an error").
			return bundle.Bundle{}, nil, fail(v1alpha1.ReasonInvalidSpec, true, "%v", &registry.PlainTrustError{
				Manifests: fmt.Sprintf("spec.path %q (format: Plain)", reg.Spec.Path), Setting: "spec.verify.manifestKeysSecretRef"})
		}
		b, serr := loadPlain(registrySource(reg), revision, files, dir)
		return b, nil, serr
	}
	var trust *signing.TrustSet
	if v := reg.Spec.Verify; v != nil && v.ManifestKeysSecretRef != nil {
		data, serr := r.secretData(ctx, reg, v.ManifestKeysSecretRef.Name, "manifest keys")
		if serr != nil {
			return bundle.Bundle{}, nil, serr
		}
		var pem bytes.Buffer
		for _, k := range sortedKeys(data) {
			pem.Write(data[k])
			pem.WriteByte('\n')
		}
		if trust, err = signing.ParseTrustSet(pem.Bytes()); err != nil {
			return bundle.Bundle{}, nil, fail(v1alpha1.ReasonInvalidSecret, true, "manifest keys Secret %s: %v: put Ed25519 public keys (PEM) in it", v.ManifestKeysSecretRef.Name, err)
		}
	}
	if !registry.IsRegistryFS(sub) {
		return bundle.Bundle{}, nil, fail(v1alpha1.ReasonLoadFailed, false, "spec.path %q has no %s at revision %s: publish with reversi manifests publish, or set format: Plain", reg.Spec.Path, registry.IndexFile, revision)
	}
	snap, errs := registry.NewFS(dir, sub).Load(trust)
	if len(errs) > 0 {
		reason, sigErr := loadProblemsReason(errs)
		if sigErr != nil {
			setCondition(reg, v1alpha1.ConditionSourceVerified, metav1.ConditionFalse, reason, sigErr.Error())
		}
		return bundle.Bundle{}, nil, loadFailure(reason, revision, errs)
	}
	return bundle.FromSnapshot(registrySource(reg), snap), &snap.Index, nil
}

func sortedKeys(m map[string][]byte) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// loadProblemsReason is the Ready reason of a refused registry load: SignatureVerificationFailed
// when a problem refuses a signature (missing, malformed, by an untrusted key, not verifying,
// or an index too old to carry one that covers the served set), returned as sigErr for
// SourceVerified=False; ValidationFailed otherwise. It decides by the errors' types
// (registry.IsSignatureError, errors.Is on the signing sentinels), never by their text: a
// problem that merely mentions "signature" (a field name, a tool name) is not one.
func loadProblemsReason(errs []error) (reason string, sigErr error) {
	for _, e := range errs {
		if registry.IsSignatureError(e) {
			return v1alpha1.ReasonSignatureVerificationFailed, e
		}
	}
	return v1alpha1.ReasonValidationFailed, nil
}

// PlainPolicyDir is the folder of a Plain registry's policies, under spec.path.
const PlainPolicyDir = "policy"

// loadPlain reads plain manifest files (and the policies of PlainPolicyDir) from the commit; files are named by their path in the
// repository, and links are refused (never followed).
func loadPlain(src, revision string, files fs.FS, dir string) (bundle.Bundle, *stepError) {
	if registry.IsRegistryFS(mustSub(files, dir)) {
		return bundle.Bundle{}, fail(v1alpha1.ReasonLoadFailed, false, "the folder holds a signed registry (%s) at revision %s: set format: Registry", registry.IndexFile, revision)
	}
	pdir := path.Join(dir, PlainPolicyDir)
	docs, errs := manifest.ReadFSSkipping(files, dir, "", pdir)
	ms, verrs := manifest.ValidateDocuments(docs)
	errs = append(errs, verrs...)
	// The policies beside the manifests (issue 21: "Plain format reads policy/*.yaml"): read
	// strictly and compiled, every error with file:line; one broken policy refuses the commit.
	var ps []*apipolicy.Policy
	if fi, err := fs.Stat(files, pdir); err == nil && fi.IsDir() {
		var perrs []error
		ps, perrs = apipolicy.ReadFS(files, pdir, "")
		if len(perrs) == 0 && len(ps) > 0 {
			_, perrs = policy.Compile(ps)
		}
		errs = append(errs, perrs...)
	}
	if len(errs) > 0 {
		manifest.SortErrors(errs)
		return bundle.Bundle{}, loadFailure(v1alpha1.ReasonValidationFailed, revision, errs)
	}
	b, err := bundle.FromManifests(src, ms)
	if err == nil {
		err = b.AddPolicies(src, ps)
	}
	if err != nil {
		return bundle.Bundle{}, fail(v1alpha1.ReasonLoadFailed, false, "%v", err)
	}
	return b, nil
}

func mustSub(fsys fs.FS, dir string) fs.FS {
	sub, err := fs.Sub(fsys, dir)
	if err != nil {
		return fsys
	}
	return sub
}

// loadFailure summarises load problems: the first few in the message, and the invalid tools.
func loadFailure(reason, revision string, errs []error) *stepError {
	const shown = 5
	lines := make([]string, 0, shown)
	for i, e := range errs {
		if i == shown {
			lines = append(lines, fmt.Sprintf("and %d more (see status.invalidTools)", len(errs)-shown))
			break
		}
		lines = append(lines, e.Error())
	}
	e := fail(reason, false, "revision %s was not applied, the last good rendering stays: %s", revision, strings.Join(lines, "; "))
	byTool := map[string][]string{}
	var order []string
	for _, err := range errs {
		tool := toolOf(err)
		if _, seen := byTool[tool]; !seen {
			order = append(order, tool)
		}
		byTool[tool] = append(byTool[tool], err.Error())
	}
	for _, t := range order {
		e.invalid = append(e.invalid, v1alpha1.InvalidTool{Tool: t, Errors: byTool[t]})
	}
	return e
}

func toolOf(err error) string {
	var fe *manifest.FieldError
	var p *registry.Problem
	switch {
	case errors.As(err, &fe) && fe.Tool != "":
		return fe.Tool
	case errors.As(err, &p) && p.Tool != "":
		return p.Tool
	}
	return "(registry)"
}

// boundInvalid keeps the status list small: at most MaxInvalidTools tools with at most
// MaxInvalidToolErrors errors each; the count says how many there were.
func boundInvalid(in []v1alpha1.InvalidTool) ([]v1alpha1.InvalidTool, int32) {
	out := in
	if len(out) > v1alpha1.MaxInvalidTools {
		out = out[:v1alpha1.MaxInvalidTools]
	}
	for i := range out {
		if len(out[i].Errors) > v1alpha1.MaxInvalidToolErrors {
			out[i].Errors = out[i].Errors[:v1alpha1.MaxInvalidToolErrors]
		}
	}
	return out, int32(len(in))
}

// renderedInputs is the inputs digest the rendering was made with (shard 0's annotation).
func (r *ManifestRegistryReconciler) renderedInputs(ctx context.Context, reg *v1alpha1.ManifestRegistry) string {
	var cm corev1.ConfigMap
	if err := r.Get(ctx, types.NamespacedName{Namespace: reg.Namespace, Name: shardName(reg.Name, 0)}, &cm); err != nil {
		return ""
	}
	return cm.Annotations[AnnotationInputs]
}

// shardName is the name of shard i: `<registry>-manifests`, then `-manifests-1`, ….
func shardName(reg string, i int) string {
	if i == 0 {
		return reg + "-manifests"
	}
	return reg + "-manifests-" + strconv.Itoa(i)
}

// render writes the bundle's shards as ConfigMaps owned by the registry, restoring any that
// someone else edited (a Warning event names who), and deletes shards no longer needed. It
// returns the names and the rendering digest.
func (r *ManifestRegistryReconciler) render(ctx context.Context, reg *v1alpha1.ManifestRegistry, b bundle.Bundle, inputs string) ([]string, string, *stepError) {
	shards, err := b.Shards(r.MaxShardBytes)
	if err != nil {
		return nil, "", fail(v1alpha1.ReasonStorageFailed, false, "%v", err)
	}
	names := shardNames(reg.Name+"-manifests", len(shards))
	set := shardSet{owner: reg, names: names, shards: shards,
		labels:      map[string]string{LabelRegistry: reg.Name, LabelManagedBy: ManagedBy},
		annotations: map[string]string{AnnotationRevision: b.Snapshots[0].Snapshot.Revision, AnnotationInputs: inputs}}
	drifts, err := set.apply(ctx, r.Client, r.Scheme())
	if len(drifts) > 0 {
		note := driftNote(reg.Namespace, drifts, "the rendering of "+b.Snapshots[0].Snapshot.Describe())
		r.event(reg, corev1.EventTypeWarning, v1alpha1.EventRenderingDrift, b.Snapshots[0].Snapshot.Revision, note)
		r.recordAlert(reg, v1alpha1.EventRenderingDrift, b.Snapshots[0].Snapshot.Revision, note)
	}
	if conflict := (*OwnershipConflictError)(nil); errors.As(err, &conflict) {
		return nil, "", fail(v1alpha1.ReasonOwnershipConflict, false, "%v", conflict)
	}
	if err != nil {
		return nil, "", fail(v1alpha1.ReasonStorageFailed, false, "%v", err)
	}
	var existing corev1.ConfigMapList
	if err := r.List(ctx, &existing, client.InNamespace(reg.Namespace), client.MatchingLabels{LabelRegistry: reg.Name}); err != nil {
		return nil, "", fail(v1alpha1.ReasonStorageFailed, false, "listing ConfigMaps: %v", err)
	}
	keep := map[string]bool{}
	for _, n := range names {
		keep[n] = true
	}
	for i := range existing.Items {
		cm := &existing.Items[i]
		if !keep[cm.Name] && metav1.IsControlledBy(cm, reg) {
			if err := r.Delete(ctx, cm); client.IgnoreNotFound(err) != nil {
				return nil, "", fail(v1alpha1.ReasonStorageFailed, false, "deleting stale shard %s: %v", cm.Name, err)
			}
		}
	}
	setCondition(reg, v1alpha1.ConditionArtifactInStorage, metav1.ConditionTrue, v1alpha1.ReasonSucceeded, "rendered "+strings.Join(names, ", "))
	log.FromContext(ctx).V(1).Info("rendered", "configMaps", names, "snapshot", b.Snapshots[0].Snapshot.Describe())
	return names, renderingDigest(shards), nil
}
