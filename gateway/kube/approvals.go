// Package kube keeps the gateway's approval queue in the Kubernetes API server: a store.Store
// decorator whose approval methods work on ApprovalRequest objects (reversi.dev/v1alpha1)
// while runs, the ledger and keys stay in the inner store. A call that needs approval creates
// an ApprovalRequest named by the approval id; approvers answer with Approval objects
// (`kubectl apply`, `reversi approve`); the controller decides and sets the phase; the gateway
// reads the phase from an informer cache (a watch, no polling) and consumes an approval once,
// by writing an annotation with optimistic concurrency.
//
// Source: DESIGN.md "ApprovalRequest" ("The controller decides; the gateway only reads the
// phase"), issue 8 (gateway side). It does not import controllers.
package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/store"
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

	mu   sync.Mutex
	seen chan struct{} // closed and replaced whenever the informer sees a change
}

// New starts an informer on the namespace's ApprovalRequests, waits until it has listed them,
// and returns the decorator. Close stops the informer and closes inner. Errors: a missing
// option, a client that cannot be built, or an informer that does not sync in time (no access
// to approvalrequests: grant get, list, watch, create, patch).
func New(ctx context.Context, inner store.Store, o Options) (*Store, error) {
	if o.Config == nil || o.Namespace == "" || o.Gateway == "" {
		return nil, errors.New("kube: Config, Namespace and Gateway are required")
	}
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = 30 * time.Second
	}
	scheme := v1alpha1.NewScheme()
	c, err := client.New(o.Config, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("kube: a client for the API server: %w", err)
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
	s := &Store{Store: inner, o: o, client: c, cache: ca, seen: make(chan struct{})}
	inf, err := ca.GetInformer(ctx, &v1alpha1.ApprovalRequest{})
	if err != nil {
		return nil, fmt.Errorf("kube: the ApprovalRequest informer: %w", err)
	}
	notify := func(any) { s.changed() }
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: notify, UpdateFunc: func(_, n any) { s.changed() }, DeleteFunc: notify,
	}); err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stop = stop
	if err := startCache(ctx, runCtx, stop, ca, o.SyncTimeout, "ApprovalRequests", o.Namespace,
		"get, list, watch, create, patch on approvalrequests.reversi.dev"); err != nil {
		return nil, err
	}
	return s, nil
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
	return s.Store.Close()
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "apr-" + hex.EncodeToString(b[:])
}

// CreateApproval creates the ApprovalRequest named req.ID ("apr-<hex>" when empty) and
// returns it once the informer has seen it. Errors: store.ErrInvalid (as the store's, plus
// what the API server's schema refuses, e.g. a quorum above 1 without roles), store.ErrExists.
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
			Run: req.Run, Actor: req.Actor, Gateway: s.o.Gateway, Reason: req.Reason, Roles: req.Roles,
			Quorum: ptr.To(int32(req.Quorum)), OnTimeout: req.OnTimeout, EscalateTo: req.EscalateTo},
	}
	if !req.Expires.IsZero() {
		ar.Spec.ExpiresAt = &metav1.Time{Time: req.Expires}
	}
	if err := s.client.Create(ctx, ar); err != nil {
		switch {
		case apierrors.IsAlreadyExists(err):
			return store.Approval{}, fmt.Errorf("%w: approval %s", store.ErrExists, req.ID)
		case apierrors.IsInvalid(err):
			return store.Approval{}, fmt.Errorf("%w: %v", store.ErrInvalid, err)
		}
		return store.Approval{}, fmt.Errorf("kube: creating ApprovalRequest %s/%s: %w", s.o.Namespace, req.ID, err)
	}
	s.waitFor(ctx, ar.Name, "")
	return toApproval(ar), nil
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

// GetApproval reads one request from the informer cache. Errors: store.ErrNotFound.
func (s *Store) GetApproval(ctx context.Context, id string) (store.Approval, error) {
	var ar v1alpha1.ApprovalRequest
	if err := s.get(ctx, id, &ar); err != nil {
		if apierrors.IsNotFound(err) {
			return store.Approval{}, fmt.Errorf("%w: approval %s", store.ErrNotFound, id)
		}
		return store.Approval{}, err
	}
	return toApproval(&ar), nil
}

// ListApprovals lists requests from the informer cache, oldest first.
func (s *Store) ListApprovals(ctx context.Context, f store.ApprovalFilter) ([]store.Approval, error) {
	var list v1alpha1.ApprovalRequestList
	opts := []client.ListOption{client.InNamespace(s.o.Namespace)}
	if f.Run != "" {
		opts = append(opts, client.MatchingFields{runIndex: f.Run})
	}
	if err := s.cache.List(ctx, &list, opts...); err != nil {
		return nil, err
	}
	slices.SortFunc(list.Items, func(a, b v1alpha1.ApprovalRequest) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	var out []store.Approval
	for i := range list.Items {
		a := toApproval(&list.Items[i])
		if (f.Run != "" && a.Run != f.Run) || (f.State != "" && a.State != f.State) {
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

// Consume lets the approved call's retry through once: it sets the reversi.dev/consumedAt
// annotation with the resourceVersion it read (optimistic concurrency), so of two gateways
// racing exactly one succeeds; on a conflict it reads the request again from the API server.
// Errors: store.ErrNotFound, store.ErrMismatch, store.ErrNotApproved, store.ErrConsumed.
func (s *Store) Consume(ctx context.Context, id, run, tool, argsDigest string) error {
	ar := &v1alpha1.ApprovalRequest{}
	fresh := false
	for attempt := 0; ; attempt++ {
		var err error
		if fresh {
			err = s.client.Get(ctx, client.ObjectKey{Namespace: s.o.Namespace, Name: id}, ar)
		} else {
			err = s.get(ctx, id, ar)
		}
		if err != nil {
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("%w: approval %s", store.ErrNotFound, id)
			}
			return err
		}
		a := toApproval(ar)
		switch {
		case a.Run != run || a.Tool != tool || a.ArgsDigest != argsDigest:
			return fmt.Errorf("%w: %s is for %s in run %s", store.ErrMismatch, id, a.Tool, a.Run)
		case a.State != store.ApprovalApproved:
			return fmt.Errorf("%w: %s is %s", store.ErrNotApproved, id, a.State)
		case !a.Consumed.IsZero():
			return fmt.Errorf("%w: %s at %s", store.ErrConsumed, id, a.Consumed.Format(time.RFC3339))
		}
		base := ar.DeepCopy()
		if ar.Annotations == nil {
			ar.Annotations = map[string]string{}
		}
		ar.Annotations[v1alpha1.AnnotationConsumedAt] = time.Now().UTC().Format(time.RFC3339Nano)
		if s.o.Replica != "" {
			ar.Annotations[v1alpha1.AnnotationConsumedBy] = s.o.Replica
		}
		err = s.client.Patch(ctx, ar, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		if err == nil {
			s.waitFor(ctx, id, base.ResourceVersion)
			return nil
		}
		if !apierrors.IsConflict(err) || attempt >= 4 {
			return fmt.Errorf("kube: consuming approval %s: %w", id, err)
		}
		fresh = true // the cache was behind: read the latest from the API server
	}
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
		a.Decisions = append(a.Decisions, store.Decision{By: c.Username, Approve: c.Decision == v1alpha1.DecisionApprove, At: c.CountedAt.UTC()})
	}
	if t, err := time.Parse(time.RFC3339Nano, ar.Annotations[v1alpha1.AnnotationConsumedAt]); err == nil {
		a.Consumed = t
	} else if ar.Annotations[v1alpha1.AnnotationConsumedAt] != "" {
		a.Consumed = ar.CreationTimestamp.UTC() // unreadable but present: used, fail closed
	}
	return a
}
