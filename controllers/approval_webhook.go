package controllers

import (
	"context"
	"fmt"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	authnv1 "k8s.io/api/authentication/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// The admission webhooks of Approval, served by `reversi controller` (controller-gen writes
// config/webhook/manifests.yaml from these markers; `make manifests`). Both fail closed: an
// Approval cannot be created while the webhook is unreachable.
// +kubebuilder:webhook:path=/mutate-reversi-dev-v1alpha1-approval,mutating=true,failurePolicy=fail,sideEffects=None,groups=reversi.dev,resources=approvals,verbs=create,versions=v1alpha1,name=mapproval.reversi.dev,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-reversi-dev-v1alpha1-approval,mutating=false,failurePolicy=fail,sideEffects=None,groups=reversi.dev,resources=approvals,verbs=create;update,versions=v1alpha1,name=vapproval.reversi.dev,admissionReviewVersions=v1

// ApprovalWebhook stamps spec.approver on Approval create from the API server's user info and
// refuses a value the user wrote that differs from it (DESIGN.md "Approval": "An admission
// webhook stamps spec.approver (username, groups, uid) from the API server's user info; a
// value written by the user that differs is refused, and the field never changes"). The
// mutating half stamps; the validating half checks the stored value again after every other
// mutating webhook ran, so a later mutation cannot forge an approver. spec is immutable by
// the CRD's CEL rule (self == oldSelf).
type ApprovalWebhook struct{}

// SetupWebhookWithManager registers the mutating and validating webhooks on the manager's
// webhook server (paths /mutate-reversi-dev-v1alpha1-approval and
// /validate-reversi-dev-v1alpha1-approval).
func (w *ApprovalWebhook) SetupWebhookWithManager(mgr ctrl.Manager) error {
	return ctrl.NewWebhookManagedBy(mgr, &v1alpha1.Approval{}).
		WithDefaulter(w).
		WithValidator(w).
		Complete()
}

// approverOf is the authenticated user of an admission request, as an Approver.
func approverOf(u authnv1.UserInfo) *v1alpha1.Approver {
	return &v1alpha1.Approver{Username: u.Username, UID: u.UID, Groups: slices.Clone(u.Groups)}
}

// mismatch says how the approver written in an Approval differs from the authenticated user:
// the username must be the same, and a uid or groups given must be the same too (groups as a
// set). "" when they agree.
func mismatch(written *v1alpha1.Approver, user authnv1.UserInfo) string {
	switch {
	case written.Username != user.Username:
		return fmt.Sprintf("spec.approver.username is %q but you are authenticated as %q", written.Username, user.Username)
	case written.UID != "" && written.UID != user.UID:
		return fmt.Sprintf("spec.approver.uid is %q but your uid is %q", written.UID, user.UID)
	case len(written.Groups) > 0 && !sameSet(written.Groups, user.Groups):
		return fmt.Sprintf("spec.approver.groups is %v but your groups are %v", written.Groups, user.Groups)
	}
	return ""
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}

func admissionRequest(ctx context.Context) (admission.Request, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return req, fmt.Errorf("the admission request is not available: %w", err)
	}
	if req.UserInfo.Username == "" {
		return req, fmt.Errorf("the API server sent no username: an Approval needs an authenticated user")
	}
	return req, nil
}

// Default stamps spec.approver on create; it refuses an approver written by the user that
// differs from the authenticated user.
func (w *ApprovalWebhook) Default(ctx context.Context, a *v1alpha1.Approval) error {
	req, err := admissionRequest(ctx)
	if err != nil {
		return err
	}
	if req.Operation != admissionv1.Create {
		return nil
	}
	if a.Spec.Approver != nil {
		if why := mismatch(a.Spec.Approver, req.UserInfo); why != "" {
			return fmt.Errorf("%s: leave spec.approver out, the API server's authentication fills it in", why)
		}
	}
	a.Spec.Approver = approverOf(req.UserInfo)
	return nil
}

// ValidateCreate checks that spec.approver is exactly the authenticated user (stamped by
// Default).
func (w *ApprovalWebhook) ValidateCreate(ctx context.Context, a *v1alpha1.Approval) (admission.Warnings, error) {
	req, err := admissionRequest(ctx)
	if err != nil {
		return nil, err
	}
	if a.Spec.Approver == nil {
		return nil, fmt.Errorf("spec.approver was not stamped: the mutating webhook mapproval.reversi.dev must run before this one (check the MutatingWebhookConfiguration)")
	}
	want := approverOf(req.UserInfo)
	if a.Spec.Approver.Username != want.Username || a.Spec.Approver.UID != want.UID || !sameSet(a.Spec.Approver.Groups, want.Groups) {
		return nil, fmt.Errorf("spec.approver %+v is not the authenticated user %+v: leave spec.approver out", *a.Spec.Approver, *want)
	}
	return nil, nil
}

// ValidateUpdate refuses a changed approver (the CRD's CEL rule already keeps spec as it was;
// this holds even if that rule is edited away).
func (w *ApprovalWebhook) ValidateUpdate(_ context.Context, old, a *v1alpha1.Approval) (admission.Warnings, error) {
	if (old.Spec.Approver == nil) != (a.Spec.Approver == nil) ||
		(old.Spec.Approver != nil && (old.Spec.Approver.Username != a.Spec.Approver.Username || old.Spec.Approver.UID != a.Spec.Approver.UID || !sameSet(old.Spec.Approver.Groups, a.Spec.Approver.Groups))) {
		return nil, fmt.Errorf("spec.approver is immutable: create a new Approval instead")
	}
	return nil, nil
}

// ValidateDelete allows deletion (withdrawing a vote the controller has not counted yet).
func (w *ApprovalWebhook) ValidateDelete(context.Context, *v1alpha1.Approval) (admission.Warnings, error) {
	return nil, nil
}
