package kube

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/rollback"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// This file makes spec.rollback a status transition (issue 8, "Rollback as a status
// transition"): a replica that sees a confirmed rollback for a new generation sets
// status.rollback.phase Pending, then claims it (Pending → Running with its replica name) in an
// update carrying the resourceVersion it read, so of several replicas exactly one wins; the
// winner runs rollback.Execute through its gateway (the Rollbacker) and writes Succeeded,
// PartiallySucceeded or Failed with each step's result. Without confirm, status.rollback is the
// plan (dryRun). The informer's events drive it: no polling.

// reconcileRollback is the rollback queue's handler for run name.
func (m *Runs) reconcileRollback(name string) {
	if err := m.rollbackRun(name); err != nil && m.ctx.Err() == nil {
		if apierrors.IsConflict(err) {
			m.rollbackQ.AddAfter(name, 50*time.Millisecond) // look again at the newer object
			return
		}
		m.warn("rollback of ReversiRun %s/%s (retried in 5s): %v", m.o.Namespace, name, err)
		m.rollbackQ.AddAfter(name, 5*time.Second)
	}
}

func (m *Runs) rollbackRun(name string) error {
	p := m.rb.Load()
	if p == nil {
		return nil // Attach enqueues every request
	}
	rb := *p
	ctx := m.ctx
	obj := &v1alpha1.ReversiRun{}
	if err := m.cache.Get(ctx, client.ObjectKey{Namespace: m.o.Namespace, Name: name}, obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	spec, st := obj.Spec.Rollback, obj.Status.Rollback
	if spec == nil || !m.ours(obj) {
		return nil // never another gateway's rollback (issue 16)
	}
	gen := obj.Generation
	if st != nil && st.ObservedGeneration == gen {
		switch {
		case st.DryRun == !spec.Confirm && st.Phase != v1alpha1.RollbackPending && st.Phase != v1alpha1.RollbackRunning:
			return nil // answered
		case st.Phase == v1alpha1.RollbackRunning && (st.Replica != m.o.Replica || m.isExecuting(name)):
			return nil // another replica's, or ours in progress
		}
	}
	if _, err := m.Store.GetRun(ctx, name); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil // not in this replica's store: a replica that has it answers
		}
		return err
	}
	if !spec.Confirm {
		res, err := rb.ExecuteRollback(ctx, name, rollback.Options{})
		next := obj.DeepCopy()
		next.Status.Rollback = &v1alpha1.RunRollbackStatus{DryRun: true, ObservedGeneration: gen, Steps: planSteps(res.Plan)}
		if err != nil {
			next.Status.Rollback.Steps, next.Status.Rollback.Message = nil, truncate("the rollback could not be planned: "+err.Error(), 1024)
		} else {
			next.Status.Rollback.Message = planMessage(res.Plan)
		}
		return m.updateStatus(ctx, obj, next)
	}
	// Read the latest from the API server: a claim decided on a stale cache would only conflict.
	if err := m.client.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !m.ours(obj) {
		return nil
	}
	if obj.Generation != gen {
		m.rollbackQ.Add(name)
		return nil
	}
	st = obj.Status.Rollback
	resume := st != nil && st.ObservedGeneration == gen && st.Phase == v1alpha1.RollbackRunning && st.Replica == m.o.Replica
	if !resume {
		if st == nil || st.ObservedGeneration != gen || st.DryRun {
			next := obj.DeepCopy()
			next.Status.Rollback = &v1alpha1.RunRollbackStatus{Phase: v1alpha1.RollbackPending, ObservedGeneration: gen,
				Message: "waiting for a gateway replica to claim the rollback"}
			if err := m.updateStatus(ctx, obj, next); err != nil {
				return err
			}
			obj = next
		} else if st.Phase != v1alpha1.RollbackPending {
			return nil
		}
		plan, err := rb.ExecuteRollback(ctx, name, rollback.Options{})
		if err != nil {
			return err
		}
		next := obj.DeepCopy()
		now := metav1.Now()
		next.Status.Rollback = &v1alpha1.RunRollbackStatus{Phase: v1alpha1.RollbackRunning, ObservedGeneration: gen, Replica: m.o.Replica,
			StartedAt: &now, Steps: planSteps(plan.Plan), Message: "running the compensations: " + planMessage(plan.Plan)}
		if err := m.updateStatus(ctx, obj, next); err != nil {
			return err // a conflict: another replica claimed it first, or the spec changed
		}
	}
	m.setExecuting(name, true)
	defer m.setExecuting(name, false)
	res, err := rb.ExecuteRollback(ctx, name, rollback.Options{Confirm: true, ApproveCompensations: spec.ApproveCompensations,
		Operator: fmt.Sprintf("spec.rollback of ReversiRun %s/%s (replica %s)", m.o.Namespace, name, m.o.Replica)})
	if ctx.Err() != nil {
		return nil // stopping: stays Running with our name, resumed by our successor
	}
	final := &v1alpha1.RunRollbackStatus{ObservedGeneration: gen, Replica: m.o.Replica}
	if err != nil {
		final.Phase, final.Message = v1alpha1.RollbackFailed, truncate("the rollback could not run: "+err.Error()+"; fix the cause and change spec.rollback (e.g. approveCompensations) to run it again", 1024)
	} else {
		final.Phase, final.Steps, final.Message = resultPhase(res)
	}
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur := &v1alpha1.ReversiRun{}
		if err := m.client.Get(ctx, client.ObjectKey{Namespace: m.o.Namespace, Name: name}, cur); err != nil {
			return err
		}
		if !m.ours(cur) {
			return nil
		}
		next := cur.DeepCopy()
		f := *final
		if prev := cur.Status.Rollback; prev != nil {
			f.StartedAt = prev.StartedAt
		}
		now := metav1.Now()
		f.CompletedAt = &now
		next.Status.Rollback = &f
		if next.Generation == gen {
			next.Status.ObservedGeneration = gen
		}
		return m.updateStatus(ctx, cur, next)
	})
}

// updateStatus writes next's status (with obj's resourceVersion, so it fails on a conflict),
// with the run's phase and conditions following status.rollback.
func (m *Runs) updateStatus(ctx context.Context, obj, next *v1alpha1.ReversiRun) error {
	status := store.RunIdle
	if obj.Status.Phase == v1alpha1.RunActive {
		status = store.RunActive
	}
	if run, err := m.Store.GetRun(ctx, obj.Name); err == nil {
		status = run.Status
	}
	runPhase(next, status)
	if err := m.client.Status().Update(ctx, next); err != nil {
		return err
	}
	return nil
}

func (m *Runs) isExecuting(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.executing[name]
}

func (m *Runs) setExecuting(name string, on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if on {
		m.executing[name] = true
	} else {
		delete(m.executing, name)
	}
}

// planSteps are the plan's steps that have something to undo or to report (skipped steps,
// such as reads, are only counted in the message), newest first, at most MaxRunSteps.
func planSteps(p rollback.Plan) []v1alpha1.RollbackStep {
	var out []v1alpha1.RollbackStep
	for _, s := range p.Steps {
		if s.Action == manifest.PlanSkip || len(out) == v1alpha1.MaxRunSteps {
			continue
		}
		rs := v1alpha1.RollbackStep{Seq: s.Step, Tool: s.Tool, Message: truncate(s.Reason, 512)}
		if s.Compensation != nil {
			rs.Compensation = s.Compensation.Tool
		}
		out = append(out, rs)
	}
	return out
}

func planMessage(p rollback.Plan) string {
	return fmt.Sprintf("%d step(s) to compensate, %d unrecoverable, %d not undone, %d skipped (nothing to undo)",
		p.Summary.Compensate, p.Summary.Unrecoverable, p.Summary.NotUndone, p.Summary.Skip)
}

// resultPhase is the phase, the steps and the message of a confirmed rollback's result.
func resultPhase(res rollback.Result) (string, []v1alpha1.RollbackStep, string) {
	var steps []v1alpha1.RollbackStep
	undone, notUndone, skipped := 0, 0, 0
	for _, s := range res.Steps {
		if s.Status == store.RollbackSkipped {
			skipped++
			continue
		}
		if s.Undone() {
			undone++
		} else {
			notUndone++
		}
		if len(steps) == v1alpha1.MaxRunSteps {
			continue
		}
		rs := v1alpha1.RollbackStep{Seq: s.Step, Tool: s.Tool, Result: stepResult(s.Status), Message: truncate(stepMessage(s), 512)}
		if s.Compensation != nil {
			rs.Compensation = s.Compensation.Tool
		}
		steps = append(steps, rs)
	}
	msg := fmt.Sprintf("%d step(s) undone, %d not undone, %d skipped (nothing to undo)", undone, notUndone, skipped)
	if len(res.Steps)-skipped > v1alpha1.MaxRunSteps {
		msg += fmt.Sprintf("; the first %d steps are listed, the rest are in the gateway's ledger", v1alpha1.MaxRunSteps)
	}
	switch {
	case notUndone == 0:
		return v1alpha1.RollbackSucceeded, steps, msg
	case undone > 0:
		return v1alpha1.RollbackPartiallySucceeded, steps, msg
	}
	return v1alpha1.RollbackFailed, steps, msg
}

// stepResult maps a ledger rollback status onto the ReversiRun's results (DESIGN.md).
func stepResult(s store.Status) string {
	switch s {
	case store.RollbackVerified:
		return "verified"
	case store.RollbackCompensated, store.RollbackUnverified:
		return "compensated"
	case store.RollbackVerificationFailed:
		return "verification_failed"
	case store.RollbackUnrecoverable, store.RollbackFailed:
		return "unrecoverable"
	}
	return "not_undone" // waiting_approval, denied, held, not_undone, skipped, started
}

func stepMessage(s rollback.StepResult) string {
	var parts []string
	if s.Status != store.RollbackVerified && s.Status != store.RollbackCompensated {
		parts = append(parts, string(s.Status))
	}
	if v := s.Verification; v != nil {
		switch {
		case v.Mismatch != "":
			parts = append(parts, "read-back "+v.Tool+" mismatch: "+v.Mismatch)
		case v.Error != "":
			parts = append(parts, "read-back "+v.Tool+": "+v.Error)
		default:
			parts = append(parts, fmt.Sprintf("read back with %s (%d attempt(s))", v.Tool, v.Attempts))
		}
	}
	if s.Approval != "" {
		parts = append(parts, "approval request "+s.Approval)
	}
	if s.Error != "" {
		parts = append(parts, s.Error)
	} else if !s.Undone() && s.Reason != "" {
		parts = append(parts, s.Reason)
	}
	if s.Earlier {
		parts = append(parts, "by an earlier rollback")
	}
	return strings.Join(parts, "; ")
}
