package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReversiRun phases.
const (
	RunActive              = "Active"
	RunIdle                = "Idle"
	RunRollingBack         = "RollingBack"
	RunRolledBack          = "RolledBack"
	RunPartiallyRolledBack = "PartiallyRolledBack"
)

// Phases of status.rollback of a confirmed rollback (issue 8: "Pending → Running → Succeeded |
// PartiallySucceeded | Failed").
const (
	RollbackPending            = "Pending"
	RollbackRunning            = "Running"
	RollbackSucceeded          = "Succeeded"
	RollbackPartiallySucceeded = "PartiallySucceeded"
	RollbackFailed             = "Failed"
)

// Bounds of ReversiRun status lists.
const (
	// MaxRunSteps bounds status.steps (the most recent steps) and status.rollback.steps.
	MaxRunSteps = 50
	// MaxPendingApprovals bounds status.pendingApprovals.
	MaxPendingApprovals = 50
)

// ReversiRunSpec is one agent session. The gateway sets actor and gateway when it creates the
// run; an operator sets rollback to undo it.
//
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.rollback) || !oldSelf.rollback.confirm || (has(self.rollback) && self.rollback.confirm)",message="a confirmed rollback cannot be withdrawn: it may already have run compensations",fieldPath=".rollback"
type ReversiRunSpec struct {
	// Actor is the principal the session belongs to (from its credential, or the gateway's
	// actor for unauthenticated sessions). Immutable.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="actor is immutable"
	Actor string `json:"actor"`

	// Gateway is the name of the ReversiGateway (in this namespace) that runs the session.
	// Immutable.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="gateway is immutable"
	Gateway string `json:"gateway"`

	// Rollback asks the gateway to undo the run: each compensation on the upstream, newest
	// first. Without confirm it is a dry run: status.rollback shows the plan and nothing is
	// executed.
	// +optional
	Rollback *RunRollback `json:"rollback,omitempty"`
}

// RunRollback is an operator's request to undo a run.
type RunRollback struct {
	// Confirm executes the rollback. False (the default) only plans it.
	// +optional
	Confirm bool `json:"confirm,omitempty"`

	// ApproveCompensations also approves the compensations whose manifests require approval;
	// without it they are reported as not_undone.
	// +optional
	ApproveCompensations bool `json:"approveCompensations,omitempty"`
}

// ReversiRunStatus is the audit view of a run, updated by the gateway in batches. The full
// ledger stays in the gateway's store; the lists here are bounded.
type ReversiRunStatus struct {
	// ObservedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, Reconciling (a rollback in progress) and Stalled (kstatus).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// Phase is Active (calls are being made), Idle (no call for a while), RollingBack,
	// RolledBack (every step undone or nothing to undo) or PartiallyRolledBack (some steps
	// could not be undone; see rollback.steps).
	// +optional
	// +kubebuilder:validation:Enum=Active;Idle;RollingBack;RolledBack;PartiallyRolledBack
	Phase string `json:"phase,omitempty"`

	// StartedAt is when the session's first call was journaled.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`

	// LastActivityAt is when the last call was journaled.
	// +optional
	LastActivityAt *metav1.Time `json:"lastActivityAt,omitempty"`

	// StepCount is the number of steps (tool calls) journaled, including those no longer
	// listed in steps.
	// +optional
	// +kubebuilder:validation:Minimum=0
	StepCount int64 `json:"stepCount,omitempty"`

	// Counts are the steps per outcome.
	// +optional
	Counts RunCounts `json:"counts,omitempty"`

	// PendingApprovals are the names of the ApprovalRequests the run waits for, at most 50.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=50
	PendingApprovals []string `json:"pendingApprovals,omitempty"`

	// Steps are the last 50 steps, oldest first.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=50
	Steps []RunStep `json:"steps,omitempty"`

	// Rollback reports the plan or the progress of spec.rollback.
	// +optional
	Rollback *RunRollbackStatus `json:"rollback,omitempty"`
}

// RunCounts counts a run's steps per outcome.
type RunCounts struct {
	// Succeeded steps.
	// +optional
	Succeeded int64 `json:"succeeded,omitempty"`
	// Failed steps (the upstream returned an error result).
	// +optional
	Failed int64 `json:"failed,omitempty"`
	// Uncertain steps (transport error or timeout: the upstream may have acted).
	// +optional
	Uncertain int64 `json:"uncertain,omitempty"`
	// Blocked steps (refused by the gateway in enforce mode).
	// +optional
	Blocked int64 `json:"blocked,omitempty"`
	// WouldBlock steps (would have been blocked; ran in observe or advise mode).
	// +optional
	WouldBlock int64 `json:"wouldBlock,omitempty"`
	// PendingApproval steps (held for an ApprovalRequest).
	// +optional
	PendingApproval int64 `json:"pendingApproval,omitempty"`
}

// RunStep is one journaled tool call.
type RunStep struct {
	// Seq is the step's position in the run, from 1.
	// +required
	// +kubebuilder:validation:Minimum=1
	Seq int64 `json:"seq"`

	// Tool called.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Tool string `json:"tool"`

	// Outcome is succeeded, failed, uncertain, blocked, would_block or pending_approval for a
	// tool call, and approval for a decision record of the run's ledger (see approval).
	// +required
	// +kubebuilder:validation:Enum=succeeded;failed;uncertain;blocked;would_block;pending_approval;approval
	Outcome string `json:"outcome"`

	// At is when the outcome was journaled.
	// +required
	At metav1.Time `json:"at"`

	// ApprovalRequest names the request the step waits or waited for.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ApprovalRequest string `json:"approvalRequest,omitempty"`

	// Message is the reason of a block, or a note (truncated to 512 characters).
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Message string `json:"message,omitempty"`

	// Approval is the decision record of an approval outcome.
	// +optional
	Approval *StepApproval `json:"approval,omitempty"`
}

// StepApproval is a decision record of the run's ledger (issue 16): a counted or rejected
// Approval, a phase change of an ApprovalRequest, a consumption, or a request the gateway
// refused to honour.
type StepApproval struct {
	// Event is requested, counted, rejected, approved, denied, expired, escalated, consumed,
	// replay_refused or ignored (a request that is not exactly as the gateway created it).
	// +required
	// +kubebuilder:validation:Enum=requested;counted;rejected;approved;denied;expired;escalated;consumed;replay_refused;ignored
	Event string `json:"event"`

	// Approver is the username of a counted or rejected Approval.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Approver string `json:"approver,omitempty"`

	// Groups of the approver.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Groups []string `json:"groups,omitempty"`

	// Decision is Approve or Deny for a counted or rejected Approval.
	// +optional
	// +kubebuilder:validation:Enum=Approve;Deny
	Decision string `json:"decision,omitempty"`

	// Reason the approver gave, or why the record was made (truncated to 512 characters).
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Reason string `json:"reason,omitempty"`
}

// RunRollbackStatus is the plan or the progress of a rollback.
type RunRollbackStatus struct {
	// DryRun is true while the rollback is only planned (spec.rollback.confirm is false).
	// +optional
	DryRun bool `json:"dryRun,omitempty"`

	// Phase of a confirmed rollback: Pending (asked for, not claimed yet), Running (claimed
	// by the gateway replica named in replica), then Succeeded (every step undone),
	// PartiallySucceeded (some steps undone) or Failed (none undone, or the rollback could
	// not run; see message). Empty for a dry run.
	// +optional
	// +kubebuilder:validation:Enum=Pending;Running;Succeeded;PartiallySucceeded;Failed
	Phase string `json:"phase,omitempty"`

	// ObservedGeneration is the metadata.generation whose spec.rollback this status answers.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Replica is the gateway replica that claimed (and runs or ran) the rollback.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Replica string `json:"replica,omitempty"`

	// Message sums the rollback up, or says why it failed (truncated to 1024 characters).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// StartedAt is when the confirmed rollback started.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`

	// CompletedAt is when the rollback finished.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`

	// Steps are the undo steps, newest step first (the order they run in), at most 50.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=50
	Steps []RollbackStep `json:"steps,omitempty"`
}

// RollbackStep is the undo of one step.
type RollbackStep struct {
	// Seq of the step undone.
	// +required
	// +kubebuilder:validation:Minimum=1
	Seq int64 `json:"seq"`

	// Tool of the step undone.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Tool string `json:"tool"`

	// Compensation is the tool that undoes it, when its manifest declares one.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	Compensation string `json:"compensation,omitempty"`

	// Result is compensated (undone, no read-back declared), verified (undone and read back),
	// verification_failed (undone but the read-back did not match), unrecoverable (no undo
	// exists, or the compensation failed) or not_undone (skipped: a dry run, a compensation
	// needing approval without approveCompensations, or nothing to undo). Empty while planned.
	// +optional
	// +kubebuilder:validation:Enum=compensated;verified;verification_failed;unrecoverable;not_undone
	Result string `json:"result,omitempty"`

	// Message explains the result (truncated to 512 characters).
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Message string `json:"message,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rrun,categories=reversi
// +kubebuilder:printcolumn:name="Actor",type=string,JSONPath=`.spec.actor`
// +kubebuilder:printcolumn:name="Gateway",type=string,JSONPath=`.spec.gateway`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Steps",type=integer,JSONPath=`.status.stepCount`
// +kubebuilder:printcolumn:name="Blocked",type=integer,JSONPath=`.status.counts.blocked`,priority=1
// +kubebuilder:printcolumn:name="Pending",type=integer,JSONPath=`.status.counts.pendingApproval`,priority=1
// +kubebuilder:printcolumn:name="Failed",type=integer,JSONPath=`.status.counts.failed`,priority=1
// +kubebuilder:printcolumn:name="Rollback",type=string,JSONPath=`.status.rollback.phase`
// +kubebuilder:printcolumn:name="Last Activity",type=date,JSONPath=`.status.lastActivityAt`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// ReversiRun is one agent session through a gateway, created and updated by the gateway:
// `kubectl get reversiruns` is the audit view. Setting spec.rollback undoes the run.
type ReversiRun struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the session and the operator's rollback request.
	// +required
	Spec ReversiRunSpec `json:"spec"`

	// Status is the audit view, written by the gateway.
	// +optional
	Status ReversiRunStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ReversiRunList is a list of ReversiRun.
type ReversiRunList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the runs.
	Items []ReversiRun `json:"items"`
}

// GetConditions returns the status conditions.
func (in *ReversiRun) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *ReversiRun) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }

func init() {
	SchemeBuilder.Register(&ReversiRun{}, &ReversiRunList{})
}
