package v1alpha1

import (
	"encoding/json"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ToolManifestSpec is one tool manifest, field for field the manifest format of the seed
// ("Tool manifests"; schemas/manifest.schema.json), with the same snake_case names. A spec
// copied from a manifest file is a valid spec, and ManifestObject turns a spec back into the
// raw manifest the validator reads.
//
// The API server checks the types, enumerations, patterns and the rules below. Two fields are
// unions the OpenAPI schema of a CRD cannot type exactly (a string or an object): `approval` and
// the entries of `requires`. The API server checks the fields of their object form; a wrong
// string or an unknown field inside them is reported by the controller's validator (condition
// Valid=False), which also applies every rule that needs the other manifests.
//
// +kubebuilder:validation:XValidation:rule="!(self.effect in ['reversible', 'compensable']) || has(self.compensation)",message="compensation is required for reversible and compensable tools: name the tool that undoes it and its argument_map",fieldPath=".compensation"
// +kubebuilder:validation:XValidation:rule="self.effect in ['reversible', 'compensable'] || !has(self.compensation)",message="compensation is only allowed for reversible and compensable tools: remove it or change effect",fieldPath=".compensation"
// +kubebuilder:validation:XValidation:rule="!has(self.retry) || self.effect in ['read_only', 'idempotent']",message="only read_only and idempotent tools may retry: retrying another effect could repeat it; remove retry",fieldPath=".retry"
// +kubebuilder:validation:XValidation:rule="!has(self.replaced_by) || (has(self.status) && self.status == 'deprecated')",message="only a deprecated tool names a replacement: set status: deprecated or remove replaced_by",fieldPath=".replaced_by"
// +kubebuilder:validation:XValidation:rule="!has(self.replaced_by) || self.replaced_by != self.tool",message="a tool cannot replace itself: name the tool to use instead",fieldPath=".replaced_by"
// +kubebuilder:validation:XValidation:rule="!has(self.compensation) || self.compensation.tool != self.tool",message="a tool cannot compensate itself: name the tool that undoes it",fieldPath=".compensation.tool"
type ToolManifestSpec struct {
	// Tool is the tool's name as the upstream exposes it (namespaced by the gateway when it
	// fronts several upstreams): letters, digits and _ . : / -, up to 128 characters.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:/-]+$`
	Tool string `json:"tool"`

	// Description is free text for reviewers. Lint warns when a mutating tool has none.
	// +optional
	Description string `json:"description,omitempty"`

	// Effect says what the tool changes and how it can be undone. read_only: changes nothing.
	// idempotent: safe to repeat, no undo needed. reversible: a true inverse exists.
	// compensable: a counteraction exists but leaves residue. irreversible: no safe undo;
	// always needs approval.
	// +required
	// +kubebuilder:validation:Enum=read_only;idempotent;reversible;compensable;irreversible
	Effect string `json:"effect"`

	// Permission a run's scope must contain to call the tool, such as payments:write.
	// One word without whitespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:Pattern=`^[^\t\n\v\f\r\x{85}\p{Z}]+$`
	Permission string `json:"permission"`

	// Approval says whether a human must approve each call: `never` (the default), `always`,
	// or an object with the rules (roles, quorum, timeout, on_timeout, escalate_to; and
	// `required: false`, which means never). Irreversible tools always need approval and cannot
	// set never. The API server checks the object form's fields; the controller's validator
	// checks the rest.
	// +optional
	Approval *ManifestApproval `json:"approval,omitempty"`

	// Compensation is how the tool is undone. Required for reversible and compensable tools;
	// not allowed for the other effects.
	// +optional
	Compensation *ManifestCompensation `json:"compensation,omitempty"`

	// Requires lists the tools that must have succeeded earlier in the run (this also orders
	// rollback). Each entry is a tool name or an object {tool, status: succeeded}; each tool
	// at most once, and never the tool itself. The API server checks the object form's fields;
	// the controller's validator checks the rest.
	// +optional
	// +listType=atomic
	Requires []ManifestRequirement `json:"requires,omitempty"`

	// Version is a positive integer, default 1. A registry increments it on every publish;
	// signatures cover it.
	// +optional
	// +kubebuilder:validation:Minimum=1
	Version *int64 `json:"version,omitempty"`

	// Status is the lifecycle state: draft (not enforceable), approved (the default) or
	// deprecated (still runs, and each call is noted).
	// +optional
	// +kubebuilder:validation:Enum=draft;approved;deprecated
	Status string `json:"status,omitempty"`

	// ReplacedBy names the tool to use instead of a deprecated one. It must have a manifest
	// of its own.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:/-]+$`
	ReplacedBy string `json:"replaced_by,omitempty"`

	// Owner is who to ask when the tool misbehaves. Free text.
	// +optional
	Owner string `json:"owner,omitempty"`

	// Oncall is who to ask when the tool misbehaves out of hours. Free text.
	// +optional
	Oncall string `json:"oncall,omitempty"`

	// Risk is recorded for policy and review.
	// +optional
	Risk *ManifestRisk `json:"risk,omitempty"`

	// TimeoutMs is the longest the gateway waits for the upstream before it journals the call
	// as uncertain. A duration.
	// +optional
	// +kubebuilder:validation:XValidation:rule="type(self) != int || (self > 0 && self <= 31536000000)",message="a duration in milliseconds is between 1 and 31536000000 (365 days); or write it with a unit, such as 30s or 15m"
	TimeoutMs *ManifestDuration `json:"timeout_ms,omitempty"`

	// Retry is the forward retry of a failed or timed-out upstream call, with exponential
	// backoff. Only for read_only and idempotent tools.
	// +optional
	Retry *ManifestRetry `json:"retry,omitempty"`

	// Idempotency makes two calls with the same rendered key duplicates: the second is refused
	// while the first still stands.
	// +optional
	Idempotency *ManifestIdempotency `json:"idempotency,omitempty"`

	// Audit settings.
	// +optional
	Audit *ManifestAudit `json:"audit,omitempty"`

	// SchemaHash is the hash of the upstream tool's input schema when the manifest was
	// written; the gateway reports drift when the upstream's schema changes.
	// +optional
	// +kubebuilder:validation:MinLength=1
	SchemaHash string `json:"schema_hash,omitempty"`
}

// ManifestDuration is a duration of the manifest format: a whole number of milliseconds
// (a JSON number) or a decimal number with a unit: 500ms, 30s, 1.5s, 15m, 2h, 1d. Positive and
// at most 365 days. The API server checks the string form's syntax (and that it is not zero),
// and the number form's range except inside approval (a CRD cannot attach a rule below a
// union); a string that is not a whole number of milliseconds (1.5ms) or longer than 365 days
// (366d) is refused by the controller's validator.
//
// The value keeps the form it was written in: Text for the string form, Milliseconds when Text
// is empty.
//
// +kubebuilder:validation:Type=""
// +kubebuilder:validation:XIntOrString
// +kubebuilder:validation:MaxLength=32
// +kubebuilder:validation:Pattern=`^([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)(ms|s|m|h|d)$`
type ManifestDuration struct {
	// Text is the string form, such as 30s. Empty when the value is a number.
	Text string `json:"-"`
	// Milliseconds is the number form, used when Text is empty.
	Milliseconds int64 `json:"-"`
}

// ManifestApproval is the `approval` union: the string never or always, or the object form
// with the fields below. The API server checks the object form's fields; a value of another
// shape, or an unknown field in the object form, is kept and reported by the controller's
// validator (condition Valid=False). In Go, Word holds the string form and Raw any other
// value, exactly as written.
//
// +kubebuilder:validation:Type=""
// +kubebuilder:pruning:PreserveUnknownFields
type ManifestApproval struct {
	// Word is the string form: never or always. Empty for the object form.
	Word string `json:"-"`

	// Required false means approval: never (not allowed for irreversible tools). Default true.
	// +optional
	Required *bool `json:"required,omitempty"`

	// Roles an approver must hold one of (Kubernetes groups for Approval objects).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:items:MinLength=1
	Roles []string `json:"roles,omitempty"`

	// Quorum is how many distinct approvers, 1 to 10 (default 1). Above 1 needs roles.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10
	Quorum *int64 `json:"quorum,omitempty"`

	// Timeout is how long a request waits for its approvals. A duration.
	// +optional
	Timeout *ManifestDuration `json:"timeout,omitempty"`

	// OnTimeout is what happens when the timeout passes: deny (the default) or escalate.
	// +optional
	// +kubebuilder:validation:Enum=deny;escalate
	OnTimeout string `json:"on_timeout,omitempty"`

	// EscalateTo are the roles asked next. Required when on_timeout is escalate.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:items:MinLength=1
	EscalateTo []string `json:"escalate_to,omitempty"`

	// Raw holds a value that is neither a string nor an object of the fields above, exactly
	// as written. When set, it is the whole value and the other fields are empty.
	Raw json.RawMessage `json:"-"`
}

// ManifestCompensation is how a tool is undone.
//
// +kubebuilder:validation:XValidation:rule="!has(self.kind) || self.kind != 'inverse' || !has(self.residue) || size(self.residue) == 0",message="kind: inverse restores the exact prior state and cannot list residue: use kind: compensation or remove residue",fieldPath=".residue"
type ManifestCompensation struct {
	// Tool is the tool that undoes this one. It must have a manifest, and not be the tool
	// itself.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:/-]+$`
	Tool string `json:"tool"`

	// ArgumentMap builds the undo call's arguments: argument name to a reference,
	// $args.<path> (the original call's arguments) or $result.<path> (what it returned).
	// +optional
	ArgumentMap map[string]ManifestReference `json:"argument_map,omitempty"`

	// Kind is compensation (the default: makes amends, may leave residue) or inverse
	// (restores the exact prior state).
	// +optional
	// +kubebuilder:validation:Enum=compensation;inverse
	Kind string `json:"kind,omitempty"`

	// Residue is what the undo cannot take back, in plain words. An inverse has none.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:items:MinLength=1
	Residue []string `json:"residue,omitempty"`

	// RequiresApproval: a human must approve running this compensation. Default false.
	// +optional
	RequiresApproval *bool `json:"requires_approval,omitempty"`

	// TimeoutMs is recorded on the rollback step for the party that runs the undo. A duration.
	// +optional
	// +kubebuilder:validation:XValidation:rule="type(self) != int || (self > 0 && self <= 31536000000)",message="a duration in milliseconds is between 1 and 31536000000 (365 days); or write it with a unit, such as 30s or 15m"
	TimeoutMs *ManifestDuration `json:"timeout_ms,omitempty"`

	// Verification reads the result of the undo back before it counts as done.
	// +optional
	Verification *ManifestVerification `json:"verification,omitempty"`
}

// ManifestReference is a reference to a value of the original call: $args.<path> or
// $result.<path>. Path segments are separated by dots and hold no whitespace; array indexes
// are segments (items.0.id).
//
// +kubebuilder:validation:Pattern=`^\$(args|result)(\.[^.\t\n\v\f\r\x{85}\p{Z}]+)+$`
type ManifestReference string

// ManifestVerification is the read-back after an undo: call a read_only tool and compare its
// answer.
type ManifestVerification struct {
	// Tool is the read-back tool; it must have a manifest with effect read_only.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:/-]+$`
	Tool string `json:"tool"`

	// Arguments of the read-back: argument name to a reference ($args.<path> or
	// $result.<path>), resolved from the original call and its result.
	// +optional
	Arguments map[string]ManifestReference `json:"arguments,omitempty"`

	// Expect maps a dotted path in the read-back's result (items.0.id) to the value expected
	// there, compared by deep equality. Values are any JSON. At least one entry.
	// +required
	// +kubebuilder:validation:MinProperties=1
	Expect map[string]apiextensionsv1.JSON `json:"expect"`

	// Retries is how many attempts before the read-back counts as failed, 1 to 10 (default 3).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10
	Retries *int64 `json:"retries,omitempty"`

	// BackoffMs is the delay before the second attempt, doubled between attempts (default
	// 1000 ms). A duration.
	// +optional
	// +kubebuilder:validation:XValidation:rule="type(self) != int || (self > 0 && self <= 31536000000)",message="a duration in milliseconds is between 1 and 31536000000 (365 days); or write it with a unit, such as 30s or 15m"
	BackoffMs *ManifestDuration `json:"backoff_ms,omitempty"`
}

// ManifestRequirement is one `requires` entry: a tool name, or the object form {tool, status:
// succeeded}. The API server checks the object form's fields; a value of another shape, or an
// unknown field in the object form, is kept and reported by the controller's validator
// (condition Valid=False). In Go, Name holds the string form and Raw any other value, exactly
// as written.
//
// +kubebuilder:validation:Type=""
// +kubebuilder:pruning:PreserveUnknownFields
type ManifestRequirement struct {
	// Name is the string form: the required tool's name. Empty for the object form.
	Name string `json:"-"`

	// Tool is the required tool (object form).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.:/-]+$`
	Tool string `json:"tool,omitempty"`

	// Status the required tool must have reached: succeeded, the only one and the default.
	// +optional
	// +kubebuilder:validation:Enum=succeeded
	Status string `json:"status,omitempty"`

	// Raw holds a value that is neither a string nor an object of the fields above, exactly
	// as written. When set, it is the whole value and the other fields are empty.
	Raw json.RawMessage `json:"-"`
}

// ManifestRisk is recorded for policy and review.
type ManifestRisk struct {
	// DataClass is free text such as pii or financial.
	// +optional
	DataClass string `json:"data_class,omitempty"`

	// BlastRadius is low, medium, high or critical.
	// +optional
	// +kubebuilder:validation:Enum=low;medium;high;critical
	BlastRadius string `json:"blast_radius,omitempty"`

	// Environment is recorded only.
	// +optional
	Environment string `json:"environment,omitempty"`
}

// ManifestRetry is the forward retry of read_only and idempotent tools.
type ManifestRetry struct {
	// Attempts, 1 to 10 (default 3).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10
	Attempts *int64 `json:"attempts,omitempty"`

	// BaseMs is the first delay (default 200 ms). A duration.
	// +optional
	// +kubebuilder:validation:XValidation:rule="type(self) != int || (self > 0 && self <= 31536000000)",message="a duration in milliseconds is between 1 and 31536000000 (365 days); or write it with a unit, such as 30s or 15m"
	BaseMs *ManifestDuration `json:"base_ms,omitempty"`

	// MaxMs is the longest delay (default 5000 ms). A duration.
	// +optional
	// +kubebuilder:validation:XValidation:rule="type(self) != int || (self > 0 && self <= 31536000000)",message="a duration in milliseconds is between 1 and 31536000000 (365 days); or write it with a unit, such as 30s or 15m"
	MaxMs *ManifestDuration `json:"max_ms,omitempty"`
}

// ManifestIdempotency is the duplicate-call key of a tool.
type ManifestIdempotency struct {
	// Key is a template over the call's arguments with at least one {{args.field}}, such as
	// charge-{{args.order_id}}. No other placeholder is allowed (checked by the validator).
	// +required
	// +kubebuilder:validation:Pattern=`\{\{[\t\n\v\f\r\x{85}\p{Z}]*args(\.[^.{}\t\n\v\f\r\x{85}\p{Z}]+)+[\t\n\v\f\r\x{85}\p{Z}]*\}\}`
	Key string `json:"key"`

	// Scope is where keys must be unique: run (the default), actor or global.
	// +optional
	// +kubebuilder:validation:Enum=run;actor;global
	Scope string `json:"scope,omitempty"`
}

// ManifestAudit holds the audit settings of a tool.
type ManifestAudit struct {
	// RetentionDays is how many days the evidence is kept. A positive integer.
	// +optional
	// +kubebuilder:validation:Minimum=1
	RetentionDays *int64 `json:"retention_days,omitempty"`

	// EvidenceExport is required or optional.
	// +optional
	// +kubebuilder:validation:Enum=required;optional
	EvidenceExport string `json:"evidence_export,omitempty"`

	// Redaction lists the paths to redact, as references such as $args.card_token.
	// +optional
	// +listType=atomic
	Redaction []ManifestReference `json:"redaction,omitempty"`
}

// ToolManifestStatus is the observed state of a ToolManifest.
type ToolManifestStatus struct {
	// ObservedGeneration is the metadata.generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, Reconciling and Stalled (kstatus), Valid and SignatureVerified.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// Checksum is the lowercase hex SHA-256 of the normalised manifest's canonical JSON (the
	// value a signature covers), set when the spec is valid.
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	Checksum string `json:"checksum,omitempty"`
}

// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=tm,categories=reversi
// +kubebuilder:printcolumn:name="Tool",type=string,JSONPath=`.spec.tool`
// +kubebuilder:printcolumn:name="Effect",type=string,JSONPath=`.spec.effect`
// +kubebuilder:printcolumn:name="Version",type=integer,JSONPath=`.spec.version`
// +kubebuilder:printcolumn:name="Signed",type=string,JSONPath=`.status.conditions[?(@.type=="SignatureVerified")].status`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Checksum",type=string,JSONPath=`.status.checksum`,priority=1

// ToolManifest is one tool manifest as a Kubernetes object, for Argo CD, Flux and kubectl
// users. The spec is the manifest format field for field. The annotations reversi.dev/signature
// and reversi.dev/key-id carry its Ed25519 signature (the message a registry version is
// signed with); `reversi manifests export --format crd` writes signed ToolManifests. The
// controller validates the spec and, when the namespace has trusted keys, verifies the
// signature.
type ToolManifest struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the manifest.
	// +required
	Spec ToolManifestSpec `json:"spec"`

	// Status is the observed state, written by the controller. Until the controller first
	// writes it, it is served with observedGeneration 0 (the default), so kstatus, and with it
	// Flux's health checks, reads a new object as in progress rather than as Current.
	// +optional
	// +kubebuilder:default={observedGeneration: 0}
	Status ToolManifestStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// ToolManifestList is a list of ToolManifest.
type ToolManifestList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the manifests.
	Items []ToolManifest `json:"items"`
}

// GetConditions returns the status conditions.
func (in *ToolManifest) GetConditions() []metav1.Condition { return in.Status.Conditions }

// SetConditions replaces the status conditions.
func (in *ToolManifest) SetConditions(c []metav1.Condition) { in.Status.Conditions = c }

func init() {
	SchemeBuilder.Register(&ToolManifest{}, &ToolManifestList{})
}
