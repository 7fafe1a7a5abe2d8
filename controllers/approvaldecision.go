package controllers

import (
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/internal/approvalrules"
	"github.com/reversi-gitops/reversi/internal/approvalsig"
)

// signDecision sets ar's status.decision, in the status patch that writes the phase: the
// controller's signature (internal/approvalsig) of an Approved phase, which is what the
// gateway honours; none for any other phase (Denied and Expired only block).
//
// The status is not what is signed on trust: whoever may write approvalrequests/status (the
// webhook rule for it removed) can write phase Approved and any status.approvals, and the
// reconciler reads its state from the status. So a decision is signed only when the request's
// Approvals, judged again from the spec alone (stamps, request uid, order of creation, the
// rules), reach Approved with exactly the approvers status.approvals lists. A signature made
// before that still verifies over the status (nothing it covers changed) is kept as it is.
func (r *ApprovalRequestReconciler) signDecision(ar *v1alpha1.ApprovalRequest, approvals []v1alpha1.Approval, now time.Time) {
	if ar.Status.Phase != v1alpha1.ApprovalApproved || r.Signing == nil {
		ar.Status.Decision = nil
		return
	}
	if ar.Status.Decision != nil && approvalsig.Verify(ar, r.Signing.Trust) == nil {
		return
	}
	ar.Status.Decision = nil
	if why := r.replay(ar, approvals); why != "" {
		r.event(ar, corev1.EventTypeWarning, v1alpha1.ReasonDecisionNotSigned,
			"status says Approved but the decision is not signed, so the gateway keeps the call held: "+why)
		return
	}
	d, err := approvalsig.Sign(ar, r.Signing.Signer, now)
	if err != nil {
		r.event(ar, corev1.EventTypeWarning, v1alpha1.ReasonDecisionNotSigned, "signing the decision: "+err.Error())
		return
	}
	ar.Status.Decision = d
}

// replay judges ar's Approvals again from its spec alone, in creation order, and says why
// they do not give the Approved decision with the approvers of status.approvals ("" when they
// do).
func (r *ApprovalRequestReconciler) replay(ar *v1alpha1.ApprovalRequest, approvals []v1alpha1.Approval) string {
	fresh := ar.DeepCopy()
	fresh.Status = v1alpha1.ApprovalRequestStatus{}
	st := stateOf(fresh)
	for i := range approvals {
		apr := &approvals[i]
		if !apr.DeletionTimestamp.IsZero() {
			continue
		}
		_ = r.cast(&st, ar, apr, r.Key.Verify(apr))
	}
	var by []string
	for _, v := range st.Votes {
		if v.Approve {
			by = append(by, v.By)
		}
	}
	slices.Sort(by)
	by = slices.Compact(by)
	listed := approvalsig.Approvers(ar)
	if st.Phase != approvalrules.Approved || !slices.Equal(by, listed) {
		return fmt.Sprintf("its Approvals give phase %s approved by %v, the status lists %v", phaseOf(st), by, listed)
	}
	return ""
}
