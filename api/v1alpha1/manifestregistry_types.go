package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ManifestRegistry format values.
const (
	// FormatRegistry is the seed's signed registry folder: one folder per tool with an
	// index.json and numbered, signed versions (written by `reversi manifests publish`).
	FormatRegistry = "Registry"
	// FormatPlain is a folder of manifest files (*.yaml, *.yml, *.json), read recursively.
	FormatPlain = "Plain"
)

// Commit verification modes.
const (
	// CommitVerifyHEAD verifies the signature of the commit the ref points at.
	CommitVerifyHEAD = "HEAD"
	// CommitVerifyTag verifies the signature of the annotated tag (ref.tag or ref.semver).
	CommitVerifyTag = "Tag"
	// CommitVerifyTagAndHEAD verifies both the tag and the commit it points at.
	CommitVerifyTagAndHEAD = "TagAndHEAD"
	// CommitVerifyChain verifies the commit the ref points at and every commit since the last
	// applied one (the head only on the first apply: trust on first use).
	CommitVerifyChain = "Chain"
)

// Defaults of ManifestRegistrySpec, also applied by the API server.
const (
	DefaultRegistryInterval = 5 * time.Minute
	DefaultRegistryTimeout  = 60 * time.Second
	// MaxInvalidTools bounds status.invalidTools.
	MaxInvalidTools = 50
	// MaxInvalidToolErrors bounds the errors listed for one invalid tool.
	MaxInvalidToolErrors = 10
)

// ManifestRegistrySpec says where the manifests are, how to check them and how often.
//
// +kubebuilder:validation:XValidation:rule="self.format != 'Registry' || (has(self.verify) && has(self.verify.manifestKeysSecretRef))",message="format Registry needs verify.manifestKeysSecretRef: name the Secret with the Ed25519 public keys every version must be signed by (or use format Plain)"
// +kubebuilder:validation:XValidation:rule="has(self.sourceRef) || !has(self.verify) || !has(self.verify.commit) || self.verify.commit.mode in ['HEAD', 'Chain'] || (has(self.ref) && (has(self.ref.tag) || has(self.ref.semver)))",message="verify.commit.mode Tag and TagAndHEAD need ref.tag or ref.semver: a branch or a commit has no tag to verify"
// +kubebuilder:validation:XValidation:rule="has(self.url) != has(self.sourceRef)",message="set exactly one of url (the controller fetches the git repository) and sourceRef (a Flux source fetches it)"
// +kubebuilder:validation:XValidation:rule="!has(self.sourceRef) || (!has(self.ref) && !has(self.secretRef))",message="ref and secretRef are set on the Flux source named by sourceRef, not on the ManifestRegistry: remove them"
// +kubebuilder:validation:XValidation:rule="!has(self.sourceRef) || !has(self.verify) || !has(self.verify.commit) || self.verify.commit.mode != 'Chain'",message="verify.commit.mode Chain needs the git history, which a Flux artifact does not carry: use HEAD, Tag or TagAndHEAD (as set on the Flux source's spec.verify)"
// +kubebuilder:validation:XValidation:rule="!has(self.sourceRef) || self.sourceRef.kind != 'Bucket' || !has(self.verify) || !has(self.verify.commit)",message="verify.commit cannot be checked for a Bucket (Flux verifies no signature of a bucket): remove verify.commit or use a GitRepository or OCIRepository"
type ManifestRegistrySpec struct {
	// URL of the git repository: https://host/path, ssh://[user@]host[:port]/path,
	// user@host:path (scp-like SSH) or file:///path (a repository on the controller's file
	// system: refused unless the controller runs with --allow-file-urls). http:// is accepted
	// only for a loopback host (127.0.0.1, [::1] or localhost),
	// for tests and local development: credentials must not cross a network in clear text.
	// Exactly one of url and sourceRef.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^((https|ssh|file)://[^\s]+|http://(127\.0\.0\.1|\[::1\]|localhost)(:[0-9]+)?(/[^\s]*)?|[A-Za-z0-9._~-]+@[A-Za-z0-9.-]+:[^\s]+)$`
	URL string `json:"url,omitempty"`

	// SourceRef names a Flux source (source.toolkit.fluxcd.io/v1 GitRepository,
	// OCIRepository or Bucket) whose artifact holds the manifests: the controller downloads
	// status.artifact.url, checks it against status.artifact.digest, and runs the same checks
	// on it as on a repository it fetched itself. ref and secretRef are then the source's.
	// With verify.commit the source must report SourceVerified=True for its current
	// generation, with the same mode and only keys that verify.commit.secretRef also lists.
	// Exactly one of url and sourceRef.
	// +optional
	SourceRef *SourceReference `json:"sourceRef,omitempty"`

	// Ref is the git reference to follow: exactly one of branch, tag, semver or commit.
	// Defaults to the branch main (not with sourceRef, whose source has its own ref).
	// +optional
	Ref *GitRef `json:"ref,omitempty"`

	// Path of the folder inside the repository that holds the manifests, relative to the
	// repository root (no leading / and no .. segment). Defaults to the root.
	// +optional
	// +kubebuilder:default="."
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/') && !self.split('/').exists(s, s == '..')",message="path must be relative to the repository root and must not contain .. segments"
	Path string `json:"path,omitempty"`

	// Format of the folder at path. Registry (the default): the signed registry written by
	// `reversi manifests publish`, where every version must be signed by a key in
	// verify.manifestKeysSecretRef. Plain: manifest files (*.yaml, *.yml, *.json), read
	// recursively; hidden files and folders are skipped; they carry no signatures, so
	// verify.manifestKeysSecretRef is an error with Plain, and a ReversiGateway with trusted keys
	// loads a Plain registry only when its spec.manifests.plainRegistries lists it.
	// +optional
	// +kubebuilder:default=Registry
	// +kubebuilder:validation:Enum=Registry;Plain
	Format string `json:"format,omitempty"`

	// Interval between fetches of the remote (jittered). A Go duration such as 1m or 5m30s.
	// Defaults to 5m. Setting the reversi.dev/requestedAt annotation fetches at once.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="interval must be positive"
	Interval *metav1.Duration `json:"interval,omitempty"`

	// Timeout of one fetch (clone or fetch plus checkout). A Go duration; defaults to 60s.
	// +optional
	// +kubebuilder:default="60s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="timeout must be positive"
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// SecretRef names a Secret in the same namespace with the git credentials. For https:
	// `username` and `password` (basic auth), or `bearerToken`. For ssh: `identity` (a
	// private key in PEM or OpenSSH format), `known_hosts` (required: host keys are always
	// checked) and optionally `password` (the identity's passphrase). Omit for public
	// repositories and file:// URLs.
	// +optional
	SecretRef *LocalObjectReference `json:"secretRef,omitempty"`

	// Verify configures the checks a revision must pass before it is rendered. A revision
	// that fails any check leaves the last good rendering in place.
	// +optional
	Verify *RegistryVerification `json:"verify,omitempty"`

	// Suspend stops fetching and rendering; the last rendering stays in place.
	// +optional
	Suspend bool `json:"suspend,omitempty"`
}

// Kinds of Flux sources a ManifestRegistry may consume (group source.toolkit.fluxcd.io, v1).
const (
	SourceKindGitRepository = "GitRepository"
	SourceKindOCIRepository = "OCIRepository"
	SourceKindBucket        = "Bucket"
)

// SourceReference names a Flux source, as Flux's own CrossNamespaceSourceReference does.
type SourceReference struct {
	// Kind of the source: GitRepository, OCIRepository or Bucket (source.toolkit.fluxcd.io/v1).
	// +required
	// +kubebuilder:validation:Enum=GitRepository;OCIRepository;Bucket
	Kind string `json:"kind"`

	// Name of the source.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Namespace of the source; defaults to the ManifestRegistry's. Another namespace is refused
	// (Ready=False, reason AccessDenied) when the controller runs with
	// --no-cross-namespace-refs, as Flux's own controllers do, and needs an author who may get
	// the source there (admission).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
}

// GitRef is the git reference a ManifestRegistry follows. Exactly one field is set.
//
// +kubebuilder:validation:XValidation:rule="(has(self.branch) ? 1 : 0) + (has(self.tag) ? 1 : 0) + (has(self.semver) ? 1 : 0) + (has(self.commit) ? 1 : 0) == 1",message="set exactly one of ref.branch, ref.tag, ref.semver or ref.commit"
type GitRef struct {
	// Branch to follow, such as main. Its newest commit is used.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	Branch string `json:"branch,omitempty"`

	// Tag to use, such as v1.4.0.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	Tag string `json:"tag,omitempty"`

	// SemVer is a semantic version range, such as ">=1.2.0 <2.0.0" or "~1.4": the highest
	// tag that parses as a version inside the range is used.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	SemVer string `json:"semver,omitempty"`

	// Commit is the full SHA-1 of a commit (40 lowercase hex characters). The repository is
	// not re-fetched once that commit is rendered.
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{40}$`
	Commit string `json:"commit,omitempty"`
}

// RegistryVerification lists the signature checks of a ManifestRegistry.
type RegistryVerification struct {
	// ManifestKeysSecretRef names a Secret whose data values are Ed25519 public keys in PEM
	// (PKIX), one per key (any key names). Every manifest version in a Registry-format folder
	// must be signed by one of them. Required for format Registry; an error (InvalidSpec) for
	// format Plain, whose files carry no signatures. A key removed from the Secret makes the
	// controller verify the current revision again.
	// +optional
	ManifestKeysSecretRef *LocalObjectReference `json:"manifestKeysSecretRef,omitempty"`

	// Commit verifies the git signature of the commit and/or the tag.
	// +optional
	Commit *CommitVerification `json:"commit,omitempty"`
}

// CommitVerification checks git commit and tag signatures.
type CommitVerification struct {
	// Mode says what is verified: HEAD (the default, as in Flux) the commit the ref resolves
	// to, Tag the annotated tag (needs ref.tag or ref.semver), TagAndHEAD both, Chain the
	// commit the ref resolves to and every commit since the last applied one
	// (status.artifact.revision): an unsigned commit under a signed head is refused. On the
	// first apply Chain verifies only the head (trust on first use). With Tag or TagAndHEAD a
	// semver ref takes the highest tag in range whose signatures verify; higher tags that do
	// not are skipped with a TagSkipped event.
	// +optional
	// +kubebuilder:default=HEAD
	// +kubebuilder:validation:Enum=HEAD;Tag;TagAndHEAD;Chain
	Mode string `json:"mode,omitempty"`

	// SecretRef names a Secret with the trusted keys: every data key ending in `.sshpub` holds
	// SSH public keys (authorized_keys format; signatures made with gpg.format=ssh in the
	// namespace git), every key ending in `.asc` an armored OpenPGP public key ring. A
	// signature by any of them is accepted.
	// +required
	SecretRef LocalObjectReference `json:"secretRef"`
}

// ManifestRegistryStatus is the observed state of a ManifestRegistry.
type ManifestRegistryStatus struct {
	// ObservedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, Reconciling and Stalled (kstatus), SourceVerified and
	// ArtifactInStorage, and NotificationsDelivered while the controller has alert receivers.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// Artifact is the rendering in use: the last revision that was fetched, verified and
	// validated. It stays when a newer revision fails.
	// +optional
	Artifact *RegistryArtifact `json:"artifact,omitempty"`

	// LastAttemptedRevision is the revision of the last fetch, whether or not it passed.
	// +optional
	LastAttemptedRevision string `json:"lastAttemptedRevision,omitempty"`

	// LastHandledReconcileAt is the value of the reversi.dev/requestedAt annotation the
	// controller handled last.
	// +optional
	LastHandledReconcileAt string `json:"lastHandledReconcileAt,omitempty"`

	// AcceptedRevision is the revision the reversi.dev/accept-revision annotation made the
	// controller accept although the ancestry, index sequence or registry id checks refused it.
	// The annotation is removed once the revision is applied (an override is used once).
	// +optional
	AcceptedRevision string `json:"acceptedRevision,omitempty"`

	// InvalidTools lists the tools of the last attempted revision that failed validation or
	// signature verification, each with its errors. Bounded: at most 50 tools (sorted by
	// name) with at most 10 errors each; invalidToolCount gives the full count.
	// +optional
	// +listType=map
	// +listMapKey=tool
	// +kubebuilder:validation:MaxItems=50
	InvalidTools []InvalidTool `json:"invalidTools,omitempty"`

	// InvalidToolCount is how many tools of the last attempted revision are invalid, including
	// those beyond the 50 listed in invalidTools.
	// +optional
	// +kubebuilder:validation:Minimum=0
	InvalidToolCount int32 `json:"invalidToolCount,omitempty"`

	// Notifications is the outbox of the controller's rendering alerts (issue 24): for each
	// receiver of `reversi controller --notifications-config` whose filters admit the
	// registry, the latest alert.rendering_refused and how its delivery went. It is written in
	// the same status write as the refusal it announces, so a controller that restarts before
	// delivering finds it here and delivers it. Bounded: one entry per receiver (the latest
	// alert; a newer one replaces it), at most 32 receivers. A controller without receivers
	// leaves it as it is.
	// +optional
	// +listType=map
	// +listMapKey=receiver
	// +kubebuilder:validation:MaxItems=32
	Notifications []RegistryNotification `json:"notifications,omitempty"`
}

// RegistryNotification is one receiver's latest rendering alert (issue 24) and its delivery.
type RegistryNotification struct {
	// Receiver is the receiver's name (`name:` in the notifications file, default
	// `<type>-<8 hex of the URL's SHA-256>`; at most 63 characters). Never the URL: a Slack
	// URL is a secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Receiver string `json:"receiver"`

	// Type is the event type, alert.rendering_refused.
	// +required
	Type string `json:"type"`

	// Key is the Idempotency-Key of every attempt:
	// `alert.rendering_refused:<namespace>/<name>:<revision>:<reason>` (as long as the
	// revision makes it: no limit here, so that a refusal's status write never fails on it).
	// +required
	Key string `json:"key"`

	// Revision is the refused revision (status.lastAttemptedRevision when it was refused, or
	// the rendered revision whose ConfigMap drifted).
	// +optional
	Revision string `json:"revision,omitempty"`

	// Reason is the refusal's reason: the Ready reason (CommitVerificationFailed,
	// SignatureVerificationFailed, VersionDowngrade, RevisionNotDescendant, RegistryMismatch,
	// or another one with SourceVerified=False), or RenderingDrift.
	// +required
	Reason string `json:"reason"`

	// Message is the refusal's message, at most 1024 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// OccurredAt is when the refusal was recorded.
	// +required
	OccurredAt metav1.Time `json:"occurredAt"`

	// State is Pending (to be delivered at nextAttemptTime), Delivered (a 2xx answer) or
	// Dead (dead-lettered: the attempts ran out or the receiver refused it for good).
	// +required
	State NotificationState `json:"state"`

	// Attempts is how many deliveries were tried.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Attempts int32 `json:"attempts,omitempty"`

	// LastAttemptTime is when the last delivery was tried.
	// +optional
	LastAttemptTime *metav1.Time `json:"lastAttemptTime,omitempty"`

	// NextAttemptTime is when a Pending alert is tried next.
	// +optional
	NextAttemptTime *metav1.Time `json:"nextAttemptTime,omitempty"`

	// LastError is the last failed attempt's error, at most 1024 bytes (never the URL).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	LastError string `json:"lastError,omitempty"`

	// Seal is the controller's Ed25519 signature (its rendering key) over the alert as it
	// recorded it: the registry (namespace, name, uid), receiver, type, key, revision, reason,
	// message and occurredAt, as `<key id>:<base64url signature>`. The controller posts only
	// entries whose seal verifies: an entry written or edited by anyone else (whoever may
	// patch manifestregistries/status) is dropped with a Warning Event StatusNotSealed and
	// never sent, so a receiver's HMAC key never signs words the controller did not write.
	// +optional
	// +kubebuilder:validation:MaxLength=200
	Seal string `json:"seal,omitempty"`
}

// NotificationState is the delivery state of a RegistryNotification.
// +kubebuilder:validation:Enum=Pending;Delivered;Dead
type NotificationState string

// The states of a RegistryNotification (issue 24).
const (
	NotificationPending   NotificationState = "Pending"
	NotificationDelivered NotificationState = "Delivered"
	NotificationDead      NotificationState = "Dead"
)

// The rendering alerts' condition on a ManifestRegistry (issue 24): NotificationsDelivered
// (ConditionNotificationsDelivered, also a ReversiGateway's) is present while the controller
// has receivers; it never changes Ready (kstatus reads Ready, Reconciling and Stalled only).
// It is False (ReasonNotificationDeadLettered; also a Warning Event) when the latest alert to
// a receiver was dead-lettered, the message naming the receiver and the last error, and True
// otherwise.
const (
	// ReasonNotificationPending: an alert is waiting for its next attempt (True).
	ReasonNotificationPending = "NotificationPending"
	// MaxRegistryNotifications bounds status.notifications (receivers).
	MaxRegistryNotifications = 32
)

// RegistryArtifact describes the rendering a ManifestRegistry stores in its ConfigMaps.
type RegistryArtifact struct {
	// Revision of the repository that was rendered: `<branch or tag>@sha1:<40 hex>`, such as
	// main@sha1:0123456789abcdef0123456789abcdef01234567 (or sha1:<hex> alone for a commit ref).
	// +required
	// +kubebuilder:validation:MinLength=1
	Revision string `json:"revision"`

	// Digest of the rendered content, `sha256:<64 hex>`; the ConfigMaps carry the same value.
	// +required
	// +kubebuilder:validation:Pattern=`^sha256:[0-9a-f]{64}$`
	Digest string `json:"digest"`

	// Tools is the number of tool manifests rendered.
	// +required
	// +kubebuilder:validation:Minimum=0
	Tools int32 `json:"tools"`

	// Policies is the number of policies rendered with the manifests (issue 21): the served
	// policy versions of a Registry, the `policy/` files of a Plain registry.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Policies int32 `json:"policies,omitempty"`

	// ConfigMaps are the names of the ConfigMaps holding the rendering, in shard order
	// (`<registry>-manifests`, then `<registry>-manifests-1`, … for large registries).
	// +optional
	// +listType=atomic
	ConfigMaps []string `json:"configMaps,omitempty"`

	// LastUpdateTime is when this artifact was stored.
	// +required
	LastUpdateTime metav1.Time `json:"lastUpdateTime"`

	// Sequence is the sequence of the rendering's signed snapshot: it only grows, and gateways
	// refuse a snapshot older than one they served.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Sequence int64 `json:"sequence,omitempty"`

	// IndexSequence is the sequence of the registry's signed index.json (format Registry). A
	// revision whose index sequence is lower is refused, unless accepted by annotation.
	// +optional
	// +kubebuilder:validation:Minimum=0
	IndexSequence int64 `json:"indexSequence,omitempty"`

	// RegistryID is the id of the registry in spec.path (format Registry, from its signed
	// index.json): a revision holding another registry is refused, unless accepted by annotation.
	// +optional
	RegistryID string `json:"registryID,omitempty"`

	// SourceDigest is the digest of the Flux artifact rendered (sourceRef only), as the source
	// reported it and the download matched: the same revision with another digest (a changed
	// ignore rule, say) is rendered again.
	// +optional
	SourceDigest string `json:"sourceDigest,omitempty"`

	// RenderingDigest is `sha256:<hex>` over the data of the rendered ConfigMaps, in shard
	// order: a ConfigMap whose data differs was changed by someone else and is rendered again.
	// +optional
	RenderingDigest string `json:"renderingDigest,omitempty"`
}

// InvalidTool is one tool that failed validation or verification, with its errors.
type InvalidTool struct {
	// Tool is the tool name (or the file, when the tool name could not be read).
	// +required
	// +kubebuilder:validation:MinLength=1
	Tool string `json:"tool"`

	// Errors, each naming the file, the field path and the rule; at most 10 (the rest are
	// counted in the last entry), each at most 1024 characters.
	// +required
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10
	// +kubebuilder:validation:items:MaxLength=1024
	Errors []string `json:"errors"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=mreg,categories=reversi
// +kubebuilder:printcolumn:name="Revision",type=string,JSONPath=`.status.artifact.revision`
// +kubebuilder:printcolumn:name="Tools",type=integer,JSONPath=`.status.artifact.tools`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.spec.url`,priority=1
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.sourceRef.name`,priority=1
// +kubebuilder:printcolumn:name="Suspended",type=boolean,JSONPath=`.spec.suspend`,priority=1

// ManifestRegistry is a git repository of tool manifests. The controller fetches it, verifies
// the commit and every manifest signature, validates the whole set, and renders the result
// into the ConfigMap(s) `<name>-manifests`, which gateways load. A revision that fails any
// step leaves the last good rendering exactly as it was.
type ManifestRegistry struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state.
	// +required
	Spec ManifestRegistrySpec `json:"spec"`

	// Status is the observed state, written by the controller. Until it first does, it is
	// served with observedGeneration 0 (the default), so kstatus (Flux's health checks) reads
	// a new object as in progress rather than as Current.
	// +optional
	// +kubebuilder:default={observedGeneration: 0}
	Status ManifestRegistryStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ManifestRegistryList is a list of ManifestRegistry.
type ManifestRegistryList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the registries.
	Items []ManifestRegistry `json:"items"`
}

// GetConditions returns the status conditions.
func (in *ManifestRegistry) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *ManifestRegistry) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }

// IntervalDuration is spec.interval, or its default when unset.
func (in *ManifestRegistry) IntervalDuration() time.Duration {
	if in.Spec.Interval == nil || in.Spec.Interval.Duration <= 0 {
		return DefaultRegistryInterval
	}
	return in.Spec.Interval.Duration
}

// TimeoutDuration is spec.timeout, or its default when unset.
func (in *ManifestRegistry) TimeoutDuration() time.Duration {
	if in.Spec.Timeout == nil || in.Spec.Timeout.Duration <= 0 {
		return DefaultRegistryTimeout
	}
	return in.Spec.Timeout.Duration
}

func init() {
	SchemeBuilder.Register(&ManifestRegistry{}, &ManifestRegistryList{})
}
