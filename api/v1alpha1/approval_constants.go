package v1alpha1

// Annotations and reasons of ApprovalRequest and Approval (issue 8).
const (
	// AnnotationConsumedAt (ApprovalRequest) is set once, by the gateway, when the approved
	// call's retry went through (RFC 3339 time). An approval lets exactly one retry pass; the
	// gateway writes it with the object's resourceVersion (optimistic concurrency), so of two
	// replicas racing only one succeeds.
	AnnotationConsumedAt = "reversi.dev/consumedAt"
	// AnnotationConsumedBy (ApprovalRequest) names the gateway replica that consumed it.
	AnnotationConsumedBy = "reversi.dev/consumedBy"

	// ReasonWaitingForApprovals (ApprovalRequest Ready=False): pending or escalated; the
	// message says how many approvals are still missing and from which roles.
	ReasonWaitingForApprovals = "WaitingForApprovals"
	// ReasonApproved, ReasonDenied, ReasonExpired (ApprovalRequest Ready=True) and
	// ReasonEscalated (an event when the request escalates): the phase reached.
	ReasonApproved  = "Approved"
	ReasonDenied    = "Denied"
	ReasonExpired   = "Expired"
	ReasonEscalated = "Escalated"
	// ReasonCounted and ReasonRejected (Approval Ready=True, and events): the result.
	ReasonCounted  = "Counted"
	ReasonRejected = "Rejected"
	// ReasonRequestNotFound (Approval Ready=False): spec.requestRef names no ApprovalRequest
	// in the namespace (yet); the Approval is counted if one appears.
	ReasonRequestNotFound = "RequestNotFound"
)
