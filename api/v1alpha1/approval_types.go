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
	// RequestRef names the ApprovalRequest (in this namespace) decided on.
	// +required
	RequestRef LocalObjectReference `json:"requestRef"`

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
	// the run's own actor, already decided, the request is already decided or expired, …).
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
// cannot approve; the quorum counts distinct usernames; one Deny denies. The spec never
// changes: to change your mind, create another Approval (a Deny still denies).
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
