package v1alpha1

// Labels, annotations and reasons of ReversiGateway and its pods (DESIGN.md "ReversiGateway",
// issue 9).
const (
	// LabelGateway on a gateway's owned objects and pods names the ReversiGateway.
	LabelGateway = "reversi.dev/gateway"

	// AnnotationManifestDigest on a gateway pod's Lease (coordination.k8s.io/v1, named as the
	// pod, in its namespace, created and controlled by the ReversiGateway): the digest
	// (`sha256:<hex>`, the bundle digest of pkg/bundle) of the manifests the pod enforces.
	// The pod writes it (a merge patch, with spec.holderIdentity and spec.renewTime) after
	// every load; the controller counts the ready pods whose Lease holds the desired one. The
	// same annotation on a Pod means nothing: pods' annotations are writable by anyone with
	// pods patch.
	AnnotationManifestDigest = "reversi.dev/manifest-digest"
	// AnnotationManifestRevision on a gateway pod's Lease: the source revision of the
	// manifests it enforces (informational; from verified snapshots only).
	AnnotationManifestRevision = "reversi.dev/manifest-revision"
	// AnnotationManifestError on a gateway pod's Lease: why the pod refused the last rendering
	// it saw (it keeps serving the previous one), at most 2048 bytes; absent after a
	// successful load.
	AnnotationManifestError = "reversi.dev/manifest-error"
	// UnreportedDigest stands for the digest of a ready pod without a report (no Lease of the
	// ReversiGateway, or none written yet) in status.manifests.otherDigests: `<pod>=unreported`.
	UnreportedDigest = "unreported"
	// AnnotationConfigDigest on a gateway's pod template: the digest of the rendered
	// gateway.yaml and container settings, so that a change rolls the pods (gateway.yaml is
	// read at start only).
	AnnotationConfigDigest = "reversi.dev/config-digest"
)

// Condition reasons of ReversiGateway.
const (
	// ReasonDuplicateTool: two manifest sources of a gateway define the same tool. The
	// controller does not pick one: it keeps the last good rendering until one source drops it.
	ReasonDuplicateTool = "DuplicateTool"
	// ReasonSourceNotReady: a referenced ManifestRegistry does not exist or has not rendered a
	// verified artifact yet.
	ReasonSourceNotReady = "SourceNotReady"
	// ReasonRolloutInProgress: the Deployment is rolling out, or not every ready pod serves the
	// desired manifests yet.
	ReasonRolloutInProgress = "RolloutInProgress"
	// ReasonApplyFailed: writing an owned object (ConfigMap, RBAC, Deployment, Service) failed.
	ReasonApplyFailed = "ApplyFailed"
	// ReasonImageNotAllowed: the gateway's image (spec.image, or the controller's default) does
	// not match the patterns the controller allows (`reversi controller --gateway-images`).
	// Nothing is rendered or changed (the Deployment keeps the image it had) until spec.image
	// is one the controller allows (issue 17; admission refuses such a spec too).
	ReasonImageNotAllowed = "ImageNotAllowed"
)

// Event reasons of ReversiGateway.
const (
	// EventManifestsRendered (Normal): a new manifest set was rendered into
	// `<gateway>-manifests`; the note names the digest and the sources' revisions.
	EventManifestsRendered = "ManifestsRendered"
)
