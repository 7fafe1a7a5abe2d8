package v1alpha1

// Condition types. Every kind reports Ready as its summary; Reconciling and Stalled follow
// kstatus and are present only while true (a controller removes them otherwise). The other
// types are specific to one or two kinds. Reasons are CamelCase; messages say what to do.
const (
	// ConditionReady summarises the object: True when the last reconcile of the current
	// generation succeeded and its result is in use.
	ConditionReady = "Ready"
	// ConditionReconciling is True while the controller works towards the desired state
	// (a fetch in progress, a new generation not handled yet). kstatus: in progress.
	ConditionReconciling = "Reconciling"
	// ConditionStalled is True when the controller cannot make progress without a change
	// to the spec or to a referenced object (an invalid spec, a missing key): it does not
	// retry until something changes. kstatus: failed.
	ConditionStalled = "Stalled"
	// ConditionSourceVerified (ManifestRegistry) is True when the fetched revision passed every
	// configured check: commit or tag signatures, and the signature of every manifest version.
	ConditionSourceVerified = "SourceVerified"
	// ConditionArtifactInStorage (ManifestRegistry) is True when a verified, valid rendering is
	// stored in the registry's ConfigMaps (possibly of an older revision than the latest one).
	ConditionArtifactInStorage = "ArtifactInStorage"
	// ConditionValid (ToolManifest) is True when the spec passes the full manifest validator.
	ConditionValid = "Valid"
	// ConditionSignatureVerified (ToolManifest) is True when the reversi.dev/signature
	// annotation is a valid signature of the spec's checksum by a trusted key.
	ConditionSignatureVerified = "SignatureVerified"
)

// Condition reasons.
const (
	// ReasonSucceeded: the operation the condition describes succeeded.
	ReasonSucceeded = "Succeeded"
	// ReasonProgressing: work is under way (with Reconciling=True).
	ReasonProgressing = "Progressing"
	// ReasonSuspended: spec.suspend is true; nothing is fetched until it is cleared.
	ReasonSuspended = "Suspended"
	// ReasonInvalidSpec: the spec cannot work as written (with Stalled=True).
	ReasonInvalidSpec = "InvalidSpec"
	// ReasonSecretNotFound: a referenced Secret does not exist.
	ReasonSecretNotFound = "SecretNotFound"
	// ReasonInvalidSecret: a referenced Secret lacks a required key or holds unusable data.
	ReasonInvalidSecret = "InvalidSecret"
	// ReasonAuthenticationFailed: the git server refused the credentials.
	ReasonAuthenticationFailed = "AuthenticationFailed"
	// ReasonFetchFailed: the repository could not be fetched (unreachable, timeout).
	ReasonFetchFailed = "FetchFailed"
	// ReasonRefNotFound: the branch, tag, semver range or commit does not exist.
	ReasonRefNotFound = "RefNotFound"
	// ReasonSourceTooLarge: a limit of the controller was hit: a file under spec.path is
	// larger than --source-max-file-bytes, the files under it total more than
	// --source-max-total-bytes, the git server sent more than the limits allow, or the history
	// back to the last applied commit is too long to check.
	ReasonSourceTooLarge = "SourceTooLarge"
	// ReasonCommitVerificationFailed: the HEAD commit or the tag (or, in mode Chain, a commit
	// since the last applied one) is unsigned or not signed by a key in
	// verify.commit.secretRef.
	ReasonCommitVerificationFailed = "CommitVerificationFailed"
	// ReasonLoadFailed: the manifests could not be read (bad YAML or JSON, missing path,
	// malformed registry folder).
	ReasonLoadFailed = "LoadFailed"
	// ReasonValidationFailed: a manifest breaks a rule of the validator (single or
	// cross-manifest).
	ReasonValidationFailed = "ValidationFailed"
	// ReasonSignatureVerificationFailed: a manifest signature is missing, malformed, made by an
	// untrusted key, or does not match the manifest.
	ReasonSignatureVerificationFailed = "SignatureVerificationFailed"
	// ReasonSignatureMissing (ToolManifest): trusted keys are configured but the object has no
	// reversi.dev/signature annotation.
	ReasonSignatureMissing = "SignatureMissing"
	// ReasonNoTrustedKeys (ToolManifest): no trusted keys are configured for the namespace,
	// so the signature is not checked.
	ReasonNoTrustedKeys = "NoTrustedKeys"
	// ReasonVerified: every configured signature check passed.
	ReasonVerified = "Verified"
	// ReasonVersionDowngrade: the new revision's signed index has a lower sequence than the
	// one applied (a branch reset to an old commit), and no annotation accepts it.
	ReasonVersionDowngrade = "VersionDowngrade"
	// ReasonRevisionNotDescendant: the new commit does not descend from the one applied last
	// (a force-push, or a ref moved to an older commit), and no annotation accepts it.
	ReasonRevisionNotDescendant = "RevisionNotDescendant"
	// ReasonRegistryMismatch: spec.path holds another registry (its signed index.json has
	// another id) than the one applied, and no annotation accepts it.
	ReasonRegistryMismatch = "RegistryMismatch"
	// ReasonStorageFailed: writing the rendered ConfigMaps failed.
	ReasonStorageFailed = "StorageFailed"
	// ReasonOwnershipConflict: an object the controller would render (a ConfigMap,
	// ServiceAccount, Role, RoleBinding, PersistentVolumeClaim, Deployment or Service) exists
	// and is not controlled by this object; the controller adopts nothing, so nothing was
	// written. The message names the object (issue 17). For a gateway pod's Lease the rest is
	// rendered; that Lease is neither written nor named in the gateway's Role, and its pod
	// cannot report (it counts as not loaded).
	ReasonOwnershipConflict = "OwnershipConflict"
)

// Event reasons that are not also condition reasons.
const (
	// EventNewArtifact (Normal): a new revision was verified, validated and stored.
	EventNewArtifact = "NewArtifact"
	// EventRenderingDrift (Warning): a rendered ConfigMap held other data than the controller
	// wrote; the note names the field managers that changed it. The rendering was restored.
	EventRenderingDrift = "RenderingDrift"
	// EventToolManifestDowngrade (Warning): a selected ToolManifest holds an older version of
	// a tool than the gateway served; it is left out of the rendering.
	EventToolManifestDowngrade = "ToolManifestDowngrade"
	// EventRevisionOverrideAccepted (Warning): the reversi.dev/accept-revision annotation made
	// the controller apply a revision the ancestry or sequence checks refused.
	EventRevisionOverrideAccepted = "RevisionOverrideAccepted"
	// EventTagSkipped (Warning): a tag in the semver range, higher than the one applied, was
	// skipped because its signature does not verify (one event per tag, naming it and why).
	EventTagSkipped = "TagSkipped"
)

// Annotations read or written by the controllers.
const (
	// AnnotationSignature on a ToolManifest: the base64 Ed25519 signature of
	// `reversi-manifest:<tool>@<version>:<checksum>`, the same message a signed registry
	// version carries.
	AnnotationSignature = "reversi.dev/signature"
	// AnnotationKeyID on a ToolManifest: the id of the key that made the signature (first 16
	// hex characters of the SHA-256 of its PKIX DER encoding).
	AnnotationKeyID = "reversi.dev/key-id"
	// AnnotationRequestedAt on a ManifestRegistry: any new value (by convention an RFC 3339
	// time) asks for a reconcile now; the value handled last is echoed in
	// status.lastHandledReconcileAt.
	AnnotationRequestedAt = "reversi.dev/requestedAt"
	// AnnotationAcceptRevision on a ManifestRegistry names one exact revision (e.g.
	// main@sha1:<40 hex>) to apply even though it does not descend from the applied one or its
	// index sequence is lower or its registry id another: the audited way to go back. Echoed in
	// status.acceptedRevision and a RevisionOverrideAccepted event, and removed once applied.
	AnnotationAcceptRevision = "reversi.dev/accept-revision"
)
