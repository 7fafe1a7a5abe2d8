package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/approvalrules"
)

// ApprovalRequestIndex is the field index of Approval objects by spec.requestRef.name.
const ApprovalRequestIndex = "spec.requestRef.name"

// ApprovalRequestReconciler decides ApprovalRequests from the Approval objects that reference
// them, with the rules of pkg/approvalrules (the same as the gateway's standalone queue):
// an approver must hold one of the request's roles (Kubernetes groups) when roles are set; the
// run's actor cannot approve; the quorum counts distinct persons (usernames, and no uid twice); one Deny denies; past
// expiresAt the request is Expired, or Escalated to escalateTo (once, for as long again).
//
// Counting is incremental and stable: an Approval is judged once, in creation order, against
// the request as it stood when the Approval was created; the counted ones are listed in the
// request's status, which is written first (optimistic lock), then each Approval's status.
// RBAC create on approvals is the outer gate; the admission webhook stamps spec.approver.
//
// Issue 16: an Approval counts only when its stamp verifies with Key (the Approval webhook
// made it: without the webhook configurations nothing counts, and the request's Ready
// condition says so with reason ApprovalNotStamped), it was made for this request's uid and
// not before the request, and its approver is not the run's actor under any name (same
// username, same uid, or the actor's e-mail: approvalrules.ActorAlias). Otherwise it is
// Rejected with why, in its status and in the request's status.rejected.
//
// Source: DESIGN.md "ApprovalRequest" and "Approval", issues 8 and 16.
type ApprovalRequestReconciler struct {
	client.Client
	Recorder recorder.EventRecorder
	// Key verifies the Approvals' stamps (required).
	Key *StampKey
	// Signing signs Approved decisions (status.decision, pkg/approvalsig), which are the
	// only ones gateways honour. Nil: nothing is signed (every request stays held).
	Signing *SigningKey
	// Now is the clock (time.Now when nil); tests do not replace it, expiry is real time.
	Now func() time.Time
}

func (r *ApprovalRequestReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// SetupWithManager indexes Approvals by the request they name and watches both kinds.
func (r *ApprovalRequestReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.Approval{}, ApprovalRequestIndex, func(o client.Object) []string {
		return []string{o.(*v1alpha1.Approval).Spec.RequestRef.Name}
	}); err != nil {
		return fmt.Errorf("indexing Approvals by %s: %w", ApprovalRequestIndex, err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.ApprovalRequest{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1alpha1.Approval{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.(*v1alpha1.Approval).Spec.RequestRef.Name}}}
		}), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named("approvalrequest").
		Complete(r)
}

// judged is the result for one Approval.
type judged struct {
	apr     *v1alpha1.Approval
	result  string // ResultCounted or ResultRejected
	message string
	fresh   bool // judged in this reconcile (events are sent for these)
}

// Reconcile counts the Approvals of one request, settles expiry, and writes the statuses.
func (r *ApprovalRequestReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ar := &v1alpha1.ApprovalRequest{}
	if err := r.Get(ctx, req.NamespacedName, ar); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !ar.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	var list v1alpha1.ApprovalList
	if err := r.List(ctx, &list, client.InNamespace(ar.Namespace), client.MatchingFields{ApprovalRequestIndex: ar.Name}); err != nil {
		return ctrl.Result{}, err
	}
	approvals := list.Items
	slices.SortFunc(approvals, func(a, b v1alpha1.Approval) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})

	base := ar.DeepCopy()
	if !r.Key.Sealed(ar) {
		return ctrl.Result{}, r.refuseUnsealed(ctx, ar, base)
	}
	st := stateOf(ar)
	before := st.Phase
	wasEscalated := st.Escalated
	now := r.now()
	var results []judged
	var unstamped []string // Approvals whose stamp does not verify, judged now or before
	for i := range approvals {
		apr := &approvals[i]
		if !apr.DeletionTimestamp.IsZero() {
			continue
		}
		stampErr := r.Key.Verify(apr)
		if stampErr != nil {
			unstamped = append(unstamped, apr.Name)
		}
		if slices.ContainsFunc(ar.Status.Approvals, func(c v1alpha1.CountedApproval) bool { return c.Name == apr.Name }) {
			results = append(results, judged{apr: apr, result: v1alpha1.ResultCounted, message: countedMessage(apr)})
			continue
		}
		if slices.ContainsFunc(ar.Status.Rejected, func(r v1alpha1.RejectedApproval) bool { return r.Name == apr.Name }) {
			continue // rejected before, as the request's status (which only the controller writes) says
		}
		// Anything else is judged now, whatever its own status says: an Approval's status is
		// not proof of an earlier verdict (anyone allowed to write approvals/status could mark
		// a Deny Rejected). Rejections beyond status.rejected's bound are judged again each
		// time, to the same verdict; only a new verdict is reported (events, rejectedCount).
		j := judged{apr: apr, fresh: true, result: v1alpha1.ResultRejected}
		switch err := r.cast(&st, ar, apr, stampErr); {
		case err == nil:
			j.result, j.message = v1alpha1.ResultCounted, countedMessage(apr)
			ar.Status.Approvals = append(ar.Status.Approvals, v1alpha1.CountedApproval{
				Name: apr.Name, Username: apr.Spec.Approver.Username, UID: apr.Spec.Approver.UID, Groups: boundGroups(apr.Spec.Approver.Groups),
				Decision: apr.Spec.Decision, Reason: apr.Spec.Reason, CountedAt: metav1.NewTime(now)})
		case errors.Is(err, approvalrules.ErrNotPending):
			j.message = fmt.Sprintf("not counted: request %s is already %s", ar.Name, phaseOf(st))
		default:
			j.message = "not counted: " + approvalrules.Why(err)
		}
		if j.result == v1alpha1.ResultRejected {
			if apr.Status.Result == v1alpha1.ResultRejected && apr.Status.Message == j.message && apr.Status.ObservedGeneration == apr.Generation {
				j.fresh = false // the same verdict as before (an Approval beyond the listed ones)
			} else {
				recordRejected(ar, apr, stampErr == nil, j.message, now)
			}
		}
		results = append(results, j)
	}
	st.Settle(now)

	r.setStatus(ar, &st, unstamped)
	r.signDecision(ar, now)
	ar.Status.Seal = r.Key.Seal(ar)
	if err := r.Status().Patch(ctx, ar, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if st.Escalated && !wasEscalated && st.Phase == approvalrules.Pending {
		r.event(ar, corev1.EventTypeNormal, v1alpha1.EventApprovalEscalated, decisionNote(ar))
	}
	if st.Phase != before {
		typ, reason := corev1.EventTypeWarning, v1alpha1.EventApprovalDenied
		switch st.Phase {
		case approvalrules.Approved:
			typ, reason = corev1.EventTypeNormal, v1alpha1.EventApprovalApproved
		case approvalrules.Expired:
			reason = v1alpha1.EventApprovalExpired
		}
		r.event(ar, typ, reason, decisionNote(ar))
	}
	for _, j := range results {
		if err := r.setApprovalStatus(ctx, j); err != nil {
			return ctrl.Result{}, err
		}
		if j.fresh {
			typ := corev1.EventTypeNormal
			if j.result == v1alpha1.ResultRejected {
				typ = corev1.EventTypeWarning
			}
			note := fmt.Sprintf("%s by %s: %s", j.apr.Spec.Decision, approverName(j.apr), j.message)
			r.event(j.apr, typ, j.result, note)
			r.event(ar, typ, j.result, fmt.Sprintf("Approval %s: %s", j.apr.Name, note))
		}
	}
	if st.Phase == approvalrules.Pending && !st.Expires.IsZero() {
		return ctrl.Result{RequeueAfter: max(st.Expires.Sub(now), 0) + 100*time.Millisecond}, nil
	}
	return ctrl.Result{}, nil
}

// refuseUnsealed answers a request whose status the controller did not write (no valid seal:
// someone with access to approvalrequests/status wrote it): nothing is counted on it and its
// decision is not signed, so the gateway keeps the call held; Stalled says why. The seal stays
// invalid, so the request stays stalled (a new call makes a new request).
func (r *ApprovalRequestReconciler) refuseUnsealed(ctx context.Context, ar, base *v1alpha1.ApprovalRequest) error {
	msg := "the status was not written by the controller (no valid seal): it is not counted on nor signed, and the gateway keeps the call held; the agent's new call makes a new request"
	if c := apimeta.FindStatusCondition(ar.Status.Conditions, v1alpha1.ConditionStalled); c != nil && c.Reason == v1alpha1.ReasonStatusNotSealed && ar.Status.Decision == nil {
		return nil
	}
	ar.Status.Decision = nil
	setCondition(ar, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonStatusNotSealed, msg)
	setCondition(ar, v1alpha1.ConditionStalled, metav1.ConditionTrue, v1alpha1.ReasonStatusNotSealed, msg)
	r.event(ar, corev1.EventTypeWarning, v1alpha1.ReasonStatusNotSealed, msg)
	return client.IgnoreNotFound(r.Status().Patch(ctx, ar, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})))
}

// cast judges one Approval against the request's state as of the Approval's creation. The
// checks of issue 16 come first: the stamp (stampErr, from Key.Verify), the request's uid and
// the order of creation; then the rules (roles, the actor under any name, one vote each).
func (r *ApprovalRequestReconciler) cast(st *approvalrules.State, ar *v1alpha1.ApprovalRequest, apr *v1alpha1.Approval, stampErr error) error {
	var se *StampError
	switch {
	case errors.As(stampErr, &se):
		st.Settle(apr.CreationTimestamp.Time)
		return fmt.Errorf("it carries no valid stamp of the Approval webhook (%s), so who decided is unknown: install the Approval webhook configurations (mapproval.reversi.dev, vapproval.reversi.dev) and create the Approval again", se.Why)
	case stampErr != nil:
		return stampErr
	case apr.Spec.RequestRef.UID == "":
		return fmt.Errorf("it was made before its request %s existed (spec.requestRef.uid is empty): approve the request as it is now with a new Approval", ar.Name)
	case apr.Spec.RequestRef.UID != string(ar.UID):
		return fmt.Errorf("it was made for another request named %s (uid %s; this one is %s): approve this request with a new Approval", ar.Name, apr.Spec.RequestRef.UID, ar.UID)
	case apr.CreationTimestamp.Before(&ar.CreationTimestamp):
		return fmt.Errorf("it was created at %s, before its request %s (created at %s): approve the request with a new Approval",
			apr.CreationTimestamp.UTC().Format(time.RFC3339), ar.Name, ar.CreationTimestamp.UTC().Format(time.RFC3339))
	}
	if st.Escalated && ar.Status.EscalatedAt != nil && apr.CreationTimestamp.Before(ar.Status.EscalatedAt) {
		// Made before the escalation: judged with the roles asked then, as when it was made
		// (issue 16 review: an Approval judged again after the escalation must not flip).
		roles := st.Roles
		st.Roles = ar.Spec.Roles
		defer func() { st.Roles = roles }()
	}
	return st.Cast(approvalrules.Vote{By: apr.Spec.Approver.Username, UID: apr.Spec.Approver.UID, Groups: apr.Spec.Approver.Groups,
		Approve: apr.Spec.Decision == v1alpha1.DecisionApprove, At: apr.CreationTimestamp.Time})
}

// boundGroups is groups cut to the 64 entries status lists hold.
func boundGroups(g []string) []string {
	return slices.Clone(g[:min(len(g), 64)])
}

// recordRejected lists a rejected Approval in the request's status (the first
// MaxCountedApprovals of them) and counts it. The approver is listed only when the stamp
// verifies (otherwise it is whatever the creator wrote).
func recordRejected(ar *v1alpha1.ApprovalRequest, apr *v1alpha1.Approval, stamped bool, message string, now time.Time) {
	if slices.ContainsFunc(ar.Status.Rejected, func(x v1alpha1.RejectedApproval) bool { return x.Name == apr.Name }) {
		return // judged again after a failed status write of the Approval
	}
	ar.Status.RejectedCount++
	if len(ar.Status.Rejected) >= v1alpha1.MaxCountedApprovals {
		return
	}
	x := v1alpha1.RejectedApproval{Name: apr.Name, Decision: apr.Spec.Decision, Reason: apr.Spec.Reason,
		Message: truncate(message, 1024), RejectedAt: metav1.NewTime(now)}
	if stamped && apr.Spec.Approver != nil {
		x.Username, x.Groups = apr.Spec.Approver.Username, boundGroups(apr.Spec.Approver.Groups)
	}
	ar.Status.Rejected = append(ar.Status.Rejected, x)
}

// stateOf is the request as the rules see it, from its spec and status.
func stateOf(ar *v1alpha1.ApprovalRequest) approvalrules.State {
	s := approvalrules.State{Actor: ar.Spec.Actor, ActorUID: ar.Spec.ActorUID, ActorEmail: ar.Spec.ActorEmail, Run: ar.Spec.Run, Roles: ar.Spec.Roles, Quorum: 1,
		Created: ar.CreationTimestamp.Time, OnTimeout: ar.Spec.OnTimeout, EscalateTo: ar.Spec.EscalateTo, Phase: approvalrules.Pending}
	if ar.Spec.Quorum != nil {
		s.Quorum = int(*ar.Spec.Quorum)
	}
	if ar.Spec.ExpiresAt != nil {
		s.Expires = ar.Spec.ExpiresAt.Time
	}
	switch ar.Status.Phase {
	case v1alpha1.ApprovalApproved:
		s.Phase = approvalrules.Approved
	case v1alpha1.ApprovalDenied:
		s.Phase = approvalrules.Denied
	case v1alpha1.ApprovalExpired:
		s.Phase = approvalrules.Expired
	}
	if ar.Status.EscalatedAt != nil && !s.Expires.IsZero() {
		s.Escalated, s.Roles = true, slices.Clone(ar.Spec.EscalateTo)
		s.Expires = s.Expires.Add(s.Expires.Sub(s.Created))
	}
	if ar.Status.DecidedAt != nil {
		s.Decided = ar.Status.DecidedAt.Time
	}
	for _, c := range ar.Status.Approvals {
		s.Votes = append(s.Votes, approvalrules.Vote{By: c.Username, UID: c.UID, Approve: c.Decision == v1alpha1.DecisionApprove, At: c.CountedAt.Time})
	}
	return s
}

// phaseOf is the status.phase word of a state.
func phaseOf(s approvalrules.State) string {
	switch s.Phase {
	case approvalrules.Approved:
		return v1alpha1.ApprovalApproved
	case approvalrules.Denied:
		return v1alpha1.ApprovalDenied
	case approvalrules.Expired:
		return v1alpha1.ApprovalExpired
	}
	if s.Escalated {
		return v1alpha1.ApprovalEscalated
	}
	return v1alpha1.ApprovalPending
}

// setStatus writes the phase, counts, times, message and conditions of ar from st. While the
// request is pending, unstamped (names of Approvals whose stamp does not verify) makes Ready
// False with reason ApprovalNotStamped.
func (r *ApprovalRequestReconciler) setStatus(ar *v1alpha1.ApprovalRequest, st *approvalrules.State, unstamped []string) {
	ar.Status.ObservedGeneration = ar.Generation
	ar.Status.Phase = phaseOf(*st)
	ar.Status.ApprovedCount = int32(st.Approvals())
	if st.Escalated && ar.Status.EscalatedAt == nil {
		at := *ar.Spec.ExpiresAt // escalation happens at the original expiry (Settle needs one)
		ar.Status.EscalatedAt = &at
	}
	if st.Phase != approvalrules.Pending && ar.Status.DecidedAt == nil {
		at := metav1.NewTime(st.Decided)
		ar.Status.DecidedAt = &at
	}
	var by []string
	for _, v := range st.Votes {
		by = append(by, v.By)
	}
	switch st.Phase {
	case approvalrules.Approved:
		ar.Status.Message = fmt.Sprintf("approved by %s (quorum %d); the gateway lets the call's retry through once", strings.Join(by, ", "), max(st.Quorum, 1))
		markReady(ar, v1alpha1.ReasonApproved, ar.Status.Message)
	case approvalrules.Denied:
		ar.Status.Message = fmt.Sprintf("denied by %s; the call stays blocked", st.Votes[len(st.Votes)-1].By)
		markReady(ar, v1alpha1.ReasonDenied, ar.Status.Message)
	case approvalrules.Expired:
		ar.Status.Message = fmt.Sprintf("expired at %s with %d of %d approvals; the call stays blocked (a new call makes a new request)", st.Expires.UTC().Format(time.RFC3339), st.Approvals(), max(st.Quorum, 1))
		markReady(ar, v1alpha1.ReasonExpired, ar.Status.Message)
	default:
		who := "any user allowed to create Approvals here except " + st.Actor
		if len(st.Roles) > 0 {
			who = "members of " + strings.Join(st.Roles, " or ")
		}
		msg := fmt.Sprintf("%d of %d approvals; waiting for %s", st.Approvals(), max(st.Quorum, 1), who)
		if st.Escalated {
			msg = "escalated: " + msg
		}
		if !st.Expires.IsZero() {
			msg += fmt.Sprintf(" until %s", st.Expires.UTC().Format(time.RFC3339))
		}
		ar.Status.Message = msg + " (kubectl apply an Approval, or reversi approve " + ar.Name + ")"
		reason := v1alpha1.ReasonWaitingForApprovals
		if len(unstamped) > 0 {
			reason = v1alpha1.ReasonApprovalNotStamped
			names := unstamped[:min(len(unstamped), 5)]
			more := ""
			if len(unstamped) > len(names) {
				more = fmt.Sprintf(" and %d more", len(unstamped)-len(names))
			}
			ar.Status.Message = truncate(fmt.Sprintf("%d Approval(s) (%s%s) carry no valid stamp of the Approval webhook and were not counted: check that the webhook configurations mapproval.reversi.dev and vapproval.reversi.dev are installed, then create those Approvals again; %s",
				len(unstamped), strings.Join(names, ", "), more, ar.Status.Message), 1024)
		}
		setCondition(ar, v1alpha1.ConditionReady, metav1.ConditionFalse, reason, ar.Status.Message)
		removeCondition(ar, v1alpha1.ConditionReconciling)
		removeCondition(ar, v1alpha1.ConditionStalled)
	}
}

// setApprovalStatus writes one Approval's result when it changed.
func (r *ApprovalRequestReconciler) setApprovalStatus(ctx context.Context, j judged) error {
	apr := j.apr
	if apr.Status.Result == j.result && apr.Status.Message == j.message && apr.Status.ObservedGeneration == apr.Generation {
		return nil
	}
	base := apr.DeepCopy()
	apr.Status.ObservedGeneration = apr.Generation
	apr.Status.Result, apr.Status.Message = j.result, j.message
	markReady(apr, j.result, j.message)
	return client.IgnoreNotFound(r.Status().Patch(ctx, apr, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})))
}

// decisionNote is the note of an approval event (issue 24): the tool, the run and its actor,
// then the status message (who approved or denied, or who the request now waits for).
func decisionNote(ar *v1alpha1.ApprovalRequest) string {
	return truncate(fmt.Sprintf("%s (run %s, actor %s): %s", ar.Spec.Tool, ar.Spec.Run, ar.Spec.Actor, ar.Status.Message), 1024)
}

func countedMessage(apr *v1alpha1.Approval) string {
	if apr.Spec.Decision == v1alpha1.DecisionDeny {
		return "counted: this Deny denies request " + apr.Spec.RequestRef.Name
	}
	return "counted towards request " + apr.Spec.RequestRef.Name
}

func approverName(apr *v1alpha1.Approval) string {
	if apr.Spec.Approver == nil {
		return "an unknown user"
	}
	return apr.Spec.Approver.Username
}

func (r *ApprovalRequestReconciler) event(obj client.Object, typ, reason, note string) {
	if r.Recorder == nil {
		return
	}
	r.Recorder.Eventf(obj, nil, typ, reason, "Decide", "%s", note)
}

// setupApprovals registers the ApprovalRequest reconciler and, with o.Webhooks, the Approval
// admission webhooks and those of the gateway's objects (GatewayObjectsWebhook).
func setupApprovals(mgr ctrl.Manager, o Options) error {
	if err := (&ApprovalRequestReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("reversi-controller"), Key: o.StampKey, Signing: o.SigningKey}).
		SetupWithManager(context.Background(), mgr); err != nil {
		return err
	}
	if !o.Webhooks {
		return nil
	}
	if o.ControllerUsername == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		if o.ControllerUsername, err = WhoAmI(ctx, mgr.GetConfig()); err != nil {
			return err
		}
	}
	if err := (&ApprovalWebhook{Key: o.StampKey, Reader: mgr.GetAPIReader(), Controller: o.ControllerUsername}).SetupWebhookWithManager(mgr); err != nil {
		return err
	}
	return (&GatewayObjectsWebhook{Reader: mgr.GetClient(), Identities: o.GatewayIdentities, Controller: o.ControllerUsername}).
		SetupWebhookWithManager(mgr.GetWebhookServer())
}
