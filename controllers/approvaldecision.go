package controllers

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/pkg/approvalsig"
)

// signDecision sets ar's status.decision, in the status patch that writes the phase: the
// controller's signature (pkg/approvalsig) of an Approved phase, which is what the
// gateway honours; none for any other phase (Denied and Expired only block).
//
// The status is what this reconcile counted on top of a status the controller sealed
// (Reconcile refuses any other), so whoever may write approvalrequests/status cannot get a
// decision of theirs signed. A signature made before that still verifies over the status is
// kept as it is.
func (r *ApprovalRequestReconciler) signDecision(ar *v1alpha1.ApprovalRequest, now time.Time) {
	if ar.Status.Phase != v1alpha1.ApprovalApproved || r.Signing == nil {
		ar.Status.Decision = nil
		return
	}
	if ar.Status.Decision != nil && approvalsig.Verify(ar, r.Signing.Trust) == nil {
		return
	}
	d, err := approvalsig.Sign(ar, r.Signing.Signer, now)
	if err != nil {
		ar.Status.Decision = nil
		r.event(ar, corev1.EventTypeWarning, v1alpha1.ReasonDecisionNotSigned, "signing the decision: "+err.Error())
		return
	}
	ar.Status.Decision = d
}
