package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
)

// The admission webhooks of Approval, served by `reversi controller` (controller-gen writes
// config/webhook/manifests.yaml from these markers; `make manifests`). Both fail closed: an
// Approval cannot be created while the webhook is unreachable.
// +kubebuilder:webhook:path=/mutate-reversi-dev-v1alpha1-approval,mutating=true,failurePolicy=fail,sideEffects=None,groups=reversi.dev,resources=approvals,verbs=create,versions=v1alpha1,name=mapproval.reversi.dev,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-reversi-dev-v1alpha1-approval,mutating=false,failurePolicy=fail,sideEffects=None,groups=reversi.dev,resources=approvals;approvals/status,verbs=create;update,versions=v1alpha1,name=vapproval.reversi.dev,admissionReviewVersions=v1

// ApprovalWebhook stamps spec.approver on Approval create from the API server's user info and
// refuses a value the user wrote that differs from it (DESIGN.md "Approval": "An admission
// webhook stamps spec.approver (username, groups, uid) from the API server's user info; a
// value written by the user that differs is refused, and the field never changes"). The
// mutating half stamps; the validating half checks the stored value again after every other
// mutating webhook ran, so a later mutation cannot forge an approver. spec is immutable by
// the CRD's CEL rule (self == oldSelf).
//
// Issue 16 binds each Approval to one request and seals it: the mutating half stamps
// spec.requestRef.uid with the uid of the ApprovalRequest of that name as the API server has
// it now (read with Reader, not a cache: the request may be a second old), empty when there is
// none, and spec.stamp with an HMAC of Key over the namespace, name, request, decision and
// approver (StampKey). A mutating webhook on create sees neither metadata.uid nor a name the
// API server generates, so an Approval must have metadata.name (generateName alone is
// refused). The validating half verifies the stamp; the ApprovalRequest reconciler counts
// only Approvals whose stamp verifies, so without these webhook configurations nothing counts.
type ApprovalWebhook struct {
	// Key stamps and verifies (required).
	Key *StampKey
	// Reader reads ApprovalRequests from the API server (the manager's APIReader; required).
	Reader client.Reader
	// Now is the clock of the stamps (time.Now when nil).
	Now func() time.Time
	// Controller is the controller's own username: the only identity that may write an
	// Approval's status (required).
	Controller string
}

// SetupWebhookWithManager registers the mutating and validating webhooks on the manager's
// webhook server (paths /mutate-reversi-dev-v1alpha1-approval and
// /validate-reversi-dev-v1alpha1-approval).
func (w *ApprovalWebhook) SetupWebhookWithManager(mgr ctrl.Manager) error {
	if w.Key == nil || w.Reader == nil {
		return errors.New("the Approval webhook needs a stamp key and an API reader")
	}
	return ctrl.NewWebhookManagedBy(mgr, &v1alpha1.Approval{}).
		WithDefaulter(w).
		WithValidator(w).
		Complete()
}

func (w *ApprovalWebhook) now() time.Time {
	if w.Now != nil {
		return w.Now()
	}
	return time.Now()
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

func equalStamp(a, b *v1alpha1.ApprovalStamp) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.KeyID == b.KeyID && a.MAC == b.MAC && a.At.Equal(&b.At)
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

// Default stamps spec.approver, spec.requestRef.uid and spec.stamp on create. It refuses an
// Approval without metadata.name, an approver or request uid written by the user that differs
// from the truth, and a spec.stamp written by the user.
func (w *ApprovalWebhook) Default(ctx context.Context, a *v1alpha1.Approval) error {
	req, err := admissionRequest(ctx)
	if err != nil {
		return err
	}
	if req.Operation != admissionv1.Create {
		return nil
	}
	if a.Name == "" {
		return fmt.Errorf("metadata.name is required: the Approval's stamp covers its name, which the API server has not generated yet when the webhook stamps (write metadata.name instead of metadata.generateName %q)", a.GenerateName)
	}
	if a.Spec.Approver != nil {
		if why := mismatch(a.Spec.Approver, req.UserInfo); why != "" {
			return fmt.Errorf("%s: leave spec.approver out, the API server's authentication fills it in", why)
		}
	}
	if a.Spec.Stamp != nil {
		return fmt.Errorf("spec.stamp is written by the Approval webhook: leave it out")
	}
	a.Spec.Approver = approverOf(req.UserInfo)
	var ar v1alpha1.ApprovalRequest
	switch err := w.Reader.Get(ctx, client.ObjectKey{Namespace: a.Namespace, Name: a.Spec.RequestRef.Name}, &ar); {
	case apierrors.IsNotFound(err):
		if a.Spec.RequestRef.UID != "" {
			return fmt.Errorf("spec.requestRef.uid is %q but no ApprovalRequest %s exists in namespace %s: leave spec.requestRef.uid out", a.Spec.RequestRef.UID, a.Spec.RequestRef.Name, a.Namespace)
		}
		// Left empty: the reconciler rejects an Approval made before its request.
	case err != nil:
		return fmt.Errorf("reading ApprovalRequest %s/%s to bind the Approval to it: %w", a.Namespace, a.Spec.RequestRef.Name, err)
	default:
		if a.Spec.RequestRef.UID != "" && a.Spec.RequestRef.UID != string(ar.UID) {
			return fmt.Errorf("spec.requestRef.uid is %q but ApprovalRequest %s has uid %s: leave spec.requestRef.uid out", a.Spec.RequestRef.UID, ar.Name, ar.UID)
		}
		a.Spec.RequestRef.UID = string(ar.UID)
	}
	a.Spec.Stamp = w.Key.Stamp(a, w.now())
	return nil
}

// ValidateCreate checks that spec.approver is exactly the authenticated user and that
// spec.stamp verifies over the Approval as it will be stored (both written by Default).
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
	if err := w.Key.Verify(a); err != nil {
		return nil, fmt.Errorf("%w: the mutating webhook mapproval.reversi.dev stamps it, and nothing may change the Approval after it (check the MutatingWebhookConfiguration)", err)
	}
	return nil, nil
}

// ValidateUpdate refuses a status write by anyone but the controller, and a changed approver,
// request reference or stamp (the CRD's CEL rule already keeps spec as it was;
// this holds even if that rule is edited away).
func (w *ApprovalWebhook) ValidateUpdate(ctx context.Context, old, a *v1alpha1.Approval) (admission.Warnings, error) {
	req, err := admission.RequestFromContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("the admission request is not available: %w", err)
	}
	if req.SubResource == "status" {
		// The verdict is the controller's alone (issue 16 review: a status written by someone
		// else must not pass for one).
		if w.Controller == "" || req.UserInfo.Username != w.Controller {
			return nil, fmt.Errorf("Approval %s/%s: status: only the controller (%s) writes an Approval's result; you are %q", a.Namespace, a.Name, w.Controller, req.UserInfo.Username)
		}
		return nil, nil
	}
	if (old.Spec.Approver == nil) != (a.Spec.Approver == nil) ||
		(old.Spec.Approver != nil && (old.Spec.Approver.Username != a.Spec.Approver.Username || old.Spec.Approver.UID != a.Spec.Approver.UID || !sameSet(old.Spec.Approver.Groups, a.Spec.Approver.Groups))) {
		return nil, fmt.Errorf("spec.approver is immutable: create a new Approval instead")
	}
	if old.Spec.RequestRef != a.Spec.RequestRef || !equalStamp(old.Spec.Stamp, a.Spec.Stamp) {
		return nil, fmt.Errorf("spec.requestRef and spec.stamp are immutable: create a new Approval instead")
	}
	return nil, nil
}

// ValidateDelete allows deletion (withdrawing a vote the controller has not counted yet).
func (w *ApprovalWebhook) ValidateDelete(context.Context, *v1alpha1.Approval) (admission.Warnings, error) {
	return nil, nil
}
