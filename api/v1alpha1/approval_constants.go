package v1alpha1

// Annotations and reasons of ApprovalRequest and Approval (issue 8).
const (
	// AnnotationConsumedAt (ApprovalRequest) mirrors, for people, when the approved call's
	// retry went through (RFC 3339 time). It decides nothing: "used once" is recorded in the
	// gateway's store, in the transaction of the call's intent (issue 16).
	AnnotationConsumedAt = "reversi.dev/consumedAt"
	// AnnotationConsumedBy (ApprovalRequest) names the gateway replica that consumed it.
	AnnotationConsumedBy = "reversi.dev/consumedBy"

	// ReasonWaitingForApprovals (ApprovalRequest Ready=False): pending or escalated; the
	// message says how many approvals are still missing and from which roles.
	ReasonWaitingForApprovals = "WaitingForApprovals"
	// ReasonApproved, ReasonDenied, ReasonExpired (ApprovalRequest Ready=True): the phase
	// reached. ReasonEscalated is the phase word of an escalated request.
	ReasonApproved  = "Approved"
	ReasonDenied    = "Denied"
	ReasonExpired   = "Expired"
	ReasonEscalated = "Escalated"
	// The events of an approval's life (issue 24), on the ApprovalRequest: EventApprovalRequested
	// (Normal, by the gateway that created it), EventApprovalApproved (Normal),
	// EventApprovalDenied and EventApprovalExpired (Warning) and EventApprovalEscalated (Normal:
	// the request now waits for escalateTo), by the controller when the phase changes. The note
	// starts with the tool, the run and its actor, then says who decided, or who is waiting.
	EventApprovalRequested = "ApprovalRequested"
	EventApprovalApproved  = "ApprovalApproved"
	EventApprovalDenied    = "ApprovalDenied"
	EventApprovalExpired   = "ApprovalExpired"
	EventApprovalEscalated = "ApprovalEscalated"
	// ReasonCounted and ReasonRejected (Approval Ready=True, and events): the result.
	ReasonCounted  = "Counted"
	ReasonRejected = "Rejected"
	// ReasonRequestNotFound (Approval Ready=False): spec.requestRef names no ApprovalRequest
	// in the namespace. An Approval made before its request is never counted: when a request
	// of that name appears, the Approval is Rejected (issue 16).
	ReasonRequestNotFound = "RequestNotFound"
	// ReasonApprovalNotStamped (ApprovalRequest Ready=False, and events): an Approval of the
	// request carries no stamp the controller can verify, so it was not counted; the message
	// says to check that the Approval webhook configurations are installed.
	ReasonApprovalNotStamped = "ApprovalNotStamped"
	// ReasonDecisionNotSigned (an event of the request): its status says Approved but its
	// Approvals do not reach that decision, so the controller does not sign it (status.decision)
	// and the gateway keeps the call held.
	ReasonDecisionNotSigned = "DecisionNotSigned"

	// ReasonStatusNotSealed (ApprovalRequest Stalled=True, Ready=False): the status carries no
	// seal of the controller, so someone else wrote it; the controller neither counts on it nor
	// signs it, and the call stays held (a new call makes a new request).
	ReasonStatusNotSealed = "StatusNotSealed"

	// AnnotationCreatedBy (ApprovalRequest, ReversiRun) is the username that created the
	// object, stamped by the admission webhook; a different value is refused on create and
	// the annotation cannot change. The webhook admits a create only from the ServiceAccount
	// of the ReversiGateway named by spec.gateway (or an identity the install names with
	// `reversi controller --gateway-identity`).
	AnnotationCreatedBy = "reversi.dev/created-by"
)
