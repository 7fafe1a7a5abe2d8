// Package policy is the policy format: named rules over calls (a match, a CEL condition and an
// effect that only tightens), with the policy's own tests; strict parsing of JSON and YAML with
// every error at once (file:line and the path inside), canonical JSON and checksums.
//
// Compiling and evaluating the CEL conditions is pkg/policy's work; this package only reads
// and checks the format (the condition is kept as text). docs/policy.md describes the format.
//
// Source of the rules: issue 21 and DESIGN.md "Policy (#17)"; the approval object and the
// durations are the manifest's (seed "Tool manifests": Approval, Fields), read by api/manifest.
// This package imports api/manifest and nothing else of the project.
package policy

import (
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// Effect is what a rule does to a call it matches. There is no allow effect: a policy can
// only tighten what the manifests and the gateway already allow.
type Effect string

const (
	// Deny refuses the call; Rule.Reason is shown to the agent.
	Deny Effect = "deny"
	// RequireApproval holds the call for a human; Rule.Approval is merged with the manifest's.
	RequireApproval Effect = "require_approval"
	// Advise adds Rule.Reason as a note to the call; it never blocks.
	Advise Effect = "advise"
	// Limit admits at most Rule.Limit.Max matching calls per scope (and window); the next
	// one is denied.
	Limit Effect = "limit"
)

// Effects lists every effect, in order of the documentation.
var Effects = []Effect{Deny, RequireApproval, Advise, Limit}

// LimitScope is who a limit counts calls for.
type LimitScope string

const (
	// PerRun counts the calls of one run (agent session). A window is optional.
	PerRun LimitScope = "run"
	// PerActor counts the calls of one principal across runs. A window is required.
	PerActor LimitScope = "actor"
	// PerGateway counts every call the gateway serves. A window is required.
	PerGateway LimitScope = "gateway"
)

// LimitScopes lists every scope.
var LimitScopes = []LimitScope{PerRun, PerActor, PerGateway}

// Policy is one policy document: a name, rules and tests. Marshalled to JSON it uses the
// format's snake_case names with durations in milliseconds, and is itself a valid policy
// that decodes to the same value (its canonical JSON is a fixed point).
type Policy struct {
	// Name is the policy's name (`policy:`): letters, digits and _ . : / -; unique in a set.
	Name        string `json:"policy"`
	Description string `json:"description,omitempty"`
	Rules       []Rule `json:"rules"`
	Tests       []Test `json:"tests,omitempty"`

	// File is the file the policy was read from ("" when decoded from a value).
	File string `json:"-"`
	// line gives the line of a path inside the policy (nil when not read from a file).
	line func(path string) int
}

// Line returns the line in File of the field at path ("rules[0].condition"), or of its
// closest enclosing field; 0 when unknown.
func (p *Policy) Line(path string) int {
	if p == nil || p.line == nil {
		return 0
	}
	return p.line(path)
}

// Rule is one rule. Name is unique in its policy; ID() is "<policy>/<rule>".
type Rule struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Match selects the calls the rule looks at; the zero Match matches every call.
	Match Match `json:"match,omitzero"`
	// Condition is a CEL expression of type bool (pkg/policy documents its variables and
	// functions); "" means true.
	Condition string `json:"condition,omitempty"`
	Effect    Effect `json:"effect"`
	// Reason is the text of the decision: shown to the agent for deny and limit, the note of
	// advise, the request's reason for require_approval. Required for deny and advise.
	Reason string `json:"reason,omitempty"`
	// Approval is who must approve (require_approval only; nil means any one approver).
	Approval *manifest.ApprovalRules `json:"approval,omitempty"`
	// Limit is set exactly for the limit effect.
	Limit *RuleLimit `json:"limit,omitempty"`
}

// Match selects calls by the tool's name and its manifest's facts. Every listed part must
// hold (and); within a part any entry may (or). An empty part matches anything. The parts
// other than Tools read the tool's manifest, so they never match a tool without one.
type Match struct {
	// Tools are tool-name globs (GlobMatch: path.Match syntax, and a name within a matched
	// name before a slash).
	Tools []string `json:"tools,omitempty"`
	// Effects are manifest effects (read_only … irreversible).
	Effects []manifest.Effect `json:"effects,omitempty"`
	// Permissions are globs over the manifest's permission ("payments:*").
	Permissions []string `json:"permissions,omitempty"`
	// Risk matches the manifest's risk fields.
	Risk *RiskMatch `json:"risk,omitempty"`
}

// IsZero reports whether the match selects every call.
func (m Match) IsZero() bool {
	return len(m.Tools) == 0 && len(m.Effects) == 0 && len(m.Permissions) == 0 && m.Risk == nil
}

// NeedsManifest reports whether the match reads the manifest (effects, permissions, risk).
func (m Match) NeedsManifest() bool {
	return len(m.Effects) > 0 || len(m.Permissions) > 0 || m.Risk != nil
}

// RiskMatch matches manifest risk fields; an empty list matches any value (also none).
type RiskMatch struct {
	DataClass   []string `json:"data_class,omitempty"`
	BlastRadius []string `json:"blast_radius,omitempty"`
}

// RuleLimit is a limit rule's bound: at most Max calls matching the rule per Per, within
// WindowMs milliseconds before the call when set (else over the whole run).
type RuleLimit struct {
	Max      int        `json:"max"`
	Per      LimitScope `json:"per"`
	WindowMs *int64     `json:"window,omitempty"`
}

// Window returns the limit's window as a time.Duration; 0 means unbounded (the whole run).
func (l *RuleLimit) Window() time.Duration {
	if l == nil || l.WindowMs == nil {
		return 0
	}
	return time.Duration(*l.WindowMs) * time.Millisecond
}

// Decision is the outcome of evaluating a policy set for one call, strongest first: deny,
// require_approval, advise, allow. A limit that is exceeded denies.
type Decision string

const (
	DecisionAllow           Decision = "allow"
	DecisionDeny            Decision = "deny"
	DecisionRequireApproval Decision = "require_approval"
	DecisionAdvise          Decision = "advise"
)

// Decisions lists every decision, as a test's `expect` names them.
var Decisions = []Decision{DecisionAllow, DecisionDeny, DecisionRequireApproval, DecisionAdvise}

// Test is one of the policy's own tests: a call (tool, args), who makes it, where and when,
// the run so far, and what the policy set must decide. `reversi test` runs them.
type Test struct {
	Name        string         `json:"name"`
	Tool        string         `json:"tool"`
	Args        map[string]any `json:"args,omitempty"`
	Actor       Actor          `json:"actor,omitzero"`
	Environment string         `json:"environment,omitempty"`
	Gateway     string         `json:"gateway,omitempty"`
	// Now is the time of the call, RFC 3339 ("2026-12-04T10:00:00Z"); "" is DefaultTestTime.
	Now string `json:"now,omitempty"`
	// Run is the run so far; its steps also feed the limit counters.
	Run TestRun `json:"run,omitzero"`

	Expect Decision `json:"expect"`
	// ExpectReason is a substring of the decision's reason (deny) or of one fired rule's
	// reason (other decisions).
	ExpectReason string `json:"expect_reason,omitempty"`
	// ExpectRules, when set, is the exact list of rule names ("<rule>" in this policy or
	// "<policy>/<rule>") that fire, in any order.
	ExpectRules []string `json:"expect_rules,omitzero"`
	// ExpectApproval, for expect: require_approval, is the merged approval; only the fields
	// written are compared (roles as a set).
	ExpectApproval *ExpectApproval `json:"expect_approval,omitempty"`
}

// DefaultTestTime is a test's `now` when it gives none: a fixed instant, so a test never
// depends on the day it runs (Thursday 1 January 1970, 00:00 UTC).
var DefaultTestTime = time.Unix(0, 0).UTC()

// Time returns the test's `now` (DefaultTestTime when empty). The decoder has checked it.
func (t *Test) Time() time.Time {
	if t.Now == "" {
		return DefaultTestTime
	}
	tm, _ := time.Parse(time.RFC3339Nano, t.Now)
	return tm
}

// Actor is who makes a call: a principal and its groups (roles).
type Actor struct {
	Principal string   `json:"principal,omitempty"`
	Groups    []string `json:"groups,omitempty"`
}

// TestRun is a run history for a test: an id and the steps before the call.
type TestRun struct {
	ID    string     `json:"id,omitempty"`
	Steps []TestStep `json:"steps,omitempty"`
}

// TestStep is one earlier call of the run. Args, when given, let a limit rule's condition see
// the earlier call; At (RFC 3339) is when it ran, default the test's now.
type TestStep struct {
	Tool   string         `json:"tool"`
	Status string         `json:"status"`
	Args   map[string]any `json:"args,omitempty"`
	At     string         `json:"at,omitempty"`
}

// StepStatuses are a step's outcomes, as the gateway's journal records them.
var StepStatuses = []string{"succeeded", "failed", "uncertain", "blocked", "would_block"}

// ExpectApproval is the part of a merged approval a test checks; nil fields are not compared.
// TimeoutMs is in milliseconds (written as a duration).
type ExpectApproval struct {
	Roles      []string `json:"roles,omitempty"`
	Quorum     *int     `json:"quorum,omitempty"`
	TimeoutMs  *int64   `json:"timeout,omitempty"`
	OnTimeout  string   `json:"on_timeout,omitempty"`
	EscalateTo []string `json:"escalate_to,omitempty"`
}

// ID names a rule across a set: "<policy>/<rule>".
func ID(policy, rule string) string { return policy + "/" + rule }
