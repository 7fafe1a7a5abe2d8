package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/rollback"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// This file mirrors the gateway's runs as ReversiRun objects (DESIGN.md "ReversiRun", issue 8):
// a store.Store decorator that creates a ReversiRun when a run opens and writes its bounded
// status (phase, counts per outcome, pending approvals, the last 50 steps) in batches: a
// change marks the run dirty, and a work queue writes it at most once per Interval per run,
// coalescing every change in between, with a final write when the run goes idle or closed and
// on Close. The status is folded from the inner store's ledger (read incrementally), which
// keeps the full ledger. Writes are updates with the resourceVersion read (optimistic
// concurrency), retried on conflict. Decision records (store.KindApproval) are steps too, with
// outcome "approval" and RunStep.Approval (issue 16).
//
// Run ids belong to one gateway (issue 16, "Runs belong to a gateway"): a run opened with a
// client-chosen id claims its name by creating the ReversiRun before the run opens (CreateRun),
// and a ReversiRun of another gateway (spec.gateway, or a reversi.dev/created-by annotation
// that is not this gateway's identity) is refused with store.OtherGatewayError. The mirror never
// writes the status of, and never executes the rollback of, a ReversiRun that is not its own.

// DefaultStatusInterval is the least time between two status writes of one run.
const DefaultStatusInterval = time.Second

// RunsOptions configure NewRuns.
type RunsOptions struct {
	// Config reaches the API server. Required.
	Config *rest.Config
	// Namespace holds the ReversiRuns (the gateway's namespace). Required.
	Namespace string
	// Gateway is spec.gateway of the runs (the ReversiGateway's name). Required.
	Gateway string
	// Replica names this gateway process in status.rollback.replica (e.g. the pod name).
	// Replicas that share a namespace must have distinct names. Required.
	Replica string
	// Interval is the least time between two status writes of one run (default 1 s).
	Interval time.Duration
	// SyncTimeout bounds the wait for the first list of ReversiRuns (default 30 s).
	SyncTimeout time.Duration
	// Stderr receives the problems of writes that are retried later (default: discarded).
	Stderr io.Writer
	// Identity is the username this gateway authenticates as (see Options.Identity); empty:
	// NewRuns asks the API server (SelfSubjectReview) and fails when it cannot.
	Identity string
}

// Rollbacker executes a run's rollback; *proxy.Gateway is one (ExecuteRollback).
type Rollbacker interface {
	ExecuteRollback(ctx context.Context, run string, o rollback.Options) (rollback.Result, error)
}

// Runs is a store.Store whose runs are mirrored as ReversiRun objects and whose runs roll back
// when an operator sets spec.rollback (once Attach names the Rollbacker). Every method is the
// inner store's; the writes that change a run also mark it for the next status write. Safe for
// concurrent use.
type Runs struct {
	store.Store
	o      RunsOptions
	client client.Client
	cache  cache.Cache
	ctx    context.Context // ends with Close
	stop   context.CancelFunc
	wg     sync.WaitGroup

	flushQ    workqueue.TypedDelayingInterface[string] // runs whose status is due
	rollbackQ workqueue.TypedDelayingInterface[string] // runs whose spec.rollback changed
	rb        atomic.Pointer[Rollbacker]

	mu        sync.Mutex
	runs      map[string]*runState
	executing map[string]bool // rollbacks running in this process
	foreign   map[string]bool // runs whose ReversiRun is another gateway's (warned once)
	closed    bool
}

// runState is what the mirror knows of one run: the status folded from its ledger so far.
// Only the flush of the run (one at a time per run: the work queue's guarantee) touches the
// folded fields; mu guards the rest.
type runState struct {
	// guarded by Runs.mu
	dirty     bool
	final     bool // the run went idle or closed: forget it after the next write
	lastWrite time.Time

	// the fold, touched by the run's flush only
	lastSeq   int64
	intents   map[int64]store.Record // intents without an outcome yet
	steps     []v1alpha1.RunStep     // the last MaxRunSteps completed steps, by Seq
	counts    v1alpha1.RunCounts
	stepCount int64
	last      time.Time
}

// NewRuns starts an informer on the namespace's ReversiRuns, waits until it has listed them,
// and returns the decorator of inner. Close writes what is pending, stops it and closes inner.
// Errors: a missing option, a client that cannot be built, or an informer that does not sync
// in time (no access: grant get, list, watch, create, update on reversiruns and update on
// reversiruns/status).
func NewRuns(ctx context.Context, inner store.Store, o RunsOptions) (*Runs, error) {
	if o.Config == nil || o.Namespace == "" || o.Gateway == "" || o.Replica == "" {
		return nil, errors.New("kube: Config, Namespace, Gateway and Replica are required to mirror runs")
	}
	if o.Interval <= 0 {
		o.Interval = DefaultStatusInterval
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
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	m := &Runs{Store: inner, o: o, client: c, cache: ca, ctx: runCtx, stop: stop,
		flushQ:    workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Name: "reversiruns-status"}),
		rollbackQ: workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[string]{Name: "reversiruns-rollback"}),
		runs:      map[string]*runState{}, executing: map[string]bool{}, foreign: map[string]bool{}}
	inf, err := ca.GetInformer(ctx, &v1alpha1.ReversiRun{})
	if err != nil {
		stop()
		return nil, fmt.Errorf("kube: the ReversiRun informer: %w", err)
	}
	if j, ok := inner.(interface{ OnJournal(func(string)) }); ok {
		j.OnJournal(func(run string) { m.touch(run, false) }) // decisions journaled from the ApprovalRequest informer
	}
	enqueue := func(obj any) {
		if r, ok := obj.(*v1alpha1.ReversiRun); ok && r.Spec.Rollback != nil {
			m.rollbackQ.Add(r.Name)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) },
	}); err != nil {
		stop()
		return nil, err
	}
	if err := startCache(ctx, runCtx, stop, ca, o.SyncTimeout, "ReversiRuns", o.Namespace,
		"get, list, watch, create, update on reversiruns.reversi.dev; update on reversiruns/status"); err != nil {
		return nil, err
	}
	for range 2 {
		m.wg.Add(2)
		go m.worker(m.flushQ, m.flush)
		go m.worker(m.rollbackQ, m.reconcileRollback)
	}
	return m, nil
}

// Attach names what executes rollbacks (the gateway built on this store) and starts acting on
// spec.rollback, including the requests made before Attach.
func (m *Runs) Attach(rb Rollbacker) {
	m.rb.Store(&rb)
	var list v1alpha1.ReversiRunList
	if err := m.cache.List(m.ctx, &list, client.InNamespace(m.o.Namespace)); err == nil {
		for _, r := range list.Items {
			if r.Spec.Rollback != nil {
				m.rollbackQ.Add(r.Name)
			}
		}
	}
}

// Close writes the last status of every run it has not written as idle yet (without waiting
// for the interval: the gateway is stopping, so the runs are Idle), stops the informer and the queues, and closes inner.
// A rollback running in this process is interrupted; it stays Running with this replica's name
// and resumes when a replica of the same name starts again.
func (m *Runs) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return m.Store.Close()
	}
	m.closed = true
	var open []string // runs written Active, or with unwritten changes
	for id := range m.runs {
		open = append(open, id)
	}
	m.mu.Unlock()
	m.flushQ.ShutDownWithDrain()
	m.rollbackQ.ShutDown()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, id := range open {
		if err := m.write(ctx, id, true); err != nil {
			m.warn("the last status of ReversiRun %s/%s was not written: %v", m.o.Namespace, id, err)
		}
	}
	m.stop()
	m.wg.Wait()
	return m.Store.Close()
}

func (m *Runs) warn(format string, args ...any) {
	fmt.Fprintf(m.o.Stderr, "reversi-gateway: "+format+"\n", args...)
}

func (m *Runs) worker(q workqueue.TypedDelayingInterface[string], do func(string)) {
	defer m.wg.Done()
	for {
		id, shutdown := q.Get()
		if shutdown {
			return
		}
		do(id)
		q.Done(id)
	}
}

// touch marks run id for a status write: now when the last write is Interval old, otherwise
// when it will be. final: the run went idle or closed.
func (m *Runs) touch(id string, final bool) {
	if id == store.GatewayJournal {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	st := m.runs[id]
	if st == nil {
		st = &runState{intents: map[int64]store.Record{}}
		m.runs[id] = st
	}
	st.dirty = true
	st.final = final
	if wait := time.Until(st.lastWrite.Add(m.o.Interval)); wait > 0 {
		m.flushQ.AddAfter(id, wait)
		return
	}
	m.flushQ.Add(id)
}

// flush is the work queue's handler: it writes run id's status unless the last write is less
// than Interval old (then it comes back when it is due), so changes coalesce.
func (m *Runs) flush(id string) {
	m.mu.Lock()
	st := m.runs[id]
	if st == nil || !st.dirty {
		m.mu.Unlock()
		return
	}
	if wait := time.Until(st.lastWrite.Add(m.o.Interval)); wait > 0 {
		m.mu.Unlock()
		m.flushQ.AddAfter(id, wait)
		return
	}
	st.dirty = false
	st.lastWrite = time.Now()
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(m.ctx, 30*time.Second)
	defer cancel()
	if err := m.write(ctx, id, false); err != nil {
		if m.ctx.Err() == nil {
			m.warn("writing the status of ReversiRun %s/%s (retried): %v", m.o.Namespace, id, err)
		}
		m.touch(id, st.final)
		return
	}
	m.mu.Lock()
	if st.final && !st.dirty && !m.closed {
		delete(m.runs, id) // idle: rebuilt from the ledger if the run is continued
	}
	m.mu.Unlock()
}

// fold reads the run's ledger records after the last one folded into st.
func (m *Runs) fold(ctx context.Context, id string, st *runState) error {
	for {
		recs, err := m.Store.Records(ctx, id, st.lastSeq, 1000)
		if err != nil {
			return err
		}
		for _, r := range recs {
			st.lastSeq = r.Seq
			switch r.Kind {
			case store.KindIntent:
				st.intents[r.Seq] = r
				st.stepCount++
				st.last = r.Time
			case store.KindOutcome:
				in, ok := st.intents[r.Step]
				if !ok {
					continue
				}
				delete(st.intents, r.Step)
				step := v1alpha1.RunStep{Seq: r.Step, Tool: in.Tool, Outcome: string(r.Status), At: metav1.NewTime(r.Time.Truncate(time.Second)),
					Message: truncate(r.Note, 512)}
				if in.Decision == "needs_approval" && r.Status == store.Blocked {
					step.Outcome = "pending_approval"
					if m := approvalRef.FindStringSubmatch(r.Note); m != nil {
						step.ApprovalRequest = m[1]
					}
				}
				count(&st.counts, step.Outcome)
				st.steps = insertStep(st.steps, step)
				st.last = r.Time
			case store.KindApproval:
				st.steps = insertStep(st.steps, decisionStep(r))
				st.last = r.Time
			}
		}
		if len(recs) < 1000 {
			return nil
		}
	}
}

// decisionStep is a decision record as a step of the ReversiRun (outcome "approval"): Seq is
// the record's own, Message what the record says (why it was rejected or ignored).
func decisionStep(r store.Record) v1alpha1.RunStep {
	tool := r.Tool
	if tool == "" {
		tool = "-"
	}
	step := v1alpha1.RunStep{Seq: r.Seq, Tool: truncate(tool, 128), Outcome: "approval", At: metav1.NewTime(r.Time.Truncate(time.Second)),
		ApprovalRequest: truncate(r.Approval, 253), Message: truncate(r.Note, 512),
		Approval: &v1alpha1.StepApproval{Event: string(r.Event), Approver: truncate(r.Approver, 253), Decision: r.Decision,
			Reason: truncate(r.Reason, 512)}}
	if len(r.Groups) > 0 {
		step.Approval.Groups = slices.Clone(r.Groups[:min(len(r.Groups), 64)])
	}
	return step
}

// approvalRef finds the request named by a pending approval's text (engine.PendingApprovalText).
var approvalRef = regexp.MustCompile(`requires approval: request (\S+) is waiting`)

func count(c *v1alpha1.RunCounts, outcome string) {
	switch outcome {
	case string(store.Succeeded):
		c.Succeeded++
	case string(store.Failed):
		c.Failed++
	case string(store.Uncertain):
		c.Uncertain++
	case string(store.Blocked):
		c.Blocked++
	case string(store.WouldBlock):
		c.WouldBlock++
	case "pending_approval":
		c.PendingApproval++
	}
}

// insertStep adds s in Seq order (outcomes of concurrent calls arrive out of order) and keeps
// the last MaxRunSteps.
func insertStep(steps []v1alpha1.RunStep, s v1alpha1.RunStep) []v1alpha1.RunStep {
	i, _ := slices.BinarySearchFunc(steps, s.Seq, func(a v1alpha1.RunStep, seq int64) int { return int(a.Seq - seq) })
	steps = slices.Insert(steps, i, s)
	if len(steps) > v1alpha1.MaxRunSteps {
		steps = slices.Delete(steps, 0, len(steps)-v1alpha1.MaxRunSteps)
	}
	return steps
}

// truncate cuts s to n characters (the CRD's maxLength counts characters, not bytes).
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// write folds the run's new ledger records and writes its status: it creates the ReversiRun
// when there is none yet, then updates the status with the resourceVersion it read, reading
// again from the API server on a conflict. stopping: the gateway is closing, so no session of
// its is attached any more (Idle), whether or not the store has been told yet.
func (m *Runs) write(ctx context.Context, id string, stopping bool) error {
	m.mu.Lock()
	st := m.runs[id]
	m.mu.Unlock()
	if st == nil {
		return nil
	}
	run, err := m.Store.GetRun(ctx, id)
	if err != nil {
		return err
	}
	if err := m.fold(ctx, id, st); err != nil {
		return err
	}
	pending, err := m.Store.ListApprovals(ctx, store.ApprovalFilter{Run: id, State: store.ApprovalPending, Limit: v1alpha1.MaxPendingApprovals})
	if err != nil {
		return err
	}
	var names []string
	for _, a := range pending {
		names = append(names, a.ID)
	}
	fresh := false
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		obj, err := m.object(ctx, run, fresh)
		fresh = true
		if errors.Is(err, store.ErrOtherGateway) {
			m.mu.Lock()
			warned := m.foreign[run.ID]
			m.foreign[run.ID] = true
			m.mu.Unlock()
			if !warned {
				m.warn("not writing the status of ReversiRun %s/%s: %v", m.o.Namespace, run.ID, err)
			}
			return nil // never another gateway's status
		}
		if err != nil {
			return err
		}
		next := obj.DeepCopy()
		s := &next.Status
		s.StartedAt = ptrTime(run.Started)
		if !st.last.IsZero() {
			s.LastActivityAt = ptrTime(st.last)
		} else {
			s.LastActivityAt = ptrTime(run.LastActivity)
		}
		s.StepCount, s.Counts, s.PendingApprovals = st.stepCount, st.counts, names
		s.Steps = slices.Clone(st.steps)
		status := run.Status
		if stopping {
			status = store.RunIdle
		}
		runPhase(next, status)
		if equality.Semantic.DeepEqual(obj.Status, next.Status) {
			return nil
		}
		return m.client.Status().Update(ctx, next)
	})
}

func ptrTime(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	mt := metav1.NewTime(t.Truncate(time.Second))
	return &mt
}

// object reads run's ReversiRun (from the cache, or the API server when fresh or when the
// cache has not seen it), creating it when it does not exist. Errors: store.OtherGatewayError
// when the object is another gateway's (ours).
func (m *Runs) object(ctx context.Context, run store.Run, fresh bool) (*v1alpha1.ReversiRun, error) {
	key := client.ObjectKey{Namespace: m.o.Namespace, Name: run.ID}
	obj := &v1alpha1.ReversiRun{}
	var err error
	if !fresh {
		err = m.cache.Get(ctx, key, obj)
	}
	if fresh || apierrors.IsNotFound(err) {
		err = m.client.Get(ctx, key, obj)
	}
	if err == nil && !m.ours(obj) {
		return nil, store.OtherGatewayError(run.ID)
	}
	if !apierrors.IsNotFound(err) {
		return obj, err
	}
	return m.claim(ctx, run.ID, run.Actor)
}

// claim creates the ReversiRun of run id now, or finds it; it returns store.OtherGatewayError
// when a ReversiRun of that name is another gateway's (see ours).
func (m *Runs) claim(ctx context.Context, id, actor string) (*v1alpha1.ReversiRun, error) {
	obj := &v1alpha1.ReversiRun{ObjectMeta: metav1.ObjectMeta{Namespace: m.o.Namespace, Name: id,
		Labels: map[string]string{"reversi.dev/gateway": m.o.Gateway}},
		Spec: v1alpha1.ReversiRunSpec{Actor: actor, Gateway: m.o.Gateway}}
	err := m.client.Create(ctx, obj)
	if apierrors.IsAlreadyExists(err) {
		if err := m.client.Get(ctx, client.ObjectKey{Namespace: m.o.Namespace, Name: id}, obj); err != nil {
			return nil, fmt.Errorf("reading ReversiRun %s/%s: %w", m.o.Namespace, id, err)
		}
		if !m.ours(obj) {
			return nil, store.OtherGatewayError(id)
		}
		return obj, nil
	}
	if err != nil {
		return nil, fmt.Errorf("creating ReversiRun %s/%s: %w", m.o.Namespace, id, err)
	}
	return obj, nil
}

// ours reports whether ReversiRun r is this gateway's: spec.gateway names it and, when the
// admission webhook stamped reversi.dev/created-by, this gateway's identity created it.
func (m *Runs) ours(r *v1alpha1.ReversiRun) bool {
	if r.Spec.Gateway != m.o.Gateway {
		return false
	}
	by, stamped := r.Annotations[v1alpha1.AnnotationCreatedBy]
	return !stamped || by == m.o.Identity
}

// runPhase sets status.phase and the kstatus conditions: a rollback's phase wins over the
// session's (Active while a session is attached, Idle otherwise).
func runPhase(r *v1alpha1.ReversiRun, status store.RunStatus) {
	s := &r.Status
	s.Phase = v1alpha1.RunIdle
	if status == store.RunActive {
		s.Phase = v1alpha1.RunActive
	}
	if rb := s.Rollback; rb != nil && !rb.DryRun {
		switch rb.Phase {
		case v1alpha1.RollbackPending, v1alpha1.RollbackRunning:
			s.Phase = v1alpha1.RunRollingBack
		case v1alpha1.RollbackSucceeded:
			s.Phase = v1alpha1.RunRolledBack
		case v1alpha1.RollbackPartiallySucceeded, v1alpha1.RollbackFailed:
			s.Phase = v1alpha1.RunPartiallyRolledBack
		}
	}
	gen := r.Generation
	if s.Phase == v1alpha1.RunRollingBack {
		meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: "Reconciling", Status: metav1.ConditionTrue, Reason: "RollingBack",
			Message: "the gateway replica " + s.Rollback.Replica + " is running the compensations", ObservedGeneration: gen})
	} else {
		meta.RemoveStatusCondition(&s.Conditions, "Reconciling")
	}
	ready := metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue, Reason: s.Phase, ObservedGeneration: gen}
	switch s.Phase {
	case v1alpha1.RunActive:
		ready.Message = "a session is attached to the run"
	case v1alpha1.RunIdle:
		ready.Message = "no session is attached; set spec.rollback to undo the run"
	case v1alpha1.RunRollingBack:
		ready.Status, ready.Message = metav1.ConditionFalse, "rolling back"
	case v1alpha1.RunRolledBack:
		ready.Message = "every step is undone or had nothing to undo"
	case v1alpha1.RunPartiallyRolledBack:
		ready.Status, ready.Reason = metav1.ConditionFalse, "RollbackIncomplete"
		ready.Message = "some steps are not undone: see status.rollback.steps; fix the cause and set spec.rollback.approveCompensations or run reversi rollback again"
	}
	meta.SetStatusCondition(&s.Conditions, ready)
}

// The store methods that change a run mark it for the next status write.

// CreateRun opens the run in the inner store and has its ReversiRun created at once. A run
// with a chosen id (r.ID) first claims the name: the ReversiRun is created (or found to be
// this gateway's) before the run opens. Errors: store.OtherGatewayError (the ReversiRun is
// another gateway's: nothing is opened), the API server's, the inner store's.
func (m *Runs) CreateRun(ctx context.Context, r store.Run) (store.Run, error) {
	if r.ID != "" {
		if _, err := m.claim(ctx, r.ID, r.Actor); err != nil {
			return store.Run{}, err
		}
	}
	run, err := m.Store.CreateRun(ctx, r)
	if err == nil {
		m.touch(run.ID, false)
	}
	return run, err
}

// ContinueRun re-attaches a session (phase Active).
func (m *Runs) ContinueRun(ctx context.Context, id, actor string) (store.Run, error) {
	run, err := m.Store.ContinueRun(ctx, id, actor)
	if err == nil {
		m.touch(id, false)
	}
	return run, err
}

// SetRunStatus changes the run's status; idle and closed runs get a final status write.
func (m *Runs) SetRunStatus(ctx context.Context, id string, status store.RunStatus) error {
	err := m.Store.SetRunStatus(ctx, id, status)
	if err == nil {
		m.touch(id, status != store.RunActive)
	}
	return err
}

// RecordIntent journals an intent (a new step).
func (m *Runs) RecordIntent(ctx context.Context, in store.Intent) (int64, error) {
	step, err := m.Store.RecordIntent(ctx, in)
	if err == nil {
		m.touch(in.Run, false)
	}
	return step, err
}

// AppendApproval journals a decision record (a step of the ReversiRun).
func (m *Runs) AppendApproval(ctx context.Context, r store.ApprovalRecord) (int64, error) {
	seq, err := m.Store.AppendApproval(ctx, r)
	if err == nil {
		m.touch(r.Run, false)
	}
	return seq, err
}

// QueueOutcome journals a step's outcome without waiting for its commit (store.Store); the
// ReversiRun is touched once it is committed.
func (m *Runs) QueueOutcome(ctx context.Context, run string, step int64, o store.StepOutcome, done func(seq int64, err error)) {
	m.Store.QueueOutcome(ctx, run, step, o, func(seq int64, err error) {
		if err == nil {
			m.touch(run, false)
		}
		if done != nil {
			done(seq, err)
		}
	})
}

// RecordOutcome journals a step's outcome.
func (m *Runs) RecordOutcome(ctx context.Context, run string, step int64, o store.StepOutcome) (int64, error) {
	seq, err := m.Store.RecordOutcome(ctx, run, step, o)
	if err == nil {
		m.touch(run, false)
	}
	return seq, err
}
