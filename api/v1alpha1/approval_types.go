package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Approval decisions.
const (
	DecisionApprove = "Approve"
	DecisionDeny    = "Deny"
)

// Approval results.
const (
	// ResultCounted: the approval counted towards its request's decision.
	ResultCounted = "Counted"
	// ResultRejected: the approval did not count; status.message says why.
	ResultRejected = "Rejected"
)

// ApprovalSpec is one human decision on an ApprovalRequest. Immutable.
type ApprovalSpec struct {
	// RequestRef names the ApprovalRequest (in this namespace) decided on. The admission
	// webhook stamps its uid: an Approval is bound to the request that existed when it was
	// created, and one made before its request (or for another uid) is Rejected.
	// +required
	RequestRef ApprovalRequestReference `json:"requestRef"`

	// Decision is Approve or Deny. One Deny denies the request.
	// +required
	// +kubebuilder:validation:Enum=Approve;Deny
	Decision string `json:"decision"`

	// Reason for the decision, such as a ticket reference. Recorded in the ledger.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`

	// Approver is who made the decision. The admission webhook sets it from the API server's
	// authentication of the request that created the object; a value that differs from it is
	// refused. Leave it out.
	// +optional
	Approver *Approver `json:"approver,omitempty"`

	// Stamp is the admission webhook's seal over this decision (see ApprovalStamp). The
	// controller counts only Approvals whose stamp it can verify. Leave it out.
	// +optional
	Stamp *ApprovalStamp `json:"stamp,omitempty"`
}

// ApprovalRequestReference names an ApprovalRequest in the Approval's namespace, and the uid
// it had when the Approval was created.
type ApprovalRequestReference struct {
	// Name of the ApprovalRequest.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// UID of the ApprovalRequest when the Approval was created, stamped by the admission
	// webhook; empty when no request of that name existed then. A value written by the user
	// that differs from the request's is refused. Leave it out.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	UID string `json:"uid,omitempty"`
}

// ApprovalStamp is an HMAC-SHA256 the admission webhook computes, with a key only the
// controller can read (the Secret named by `reversi controller --stamp-key-secret`), over the
// Approval's namespace and name, the request's name and uid, the decision, the approver
// (username, uid, groups) and At. Without the webhook no valid stamp can be made, so an
// Approval created while the webhook configurations are missing is never counted (fail
// closed). Source: issue 16.
type ApprovalStamp struct {
	// At is when the webhook stamped the Approval (RFC 3339, seconds). The controller counts
	// a stamp only when the Approval's creationTimestamp is within a minute of it, so a stamp
	// copied onto a later Approval is refused.
	// +required
	At metav1.Time `json:"at"`

	// KeyID names the stamp key: the first 16 hex digits of its SHA-256.
	// +required
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{16}$`
	KeyID string `json:"keyID"`

	// MAC is the HMAC-SHA256, unpadded base64url (43 characters).
	// +required
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_-]{43}$`
	MAC string `json:"mac"`
}

// Approver is the authenticated user who created an Approval.
type Approver struct {
	// Username as the API server authenticated it.
	// +required
	// +kubebuilder:validation:MinLength=1
	Username string `json:"username"`

	// UID of the user, when the authenticator provides one.
	// +optional
	UID string `json:"uid,omitempty"`

	// Groups the user belongs to; the request's roles are matched against them.
	// +optional
	// +listType=atomic
	Groups []string `json:"groups,omitempty"`
}

// ApprovalStatus says whether an Approval counted.
type ApprovalStatus struct {
	// ObservedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready (True once the approval is counted or rejected), Reconciling and
	// Stalled (kstatus).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// Result is Counted or Rejected.
	// +optional
	// +kubebuilder:validation:Enum=Counted;Rejected
	Result string `json:"result,omitempty"`

	// Message says why an approval was rejected (the approver lacks the request's roles, is
	// the run's own actor or an alias of it, already decided, the request is already decided
	// or expired, the Approval was made before its request or for another uid, or it carries
	// no valid stamp of the admission webhook).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=apr,categories=reversi
// +kubebuilder:printcolumn:name="Request",type=string,JSONPath=`.spec.requestRef.name`
// +kubebuilder:printcolumn:name="Decision",type=string,JSONPath=`.spec.decision`
// +kubebuilder:printcolumn:name="Approver",type=string,JSONPath=`.spec.approver.username`
// +kubebuilder:printcolumn:name="Result",type=string,JSONPath=`.status.result`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// Approval is a human decision on an ApprovalRequest, made with `kubectl apply`. The rules:
// the approver must hold one of the request's roles when roles are set; the run's own actor
// cannot approve (same username, same uid, or a username equal to the actor's e-mail); the
// quorum counts distinct persons (usernames; two usernames with one uid are one person); one
// Deny denies; only Approvals stamped by the admission webhook, created after their request
// and for its uid, count. The spec never changes: to change your mind, create another
// Approval (a Deny still denies).
type Approval struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the decision. Immutable.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: an Approval records one decision; create a new Approval instead"
	Spec ApprovalSpec `json:"spec"`

	// Status says whether the approval counted, written by the controller.
	// +optional
	Status ApprovalStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ApprovalList is a list of Approval.
type ApprovalList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the approvals.
	Items []Approval `json:"items"`
}

// GetConditions returns the status conditions.
func (in *Approval) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *Approval) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }

func init() {
	SchemeBuilder.Register(&Approval{}, &ApprovalList{})
}
