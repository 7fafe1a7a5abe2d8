package policy

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/interpreter"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
)

// Input is one call to decide, with what the rules may read.
type Input struct {
	Tool string
	// Args are the call's arguments as decoded JSON (map[string]any, []any, string, float64
	// or int64, bool, nil). nil is no arguments.
	Args map[string]any
	// Manifest is the tool's manifest, nil when it has none. Match parts other than tools
	// read it, and the `manifest` variable shows its facts; its approval is merged with the
	// policy's (Result.Approval).
	Manifest    *manifest.Manifest
	Actor       Actor
	Run         Run
	Gateway     string
	Environment string
	// Now is the time of the call; zero is time.Now().
	Now time.Time
	// Counter counts the calls of limit rules; nil makes every limit rule that matches deny
	// (it cannot be enforced).
	Counter Counter
}

// Result is the decision for one call.
type Result struct {
	// Decision is the strongest effect that fired: deny (a deny rule, an exceeded limit, a
	// limit that could not be counted) over require_approval over advise over allow.
	Decision apipolicy.Decision
	// Fired lists every rule that fired, in evaluation order (limits only when exceeded or
	// not countable).
	Fired []Fired
	// Reason is the text of the decision: the deny reasons (shown to the agent as "Blocked by
	// Reversi: <reason>"), or the reasons of the approval rules (the request's reason), or the
	// advice notes, joined with "; ". Empty for allow.
	Reason string
	// Advice holds the notes of the advise rules that fired, whatever the decision.
	Advice []string
	// Approval is the merged approval when Decision is require_approval: the approval rules
	// that fired, merged with the manifest's own rules when it requires approval
	// (MergeApproval). nil otherwise.
	Approval *manifest.ApprovalRules
	// Counts are the limit counters this call counts under when it goes ahead (the limit
	// rules it matches that are not reached): the caller records them with Record once the
	// call is forwarded, which records nothing for a denied call.
	Counts []CountKey
}

// Fired is one rule that fired.
type Fired struct {
	// Rule is "<policy>/<rule>".
	Rule   string
	Effect apipolicy.Effect
	// Reason is the rule's reason (for a limit, with the bound that was reached).
	Reason string
	// Error is set when the condition could not be evaluated (a missing argument, a type
	// mismatch, the cost limit): the rule then fires as if its condition held.
	Error string
	// Approval is the rule's own approval (require_approval; nil means any one approver).
	Approval *manifest.ApprovalRules
}

// Evaluate decides one call: every rule whose match selects the call and whose condition
// holds fires; the strongest effect decides (see Result). Rules run in the set's order
// (policies by name, rules as written); the decision does not depend on the order, only the
// order of Fired and of the joined reasons does.
//
// Failing closed: a condition that cannot be evaluated (an error such as a missing argument,
// "no such key", a value of the wrong type, the cost limit) counts as true, so
// the rule fires at its own strength and Fired.Error says why: a deny rule denies, an approval
// rule asks for approval, a limit counts the call, an advise rule only adds its note (it can
// never block). A condition that must not fire for calls without an argument says so with
// has(args.x) or args.?x.orValue(default). A limit whose count fails, or with no Counter,
// denies.
//
// ctx is passed to the Counter only (conditions are bounded by CostLimit, not by time).
// Cost: nothing per rule that does not match; each variable is converted to a CEL value once
// per call, on first use; a condition's evaluation is bounded by CostLimit.
func (s *Set) Evaluate(ctx context.Context, in Input) Result {
	res := Result{Decision: apipolicy.DecisionAllow}
	if s == nil || len(s.rules) == 0 {
		return res
	}
	if in.Now.IsZero() {
		in.Now = time.Now()
	}
	act := activation{in: &in, adapter: s.adapter}
	var denies, approvalReasons []string
	var approvals []*manifest.ApprovalRules
	approval := false
	var counts []CountKey
	for _, r := range s.rules {
		if !r.match.matches(in.Tool, in.Manifest) {
			continue
		}
		errText := ""
		if r.prg != nil {
			out, _, err := r.prg.Eval(&act)
			switch {
			case err != nil:
				errText = err.Error()
			default:
				b, ok := out.Value().(bool)
				if !ok {
					errText = fmt.Sprintf("the condition gave %s, not a bool", out.Type())
				} else if !b {
					continue
				}
			}
		}
		reason := r.r.Reason
		if errText != "" {
			reason = fmt.Sprintf("rule %s could not evaluate its condition (%s), so it applies", r.id, errText) + suffix(reason)
		}
		switch r.r.Effect {
		case apipolicy.Deny:
			res.Fired = append(res.Fired, Fired{Rule: r.id, Effect: r.r.Effect, Reason: reason, Error: errText})
			denies = append(denies, reason)
		case apipolicy.RequireApproval:
			if reason == "" {
				reason = "rule " + r.id + " requires approval"
			}
			res.Fired = append(res.Fired, Fired{Rule: r.id, Effect: r.r.Effect, Reason: reason, Error: errText, Approval: r.r.Approval})
			approval = true
			approvals = append(approvals, r.r.Approval)
			approvalReasons = append(approvalReasons, reason)
		case apipolicy.Advise:
			res.Fired = append(res.Fired, Fired{Rule: r.id, Effect: r.r.Effect, Reason: reason, Error: errText})
			res.Advice = append(res.Advice, reason)
		case apipolicy.Limit:
			key, why := r.checkLimit(ctx, &in)
			if why == "" {
				counts = append(counts, key)
				continue
			}
			if errText != "" {
				why += fmt.Sprintf(" (its condition could not be evaluated: %s)", errText)
			}
			res.Fired = append(res.Fired, Fired{Rule: r.id, Effect: r.r.Effect, Reason: why, Error: errText})
			denies = append(denies, why)
		}
	}
	switch {
	case len(denies) > 0:
		res.Decision = apipolicy.DecisionDeny
		res.Reason = strings.Join(denies, "; ")
	case approval:
		res.Decision = apipolicy.DecisionRequireApproval
		res.Reason = strings.Join(approvalReasons, "; ")
		var base *manifest.ApprovalRules
		if in.Manifest != nil && in.Manifest.Approval.Required {
			base = in.Manifest.Approval.Rules
			if base == nil {
				base = &manifest.ApprovalRules{Quorum: manifest.DefaultQuorum, OnTimeout: "deny"}
			}
		}
		res.Approval = MergeApproval(base, approvals...)
	case len(res.Advice) > 0:
		res.Decision = apipolicy.DecisionAdvise
		res.Reason = strings.Join(res.Advice, "; ")
	}
	res.Counts = counts
	return res
}

func suffix(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + reason
}

// checkLimit counts the calls of a limit rule: the key and the deny reason ("" when the call
// is within the limit).
func (r *rule) checkLimit(ctx context.Context, in *Input) (CountKey, string) {
	l := r.r.Limit
	key := CountKey{Rule: r.id, Scope: l.Per}
	switch l.Per {
	case apipolicy.PerRun:
		key.Subject = in.Run.ID
	case apipolicy.PerActor:
		key.Subject = in.Actor.Principal
	case apipolicy.PerGateway:
		key.Subject = in.Gateway
	}
	bound := fmt.Sprintf("at most %d %s of rule %s per %s%s", l.Max, plural(l.Max, "call", "calls"), r.id, l.Per, windowText(l))
	if in.Counter == nil {
		return key, "cannot enforce " + bound + ": no counter is configured"
	}
	var since time.Time
	if w := l.Window(); w > 0 {
		since = in.Now.Add(-w)
	}
	n, err := in.Counter.Count(ctx, key, since)
	if err != nil {
		return key, fmt.Sprintf("cannot enforce %s: counting failed: %v", bound, err)
	}
	if n < l.Max {
		return key, ""
	}
	if r.r.Reason != "" {
		return key, r.r.Reason + " (" + bound + ")"
	}
	return key, bound
}

func windowText(l *apipolicy.RuleLimit) string {
	if l.WindowMs == nil {
		return ""
	}
	return " within " + formatMs(*l.WindowMs)
}

// formatMs writes milliseconds in the largest whole unit of the manifest durations.
func formatMs(ms int64) string {
	for _, u := range []struct {
		n    int64
		name string
	}{{86400e3, "d"}, {3600e3, "h"}, {60e3, "m"}, {1e3, "s"}} {
		if ms%u.n == 0 {
			return fmt.Sprintf("%d%s", ms/u.n, u.name)
		}
	}
	return fmt.Sprintf("%dms", ms)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// activation resolves the CEL variables of one call, building each on first use and keeping
// it as a CEL value, so the rules of one call share one conversion.
type activation struct {
	in      *Input
	adapter types.Adapter
	vals    [8]ref.Val // one per Variables entry
}

var emptyArgs = map[string]any{}

// varIndex is the position of each variable in activation.vals.
var varIndex = func() map[string]int {
	m := make(map[string]int, len(Variables))
	for i, v := range Variables {
		m[v] = i
	}
	return m
}()

// ResolveName implements interpreter.Activation.
func (a *activation) ResolveName(name string) (any, bool) {
	i, ok := varIndex[name]
	if !ok {
		return nil, false
	}
	if v := a.vals[i]; v != nil {
		return v, true
	}
	var native any
	switch name {
	case VarTool:
		native = a.in.Tool
	case VarArgs:
		if a.in.Args == nil {
			native = emptyArgs
		} else {
			native = a.in.Args
		}
	case VarManifest:
		native = manifestFacts(a.in.Manifest)
	case VarActor:
		act := a.in.Actor
		if act.Groups == nil {
			act.Groups = []string{}
		}
		native = &act
	case VarRun:
		native = runFacts(a.in.Run)
	case VarGateway:
		native = a.in.Gateway
	case VarEnvironment:
		native = a.in.Environment
	case VarNow:
		native = a.in.Now
	}
	v := a.adapter.NativeToValue(native)
	a.vals[i] = v
	return v, true
}

// Parent implements interpreter.Activation.
func (a *activation) Parent() interpreter.Activation { return nil }

// manifestFacts is the `manifest` variable of a manifest (nil: Found false).
func manifestFacts(m *manifest.Manifest) *Manifest {
	if m == nil {
		return &Manifest{}
	}
	f := &Manifest{Found: true, Tool: m.Tool, Effect: string(m.Effect), Permission: m.Permission, Status: string(m.Status),
		Version: m.Version, Owner: m.Owner, Oncall: m.Oncall, ApprovalRequired: m.Approval.Required}
	if m.Risk != nil {
		f.Risk = Risk{DataClass: m.Risk.DataClass, BlastRadius: m.Risk.BlastRadius, Environment: m.Risk.Environment}
	}
	return f
}

// runFacts fills in Counts and Outcomes from Steps when they are nil.
func runFacts(r Run) *Run {
	if r.Steps == nil {
		r.Steps = []Step{}
	}
	if r.Counts == nil {
		r.Counts = make(map[string]int)
		for _, s := range r.Steps {
			r.Counts[s.Tool]++
		}
	}
	if r.Outcomes == nil {
		r.Outcomes = make(map[string]int)
		for _, s := range r.Steps {
			r.Outcomes[s.Status]++
		}
	}
	return &r
}
