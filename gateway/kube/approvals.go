// Package kube keeps the gateway's approval queue in the Kubernetes API server: a store.Store
// decorator whose approval methods work on ApprovalRequest objects (reversi.dev/v1alpha1)
// while runs, the ledger and keys stay in the inner store. A call that needs approval creates
// an ApprovalRequest named by the approval id; approvers answer with Approval objects
// (`kubectl apply`, `reversi approve`); the controller decides and sets the phase; the gateway
// reads the phase from an informer cache (a watch, no polling).
//
// What the gateway honours (issue 16, "A gateway honours only requests it created, exactly as
// it created them"): when it creates a request it records, in the inner store, its name, UID
// and the SHA-256 of its spec exactly as the API server returned it from the create
// (specDigest); on the retry it reads the object and uses its phase only when the object still
// has that UID and spec digest and names this gateway in spec.gateway. A copy, an edited or
// replaced object, or another gateway's request for one of this gateway's runs is ignored and
// journaled once as an `ignored` decision record of the run. An Approved phase counts only
// with the controller's signature of that decision (status.decision, pkg/approvalsig:
// over this object's uid, spec digest, phase, decidedAt and approvers, with the quorum
// reached) by one of Options.ControllerKeys; without it the request stays Pending (held) and
// an `ignored` record says why, once: whoever may write approvalrequests/status cannot
// approve. Consumption is the inner store's
// (store.Intent.Approval, in the intent's transaction); the reversi.dev/consumedAt annotation
// is written after the intent as a mirror for people and decides nothing. The decisions the
// controller records on the gateway's own requests (counted and rejected Approvals, phase
// changes) are journaled as decision records of the run, each once.
//
// Source: DESIGN.md "ApprovalRequest" ("The controller decides; the gateway only reads the
// phase"), issue 8 (gateway side), issue 16. It does not import controllers.
package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	kevents "k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/approvalsig"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// runIndex is the cache index of ApprovalRequests by spec.run.
const runIndex = "spec.run"

// Options configure New.
type Options struct {
	// Config reaches the API server (a kubeconfig, or in-cluster). Required.
	Config *rest.Config
	// Namespace holds the requests (the gateway's namespace). Required.
	Namespace string
	// Gateway is spec.gateway of the requests (the ReversiGateway's name). Required.
	Gateway string
	// Replica names this gateway process in the consumedBy annotation (e.g. the pod name).
	Replica string
	// Identity is the username this gateway authenticates as (the ReversiGateway's
	// ServiceAccount, or the user of its kubeconfig); the admission webhook stamps it on the
	// objects it creates (reversi.dev/created-by). Empty: New asks the API server
	// (SelfSubjectReview) and fails when it cannot.
	Identity string
	// ControllerKeys are the controller's public keys ($REVERSI_CONTROLLER_KEYS): an Approved
	// phase is honoured only with the controller's signature of it by one of them. Required.
	ControllerKeys *signing.TrustSet
	// Events records a Kubernetes Event (events.k8s.io/v1, reason ApprovalRequested) on each
	// ApprovalRequest this gateway creates, with the tool, run, actor and who may approve
	// (issue 24; the controller records the decisions). The gateway needs create and patch on
	// events.events.k8s.io; an Event it cannot write is logged, nothing else.
	Events bool
	// Stderr receives the problems of mirror writes and journaling (default: discarded).
	Stderr io.Writer
	// SyncTimeout bounds the wait for the first list of requests (default 30 s).
	SyncTimeout time.Duration
}

// Store is a store.Store whose approval queue is ApprovalRequest objects; every other method
// is the inner store's. Safe for concurrent use.
type Store struct {
	store.Store
	o      Options
	client client.Client // writes, and reads that must not be stale
	cache  cache.Cache
	stop   context.CancelFunc

	mu        sync.Mutex
	seen      chan struct{}   // closed and replaced whenever the informer sees a change
	journaled map[string]bool // decision records written (or found written) by this process
	ignoredIn map[string]int  // ignored records of others' objects per run (MaxIgnoredPerRun)
	creating  map[string]bool // requests this process created and is recording (CreateApproval)
	notEnded  map[string]bool // requests whose run's ledger has no denied or expired record of them

	recorder kevents.EventRecorder // nil without Options.Events

	events workqueue.TypedDelayingInterface[string] // requests whose status changed
	wg     sync.WaitGroup
	// journaledTo is told the run of every decision record journaled (Runs: the ReversiRun's
	// steps show it); nil until OnJournal.
	journaledTo atomic.Pointer[func(run string)]
}

// OnJournal names a function told the run of each decision record this store journals by
// itself (from the informer, or a request's creation), e.g. the run mirror's status write.
func (s *Store) OnJournal(fn func(run string)) { s.journaledTo.Store(&fn) }

// IgnoreGrace is how long an ApprovalRequest that this gateway's store does not record, but
// that names one of its runs and was created by this gateway's identity, may stay unrecorded
// before it is journaled as ignored: between the create and the record of a replica.
const IgnoreGrace = 2 * time.Second

// creatingRecheck is how soon inspect looks again at a request this process is recording.
const creatingRecheck = 200 * time.Millisecond

// New starts an informer on the namespace's ApprovalRequests, waits until it has listed them,
// and returns the decorator. Close stops the informer and closes inner. Errors: a missing
// option, a client that cannot be built, or an informer that does not sync in time (no access
// to approvalrequests: grant get, list, watch, create, patch).
func New(ctx context.Context, inner store.Store, o Options) (*Store, error) {
	if o.Config == nil || o.Namespace == "" || o.Gateway == "" {
		return nil, errors.New("kube: Config, Namespace and Gateway are required")
	}
	if o.ControllerKeys == nil {
		return nil, errors.New("kube: the approval queue needs the controller's public keys (reversi gateway --kube-controller-keys FILE, or the PEM in $REVERSI_CONTROLLER_KEYS, as a ReversiGateway's pods get it; the controller publishes them in the ConfigMap reversi-controller-keys of its namespace): without them an Approved phase cannot be told from one written by anyone who may write approvalrequests/status")
	}
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = 30 * time.Second
	}
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	scheme := v1alpha1.NewScheme()
	c, err := client.New(o.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("kube: a client for the API server: %w", err)
	}
	if o.Identity == "" {
		if o.Identity, err = SelfUsername(ctx, o.Config); err != nil {
			return nil, err
		}
	}
	ca, err := cache.New(o.Config, cache.Options{Scheme: scheme, DefaultNamespaces: map[string]cache.Config{o.Namespace: {}}})
	if err != nil {
		return nil, fmt.Errorf("kube: the informer cache: %w", err)
	}
	if err := ca.IndexField(ctx, &v1alpha1.ApprovalRequest{}, runIndex, func(obj client.Object) []string {
		return []string{obj.(*v1alpha1.ApprovalRequest).Spec.Run}
	}); err != nil {
		return nil, fmt.Errorf("kube: indexing ApprovalRequests by run: %w", err)
	}
	s := &Store{Store: inner, o: o, client: c, cache: ca, seen: make(chan struct{}), journaled: map[string]bool{}, ignoredIn: map[string]int{}, creating: map[string]bool{}, notEnded: map[string]bool{},
		events: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Name: "approvalrequests-decisions"})}
	inf, err := ca.GetInformer(ctx, &v1alpha1.ApprovalRequest{})
	if err != nil {
		return nil, fmt.Errorf("kube: the ApprovalRequest informer: %w", err)
	}
	notify := func(obj any) {
		s.changed()
		if ar, ok := obj.(*v1alpha1.ApprovalRequest); ok {
			s.events.Add(ar.Name)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: notify, UpdateFunc: func(_, n any) { notify(n) }, DeleteFunc: func(any) { s.changed() },
	}); err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stop = func() { stop(); s.events.ShutDown() }
	if o.Events {
		cs, err := kubernetes.NewForConfig(o.Config)
		if err != nil {
			stop()
			s.events.ShutDown()
			return nil, fmt.Errorf("kube: a client for Events: %w", err)
		}
		b := kevents.NewBroadcaster(&kevents.EventSinkImpl{Interface: cs.EventsV1()})
		if err := b.StartRecordingToSinkWithContext(runCtx); err != nil {
			stop()
			s.events.ShutDown()
			return nil, fmt.Errorf("kube: recording Events: %w", err)
		}
		s.recorder = b.NewRecorder(scheme, "reversi-gateway")
		s.stop = func() { stop(); s.events.ShutDown(); b.Shutdown() }
	}
	if err := startCache(ctx, runCtx, stop, ca, o.SyncTimeout, "ApprovalRequests", o.Namespace,
		"get, list, watch, create, patch on approvalrequests.reversi.dev"); err != nil {
		s.events.ShutDown()
		return nil, err
	}
	s.wg.Add(1)
	go s.journalWorker(runCtx)
	return s, nil
}

// SelfUsername asks the API server who cfg authenticates as (authentication.k8s.io/v1
// SelfSubjectReview). Errors: the review is refused or fails; the gateway then does not start
// (it could not tell its own objects from another gateway's: issue 16, fail closed).
func SelfUsername(ctx context.Context, cfg *rest.Config) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("kube: a client for the API server: %w", err)
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("kube: who this gateway is (SelfSubjectReview, authentication.k8s.io/v1): %w; set the gateway's identity explicitly", err)
	}
	if r.Status.UserInfo.Username == "" {
		return "", errors.New("kube: the API server's SelfSubjectReview names no username for this gateway")
	}
	return r.Status.UserInfo.Username, nil
}

// Identity is the username this gateway authenticates as (Options.Identity).
func (s *Store) Identity() string { return s.o.Identity }

func (s *Store) warn(format string, args ...any) {
	fmt.Fprintf(s.o.Stderr, "reversi-gateway: "+format+"\n", args...)
}

// changed wakes the waiters of waitFor.
func (s *Store) changed() {
	s.mu.Lock()
	close(s.seen)
	s.seen = make(chan struct{})
	s.mu.Unlock()
}

// waitFor waits until the cache holds request name with a resourceVersion other than not
// (so the retry that follows a create or a consumption sees it), or ctx ends.
func (s *Store) waitFor(ctx context.Context, name, not string) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		s.mu.Lock()
		ch := s.seen
		s.mu.Unlock()
		var ar v1alpha1.ApprovalRequest
		if err := s.cache.Get(ctx, client.ObjectKey{Namespace: s.o.Namespace, Name: name}, &ar); err == nil && ar.ResourceVersion != not {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// Close stops the informer and closes the inner store.
func (s *Store) Close() error {
	s.stop()
	s.wg.Wait()
	return s.Store.Close()
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "apr-" + hex.EncodeToString(b[:])
}

// CreateApproval creates the ApprovalRequest named req.ID ("apr-<hex>" when empty), records
// it in the inner store with the object's UID and spec digest as the API server returned them
// (the only requests this gateway honours), journals a requested decision record, and returns
// it once the informer has seen it. Errors: store.ErrInvalid (as the store's, plus what the API
// server's schema refuses, e.g. a quorum above 1 without roles), store.ErrExists; a request the
// inner store cannot record is deleted again and the error returned.
func (s *Store) CreateApproval(ctx context.Context, req store.ApprovalRequest) (store.Approval, error) {
	if req.ID == "" {
		req.ID = newID()
	}
	if req.Tool == "" || req.Run == "" || req.Actor == "" {
		return store.Approval{}, fmt.Errorf("%w: an approval request needs tool, run and actor", store.ErrInvalid)
	}
	req.Quorum = max(req.Quorum, 1)
	if req.Quorum > 10 {
		return store.Approval{}, fmt.Errorf("%w: quorum %d is above 10", store.ErrInvalid, req.Quorum)
	}
	switch req.OnTimeout {
	case "":
		req.OnTimeout = "deny"
	case "deny", "escalate":
	default:
		return store.Approval{}, fmt.Errorf("%w: on_timeout %q (deny or escalate)", store.ErrInvalid, req.OnTimeout)
	}
	if !req.Expires.IsZero() && !req.Expires.After(time.Now()) {
		return store.Approval{}, fmt.Errorf("%w: the request expires at %s, which has passed", store.ErrInvalid, req.Expires)
	}
	ar := &v1alpha1.ApprovalRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.o.Namespace, Name: req.ID},
		Spec: v1alpha1.ApprovalRequestSpec{Tool: req.Tool, ArgumentsDigest: req.ArgsDigest, ArgumentsPreview: req.ArgsPreview,
			Run: req.Run, Actor: req.Actor, ActorUID: req.ActorUID, ActorEmail: req.ActorEmail, Gateway: s.o.Gateway,
			Reason: req.Reason, Roles: req.Roles, Quorum: ptr.To(int32(req.Quorum)), OnTimeout: req.OnTimeout, EscalateTo: req.EscalateTo},
	}
	if !req.Expires.IsZero() {
		ar.Spec.ExpiresAt = &metav1.Time{Time: req.Expires}
	}
	// Until it is recorded, the informer's inspect must not take it for another's (a loaded
	// machine can take longer than IgnoreGrace between the create and the record).
	s.mu.Lock()
	s.creating[ar.Name] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.creating, ar.Name)
		s.mu.Unlock()
	}()
	if err := s.client.Create(ctx, ar); err != nil {
		switch {
		case apierrors.IsAlreadyExists(err):
			return store.Approval{}, fmt.Errorf("%w: approval %s", store.ErrExists, req.ID)
		case apierrors.IsInvalid(err):
			return store.Approval{}, fmt.Errorf("%w: %v", store.ErrInvalid, err)
		}
		return store.Approval{}, fmt.Errorf("kube: creating ApprovalRequest %s/%s: %w", s.o.Namespace, req.ID, err)
	}
	// ar is now the object as the API server stored it (defaults applied, times in seconds).
	rec := req
	rec.UID, rec.SpecDigest = string(ar.UID), specDigest(&ar.Spec)
	rec.Quorum, rec.OnTimeout = int(ptr.Deref(ar.Spec.Quorum, 1)), ar.Spec.OnTimeout
	if ar.Spec.ExpiresAt != nil {
		rec.Expires = ar.Spec.ExpiresAt.UTC()
	}
	stored, err := s.Store.CreateApproval(ctx, rec)
	if err != nil {
		// Unrecorded, the object would never be honoured: remove it rather than leave it waiting.
		if derr := s.client.Delete(context.WithoutCancel(ctx), ar, client.Preconditions{UID: &ar.UID}); derr != nil && !apierrors.IsNotFound(derr) {
			s.warn("ApprovalRequest %s/%s could not be recorded (%v) nor deleted: %v", s.o.Namespace, ar.Name, err, derr)
		}
		return store.Approval{}, fmt.Errorf("kube: recording ApprovalRequest %s/%s in the gateway's store: %w", s.o.Namespace, req.ID, err)
	}
	s.journal(ctx, store.ApprovalRecord{Run: req.Run, Request: ar.Name, Tool: req.Tool, Event: store.EventRequested,
		Reason: req.Reason, Once: "requested"})
	if s.recorder != nil {
		s.recorder.Eventf(ar, nil, corev1.EventTypeNormal, v1alpha1.EventApprovalRequested, "Hold", "%s", requestedNote(ar))
	}
	s.waitFor(ctx, ar.Name, "")
	return s.view(ar, stored), nil
}

// requestedNote is the note of the ApprovalRequested event: the tool, run and actor (as the
// controller's decision events begin), why the call is held, who may approve, until when, and
// how.
func requestedNote(ar *v1alpha1.ApprovalRequest) string {
	sp := ar.Spec
	who := "any user allowed to create Approvals here except " + sp.Actor
	if len(sp.Roles) > 0 {
		who = "members of " + strings.Join(sp.Roles, " or ")
	}
	note := fmt.Sprintf("%s (run %s, actor %s): held for approval", sp.Tool, sp.Run, sp.Actor)
	if sp.Reason != "" {
		note += " (" + sp.Reason + ")"
	}
	note += fmt.Sprintf("; needs %d approval(s) from %s", ptr.Deref(sp.Quorum, 1), who)
	if sp.ExpiresAt != nil {
		note += " until " + sp.ExpiresAt.UTC().Format(time.RFC3339)
	}
	note += " (kubectl apply an Approval, or reversi approve " + ar.Name + " --apply)"
	if len(note) > 1024 {
		note = note[:1021] + "..."
	}
	return note
}

// specDigest is v1alpha1.ApprovalRequestSpec.Digest, which the controller's decision
// signature covers too.
func specDigest(spec *v1alpha1.ApprovalRequestSpec) string { return spec.Digest() }

// unsigned says why ar's Approved phase is not the controller's decision ("" when it is, or
// the phase is not Approved): no signature, or one that does not verify with
// Options.ControllerKeys over this object and decision (approvalsig.Verify).
func (s *Store) unsigned(ar *v1alpha1.ApprovalRequest) string {
	if ar.Status.Phase != v1alpha1.ApprovalApproved {
		return ""
	}
	if err := approvalsig.Verify(ar, s.o.ControllerKeys); err != nil {
		return fmt.Sprintf("ApprovalRequest %s says Approved but that is not the controller's decision (%v): the call stays held", ar.Name, err)
	}
	return ""
}

// signedPhase is ar with an Approved phase the controller did not sign (unsigned) taken back
// to Pending (journaled once as ignored, with why); ar itself otherwise.
func (s *Store) signedPhase(ctx context.Context, ar *v1alpha1.ApprovalRequest, rec *store.Approval) *v1alpha1.ApprovalRequest {
	why := s.unsigned(ar)
	if why == "" {
		return ar
	}
	// once per object, whatever forged signatures follow (a status writer cannot flood the run)
	s.journal(ctx, store.ApprovalRecord{Run: rec.Run, Request: rec.ID, Tool: rec.Tool, Event: store.EventIgnored, Note: why,
		Once: "unsigned/" + string(ar.UID)})
	held := ar.DeepCopy()
	held.Status.Phase, held.Status.DecidedAt, held.Status.Decision = v1alpha1.ApprovalPending, nil, nil
	return held
}

// get reads a request from the informer cache, or from the API server when the cache has
// not seen it yet (just created by another replica).
func (s *Store) get(ctx context.Context, id string, ar *v1alpha1.ApprovalRequest) error {
	key := client.ObjectKey{Namespace: s.o.Namespace, Name: id}
	err := s.cache.Get(ctx, key, ar)
	if apierrors.IsNotFound(err) {
		err = s.client.Get(ctx, key, ar)
	}
	return err
}

// mismatch says why object ar is not the request rec this gateway recorded ("" when it is).
func (s *Store) mismatch(ar *v1alpha1.ApprovalRequest, rec *store.Approval) string {
	switch {
	case string(ar.UID) != rec.UID:
		return fmt.Sprintf("ApprovalRequest %s is not the object this gateway created (uid %s, recorded %s): it was replaced", ar.Name, ar.UID, rec.UID)
	case ar.Spec.Gateway != s.o.Gateway:
		return fmt.Sprintf("ApprovalRequest %s names the gateway %q, not %q", ar.Name, ar.Spec.Gateway, s.o.Gateway)
	case specDigest(&ar.Spec) != rec.SpecDigest:
		return fmt.Sprintf("the spec of ApprovalRequest %s is not the one this gateway created (digest %s, recorded %s): it was edited", ar.Name, specDigest(&ar.Spec), rec.SpecDigest)
	}
	return ""
}

// honoured returns request id as this gateway may use it: the inner store's record (which
// says what was created, and whether it was consumed) with the phase of the object, when the
// object is exactly as created. ok is false for a request that is not recorded, was kept by
// the store itself (not Kubernetes), whose object is gone, or whose object is not as created
// (journaled as ignored). Errors: the stores'.
func (s *Store) honoured(ctx context.Context, rec store.Approval) (store.Approval, bool, error) {
	if !rec.Kept() {
		return store.Approval{}, false, nil
	}
	var ar v1alpha1.ApprovalRequest
	if err := s.get(ctx, rec.ID, &ar); err != nil {
		if apierrors.IsNotFound(err) {
			return store.Approval{}, false, nil
		}
		return store.Approval{}, false, err
	}
	if why := s.mismatch(&ar, &rec); why != "" {
		s.journal(ctx, store.ApprovalRecord{Run: rec.Run, Request: rec.ID, Tool: rec.Tool, Event: store.EventIgnored, Note: why,
			Once: "ignored/" + string(ar.UID) + "/" + specDigest(&ar.Spec)})
		return store.Approval{}, false, nil
	}
	seen := s.signedPhase(ctx, &ar, &rec)
	if seen.Status.Phase == v1alpha1.ApprovalApproved {
		if ended := s.endedBefore(ctx, rec); ended != "" {
			// Denied or Expired once, it stays so: a status wiped and counted afresh (or a
			// request deleted and made again) must not approve it (issue 16 review).
			seen = seen.DeepCopy()
			seen.Status.Phase = map[store.ApprovalEvent]string{store.EventDenied: v1alpha1.ApprovalDenied, store.EventExpired: v1alpha1.ApprovalExpired}[ended]
		}
	}
	return s.view(seen, rec), true, nil
}

// endedBefore is the event (denied or expired) of a decision record of request rec in its
// run's ledger, "" when there is none: the phase this gateway saw the request end in before.
// A request found without one is remembered, so the ledger is read once per request.
func (s *Store) endedBefore(ctx context.Context, rec store.Approval) store.ApprovalEvent {
	s.mu.Lock()
	for _, ev := range []store.ApprovalEvent{store.EventDenied, store.EventExpired} {
		if s.journaled[rec.Run+"\x00"+rec.ID+"\x00"+string(ev)+"\x00phase/"+string(ev)] {
			s.mu.Unlock()
			return ev
		}
	}
	clean := s.notEnded[rec.ID]
	s.mu.Unlock()
	if clean {
		return ""
	}
	for after := int64(0); ; {
		recs, err := s.Store.Records(ctx, rec.Run, after, 1000)
		if err != nil {
			return store.EventDenied // cannot tell: fail closed
		}
		for _, r := range recs {
			after = r.Seq
			if r.Kind == store.KindApproval && r.Approval == rec.ID && (r.Event == store.EventDenied || r.Event == store.EventExpired) {
				return r.Event
			}
		}
		if len(recs) < 1000 {
			break
		}
	}
	s.mu.Lock()
	s.notEnded[rec.ID] = true
	s.mu.Unlock()
	return ""
}

// view is the object's state over the inner store's record: consumption and identity from the
// record, phase, decisions and expiry from the object.
func (s *Store) view(ar *v1alpha1.ApprovalRequest, rec store.Approval) store.Approval {
	a := toApproval(ar)
	a.Consumed, a.UID, a.SpecDigest = rec.Consumed, rec.UID, rec.SpecDigest
	a.ActorUID, a.ActorEmail = ar.Spec.ActorUID, ar.Spec.ActorEmail
	return a
}

// GetApproval returns one request this gateway honours (see honoured). Errors:
// store.ErrNotFound, also for an object this gateway did not create exactly so.
func (s *Store) GetApproval(ctx context.Context, id string) (store.Approval, error) {
	rec, err := s.Store.GetApproval(ctx, id)
	if err != nil {
		return store.Approval{}, err
	}
	a, ok, err := s.honoured(ctx, rec)
	if err != nil {
		return store.Approval{}, err
	}
	if !ok {
		return store.Approval{}, fmt.Errorf("%w: approval %s (no ApprovalRequest exactly as this gateway created it)", store.ErrNotFound, id)
	}
	return a, nil
}

// ListApprovals lists the requests this gateway honours (see honoured), oldest first. With
// f.Run, the objects of the run it did not create are journaled as ignored (inspect).
func (s *Store) ListApprovals(ctx context.Context, f store.ApprovalFilter) ([]store.Approval, error) {
	recs, err := s.Store.ListApprovals(ctx, store.ApprovalFilter{Run: f.Run})
	if err != nil {
		return nil, err
	}
	if f.Run != "" {
		var list v1alpha1.ApprovalRequestList
		if err := s.cache.List(ctx, &list, client.InNamespace(s.o.Namespace), client.MatchingFields{runIndex: f.Run}); err == nil {
			for i := range list.Items {
				s.inspect(ctx, &list.Items[i])
			}
		}
	}
	var out []store.Approval
	for _, rec := range recs {
		a, ok, err := s.honoured(ctx, rec)
		if err != nil {
			return nil, err
		}
		if !ok || (f.State != "" && a.State != f.State) {
			continue
		}
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
		out = append(out, a)
	}
	return out, nil
}

// Decide is refused: in Kubernetes mode a decision is an Approval object, so that the API
// server authenticates who made it.
func (s *Store) Decide(_ context.Context, id string, _ store.Decision) (store.Approval, error) {
	return store.Approval{}, fmt.Errorf("%w: approvals of this gateway are Kubernetes objects: create an Approval for %s in namespace %s (reversi approve %s -n %s --apply)",
		store.ErrNotAllowed, id, s.o.Namespace, id, s.o.Namespace)
}

// RecordIntent journals the intent in the inner store. With in.Approval, the request must be
// one this gateway honours and Approved (else store.ErrNotApproved), and the inner store
// consumes it in the intent's transaction (store.ErrConsumed for a replay); then the
// reversi.dev/consumedAt annotation is written, as a mirror only.
func (s *Store) RecordIntent(ctx context.Context, in store.Intent) (int64, error) {
	if in.Approval != "" {
		if err := s.approved(ctx, in.Approval); err != nil {
			return 0, err
		}
	}
	step, err := s.Store.RecordIntent(ctx, in)
	if err == nil && in.Approval != "" {
		s.mirrorConsumed(ctx, in.Approval)
	}
	return step, err
}

// AppendRollback appends a rollback record; with e.Approval, the compensation's request must
// be honoured and Approved, as for RecordIntent.
func (s *Store) AppendRollback(ctx context.Context, e store.RollbackEntry) (int64, error) {
	if e.Approval != "" {
		if err := s.approved(ctx, e.Approval); err != nil {
			return 0, err
		}
	}
	return s.Store.AppendRollback(ctx, e)
}

// approved checks that request id is honoured and its object Approved.
func (s *Store) approved(ctx context.Context, id string) error {
	a, err := s.GetApproval(ctx, id)
	if err != nil {
		return err
	}
	if a.State != store.ApprovalApproved {
		return fmt.Errorf("%w: %s is %s", store.ErrNotApproved, id, a.State)
	}
	return nil
}

// mirrorConsumed writes the consumedAt (and consumedBy) annotation of a consumed request, for
// people reading the object. It decides nothing (issue 16: "annotations are at most a
// mirror"), so a failure is only reported.
func (s *Store) mirrorConsumed(ctx context.Context, id string) {
	ann := map[string]any{v1alpha1.AnnotationConsumedAt: time.Now().UTC().Format(time.RFC3339Nano)}
	if s.o.Replica != "" {
		ann[v1alpha1.AnnotationConsumedBy] = s.o.Replica
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	ar := &v1alpha1.ApprovalRequest{ObjectMeta: metav1.ObjectMeta{Namespace: s.o.Namespace, Name: id}}
	if err := s.client.Patch(context.WithoutCancel(ctx), ar, client.RawPatch(types.MergePatchType, patch)); err != nil {
		s.warn("mirroring the consumption of ApprovalRequest %s/%s: %v", s.o.Namespace, id, err)
	}
}

// journal appends a decision record once per process and, through its Once key, once per
// run whatever the process (a restart, another replica).
func (s *Store) journal(ctx context.Context, r store.ApprovalRecord) {
	key := r.Run + "\x00" + r.Request + "\x00" + string(r.Event) + "\x00" + r.Once
	s.mu.Lock()
	done := r.Once != "" && s.journaled[key]
	s.mu.Unlock()
	if done {
		return
	}
	_, err := s.Store.AppendApproval(context.WithoutCancel(ctx), r)
	if err == nil {
		if fn := s.journaledTo.Load(); fn != nil {
			(*fn)(r.Run)
		}
	}
	switch {
	case err == nil, errors.Is(err, store.ErrExists):
		s.mu.Lock()
		s.journaled[key] = true
		s.mu.Unlock()
	case errors.Is(err, store.ErrNotFound): // not a run of this gateway's store
	default:
		s.warn("journal the %s record of ApprovalRequest %s/%s: %v", r.Event, s.o.Namespace, r.Request, err)
	}
}

// MaxIgnoredPerRun bounds, per run and process, the ignored records of requests this gateway
// did not create: others' objects must not push the run's own records out of its audit view.
// The first one over the bound is journaled as a note that says so; the rest are not.
const MaxIgnoredPerRun = 16

// overIgnoreLimit counts r (an ignored record of an object this gateway did not create) against
// MaxIgnoredPerRun and reports whether it is over the bound (then it is not to be journaled).
func (s *Store) overIgnoreLimit(r store.ApprovalRecord) bool {
	key := r.Run + "\x00" + r.Request + "\x00" + string(r.Event) + "\x00" + r.Once
	s.mu.Lock()
	if s.journaled[key] {
		s.mu.Unlock()
		return false // journaled already: journal is a no-op
	}
	n := s.ignoredIn[r.Run]
	if n <= MaxIgnoredPerRun {
		s.ignoredIn[r.Run] = n + 1
	}
	s.mu.Unlock()
	if n < MaxIgnoredPerRun {
		return false
	}
	if n == MaxIgnoredPerRun {
		s.journal(context.Background(), store.ApprovalRecord{Run: r.Run, Request: r.Request, Tool: r.Tool, Event: store.EventIgnored, Once: "ignored/limit",
			Note: fmt.Sprintf("more than %d ApprovalRequests this gateway did not create name run %s: the rest are not journaled (kubectl get apreq lists them)", MaxIgnoredPerRun, r.Run)})
	}
	return true
}

// journalWorker turns the informer's events into decision records (inspect).
func (s *Store) journalWorker(ctx context.Context) {
	defer s.wg.Done()
	for {
		name, shutdown := s.events.Get()
		if shutdown {
			return
		}
		var ar v1alpha1.ApprovalRequest
		if err := s.cache.Get(ctx, client.ObjectKey{Namespace: s.o.Namespace, Name: name}, &ar); err == nil {
			if again := s.inspect(ctx, &ar); again > 0 {
				s.events.AddAfter(name, again)
			}
		}
		s.events.Done(name)
	}
}

// inspect journals what object ar says to the run it names, once each: for a request this
// gateway recorded and that is exactly as created, its counted and rejected Approvals and its
// phase changes; for an object that is not (a copy, an edit, another gateway's request for a
// run of this gateway), an ignored record. An unrecorded object created by this gateway's own
// identity gets IgnoreGrace to be recorded first (a replica between its create and its
// record): inspect then returns how long to wait before looking again.
func (s *Store) inspect(ctx context.Context, ar *v1alpha1.ApprovalRequest) (again time.Duration) {
	run := ar.Spec.Run
	rec, err := s.Store.GetApproval(ctx, ar.Name)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !rec.Kept()) {
		if _, err := s.Store.GetRun(ctx, run); err != nil {
			return 0 // not a run of this gateway: none of its business
		}
		s.mu.Lock()
		mine := s.creating[ar.Name]
		s.mu.Unlock()
		if mine {
			return creatingRecheck // this process is recording it now
		}
		by := ar.Annotations[v1alpha1.AnnotationCreatedBy]
		if by == "" || by == s.o.Identity {
			if wait := IgnoreGrace - time.Since(ar.CreationTimestamp.Time); wait > 0 {
				return wait
			}
		}
		why := fmt.Sprintf("ApprovalRequest %s names run %s but this gateway did not create it", ar.Name, run)
		if by != "" {
			why += " (created by " + by + ")"
		}
		r := store.ApprovalRecord{Run: run, Request: ar.Name, Tool: ar.Spec.Tool, Event: store.EventIgnored, Note: why,
			Once: "ignored/" + string(ar.UID) + "/" + specDigest(&ar.Spec)}
		if s.overIgnoreLimit(r) {
			return 0
		}
		s.journal(ctx, r)
		return 0
	}
	if err != nil {
		return 0
	}
	if why := s.mismatch(ar, &rec); why != "" {
		s.journal(ctx, store.ApprovalRecord{Run: rec.Run, Request: rec.ID, Tool: rec.Tool, Event: store.EventIgnored, Note: why,
			Once: "ignored/" + string(ar.UID) + "/" + specDigest(&ar.Spec)})
		return 0
	}
	for _, c := range ar.Status.Approvals {
		s.journal(ctx, store.ApprovalRecord{Run: rec.Run, Request: rec.ID, Tool: rec.Tool, Event: store.EventCounted, Approver: c.Username,
			Groups: c.Groups, Decision: c.Decision, Reason: truncate(c.Reason, 512), Once: "counted/" + c.Name})
	}
	for _, r := range ar.Status.Rejected {
		s.journal(ctx, store.ApprovalRecord{Run: rec.Run, Request: rec.ID, Tool: rec.Tool, Event: store.EventRejected, Approver: r.Username,
			Groups: r.Groups, Decision: r.Decision, Reason: truncate(r.Reason, 512), Note: r.Message, Once: "rejected/" + r.Name})
	}
	if ar.Status.EscalatedAt != nil {
		s.journal(ctx, store.ApprovalRecord{Run: rec.Run, Request: rec.ID, Tool: rec.Tool, Event: store.EventEscalated,
			Note: ar.Status.Message, Once: "phase/escalated"})
	}
	ev := map[string]store.ApprovalEvent{v1alpha1.ApprovalApproved: store.EventApproved, v1alpha1.ApprovalDenied: store.EventDenied,
		v1alpha1.ApprovalExpired: store.EventExpired}[s.signedPhase(ctx, ar, &rec).Status.Phase]
	if ev != "" {
		s.journal(ctx, store.ApprovalRecord{Run: rec.Run, Request: rec.ID, Tool: rec.Tool, Event: ev, Note: ar.Status.Message,
			Once: "phase/" + string(ev)})
	}
	return 0
}

// toApproval is an ApprovalRequest as the store's Approval.
func toApproval(ar *v1alpha1.ApprovalRequest) store.Approval {
	a := store.Approval{ApprovalRequest: store.ApprovalRequest{ID: ar.Name, Tool: ar.Spec.Tool, ArgsDigest: ar.Spec.ArgumentsDigest,
		Run: ar.Spec.Run, Actor: ar.Spec.Actor, Roles: slices.Clone(ar.Spec.Roles), Quorum: 1, Created: ar.CreationTimestamp.UTC(),
		OnTimeout: ar.Spec.OnTimeout, EscalateTo: slices.Clone(ar.Spec.EscalateTo), Reason: ar.Spec.Reason, ArgsPreview: ar.Spec.ArgumentsPreview},
		State: store.ApprovalPending}
	if ar.Spec.Quorum != nil {
		a.Quorum = int(*ar.Spec.Quorum)
	}
	if ar.Spec.ExpiresAt != nil {
		a.Expires = ar.Spec.ExpiresAt.UTC()
	}
	switch ar.Status.Phase {
	case v1alpha1.ApprovalApproved:
		a.State = store.ApprovalApproved
	case v1alpha1.ApprovalDenied:
		a.State = store.ApprovalDenied
	case v1alpha1.ApprovalExpired:
		a.State = store.ApprovalExpired
	}
	if ar.Status.EscalatedAt != nil {
		a.Escalated, a.Roles = true, slices.Clone(ar.Spec.EscalateTo)
	}
	if ar.Status.DecidedAt != nil {
		a.Decided = ar.Status.DecidedAt.UTC()
	}
	for _, c := range ar.Status.Approvals {
		a.Decisions = append(a.Decisions, store.Decision{By: c.Username, Roles: slices.Clone(c.Groups), Approve: c.Decision == v1alpha1.DecisionApprove,
			Comment: c.Reason, At: c.CountedAt.UTC()})
	}
	return a // Consumed: the inner store's (view), never the annotation
}
