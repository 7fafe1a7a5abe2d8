// Package manifest is the tool manifest format: types, strict parsing of JSON and YAML,
// durations, defaults, normalisation, validation (one manifest and a set), canonical JSON and
// checksums, and the pure parts of undo (references, plan step, verification, duplicate keys).
//
// Source of the rules: seed "Tool manifests" (../shared/seeds/000_0a534b082ba0ade1.txt).
// This package imports nothing of the project.
package manifest

// Effect says what a tool changes and how it can be undone (seed: Effects).
type Effect string

const (
	ReadOnly     Effect = "read_only"
	Idempotent   Effect = "idempotent"
	Reversible   Effect = "reversible"
	Compensable  Effect = "compensable"
	Irreversible Effect = "irreversible"
)

// Effects lists every effect in the seed's order.
var Effects = []Effect{ReadOnly, Idempotent, Reversible, Compensable, Irreversible}

// Mutating reports whether the effect changes something (everything but read_only).
func (e Effect) Mutating() bool { return e != ReadOnly }

// NeedsCompensation reports whether a compensation is required (reversible, compensable);
// for every other effect it is forbidden.
func (e Effect) NeedsCompensation() bool { return e == Reversible || e == Compensable }

// Retryable reports whether `retry` is allowed: only read_only and idempotent tools, since
// retrying anything else could repeat its effect.
func (e Effect) Retryable() bool { return e == ReadOnly || e == Idempotent }

// Status is a manifest's lifecycle state (seed: Lifecycle).
type Status string

const (
	Draft      Status = "draft"
	Approved   Status = "approved"
	Deprecated Status = "deprecated"
)

// Default values of the seed's tables.
const (
	DefaultVersion             = 1
	DefaultRetryAttempts       = 3
	DefaultRetryBaseMs   int64 = 200
	DefaultRetryMaxMs    int64 = 5000
	DefaultVerifyRetries       = 3
	DefaultVerifyBackoff int64 = 1000
	DefaultQuorum              = 1
	MaxToolNameLength          = 128
)

// Manifest is one normalised tool manifest. Durations are milliseconds. Marshalled to JSON it
// uses the seed's snake_case names, states every default explicitly, and is itself a valid
// manifest that normalises to the same value (so its canonical JSON is a fixed point).
type Manifest struct {
	Tool         string        `json:"tool"`
	Description  string        `json:"description,omitempty"`
	Effect       Effect        `json:"effect"`
	Permission   string        `json:"permission"`
	Approval     Approval      `json:"approval"`
	Compensation *Compensation `json:"compensation,omitempty"`
	Requires     []Requirement `json:"requires,omitempty"`
	Version      int           `json:"version"`
	Status       Status        `json:"status"`
	ReplacedBy   string        `json:"replaced_by,omitempty"`
	Owner        string        `json:"owner,omitempty"`
	Oncall       string        `json:"oncall,omitempty"`
	Risk         *Risk         `json:"risk,omitempty"`
	TimeoutMs    *int64        `json:"timeout_ms,omitempty"`
	Retry        *Retry        `json:"retry,omitempty"`
	Idempotency  *Idempotency  `json:"idempotency,omitempty"`
	Audit        *Audit        `json:"audit,omitempty"`
	SchemaHash   string        `json:"schema_hash,omitempty"`
}

// Approval is the normalised `approval` field: Required false is `never`; Required true with
// no Rules is `always`; with Rules it is the object form (seed: Approval). Irreversible tools
// always have Required true.
type Approval struct {
	Required bool
	Rules    *ApprovalRules
}

// ApprovalRules say who and how many must approve. TimeoutMs is in milliseconds.
type ApprovalRules struct {
	Roles      []string `json:"roles,omitempty"`
	Quorum     int      `json:"quorum"`
	TimeoutMs  *int64   `json:"timeout,omitempty"`
	OnTimeout  string   `json:"on_timeout"`
	EscalateTo []string `json:"escalate_to,omitempty"`
}

// Compensation is how a tool is undone (seed: Compensation). TimeoutMs is in milliseconds.
type Compensation struct {
	Tool             string            `json:"tool"`
	ArgumentMap      map[string]string `json:"argument_map,omitempty"`
	Kind             string            `json:"kind"`
	Residue          []string          `json:"residue,omitempty"`
	RequiresApproval bool              `json:"requires_approval"`
	TimeoutMs        *int64            `json:"timeout_ms,omitempty"`
	Verification     *Verification     `json:"verification,omitempty"`
}

// Compensation kinds.
const (
	KindCompensation = "compensation"
	KindInverse      = "inverse"
)

// Verification is the read-back after an undo (seed: Verification). BackoffMs is the first
// delay in milliseconds, doubled between attempts.
type Verification struct {
	Tool      string            `json:"tool"`
	Arguments map[string]string `json:"arguments,omitempty"`
	Expect    map[string]any    `json:"expect"`
	Retries   int               `json:"retries"`
	BackoffMs int64             `json:"backoff_ms"`
}

// Requirement is one `requires` entry, normalised to the object form.
type Requirement struct {
	Tool   string `json:"tool"`
	Status string `json:"status"`
}

// RequirementSucceeded is the only status a requirement can name.
const RequirementSucceeded = "succeeded"

// Risk is recorded for policy and review. BlastRadius is low, medium, high or critical.
type Risk struct {
	DataClass   string `json:"data_class,omitempty"`
	BlastRadius string `json:"blast_radius,omitempty"`
	Environment string `json:"environment,omitempty"`
}

// Retry is the forward retry of read_only and idempotent tools. Times in milliseconds.
type Retry struct {
	Attempts int   `json:"attempts"`
	BaseMs   int64 `json:"base_ms"`
	MaxMs    int64 `json:"max_ms"`
}

// Idempotency is the duplicate-call key (seed: Duplicate calls). Scope is run, actor or global.
type Idempotency struct {
	Key   string `json:"key"`
	Scope string `json:"scope"`
}

// Audit settings. Redaction entries are references such as $args.card_token.
type Audit struct {
	RetentionDays  int      `json:"retention_days,omitempty"`
	EvidenceExport string   `json:"evidence_export,omitempty"`
	Redaction      []string `json:"redaction,omitempty"`
}

// Enumerations of the seed's tables.
var (
	BlastRadii        = []string{"low", "medium", "high", "critical"}
	OnTimeouts        = []string{"deny", "escalate"}
	IdempotencyScopes = []string{"run", "actor", "global"}
	EvidenceExports   = []string{"required", "optional"}
	Kinds             = []string{KindCompensation, KindInverse}
	Statuses          = []Status{Draft, Approved, Deprecated}
)
