package controllers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/http/fetch"
	"github.com/fluxcd/pkg/tar"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/source"
)

// ReasonAccessDenied is the Ready reason of a registry whose sourceRef names another namespace
// while the controller runs with --no-cross-namespace-refs (Flux's reason for the same rule).
const ReasonAccessDenied = "AccessDenied"

// Ready reasons of a registry with a sourceRef.
const (
	// ReasonSourceNotReady: the Flux source is missing, not Ready for its generation, or has no
	// artifact yet; the registry retries and reconciles when the source changes.
	ReasonSourceNotReady = "SourceNotReady"
	// ReasonArtifactFailed: downloading, checking the digest of or unpacking the artifact failed.
	ReasonArtifactFailed = "ArtifactFailed"
)

// sourceRefIndex indexes ManifestRegistries by the Flux source they name ("Kind/ns/name").
const sourceRefIndex = ".spec.sourceRef"

// fluxKinds are the Flux source kinds a sourceRef may name, with an empty object of each.
var fluxKinds = map[string]func() fluxSource{
	v1alpha1.SourceKindGitRepository: func() fluxSource { return &sourcev1.GitRepository{} },
	v1alpha1.SourceKindOCIRepository: func() fluxSource { return &sourcev1.OCIRepository{} },
	v1alpha1.SourceKindBucket:        func() fluxSource { return &sourcev1.Bucket{} },
}

// fluxSource is what the controller reads of a Flux source: its artifact and conditions.
type fluxSource interface {
	client.Object
	GetArtifact() *meta.Artifact
	GetConditions() []metav1.Condition
}

// sourceKey is the sourceRefIndex value of a registry's sourceRef, "" without one.
func sourceKey(reg *v1alpha1.ManifestRegistry) string {
	ref := reg.Spec.SourceRef
	if ref == nil {
		return ""
	}
	return ref.Kind + "/" + sourceNamespace(reg) + "/" + ref.Name
}

func sourceNamespace(reg *v1alpha1.ManifestRegistry) string {
	if ns := reg.Spec.SourceRef.Namespace; ns != "" {
		return ns
	}
	return reg.Namespace
}

func sourceName(reg *v1alpha1.ManifestRegistry) string {
	return fmt.Sprintf("%s %s/%s", reg.Spec.SourceRef.Kind, sourceNamespace(reg), reg.Spec.SourceRef.Name)
}

// watchFluxSources makes a new artifact (or a change of a source's Ready or SourceVerified)
// reconcile the registries naming that source at once. Only the kinds the API server serves
// are watched (Flux is optional): a registry naming a kind installed later is still
// reconciled every interval, reading the source uncached.
func (r *ManifestRegistryReconciler) watchFluxSources(mgr ctrl.Manager, b *builder.TypedBuilder[reconcile.Request]) error {
	if err := sourcev1.AddToScheme(mgr.GetScheme()); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.ManifestRegistry{}, sourceRefIndex, func(o client.Object) []string {
		if k := sourceKey(o.(*v1alpha1.ManifestRegistry)); k != "" {
			return []string{k}
		}
		return nil
	}); err != nil {
		return err
	}
	kinds := make([]string, 0, len(fluxKinds))
	for k := range fluxKinds {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, kind := range kinds {
		gk := schema.GroupKind{Group: sourcev1.GroupVersion.Group, Kind: kind}
		if _, err := mgr.GetRESTMapper().RESTMapping(gk, sourcev1.GroupVersion.Version); err != nil {
			log.Log.Info("Flux source kind not served: registries naming it are reconciled every interval, not on change", "kind", kind, "reason", err.Error())
			continue
		}
		b.Watches(fluxKinds[kind](), handler.EnqueueRequestsFromMapFunc(r.registriesForSource(kind)),
			builder.WithPredicates(sourceChanged))
	}
	return nil
}

// registriesForSource maps a Flux source to the registries that name it.
func (r *ManifestRegistryReconciler) registriesForSource(kind string) handler.MapFunc {
	return func(ctx context.Context, obj client.Object) []reconcile.Request {
		var regs v1alpha1.ManifestRegistryList
		key := kind + "/" + obj.GetNamespace() + "/" + obj.GetName()
		if err := r.List(ctx, &regs, client.MatchingFields{sourceRefIndex: key}); err != nil {
			log.FromContext(ctx).Error(err, "listing the registries of a Flux source", "source", key)
			return nil
		}
		reqs := make([]reconcile.Request, len(regs.Items))
		for i := range regs.Items {
			reqs[i] = reconcile.Request{NamespacedName: types.NamespacedName{Namespace: regs.Items[i].Namespace, Name: regs.Items[i].Name}}
		}
		return reqs
	}
}

// sourceChanged passes the updates of a Flux source that can change what a registry renders:
// another artifact, or another status of Ready or SourceVerified.
var sourceChanged = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	o, ok1 := e.ObjectOld.(fluxSource)
	n, ok2 := e.ObjectNew.(fluxSource)
	if !ok1 || !ok2 {
		return true
	}
	if !artifactEqual(o.GetArtifact(), n.GetArtifact()) || o.GetGeneration() != n.GetGeneration() {
		return true
	}
	for _, t := range []string{meta.ReadyCondition, sourcev1.SourceVerifiedCondition} {
		if conditionStatus(o.GetConditions(), t) != conditionStatus(n.GetConditions(), t) {
			return true
		}
	}
	return false
}}

func artifactEqual(a, b *meta.Artifact) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Revision == b.Revision && a.Digest == b.Digest && a.URL == b.URL
}

func conditionStatus(conds []metav1.Condition, t string) metav1.ConditionStatus {
	if c := apimeta.FindStatusCondition(conds, t); c != nil {
		return c.Status
	}
	return ""
}

// readFluxSource reads the source of reg.Spec.SourceRef from the API server and checks that
// it may be used: the namespace rule, Ready for its current generation with an artifact, and
// with verify.commit its SourceVerified (checkFluxVerification).
func (r *ManifestRegistryReconciler) readFluxSource(ctx context.Context, reg *v1alpha1.ManifestRegistry) (fluxSource, *stepError) {
	ref := reg.Spec.SourceRef
	ns := sourceNamespace(reg)
	if ns != reg.Namespace && r.NoCrossNamespaceRefs {
		return nil, fail(ReasonAccessDenied, true, "spec.sourceRef names %s in another namespace, which this controller refuses (--no-cross-namespace-refs): use a source in namespace %s", sourceName(reg), reg.Namespace)
	}
	newObj, ok := fluxKinds[ref.Kind]
	if !ok {
		return nil, fail(v1alpha1.ReasonInvalidSpec, true, "spec.sourceRef.kind %q is not a Flux source kind: use GitRepository, OCIRepository or Bucket", ref.Kind)
	}
	src := newObj()
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: ref.Name}, src); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return nil, fail(ReasonSourceNotReady, false, "%s was not found: create it, or fix spec.sourceRef", sourceName(reg))
		case apimeta.IsNoMatchError(err):
			return nil, fail(ReasonSourceNotReady, false, "%s cannot be read: the API server does not serve %s (install Flux's source-controller CRDs, then restart the controller so it watches them)", sourceName(reg), sourcev1.GroupVersion.WithKind(ref.Kind))
		default:
			return nil, fail(ReasonSourceNotReady, false, "reading %s: %v", sourceName(reg), err)
		}
	}
	ready := apimeta.FindStatusCondition(src.GetConditions(), meta.ReadyCondition)
	if ready == nil || ready.Status != metav1.ConditionTrue || ready.ObservedGeneration != src.GetGeneration() {
		why := "it has no Ready condition yet"
		if ready != nil {
			why = fmt.Sprintf("its Ready is %s%s: %s", ready.Status, staleGeneration(ready, src), ready.Message)
		}
		if v := reg.Spec.Verify; v != nil && v.Commit != nil {
			// Flux refused the newest commit's signature: say so, as the registry's own
			// verification would (SourceVerified=False, CommitVerificationFailed).
			if c := apimeta.FindStatusCondition(src.GetConditions(), sourcev1.SourceVerifiedCondition); c != nil && c.Status == metav1.ConditionFalse {
				e := fail(v1alpha1.ReasonCommitVerificationFailed, false, "%s refused the signature of its newest revision (SourceVerified=False: %s); the last good rendering stays", sourceName(reg), c.Message)
				setCondition(reg, v1alpha1.ConditionSourceVerified, metav1.ConditionFalse, e.reason, e.msg)
				return nil, e
			}
		}
		return nil, fail(ReasonSourceNotReady, false, "%s is not ready, %s; the last good rendering stays", sourceName(reg), why)
	}
	if a := src.GetArtifact(); a == nil || a.URL == "" || a.Digest == "" || a.Revision == "" {
		return nil, fail(ReasonSourceNotReady, false, "%s has no artifact (with url, digest and revision) yet", sourceName(reg))
	}
	if why := oddRevision(src.GetArtifact().Revision); why != "" {
		return nil, fail(ReasonArtifactFailed, false, "%s reports an artifact revision that is %s: source-controller writes `<ref>@sha1:<hex>`, `<tag>@sha256:<hex>` or `sha256:<hex>`; the last good rendering stays", sourceName(reg), why)
	}
	if serr := r.checkFluxVerification(ctx, reg, src); serr != nil {
		return nil, serr
	}
	return src, nil
}

// MaxFluxRevisionLength bounds the revision of a Flux artifact the controller accepts: it is
// carried into the status, the ConfigMaps' annotations, the signed snapshot and what gateways
// log and report.
const MaxFluxRevisionLength = 512

// oddRevision says why a Flux revision is not one the controller passes on ("" when it is):
// too long, or with a character outside printable ASCII (a new line, a space, a control
// character would forge lines in logs and events).
func oddRevision(rev string) string {
	if len(rev) > MaxFluxRevisionLength {
		return fmt.Sprintf("%d bytes long, more than %d", len(rev), MaxFluxRevisionLength)
	}
	for i := 0; i < len(rev); i++ {
		if c := rev[i]; c <= ' ' || c > '~' {
			return fmt.Sprintf("holding the byte %q at %d", c, i)
		}
	}
	return ""
}

// checkFluxVerification enforces verify.commit on a Flux source: the source verifies
// signatures itself (spec.verify), with the same mode, with no key that
// verify.commit.secretRef does not list (a GitRepository's author cannot swap the keys), adds
// or leaves out nothing the signature does not cover (spec.include, spec.ignore,
// spec.sparseCheckout), and reports SourceVerified=True for the artifact it serves. For a
// GitRepository that report must name the artifact's commit and, for each object verified,
// a key verify.commit.secretRef lists (bindGitVerification): the key Secret a source names can
// be rewritten after source-controller verified with it, and source-controller does not
// verify a commit again, so the keys the Secret holds now prove nothing. For an
// OCIRepository, whose report names no key, the source must verify with the registry's own
// Secret and report SourceVerified for its current generation and the artifact's revision.
// Without verify.commit nothing is required. A failure sets SourceVerified=False.
func (r *ManifestRegistryReconciler) checkFluxVerification(ctx context.Context, reg *v1alpha1.ManifestRegistry, src fluxSource) *stepError {
	v := reg.Spec.Verify
	if v == nil || v.Commit == nil {
		removeCondition(reg, v1alpha1.ConditionSourceVerified)
		return nil
	}
	refuse := func(format string, args ...any) *stepError {
		e := fail(v1alpha1.ReasonCommitVerificationFailed, false, "%s: %s; the last good rendering stays", sourceName(reg), fmt.Sprintf(format, args...))
		setCondition(reg, v1alpha1.ConditionSourceVerified, metav1.ConditionFalse, e.reason, e.msg)
		return e
	}
	a := src.GetArtifact()
	mode, keysRef := "", ""
	switch s := src.(type) {
	case *sourcev1.GitRepository:
		if s.Spec.Verification == nil {
			return refuse("spec.verify.commit is set but the GitRepository verifies no signature: set its spec.verify (mode %s, secretRef %s)", v.Commit.Mode, v.Commit.SecretRef.Name)
		}
		mode, keysRef = strings.ToUpper(string(s.Spec.Verification.GetMode())), s.Spec.Verification.SecretRef.Name
		if want := strings.ToUpper(v.Commit.Mode); mode != want {
			return refuse("the GitRepository verifies mode %s, spec.verify.commit.mode is %s: make them the same", s.Spec.Verification.GetMode(), v.Commit.Mode)
		}
		if why := gitUnsignedContent(s); why != "" {
			return refuse("%s", why)
		}
	case *sourcev1.OCIRepository:
		if s.Spec.Verify == nil || s.Spec.Verify.SecretRef == nil {
			return refuse("spec.verify.commit is set but the OCIRepository verifies no signature with keys: set its spec.verify with a secretRef (keyless verification cannot be tied to spec.verify.commit.secretRef)")
		}
		keysRef = s.Spec.Verify.SecretRef.Name
		if s.Namespace != reg.Namespace || keysRef != v.Commit.SecretRef.Name {
			// source-controller does not say which key verified, and does not verify again when
			// a Secret changes: only the registry's own Secret ties its report to our keys.
			return refuse("the OCIRepository verifies with Secret %s/%s: it must verify with spec.verify.commit.secretRef itself (%s/%s), since its report does not name the key and a Secret rewritten after the verification is not read again", s.Namespace, keysRef, reg.Namespace, v.Commit.SecretRef.Name)
		}
		if s.Spec.Ignore != nil {
			return refuse("the OCIRepository's spec.ignore leaves files of the signed artifact out (a policy, say), which the signature cannot show: remove spec.ignore (the registry reads only spec.path)")
		}
	default:
		return refuse("a %s carries no verified signature: remove spec.verify.commit or use a GitRepository or OCIRepository", reg.Spec.SourceRef.Kind)
	}
	if serr := r.checkFluxKeys(ctx, reg, src.GetNamespace(), keysRef); serr != nil {
		setCondition(reg, v1alpha1.ConditionSourceVerified, metav1.ConditionFalse, serr.reason, serr.msg)
		return serr
	}
	c := apimeta.FindStatusCondition(src.GetConditions(), sourcev1.SourceVerifiedCondition)
	if c == nil || c.Status != metav1.ConditionTrue {
		why := "it has no SourceVerified condition"
		if c != nil {
			why = fmt.Sprintf("its SourceVerified is %s: %s", c.Status, c.Message)
		}
		return refuse("%s", why)
	}
	if _, ok := src.(*sourcev1.GitRepository); ok {
		// source-controller keeps SourceVerified of a commit it verified at an earlier
		// generation (it does not verify the same commit again): what binds the report to
		// the artifact is the commit and the keys it names, not its generation.
		keys, serr := r.commitKeys(ctx, reg)
		if serr != nil {
			return serr
		}
		if why := bindGitVerification(c.Message, mode, a.Revision, keys); why != "" {
			return refuse("its SourceVerified does not vouch for the artifact with the registry's keys: %s", why)
		}
	} else {
		if c.ObservedGeneration != src.GetGeneration() {
			return refuse("its SourceVerified is for generation %d (the source is at %d): %s", c.ObservedGeneration, src.GetGeneration(), c.Message)
		}
		if want := "verified signature of revision " + a.Revision; strings.TrimSpace(c.Message) != want {
			return refuse("its SourceVerified says %q, not %q", c.Message, want)
		}
	}
	setCondition(reg, v1alpha1.ConditionSourceVerified, metav1.ConditionTrue, v1alpha1.ReasonVerified,
		fmt.Sprintf("%s verified revision %s with the keys of Secret %s/%s: %s", sourceName(reg), a.Revision, src.GetNamespace(), keysRef, c.Message))
	return nil
}

// gitUnsignedContent says why a GitRepository's artifact may hold other content than the
// signed commit's tree ("" when it cannot): spec.include copies other sources' artifacts
// in, spec.ignore and spec.sparseCheckout leave files out (a policy, say). Both the spec and
// what source-controller observed building the artifact are checked.
func gitUnsignedContent(s *sourcev1.GitRepository) string {
	switch {
	case len(s.Spec.Include) > 0 || len(s.Status.IncludedArtifacts) > 0 || len(s.Status.ObservedInclude) > 0:
		return "the GitRepository's spec.include copies other sources' artifacts into it, which the commit signature does not cover: remove spec.include"
	case s.Spec.Ignore != nil || s.Status.ObservedIgnore != nil:
		return "the GitRepository's spec.ignore leaves files of the signed commit out of the artifact (a policy, say), which the signature cannot show: remove spec.ignore (the registry reads only spec.path)"
	case len(s.Spec.SparseCheckout) > 0 || len(s.Status.ObservedSparseCheckout) > 0:
		return "the GitRepository's spec.sparseCheckout leaves files of the signed commit out of the artifact, which the signature cannot show: remove spec.sparseCheckout (the registry reads only spec.path)"
	}
	return ""
}

// fluxVerifiedLine is one object source-controller reports it verified (its SourceVerified
// message: "verified signature of", then a line "\t- commit '<hash>' with key '<id>'" or
// "\t- tag '<name>@<hash>' with key '<id>'" per object).
var fluxVerifiedLine = regexp.MustCompile(`^- (commit|tag) '([^'\s]+)' with key '([^'\s]+)'$`)

// bindGitVerification checks source-controller's SourceVerified message of a GitRepository
// against the artifact and the registry's keys: it must report the objects the mode verifies
// (the commit for HEAD and TagAndHEAD, the tag for Tag and TagAndHEAD), the commit it names
// must be the artifact's, and every key it names must be in keys. Anything else in the
// message refuses (fail closed). It returns why not, "" when bound.
func bindGitVerification(msg, mode, revision string, keys *source.KeyRing) string {
	lines := strings.Split(strings.TrimSpace(msg), "\n")
	if len(lines) < 2 || strings.TrimSpace(lines[0]) != "verified signature of" {
		return fmt.Sprintf("the message %q is not source-controller's report of a verified signature", msg)
	}
	commit := revisionCommit(revision)
	if commit == "" {
		return fmt.Sprintf("the artifact's revision %q names no sha1 commit", revision)
	}
	seen := map[string]bool{}
	for _, l := range lines[1:] {
		m := fluxVerifiedLine.FindStringSubmatch(strings.TrimSpace(l))
		if m == nil {
			return fmt.Sprintf("the line %q of the message is not a verified object", l)
		}
		what, obj, key := m[1], m[2], m[3]
		if what == "commit" && !strings.EqualFold(obj, commit) {
			return fmt.Sprintf("it verified commit %s, but the artifact is revision %s", obj, revision)
		}
		if _, ok := keys.Lookup(key); !ok {
			return fmt.Sprintf("the %s %s was verified with key %s, which spec.verify.commit.secretRef does not list", what, obj, key)
		}
		seen[what] = true
	}
	if (mode == "HEAD" || mode == "TAGANDHEAD") && !seen["commit"] {
		return fmt.Sprintf("mode %s needs the commit verified, but it reports no commit", mode)
	}
	if (mode == "TAG" || mode == "TAGANDHEAD") && !seen["tag"] {
		return fmt.Sprintf("mode %s needs the tag verified, but it reports no tag", mode)
	}
	return ""
}

// checkFluxKeys refuses a source whose verification Secret holds a key that
// spec.verify.commit.secretRef does not: every data value of the source's Secret must also be a
// data value of ours (compared without surrounding white space). The same Secret passes.
func (r *ManifestRegistryReconciler) checkFluxKeys(ctx context.Context, reg *v1alpha1.ManifestRegistry, ns, name string) *stepError {
	ours, serr := r.secretData(ctx, reg, reg.Spec.Verify.Commit.SecretRef.Name, "commit verification keys")
	if serr != nil {
		return serr
	}
	var theirs map[string][]byte
	if ns == reg.Namespace && name == reg.Spec.Verify.Commit.SecretRef.Name {
		theirs = ours
	} else {
		// Uncached: the source may be in a namespace the controller's cache does not hold.
		var s corev1.Secret
		if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
			return fail(v1alpha1.ReasonCommitVerificationFailed, false, "reading Secret %s/%s, the keys %s verifies with: %v", ns, name, sourceName(reg), err)
		}
		theirs = s.Data
	}
	trusted := map[string]bool{}
	for _, v := range ours {
		trusted[strings.TrimSpace(string(v))] = true
	}
	var extra []string
	for _, k := range sortedKeys(theirs) {
		if !trusted[strings.TrimSpace(string(theirs[k]))] {
			extra = append(extra, k)
		}
	}
	if len(extra) > 0 {
		return fail(v1alpha1.ReasonCommitVerificationFailed, false, "%s verifies with keys of Secret %s/%s that spec.verify.commit.secretRef (%s) does not list (%s): a signature by them is not one the registry trusts; put the same keys in both, or name the same Secret",
			sourceName(reg), ns, name, reg.Spec.Verify.Commit.SecretRef.Name, strings.Join(extra, ", "))
	}
	return nil
}

// fluxArtifact is a downloaded, digest-checked and unpacked Flux artifact.
type fluxArtifact struct {
	dir      string
	revision string
	digest   string
}

// DefaultFluxArtifactHosts is where a default Flux install serves artifacts from
// (source-controller's --storage-adv-addr in namespace flux-system): the hosts a
// ManifestRegistry downloads a source's status.artifact.url from unless
// --flux-artifact-hosts says otherwise.
var DefaultFluxArtifactHosts = []string{"source-controller.flux-system.svc.cluster.local."}

// checkArtifactURL refuses a status.artifact.url the controller should not download: not
// http(s), with credentials, a query or a fragment, on a host that is not one of
// FluxArtifactHosts (DefaultFluxArtifactHosts when empty; "*" allows every host), or not a
// file of the source's own folder in source-controller's storage (`<kind>/<ns>/<name>/<file>`).
// The URL comes from the source's status: anyone who may write that status would otherwise
// make the controller fetch any URL its network reaches (a blind request from inside the
// cluster), or serve another source's artifact as this one's.
func (r *ManifestRegistryReconciler) checkArtifactURL(reg *v1alpha1.ManifestRegistry, src fluxSource) *stepError {
	raw := src.GetArtifact().URL
	refuse := func(why string) *stepError {
		return fail(ReasonArtifactFailed, false, "the artifact URL %q of %s was refused: %s; the last good rendering stays", raw, sourceName(reg), why)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return refuse(err.Error())
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Opaque != "" {
		return refuse("source-controller serves artifacts at http(s)://HOST/PATH, without credentials, query or fragment")
	}
	hosts := r.FluxArtifactHosts
	if len(hosts) == 0 {
		hosts = DefaultFluxArtifactHosts
	}
	if !artifactHostAllowed(u, hosts) {
		return refuse(fmt.Sprintf("its host %s is not one of the controller's --flux-artifact-hosts (%s): artifacts are downloaded only from source-controller's storage; set the flag to the host of source-controller's --storage-adv-addr", u.Host, strings.Join(hosts, ",")))
	}
	dir := "/" + strings.ToLower(reg.Spec.SourceRef.Kind) + "/" + src.GetNamespace() + "/" + src.GetName() + "/"
	file, ok := strings.CutPrefix(u.Path, dir)
	if !ok || file == "" || strings.Contains(file, "/") || file == "." || file == ".." || (u.RawPath != "" && u.RawPath != u.Path) {
		return refuse(fmt.Sprintf("it is not a file of the source's folder %s in source-controller's storage", dir))
	}
	return nil
}

// artifactHostAllowed says whether u's host is one of hosts: "*" is every host, "HOST" is
// that host on any port, "HOST:PORT" that host on that port (names compared without case
// and without a trailing dot).
func artifactHostAllowed(u *url.URL, hosts []string) bool {
	norm := func(h string) string { return strings.TrimSuffix(strings.ToLower(h), ".") }
	host, port := norm(u.Hostname()), u.Port()
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if h == "*" {
			return true
		}
		wantHost, wantPort := h, ""
		if hh, pp, err := net.SplitHostPort(h); err == nil {
			wantHost, wantPort = hh, pp
		} else {
			wantHost = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
		}
		if norm(wantHost) == host && (wantPort == "" || wantPort == port) {
			return true
		}
	}
	return false
}

// fetchFluxArtifact downloads the source's artifact with Flux's own fetcher (digest checked
// before anything is unpacked) and unpacks it with Flux's untar (links skipped), bounded like
// a git fetch: the archive and the unpacked files at SourceMaxTotalBytes, the entries at
// SourceMaxFiles, one file at SourceMaxFileBytes, the time at the registry's timeout. The
// unpacking stops at the first entry over a bound and when the time is up (Flux's untar
// alone reads every header of the archive: a small gzip of empty entries would hold a
// worker for minutes).
func (r *ManifestRegistryReconciler) fetchFluxArtifact(ctx context.Context, reg *v1alpha1.ManifestRegistry, src fluxSource) (*fluxArtifact, *stepError) {
	a := src.GetArtifact()
	if serr := r.checkArtifactURL(reg, src); serr != nil {
		return nil, serr
	}
	maxTotal := r.SourceMaxTotalBytes
	if maxTotal <= 0 {
		maxTotal = source.DefaultMaxTotalBytes
	}
	maxFile := r.SourceMaxFileBytes
	if maxFile <= 0 {
		maxFile = source.DefaultMaxFileBytes
	}
	maxFiles := r.SourceMaxFiles
	if maxFiles <= 0 {
		maxFiles = source.DefaultMaxFiles
	}
	download, err := os.MkdirTemp(r.TempDir, "reversi-artifact-download-")
	if err != nil {
		return nil, fail(ReasonArtifactFailed, false, "making a folder for the artifact of %s: %v", sourceName(reg), err)
	}
	defer os.RemoveAll(download)
	dir, err := os.MkdirTemp(r.TempDir, "reversi-artifact-")
	if err != nil {
		return nil, fail(ReasonArtifactFailed, false, "making a folder for the artifact of %s: %v", sourceName(reg), err)
	}
	var entries atomic.Int64
	var tooLarge atomic.Value
	filter := func(p string, fi os.FileInfo) bool {
		if entries.Add(1) > int64(maxFiles) {
			tooLarge.CompareAndSwap(nil, fmt.Sprintf("it has more than %d entries", maxFiles))
			return true
		}
		if fi.Mode().IsRegular() && fi.Size() > maxFile {
			tooLarge.CompareAndSwap(nil, fmt.Sprintf("%s is %d bytes, more than %d", p, fi.Size(), maxFile))
			return true
		}
		return false
	}
	fctx, cancel := context.WithTimeout(ctx, r.fetchTimeout(reg))
	defer cancel()
	const archive = "artifact.tar.gz"
	fetcher := fetch.New(fetch.WithRetries(1), fetch.WithMaxDownloadSize(int(maxTotal)), fetch.WithFileName(archive), fetch.WithLogger(nil))
	err = fetcher.FetchWithContext(fctx, a.URL, a.Digest, download)
	if err == nil {
		var f *os.File
		if f, err = os.Open(filepath.Join(download, archive)); err == nil {
			err = tar.Untar(&stoppingReader{r: f, ctx: fctx, stop: &tooLarge}, dir,
				tar.WithMaxUntarSize(int(maxTotal)), tar.WithFilter(filter), tar.WithSkipSymlinks())
			f.Close()
		}
	}
	if why, _ := tooLarge.Load().(string); why != "" {
		os.RemoveAll(dir)
		return nil, fail(v1alpha1.ReasonSourceTooLarge, false, "the artifact of %s (revision %s) is too large: %s; the last good rendering stays", sourceName(reg), a.Revision, why)
	}
	if err != nil {
		os.RemoveAll(dir)
		if errors.Is(err, fetch.ErrFileNotFound) {
			return nil, fail(ReasonArtifactFailed, false, "the artifact of %s (revision %s) is gone from %s (the source stored a newer one?): retrying", sourceName(reg), a.Revision, a.URL)
		}
		if fctx.Err() != nil {
			err = fmt.Errorf("%w (the registry's timeout is %s)", err, r.fetchTimeout(reg))
		}
		return nil, fail(ReasonArtifactFailed, false, "the artifact of %s (revision %s, digest %s) was refused: %v; the last good rendering stays", sourceName(reg), a.Revision, a.Digest, err)
	}
	return &fluxArtifact{dir: dir, revision: a.Revision, digest: a.Digest}, nil
}

// stoppingReader reads the archive until the time is up or an entry went over a bound.
type stoppingReader struct {
	r    io.Reader
	ctx  context.Context
	stop *atomic.Value
}

func (s *stoppingReader) Read(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		return 0, err
	}
	if why, _ := s.stop.Load().(string); why != "" {
		return 0, errors.New(why)
	}
	return s.r.Read(p)
}

// files is the unpacked artifact as a file system.
func (f *fluxArtifact) files() fs.FS { return os.DirFS(f.dir) }

func (f *fluxArtifact) cleanup() { os.RemoveAll(f.dir) }

// staleGeneration says, when c describes an older generation than src's, which ("" otherwise).
func staleGeneration(c *metav1.Condition, src client.Object) string {
	if c.ObservedGeneration == src.GetGeneration() {
		return ""
	}
	return fmt.Sprintf(" for generation %d (the source is at %d)", c.ObservedGeneration, src.GetGeneration())
}
