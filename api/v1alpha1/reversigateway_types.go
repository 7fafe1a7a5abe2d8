package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Gateway modes (seed "MCP gateway", Modes).
const (
	GatewayModeEnforce = "enforce"
	GatewayModeAdvise  = "advise"
	GatewayModeObserve = "observe"
)

// Gateway store types.
const (
	// StoreSQLite keeps the ledger in a SQLite file on a PersistentVolumeClaim: one replica.
	StoreSQLite = "sqlite"
	// StorePostgres keeps the ledger in PostgreSQL: any number of replicas.
	StorePostgres = "postgres"
)

// ReversiGatewaySpec is a gateway deployment: the MCP gateway's configuration (the seed's
// gateway.yaml, in camelCase) plus where it gets manifests, keys and storage.
//
// +kubebuilder:validation:XValidation:rule="!has(self.store) || self.store.type != 'sqlite' || !has(self.replicas) || self.replicas <= 1",message="the sqlite store holds one replica's ledger: use replicas 0 or 1, or store.type postgres",fieldPath=".replicas"
type ReversiGatewaySpec struct {
	// Replicas is the number of gateway pods. Default 1. More than one needs the postgres
	// store.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	Replicas *int32 `json:"replicas,omitempty"`

	// Image of the gateway (the reversi image, which runs `reversi gateway`). Defaults to the
	// image the controller is configured with.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image,omitempty"`

	// Mode is enforce (a call that breaks a rule is blocked), advise (it runs, with an
	// advisory) or observe (it runs and is journaled as would_block). Unset: observe while no
	// manifest is loaded, enforce otherwise. Read when a pod starts.
	// +optional
	// +kubebuilder:validation:Enum=enforce;advise;observe
	Mode string `json:"mode,omitempty"`

	// UnclassifiedReads is block (the default) or observe: in enforce mode, observe lets a
	// tool without a manifest that the upstream annotates readOnlyHint run, as an unverified
	// shadow observe run.
	// +optional
	// +kubebuilder:default=block
	// +kubebuilder:validation:Enum=block;observe
	UnclassifiedReads string `json:"unclassifiedReads,omitempty"`

	// ValidateSchemas checks each call's arguments, and structured results, against the
	// schemas the upstream publishes. Default true.
	// +optional
	// +kubebuilder:default=true
	ValidateSchemas *bool `json:"validateSchemas,omitempty"`

	// OutputSchemas is advertise (the default: upstream tools are listed with their
	// outputSchema) or hide (listed without it). The gateway drops structuredContent that
	// breaks the advertised schema; a client that validates results (the TypeScript SDK) then
	// throws for the missing structuredContent, so hide is for such clients. Results are
	// checked against the upstream's schemas either way. Read when a pod starts.
	// +optional
	// +kubebuilder:default=advertise
	// +kubebuilder:validation:Enum=advertise;hide
	OutputSchemas string `json:"outputSchemas,omitempty"`

	// Actor is the principal of unauthenticated sessions. Default mcp-client.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Actor string `json:"actor,omitempty"`

	// Permissions is the scope of every session (capped by an API key's max_permissions).
	// Unset: every permission named in the manifests.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	Permissions []string `json:"permissions,omitempty"`

	// Upstreams are the MCP servers the gateway fronts. Several upstreams expose their tools
	// as `<name>.<tool>` unless namespaceTools is false.
	// +required
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.filter(u, has(u.container)).size() <= 16",message="at most 16 container upstreams per gateway (each is a container of every gateway pod): split them across gateways"
	Upstreams []GatewayUpstream `json:"upstreams"`

	// Allow lists tool-name globs; when set, only matching tools may be called (and listed).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=256
	Allow []string `json:"allow,omitempty"`

	// Deny lists tool-name globs that may never be called.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=256
	Deny []string `json:"deny,omitempty"`

	// Manifests says which manifests the gateway enforces: the renderings of ManifestRegistries
	// in this namespace and/or the ToolManifests a label selector picks. The controller merges
	// them into the ConfigMap `<gateway>-manifests`; a tool defined twice is an error.
	// +optional
	Manifests *GatewayManifests `json:"manifests,omitempty"`

	// Policies says which of the policies of spec.manifests.registries the gateway enforces
	// (issue 21). Unset: every policy those registries serve. The controller renders every
	// policy of the selected registries (each is verified against the registry's signed
	// index, which covers them all) and signs which of them the gateway enforces.
	// +optional
	Policies *GatewayPolicies `json:"policies,omitempty"`

	// TrustedKeysSecretRef names a Secret whose data values are Ed25519 public keys (PEM). The
	// gateway verifies every manifest's signature against them before it enforces anything;
	// the one exception is a registry listed in spec.manifests.plainRegistries.
	// +optional
	TrustedKeysSecretRef *LocalObjectReference `json:"trustedKeysSecretRef,omitempty"`

	// Store is where the gateway keeps its ledger and approval queue.
	// +optional
	// +kubebuilder:default={type: sqlite}
	Store *GatewayStore `json:"store,omitempty"`

	// Auth configures how agents and operators authenticate. The gateway refuses to listen
	// beyond loopback without authentication, so a gateway without auth serves nothing.
	// +optional
	Auth *GatewayAuth `json:"auth,omitempty"`

	// Notifications are the receivers the gateway tells about approval events (issue 24,
	// docs/notifications.md): a held call (approval.requested) and its decision. The URLs and
	// HMAC keys come from Secrets only: the controller renders ${NAME} references into
	// gateway.yaml and gives the gateway container the values as environment variables read
	// from the Secrets (valueFrom.secretKeyRef), so no value reaches the ConfigMap. Delivery
	// goes through the gateway's store (an outbox), at least once.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	Notifications []GatewayNotification `json:"notifications,omitempty"`

	// Port the gateway's HTTP endpoints (/mcp, /operator/mcp, /healthz, /readyz) listen on,
	// and the Service exposes. Default 7431.
	// +optional
	// +kubebuilder:default=7431
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`
}

// GatewayUpstream is one upstream MCP server: exactly one of url (Streamable HTTP), command
// (stdio, run inside the gateway container; the gateway image must carry it) or container
// (stdio, an image of its own run as a native sidecar of the gateway pod, reached over a Unix
// socket through `reversi stdio-bridge`).
//
// +kubebuilder:validation:XValidation:rule="has(self.url) || has(self.command) || has(self.container)",message="set one of url (a Streamable HTTP server), command (a stdio server the gateway image carries) or container (a stdio server image, run as a sidecar of the gateway pod)"
// +kubebuilder:validation:XValidation:rule="[has(self.url), has(self.command), has(self.container)].filter(x, x).size() <= 1",message="url, command and container exclude each other: keep one of them per upstream"
// +kubebuilder:validation:XValidation:rule="!has(self.container) || (self.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$') && size(self.name) <= 54)",message="a container upstream's name names its sidecar (upstream-<name>): use lowercase letters, digits and '-' (no '_'), at most 54 characters"
// +kubebuilder:validation:XValidation:rule="has(self.command) || (!has(self.args) && !has(self.env))",message="args and env are for command upstreams"
// +kubebuilder:validation:XValidation:rule="has(self.url) || !has(self.headers)",message="headers are for url upstreams"
type GatewayUpstream struct {
	// Name of the upstream, and the prefix of its tools when several upstreams are namespaced.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9_]*[a-z0-9])?$`
	Name string `json:"name"`

	// URL of a Streamable HTTP MCP endpoint. The egress rules are checked before connecting.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[^\s]+$`
	URL string `json:"url,omitempty"`

	// Headers sent with every request to a url upstream, each a literal value or a value from a
	// Secret (for tokens).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	Headers []ValueFrom `json:"headers,omitempty"`

	// Command of a stdio upstream, run in the gateway container.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Command string `json:"command,omitempty"`

	// Args of the command.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Args []string `json:"args,omitempty"`

	// Env of the command. A stdio upstream does not inherit the gateway's environment: it sees
	// only these variables.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Env []ValueFrom `json:"env,omitempty"`

	// NamespaceTools prefixes the upstream's tools with `<name>.` when the gateway fronts
	// several upstreams. Default true; two upstreams exposing the same name without it is an
	// error.
	// +optional
	NamespaceTools *bool `json:"namespaceTools,omitempty"`

	// Container runs a stdio server from an image of its own, as a native sidecar of the
	// gateway pod (an init container with restartPolicy Always), its command wrapped by
	// `reversi stdio-bridge` (copied into the pod by an init container of the gateway image),
	// which the gateway reaches over the Unix socket /run/reversi/<name>.sock. The sidecar
	// runs with secure defaults, sees only the environment and volumes written here, and gets
	// no ServiceAccount token.
	// +optional
	Container *UpstreamContainer `json:"container,omitempty"`

	// Session says how agent sessions map to upstream sessions: PerClient (one upstream session
	// per agent session, so that progress, logs and the upstream's sampling, elicitation and
	// roots requests reach the right agent) or Shared (one for all agents). Default PerClient
	// for a url upstream, Shared for a command or a container. For a container it is also the
	// bridge's: Shared runs one server process for the gateway's one connection, PerClient one
	// process per agent session.
	// +optional
	// +kubebuilder:validation:Enum=Shared;PerClient
	Session string `json:"session,omitempty"`

	// Resources relays the upstream's resources and resource templates. Default true; set false
	// on one of two upstreams that list the same URIs (otherwise a clash the gateway refuses).
	// +optional
	Resources *bool `json:"resources,omitempty"`
}

// Notification receiver types.
const (
	// NotificationWebhook is a generic JSON webhook, signed with X-Reversi-Signature when
	// secretRef is set.
	NotificationWebhook = "Webhook"
	// NotificationSlack is a Slack-compatible incoming webhook (its URL is the secret).
	NotificationSlack = "Slack"
)

// GatewayNotification is one receiver of the gateway's approval events: `notifications:` of
// gateway.yaml (docs/notifications.md), with its URL and key from Secrets.
//
// +kubebuilder:validation:XValidation:rule="self.type == 'Webhook' || !has(self.secretRef)",message="secretRef (the HMAC key of X-Reversi-Signature) is for Webhook receivers: a Slack incoming webhook takes no key (its URL is the secret)",fieldPath=".secretRef"
type GatewayNotification struct {
	// Name identifies the receiver in the gateway's outbox (`reversi notifications list`):
	// notifications still pending for a name that is no longer configured are dead-lettered
	// when the gateway starts.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_-]+$`
	Name string `json:"name"`

	// Type is Webhook (a generic JSON webhook) or Slack (a Slack-compatible incoming webhook).
	// +required
	// +kubebuilder:validation:Enum=Webhook;Slack
	Type string `json:"type"`

	// URLSecretRef selects the Secret key holding the receiver's http or https URL. The
	// gateway refuses to start with a value that is not one (the egress rules apply too).
	// +required
	URLSecretRef SecretKeyReference `json:"urlSecretRef"`

	// SecretRef selects the Secret key holding the HMAC-SHA256 key of the webhook's
	// X-Reversi-Signature header. Webhook only; unset sends no signature.
	// +optional
	SecretRef *SecretKeyReference `json:"secretRef,omitempty"`

	// Events are the approval events sent. Default: all of them.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=5
	// +kubebuilder:validation:items:Enum=approval.requested;approval.approved;approval.denied;approval.expired;approval.escalated
	Events []string `json:"events,omitempty"`

	// Tools are tool-name globs (the syntax of allow and deny); only events of matching
	// tools are sent. Default: every tool.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=256
	Tools []string `json:"tools,omitempty"`

	// Risk are the blast radii (the manifest's risk.blast_radius) whose events are sent.
	// Default: any, also a tool without one.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=4
	// +kubebuilder:validation:items:Enum=low;medium;high;critical
	Risk []string `json:"risk,omitempty"`
}

// ValueFrom is a named value, given literally or read from a Secret key.
//
// +kubebuilder:validation:ExactlyOneOf=value;secretKeyRef
type ValueFrom struct {
	// Name of the header or environment variable.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`

	// Value, literally. Use secretKeyRef for anything secret.
	// +optional
	Value string `json:"value,omitempty"`

	// SecretKeyRef reads the value from a key of a Secret in the gateway's namespace.
	// +optional
	SecretKeyRef *SecretKeyReference `json:"secretKeyRef,omitempty"`
}

// GatewayManifests selects the manifests a gateway enforces.
type GatewayManifests struct {
	// Registries are names of ManifestRegistries in the gateway's namespace whose renderings
	// the gateway loads.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	Registries []string `json:"registries,omitempty"`

	// PlainRegistries are those of Registries with format Plain whose manifests the gateway
	// accepts although trustedKeysSecretRef is set: they carry no writer signature (the
	// controller vouches for the commit it verified, so the registry must verify its commits:
	// spec.verify.commit). A Plain registry not listed here, or listed but not verifying its
	// commits, is refused by such a gateway, so that changing a registry to Plain, or dropping
	// its commit verification, cannot drop the signatures.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=253
	PlainRegistries []string `json:"plainRegistries,omitempty"`

	// Selector picks ToolManifests in the gateway's namespace by label. Only manifests with
	// Ready=True (valid and, with trusted keys, verified) are loaded. Unset: none.
	// +optional
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
}

// GatewayPolicies selects policies by name.
type GatewayPolicies struct {
	// Names are the policies (their `policy:` names) the gateway enforces; each must be served
	// by one of spec.manifests.registries. Empty: none.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=128
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9_.:/-]+$`
	Names []string `json:"names,omitempty"`
}

// GatewayStore is where a gateway keeps its ledger and approval queue.
//
// +kubebuilder:validation:XValidation:rule="self.type != 'postgres' || has(self.postgres)",message="store.type postgres needs store.postgres.urlSecretRef"
// +kubebuilder:validation:XValidation:rule="self.type == 'postgres' || !has(self.postgres)",message="store.postgres is only used with store.type postgres"
type GatewayStore struct {
	// Type is sqlite (the default: a file on a PersistentVolumeClaim, one replica) or postgres
	// (several replicas share one database).
	// +optional
	// +kubebuilder:default=sqlite
	// +kubebuilder:validation:Enum=sqlite;postgres
	Type string `json:"type,omitempty"`

	// SQLite configures the volume of the sqlite store.
	// +optional
	SQLite *SQLiteStore `json:"sqlite,omitempty"`

	// Postgres configures the postgres store.
	// +optional
	Postgres *PostgresStore `json:"postgres,omitempty"`
}

// SQLiteStore is the PersistentVolumeClaim of a sqlite store.
type SQLiteStore struct {
	// Size of the volume. Default 1Gi.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// StorageClassName of the volume; unset uses the cluster's default class.
	// +optional
	StorageClassName *string `json:"storageClassName,omitempty"`
}

// PostgresStore names the database of a postgres store.
type PostgresStore struct {
	// URLSecretRef selects the Secret key holding the connection URL
	// (postgres://user:password@host:5432/db?sslmode=verify-full).
	// +required
	URLSecretRef SecretKeyReference `json:"urlSecretRef"`
}

// GatewayAuth configures the gateway's authentication.
//
// +kubebuilder:validation:AtLeastOneOf=keysSecretRef;oidc
type GatewayAuth struct {
	// KeysSecretRef selects the Secret key holding the API key file (keys.json: hashed keys
	// with their principal, role and max_permissions).
	// +optional
	KeysSecretRef *SecretKeyReference `json:"keysSecretRef,omitempty"`

	// OIDC validates bearer tokens from an OpenID Connect issuer.
	// +optional
	OIDC *GatewayOIDC `json:"oidc,omitempty"`
}

// GatewayOIDC validates OpenID Connect access tokens.
type GatewayOIDC struct {
	// Issuer URL; its discovery document gives the JWKS unless jwksURI is set.
	// +required
	// +kubebuilder:validation:Pattern=`^https://[^\s]+$`
	Issuer string `json:"issuer"`

	// Audience tokens must carry (the gateway's public URL).
	// +required
	// +kubebuilder:validation:MinLength=1
	Audience string `json:"audience"`

	// RoleMap maps a token role (or group) to a gateway role: agent, auditor, approver,
	// operator or admin.
	// +optional
	RoleMap map[string]string `json:"roleMap,omitempty"`

	// RoleClaim is the claim holding the roles. Default roles.
	// +optional
	RoleClaim string `json:"roleClaim,omitempty"`

	// ActorClaim is the claim naming the actor. Default sub. Set it, and actorPrefix, as the
	// API server's username claim and prefix (--oidc-username-claim, --oidc-username-prefix,
	// or claimMappings.username), so that the gateway's actor is the username the API server
	// gives the same person: the run's actor cannot approve its own calls.
	// +optional
	ActorClaim string `json:"actorClaim,omitempty"`

	// ActorPrefix is put before the actor claim's value (the API server's username prefix,
	// e.g. "oidc:"). Default none.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ActorPrefix string `json:"actorPrefix,omitempty"`

	// UIDClaim is the claim holding the user's uid (the API server's claimMappings.uid).
	// Default none. An approver with the actor's uid is Rejected.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	UIDClaim string `json:"uidClaim,omitempty"`

	// EmailClaim is the claim holding the user's e-mail. Default email. An approver whose
	// username is the actor's e-mail is Rejected.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	EmailClaim string `json:"emailClaim,omitempty"`

	// JWKSURI overrides the key set URL of the discovery document.
	// +optional
	// +kubebuilder:validation:Pattern=`^https://[^\s]+$`
	JWKSURI string `json:"jwksURI,omitempty"`
}

// ReversiGatewayStatus is the observed state of a ReversiGateway.
type ReversiGatewayStatus struct {
	// ObservedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, Reconciling and Stalled (kstatus), and NotificationsDelivered while
	// spec.notifications is set (False when a pod's store holds dead-lettered notifications;
	// it does not change Ready).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// Replicas is the number of gateway pods (for the scale subresource).
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// ReadyReplicas is the number of gateway pods that are ready.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// Selector is the label selector of the gateway's pods, as a string (for the scale
	// subresource and autoscalers).
	// +optional
	Selector string `json:"selector,omitempty"`

	// Manifests reports the manifest set the gateway should enforce and how many pods have
	// loaded it.
	// +optional
	Manifests *GatewayManifestsStatus `json:"manifests,omitempty"`
}

// GatewayManifestsStatus is the rollout of a manifest set to a gateway's pods.
type GatewayManifestsStatus struct {
	// DesiredRevision identifies the rendered manifest set (the digest of
	// `<gateway>-manifests`, `sha256:<hex>`).
	// +optional
	DesiredRevision string `json:"desiredRevision,omitempty"`

	// Tools is the number of tools in the desired set.
	// +optional
	Tools int32 `json:"tools,omitempty"`

	// LoadedReplicas is how many ready pods report, on their Lease, that they enforce
	// DesiredRevision.
	// +optional
	LoadedReplicas int32 `json:"loadedReplicas,omitempty"`

	// LastLoadError is the last error a pod reported when it loaded the set (it keeps the
	// previous set in that case). Empty when the last load succeeded.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	LastLoadError string `json:"lastLoadError,omitempty"`

	// OtherDigests names the ready pods that serve another digest than DesiredRevision (still
	// loading, or refusing the desired set: see LastLoadError), at most 10, as `pod=digest`,
	// or `pod=unreported` for a ready pod without a report on its Lease.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10
	OtherDigests []string `json:"otherDigests,omitempty"`

	// Sequence is that of the rendering's signed gateway snapshot. The controller restores an
	// edited rendering with the same sequences (they grow only when what they sign changes);
	// values far past its clock are ignored.
	// +optional
	Sequence int64 `json:"sequence,omitempty"`
	// Sources are the sources the gateway snapshot names, e.g. "ManifestRegistry ns/name".
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=33
	Sources []string `json:"sources,omitempty"`
	// ToolManifestsSequence is the sequence of the signed snapshot of the selected ToolManifests.
	// +optional
	ToolManifestsSequence int64 `json:"toolManifestsSequence,omitempty"`
	// ToolManifestsDigest is the digest of the selected ToolManifests' entries, `sha256:<hex>`.
	// +optional
	ToolManifestsDigest string `json:"toolManifestsDigest,omitempty"`
	// ToolManifestFloors is the highest version of each tool the selected ToolManifests ever
	// served: a ToolManifest holding an older version is left out (event ToolManifestDowngrade).
	// +optional
	ToolManifestFloors map[string]int32 `json:"toolManifestFloors,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=rgw,categories=reversi
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Available",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Manifests",type=string,JSONPath=`.status.manifests.desiredRevision`,priority=1
// +kubebuilder:printcolumn:name="Loaded",type=integer,JSONPath=`.status.manifests.loadedReplicas`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// ReversiGateway is a deployed MCP gateway. The controller renders the ConfigMaps
// `<name>-manifests` and `<name>-config` and owns the gateway's ServiceAccount, Role,
// RoleBinding, Deployment and Service. Gateway pods hot-reload the manifests and verify their
// signatures before enforcing them.
type ReversiGateway struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state.
	// +required
	Spec ReversiGatewaySpec `json:"spec"`

	// Status is the observed state, written by the controller. Until it first does, it is
	// served with observedGeneration 0 (the default), so kstatus (Flux's health checks) reads
	// a new object as in progress rather than as Current.
	// +optional
	// +kubebuilder:default={observedGeneration: 0}
	Status ReversiGatewayStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ReversiGatewayList is a list of ReversiGateway.
type ReversiGatewayList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the gateways.
	Items []ReversiGateway `json:"items"`
}

// GetConditions returns the status conditions.
func (in *ReversiGateway) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *ReversiGateway) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }

func init() {
	SchemeBuilder.Register(&ReversiGateway{}, &ReversiGatewayList{})
}

// The notification outbox of a gateway's pods as the ReversiGateway reports it (issue 24:
// dead letters "visible (`reversi notifications list`, a metric, a condition)").
const (
	// AnnotationNotificationsDead on a gateway pod's Lease (see AnnotationManifestDigest):
	// how many notifications of the configured receivers are dead-lettered in the pod's store
	// (a decimal count, at most 10000: "at least" then). Written by the pod when it changes
	// (the outbox is read every 2 s); absent when the gateway has no receivers.
	AnnotationNotificationsDead = "reversi.dev/notifications-dead"
	// AnnotationNotificationsRetrying on a gateway pod's Lease: how many notifications are
	// pending after a failed attempt (due again after a backoff). Absent as above.
	AnnotationNotificationsRetrying = "reversi.dev/notifications-retrying"
	// AnnotationNotificationsLastDead on a gateway pod's Lease: the newest dead letter,
	// `<receiver>: <error> (<idempotency key>)`, at most 1024 bytes; never a receiver's URL or
	// key. Absent when there is none.
	AnnotationNotificationsLastDead = "reversi.dev/notifications-last-dead"

	// ConditionNotificationsDelivered on a ManifestRegistry: see its status.notifications.
	// On a ReversiGateway (present while spec.notifications is set): True when no pod reports a dead-lettered notification, False (reason
	// ReasonNotificationDeadLettered) when one does, Unknown (ReasonNotificationsUnreported)
	// before any pod has reported its outbox. It never changes Ready, which is about serving.
	ConditionNotificationsDelivered = "NotificationsDelivered"
	// ReasonNotificationDeadLettered (NotificationsDelivered=False): a ReversiGateway pod's
	// store holds dead letters (the message names the pod, the count, the last error and the
	// command that lists them; they stay in the store until `reversi notifications retry`), or a
	// ManifestRegistry's latest alert to a receiver was dead-lettered.
	ReasonNotificationDeadLettered = "NotificationDeadLettered"
	// ReasonNoDeadLetters (NotificationsDelivered=True): no pod reports a dead letter.
	ReasonNoDeadLetters = "NoDeadLetters"
	// ReasonNotificationsUnreported (NotificationsDelivered=Unknown): no pod has reported
	// its outbox on its Lease yet (starting, or an image without the report).
	ReasonNotificationsUnreported = "NotificationsUnreported"
)
