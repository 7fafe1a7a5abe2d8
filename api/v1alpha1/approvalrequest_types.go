package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ApprovalRequest phases.
const (
	ApprovalPending   = "Pending"
	ApprovalApproved  = "Approved"
	ApprovalDenied    = "Denied"
	ApprovalExpired   = "Expired"
	ApprovalEscalated = "Escalated"
)

// MaxCountedApprovals bounds ApprovalRequest status.approvals and status.rejected.
const MaxCountedApprovals = 32

// ApprovalRequestSpec is the call that waits for a human, as the gateway saw it. Immutable.
//
// +kubebuilder:validation:XValidation:rule="!has(self.onTimeout) || self.onTimeout != 'escalate' || (has(self.escalateTo) && size(self.escalateTo) > 0)",message="onTimeout escalate needs escalateTo: name the roles asked next",fieldPath=".escalateTo"
// +kubebuilder:validation:XValidation:rule="!has(self.quorum) || self.quorum <= 1 || (has(self.roles) && size(self.roles) > 0)",message="a quorum above 1 needs roles",fieldPath=".quorum"
type ApprovalRequestSpec struct {
	// Tool is the name of the tool the held call invokes.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:/-]+$`
	Tool string `json:"tool"`

	// ArgumentsDigest is the SHA-256 of the call's arguments as canonical JSON,
	// `sha256:<64 hex>`. An approval is for exactly these arguments: a retry with other
	// arguments needs a new request.
	// +required
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	ArgumentsDigest string `json:"argumentsDigest"`

	// ArgumentsPreview is the call's arguments as JSON with the manifest's audit.redaction
	// paths (and anything that looks like a secret) replaced, for the approver to read.
	// Truncated to 4096 characters.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	ArgumentsPreview string `json:"argumentsPreview,omitempty"`

	// Run is the name of the ReversiRun (in this namespace) the call belongs to.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Run string `json:"run"`

	// Actor is the principal of the run, mapped from the agent's credential as the API server
	// maps the same OIDC token (username claim and prefix). It cannot approve its own request.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Actor string `json:"actor"`

	// ActorUID is the actor's uid claim (or its API key's uid), when the credential has one.
	// An approver with the same uid is the actor under another name and is Rejected.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ActorUID string `json:"actorUID,omitempty"`

	// ActorEmail is the actor's e-mail claim (or its API key's email), when the credential has
	// one. An approver whose username is this address (case-insensitive) is Rejected.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ActorEmail string `json:"actorEmail,omitempty"`

	// Gateway is the name of the ReversiGateway (in this namespace) holding the call.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Gateway string `json:"gateway"`

	// Reason is why the call needs approval (the manifest rule, or the policy) and, when the
	// client sent one, why the agent made the call.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	Reason string `json:"reason,omitempty"`

	// Roles an approver must hold one of, as Kubernetes groups. Empty: any user allowed to
	// create Approvals in the namespace may approve.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	Roles []string `json:"roles,omitempty"`

	// Quorum is how many distinct persons must approve, 1 to 10 (distinct usernames, and no
	// uid counted twice). Default 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10
	Quorum *int32 `json:"quorum,omitempty"`

	// ExpiresAt is when the request times out (the manifest's approval.timeout after the
	// call). Unset: it waits until decided.
	// +optional
	ExpiresAt *metav1.Time `json:"expiresAt,omitempty"`

	// OnTimeout is deny (the default: the request becomes Expired) or escalate (it becomes
	// Escalated and escalateTo may decide).
	// +optional
	// +kubebuilder:default=deny
	// +kubebuilder:validation:Enum=deny;escalate
	OnTimeout string `json:"onTimeout,omitempty"`

	// EscalateTo are the roles (Kubernetes groups) asked after the timeout when onTimeout is
	// escalate.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	EscalateTo []string `json:"escalateTo,omitempty"`

	// Risk is the tool's risk from its manifest, for the approver.
	// +optional
	Risk *RiskSummary `json:"risk,omitempty"`
}

// Digest is "sha256:<hex>" of the spec's JSON encoding (encoding/json of this Go type: fields
// in declaration order, times in RFC 3339 seconds), so the spec a create returned and the spec
// read back later digest alike when, and only when, they are equal. The gateway records it
// when it creates a request; the controller's signed decision (status.decision) covers it.
func (in *ApprovalRequestSpec) Digest() string {
	b, err := json.Marshal(in)
	if err != nil {
		return "" // never: the spec is plain data; "" matches no recorded digest
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// RiskSummary is the risk a tool's manifest records.
type RiskSummary struct {
	// DataClass, such as pii or financial.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	DataClass string `json:"dataClass,omitempty"`

	// BlastRadius is low, medium, high or critical.
	// +optional
	// +kubebuilder:validation:Enum=low;medium;high;critical
	BlastRadius string `json:"blastRadius,omitempty"`

	// Environment, as recorded in the manifest.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Environment string `json:"environment,omitempty"`
}

// ApprovalRequestStatus is the decision on an ApprovalRequest, written by the controller. The
// gateway reads the phase, and honours Approved only with a valid decision signature.
type ApprovalRequestStatus struct {
	// ObservedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready (True once decided), Reconciling and Stalled (kstatus).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// Phase is Pending until decided, then Approved (quorum reached), Denied (one Deny),
	// Expired (past expiresAt with onTimeout deny) or Escalated (past expiresAt with onTimeout
	// escalate; escalateTo may still approve or deny, which moves it to Approved or Denied).
	// +optional
	// +kubebuilder:validation:Enum=Pending;Approved;Denied;Expired;Escalated
	Phase string `json:"phase,omitempty"`

	// Approvals are the Approval objects that were counted, at most 32.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	Approvals []CountedApproval `json:"approvals,omitempty"`

	// ApprovedCount is the number of distinct persons that approved.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ApprovedCount int32 `json:"approvedCount,omitempty"`

	// Rejected are the first 32 Approval objects that did not count, with why; the gateway
	// journals them as records of the run.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	Rejected []RejectedApproval `json:"rejected,omitempty"`

	// RejectedCount is the number of Approvals rejected, including those not listed.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RejectedCount int32 `json:"rejectedCount,omitempty"`

	// DecidedAt is when the phase left Pending for Approved, Denied or Expired.
	// +optional
	DecidedAt *metav1.Time `json:"decidedAt,omitempty"`

	// EscalatedAt is when the request was escalated.
	// +optional
	EscalatedAt *metav1.Time `json:"escalatedAt,omitempty"`

	// Message explains the phase in words (who decided, or what is still missing).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// Decision is the controller's signature of an Approved phase (set with it): the gateway
	// lets a held call through only when it verifies with one of the controller's public keys
	// over this object's namespace, name, uid, spec digest, phase, decidedAt and approving
	// usernames (pkg/approvalsig), so that whoever may write this status cannot approve.
	// +optional
	Decision *SignedDecision `json:"decision,omitempty"`

	// Seal is the controller's HMAC-SHA256 (its Approval stamp key) over the decision state
	// this status holds (phase, counted and rejected Approvals, counts and times), as
	// `<keyID>:<unpadded base64url>`. The controller builds only on a status it sealed: one
	// written by anyone else is never counted on nor signed (issue 16 review).
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Seal string `json:"seal,omitempty"`
}

// SignedDecision is the controller's Ed25519 signature of an ApprovalRequest's decision.
type SignedDecision struct {
	// KeyID is the fingerprint of the controller key that signed (16 hex characters).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	KeyID string `json:"keyID"`

	// Signature is the Ed25519 signature, base64 (standard encoding), of the message
	// `reversi-approval-decision:v1` NL namespace NL name NL uid NL spec digest NL phase NL
	// decidedAt (RFC 3339) NL the sorted distinct approving usernames joined by ",".
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Signature string `json:"signature"`

	// SignedAt is when the controller signed (not covered by the signature).
	// +optional
	SignedAt *metav1.Time `json:"signedAt,omitempty"`
}

// CountedApproval is one Approval that counted towards a decision.
type CountedApproval struct {
	// Name of the Approval object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Username of the approver, as the API server authenticated it.
	// +required
	// +kubebuilder:validation:MinLength=1
	Username string `json:"username"`

	// UID of the approver, as the API server authenticated it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	UID string `json:"uid,omitempty"`

	// Groups of the approver, as the API server authenticated them.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Groups []string `json:"groups,omitempty"`

	// Decision is Approve or Deny.
	// +required
	// +kubebuilder:validation:Enum=Approve;Deny
	Decision string `json:"decision"`

	// Reason the approver gave (spec.reason of the Approval).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`

	// CountedAt is when the controller counted it.
	// +required
	CountedAt metav1.Time `json:"countedAt"`
}

// RejectedApproval is one Approval that did not count, and why.
type RejectedApproval struct {
	// Name of the Approval object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Username of the approver as stamped; empty when the Approval carries no valid stamp.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Username string `json:"username,omitempty"`

	// Groups of the approver as stamped.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Groups []string `json:"groups,omitempty"`

	// Decision is Approve or Deny.
	// +required
	// +kubebuilder:validation:Enum=Approve;Deny
	Decision string `json:"decision"`

	// Reason the approver gave.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`

	// Message says why it did not count.
	// +required
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message"`

	// RejectedAt is when the controller judged it.
	// +required
	RejectedAt metav1.Time `json:"rejectedAt"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=apreq,categories=reversi
// +kubebuilder:printcolumn:name="Tool",type=string,JSONPath=`.spec.tool`
// +kubebuilder:printcolumn:name="Run",type=string,JSONPath=`.spec.run`
// +kubebuilder:printcolumn:name="Actor",type=string,JSONPath=`.spec.actor`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Approved",type=integer,JSONPath=`.status.approvedCount`
// +kubebuilder:printcolumn:name="Quorum",type=integer,JSONPath=`.spec.quorum`
// +kubebuilder:printcolumn:name="Expires",type=string,JSONPath=`.spec.expiresAt`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.spec.reason`,priority=1

// ApprovalRequest is a tool call a gateway holds until humans decide. Gateways create it;
// approvers answer with Approval objects; the controller counts them and sets the phase, which
// the gateway reads. The spec never changes.
type ApprovalRequest struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the held call. Immutable.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: an ApprovalRequest describes one held call; create a new request instead"
	Spec ApprovalRequestSpec `json:"spec"`

	// Status is the decision, written by the controller.
	// +optional
	Status ApprovalRequestStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ApprovalRequestList is a list of ApprovalRequest.
type ApprovalRequestList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the requests.
	Items []ApprovalRequest `json:"items"`
}

// GetConditions returns the status conditions.
func (in *ApprovalRequest) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *ApprovalRequest) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }

func init() {
	SchemeBuilder.Register(&ApprovalRequest{}, &ApprovalRequestList{})
}
