// Package lint finds tool manifests that are valid but unsafe, incomplete or contradictory.
//
// Source of every rule, level and the line form: seed "Tool manifests", Lint
// (../shared/seeds/000_0a534b082ba0ade1.txt). L017, L020, L027 and L033–L035 compare manifests
// with the real tools' input schemas (upstream.go).
package lint

import (
	"fmt"
	"sort"
	"strings"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// Level is how serious a finding is. `reversi lint` exits 1 on errors, and on warnings with
// --strict.
type Level string

const (
	Error   Level = "error"
	Warning Level = "warning"
	Info    Level = "info"
)

// Finding is one lint result. Path is the manifest field it is about, when there is one.
// Policy findings (L040–L043) name the rule ("<policy>/<rule>") in Tool, the field inside the
// policy in Path ("rules[0].condition"), and the file and line.
type Finding struct {
	Level   Level  `json:"level"`
	Code    string `json:"code"`
	Tool    string `json:"tool"`
	Message string `json:"message"`
	Path    string `json:"path,omitempty"`
	File    string `json:"file,omitempty"`
	Line    int    `json:"line,omitempty"`
}

// String is the seed's line form: `warning L011 stripe.refund: mutating tool has no owner: …`.
// A finding with a file puts its place and path first:
// `error L041 policy/payments.yaml:12: payments/big: rules[0].condition: …`.
func (f Finding) String() string {
	if f.File == "" {
		return fmt.Sprintf("%s %s %s: %s", f.Level, f.Code, f.Tool, f.Message)
	}
	loc := f.File
	if f.Line > 0 {
		loc = fmt.Sprintf("%s:%d", f.File, f.Line)
	}
	if f.Path != "" {
		return fmt.Sprintf("%s %s %s: %s: %s: %s", f.Level, f.Code, loc, f.Tool, f.Path, f.Message)
	}
	return fmt.Sprintf("%s %s %s: %s: %s", f.Level, f.Code, loc, f.Tool, f.Message)
}

// Rule is one lint code: its level and its message, `<what>: <why it matters>`. What may hold
// fmt verbs filled in per finding.
type Rule struct {
	Level Level
	What  string
	Why   string
}

// Rules is the one table of codes, levels and messages. The levels and the L011, L012 and
// L022 messages are the seed's, word for word.
var Rules = map[string]Rule{
	"L010": {Warning, "mutating tool has no description", "reviewers cannot tell what it changes"},
	"L011": {Warning, "mutating tool has no owner", "nobody is named to ask when it misbehaves"},
	"L012": {Warning, "no risk.data_class", "policy and retention cannot treat sensitive data differently"},
	"L013": {Warning, "compensable but the compensation declares no residue", "a reviewer cannot see what a rollback leaves behind"},
	"L014": {Warning, "compensation tool %s is %s, not idempotent", "rollback retries it, so a retry may repeat the undo"},
	"L015": {Warning, "irreversible with no risk.blast_radius and no approval roles", "nothing tells an approver how much it can break, and anyone may approve it"},
	"L016": {Info, "the undo is not verified", "an API can answer ok and do nothing, and the rollback still counts as done"},
	"L019": {Warning, "read-only tool shares permission %s with mutating tools %s", "a scope that allows the read also allows the change"},
	"L021": {Info, "irreversible without audit.evidence_export: required", "what it did cannot be undone, so evidence of it should not be optional"},
	"L022": {Info, "no timeout_ms", "a hung call is only bounded by the gateway default"},
	"L023": {Error, "requires forms a cycle %s", "no tool in it can be called, since each waits for another to succeed first"},
	"L024": {Warning, "draft manifest", "calls to the tool are blocked until a reviewer approves it"},
	"L030": {Warning, "declared reversible but the compensation lists residue", "a true inverse leaves nothing behind, so the effect and the residue contradict each other"},
	"L031": {Warning, "declared compensable but the compensation is an exact inverse", "make it reversible if the undo restores the exact prior state, else use kind: compensation and list the residue"},
	"L032": {Info, "compensation takes no arguments from the call", "the undo cannot tell which change to take back"},
	"L017": {Error, "%s reads %s, which the input schema lacks (%s)", "the value will be missing when the tool returns, so the undo or its read-back cannot be built"},
	"L020": {Error, "%s uses %s, which the input schema lacks (%s)", "a call whose key cannot be built from its arguments is refused"},
	"L027": {Info, "no schema_hash", "a change of the upstream's input schema goes unnoticed; reversi suggest-manifest fills it in"},
	"L033": {Warning, "%s names %s, which the input schema lacks (%s)", "the argument meant to be hidden is probably named differently, and would be kept"},
	"L034": {Warning, "no upstream tool has this name", "the manifest governs nothing; check the name (through gateway.yaml, tools are named <upstream>.<tool>)"},
	"L035": {Warning, "the upstream offers this tool, but no manifest describes it", "its calls are not governed by a reviewed manifest; reversi suggest-manifest drafts one"},
	// Policy codes (policy.go).
	"L040": {Error, "the condition is not CEL%s", "the policy cannot load, so a gateway keeps serving the previous one"},
	"L041": {Error, "the condition does not type-check%s", "the policy cannot load, so a gateway keeps serving the previous one"},
	"L042": {Warning, "%s", "the rule can never fire; check the names against the manifests"},
	"L043": {Error, "the condition reads args.%s, which no input schema of the tools it matches has (%s)", "the value is always missing, so the condition fails on every call and the rule applies (or, under has(), never does)"},
}

func newFinding(code, tool, path string, args ...any) Finding {
	r, ok := Rules[code]
	if !ok {
		panic("lint: unknown code " + code)
	}
	return Finding{Level: r.Level, Code: code, Tool: tool, Path: path, Message: fmt.Sprintf(r.What, args...) + ": " + r.Why}
}

// Lint checks a set of manifests that passed validation (single and cross-manifest) and
// returns the findings sorted by tool, then code. Source: seed "Tool manifests", Lint.
func Lint(ms []*manifest.Manifest) []Finding {
	byName := make(map[string]*manifest.Manifest, len(ms))
	for _, m := range ms {
		if _, dup := byName[m.Tool]; !dup {
			byName[m.Tool] = m
		}
	}
	var out []Finding
	for _, m := range ms {
		out = append(out, lintOne(m, byName)...)
	}
	out = append(out, sharedPermissions(ms)...)
	out = append(out, requireCycles(ms)...)
	sortFindings(out)
	return out
}

// sortFindings orders findings by tool, then code, then message.
func sortFindings(out []Finding) {
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Tool != b.Tool {
			return a.Tool < b.Tool
		}
		if a.Code != b.Code {
			return a.Code < b.Code
		}
		return a.Message < b.Message
	})
}

// lintOne applies the rules that read one manifest (and the compensation tool's manifest).
func lintOne(m *manifest.Manifest, byName map[string]*manifest.Manifest) []Finding {
	var out []Finding
	add := func(code, path string, args ...any) { out = append(out, newFinding(code, m.Tool, path, args...)) }

	// The seed's example shows stripe.get_charge (read_only, no data_class, no timeout) with
	// no L012 or L022: like L010 and L011 they are about tools that change things.
	if m.Effect.Mutating() {
		if strings.TrimSpace(m.Description) == "" {
			add("L010", "description")
		}
		// An oncall rotation is someone to ask too, so only both missing is a finding.
		if strings.TrimSpace(m.Owner) == "" && strings.TrimSpace(m.Oncall) == "" {
			add("L011", "owner")
		}
		if m.Risk == nil || strings.TrimSpace(m.Risk.DataClass) == "" {
			add("L012", "risk.data_class")
		}
		if m.TimeoutMs == nil {
			add("L022", "timeout_ms")
		}
	}
	if m.Effect == manifest.Irreversible {
		noBlast := m.Risk == nil || m.Risk.BlastRadius == ""
		noRoles := m.Approval.Rules == nil || len(m.Approval.Rules.Roles) == 0
		if noBlast && noRoles {
			add("L015", "risk.blast_radius")
		}
		if m.Audit == nil || m.Audit.EvidenceExport != "required" {
			add("L021", "audit.evidence_export")
		}
	}
	if m.Status == manifest.Draft {
		add("L024", "status")
	}

	c := m.Compensation
	if c == nil {
		return out
	}
	switch {
	// An inverse cannot list residue (a validator rule), so L031 alone says what to fix.
	case m.Effect == manifest.Compensable && c.Kind == manifest.KindInverse:
		add("L031", "compensation.kind")
	case m.Effect == manifest.Compensable && len(c.Residue) == 0:
		add("L013", "compensation.residue")
	case m.Effect == manifest.Reversible && len(c.Residue) > 0:
		add("L030", "compensation.residue")
	}
	// read_only is as safe to repeat as idempotent; a missing manifest is a validator error.
	if ct, ok := byName[c.Tool]; ok && !ct.Effect.Retryable() {
		add("L014", "compensation.tool", c.Tool, ct.Effect)
	}
	if c.Verification == nil {
		add("L016", "compensation.verification")
	}
	if len(c.ArgumentMap) == 0 {
		add("L032", "compensation.argument_map")
	}
	return out
}

// sharedPermissions reports each read_only tool whose permission a mutating tool also needs
// (L019): granting the read grants the write.
func sharedPermissions(ms []*manifest.Manifest) []Finding {
	mutating := map[string][]string{}
	for _, m := range ms {
		if m.Effect.Mutating() {
			mutating[m.Permission] = append(mutating[m.Permission], m.Tool)
		}
	}
	var out []Finding
	for _, m := range ms {
		writers := mutating[m.Permission]
		if m.Effect != manifest.ReadOnly || len(writers) == 0 {
			continue
		}
		names := append([]string(nil), writers...)
		sort.Strings(names)
		out = append(out, newFinding("L019", m.Tool, "permission", m.Permission, strings.Join(names, ", ")))
	}
	return out
}

// requireCycles reports the cycles of the `requires` graph (L023). It reports one cycle per
// back edge of a depth-first search in name order: every cycle contains a back edge, so
// breaking the reported ones breaks them all, each is reported once, and the search is linear
// (listing every elementary cycle can be exponential). A cycle is named from its smallest
// tool, `a -> b -> a`, and reported on that tool.
func requireCycles(ms []*manifest.Manifest) []Finding {
	edges := map[string][]string{}
	var nodes []string
	for _, m := range ms {
		if _, seen := edges[m.Tool]; seen {
			continue
		}
		nodes = append(nodes, m.Tool)
		var next []string
		for _, r := range m.Requires {
			next = append(next, r.Tool)
		}
		sort.Strings(next)
		edges[m.Tool] = next
	}
	sort.Strings(nodes)

	const (
		unseen = iota
		onStack
		done
	)
	state := map[string]int{}
	var stack []string
	var out []Finding
	reported := map[string]bool{}
	var visit func(n string)
	visit = func(n string) {
		state[n] = onStack
		stack = append(stack, n)
		for _, to := range edges[n] {
			if _, defined := edges[to]; !defined {
				continue // a missing tool is a validator error, not a cycle
			}
			switch state[to] {
			case unseen:
				visit(to)
			case onStack:
				i := len(stack) - 1
				for stack[i] != to {
					i--
				}
				path := cyclePath(stack[i:])
				if !reported[path] {
					reported[path] = true
					out = append(out, newFinding("L023", path[:strings.Index(path, " -> ")], "requires", path))
				}
			}
		}
		stack = stack[:len(stack)-1]
		state[n] = done
	}
	for _, n := range nodes {
		if state[n] == unseen {
			visit(n)
		}
	}
	return out
}

// cyclePath names the cycle through nodes (each requiring the next, the last the first),
// starting from its smallest name so the same cycle always reads the same.
func cyclePath(nodes []string) string {
	start := 0
	for i, n := range nodes {
		if n < nodes[start] {
			start = i
		}
	}
	rotated := append(append([]string(nil), nodes[start:]...), nodes[:start]...)
	return strings.Join(append(rotated, rotated[0]), " -> ")
}

// Counts returns how many findings are errors, warnings and notes (info).
func Counts(fs []Finding) (errors, warnings, notes int) {
	for _, f := range fs {
		switch f.Level {
		case Error:
			errors++
		case Warning:
			warnings++
		case Info:
			notes++
		}
	}
	return errors, warnings, notes
}

// Summary is the seed's closing line, `0 errors, 2 warnings, 1 notes` (always plural words).
func Summary(fs []Finding) string {
	e, w, n := Counts(fs)
	return fmt.Sprintf("%d errors, %d warnings, %d notes", e, w, n)
}
