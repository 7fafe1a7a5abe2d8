// Package rollback plans the undo of a run from its ledger: per step, newest first, whether a
// rollback compensates it (with the compensation tool and the arguments journaled in its
// handle), skips it, cannot recover it, or leaves it not undone. It executes nothing: Plan and
// DryRun back `reversi.plan_rollback` and `reversi.dry_run_rollback`, and the executing
// rollback (`reversi.execute_rollback`, `spec.rollback` on a ReversiRun) runs the plan's
// compensate steps in order.
//
// Source: seed "MCP gateway" (../shared/seeds/003_0ebd38203277749f.txt), `reversi.*` tools and
// Limits ("Rollback executes against the upstream the compensation tool is exposed by"); seed
// "Tool manifests" (000): Effects ("irreversible ... rollback reports it as not undone"),
// Compensation ("marked unrecoverable rather than guessed"; "The plan reports kind and residue
// per step"); DESIGN.md, ReversiRun rollback steps; issue 5.
package rollback

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// StepRecords is one step of a run: its intent record and its outcome record (nil while the
// call is in flight, or when the gateway stopped before journaling it and Recover has not run).
type StepRecords struct {
	Intent  store.Record
	Outcome *store.Record
}

// Steps folds a run's records (any order) into steps, in intent Seq order. Records that are
// not intents or outcomes are left out; an outcome without its intent is ignored.
func Steps(recs []store.Record) []StepRecords {
	byStep := map[int64]int{}
	var out []StepRecords
	for _, r := range recs {
		if r.Kind == store.KindIntent {
			byStep[r.Seq] = len(out)
			out = append(out, StepRecords{Intent: r})
		}
	}
	for i := range recs {
		r := recs[i]
		if r.Kind != store.KindOutcome {
			continue
		}
		if j, ok := byStep[r.Step]; ok {
			out[j].Outcome = &r
		}
	}
	slices.SortFunc(out, func(a, b StepRecords) int { return int(a.Intent.Seq - b.Intent.Seq) })
	return out
}

// Manifests gives the manifest that applies to a tool now (*engine.Engine is one).
type Manifests interface {
	Manifest(tool string) *manifest.Manifest
}

// Tools checks compensation calls against the upstreams' tools (*engine.Engine is one).
type Tools interface {
	// Exposed reports whether an upstream offers the tool.
	Exposed(tool string) bool
	// CheckArguments returns "" or the input-schema problems of args; unchecked is true
	// when the tool publishes no usable input schema.
	CheckArguments(tool string, args map[string]any) (problem string, unchecked bool)
}

// Compensation is the undo call of a step.
type Compensation struct {
	Tool string `json:"tool" jsonschema:"the compensation tool (exposed name)"`
	// Kind, Residue and RequiresApproval come from the manifest that applies now.
	Kind             string   `json:"kind,omitempty" jsonschema:"compensation or inverse"`
	Residue          []string `json:"residue,omitempty" jsonschema:"what the undo leaves behind"`
	RequiresApproval bool     `json:"requires_approval" jsonschema:"the compensation itself needs approval"`
	// Arguments are the undo call's arguments: the values argument_map named, journaled in
	// the step's handle when the call returned (or resolved from the call's arguments, in an
	// outlook).
	Arguments map[string]any `json:"arguments,omitempty" jsonschema:"the undo call's arguments"`
}

// Check is the dry run's verdict on one compensate step.
type Check struct {
	Exposed        bool   `json:"exposed" jsonschema:"an upstream offers the compensation tool"`
	ArgumentsValid bool   `json:"arguments_valid" jsonschema:"the arguments pass the tool's input schema"`
	Problem        string `json:"problem,omitempty" jsonschema:"why the compensation could not run"`
	Note           string `json:"note,omitempty"`
}

// Step is the plan for one step of the run.
type Step struct {
	Step     int64  `json:"step" jsonschema:"the step number (the intent record's seq)"`
	Tool     string `json:"tool"`
	Decision string `json:"decision,omitempty" jsonschema:"the journaled decision: allow, block, needs_approval or would_block"`
	Status   string `json:"status,omitempty" jsonschema:"the journaled outcome; empty while the call has none"`
	// Action is compensate, skip, unrecoverable or not_undone.
	Action       manifest.PlanAction `json:"action" jsonschema:"compensate, skip, unrecoverable or not_undone"`
	Reason       string              `json:"reason"`
	Compensation *Compensation       `json:"compensation,omitempty"`
	Missing      []string            `json:"missing,omitempty" jsonschema:"unrecoverable: the references that had no value"`
	// ManifestVersion and ManifestChecksum are the journaled ones (the manifest that applied
	// when the call was made); ManifestNote says when the current manifest differs.
	ManifestVersion  string `json:"manifest_version,omitempty"`
	ManifestChecksum string `json:"manifest_checksum,omitempty"`
	ManifestNote     string `json:"manifest_note,omitempty"`
	Check            *Check `json:"check,omitempty" jsonschema:"dry run only"`
}

// Summary counts the plan's steps per action.
type Summary struct {
	Compensate    int `json:"compensate"`
	Skip          int `json:"skip"`
	Unrecoverable int `json:"unrecoverable"`
	NotUndone     int `json:"not_undone"`
}

// Plan is the rollback plan of one run: its steps newest first.
type Plan struct {
	Run     string  `json:"run"`
	Steps   []Step  `json:"steps"`
	Summary Summary `json:"summary"`
	// Checked is true after DryRun; Ready then says every compensate step passed its check.
	Checked bool `json:"checked"`
	Ready   bool `json:"ready"`
}

// Texts of the plan's reasons.
const (
	InFlightReason     = "the call has no outcome: it is in flight, or the gateway stopped before journaling one (on restart it becomes uncertain); check the upstream by hand"
	UncertainReason    = "the outcome is uncertain: the upstream may or may not have acted, so no compensation is run automatically; check the upstream by hand"
	UnclassifiedReason = "no manifest: treated as a change that could not be undone"
	NoHandleReason     = "the call journaled no compensation handle (the manifest that applied then declared no compensation), so it cannot be undone automatically"
)

// Build plans the rollback of run: it reads the run's ledger from st and applies, for each
// step, the manifest that applies now (ms); a step an earlier rollback undid is a skip. It executes nothing and writes nothing. It returns
// the store's error when the ledger cannot be read; the caller checks that the run exists and
// belongs to the principal.
func Build(ctx context.Context, st store.Store, ms Manifests, run string) (Plan, error) {
	recs, err := st.Records(ctx, run, 0, 0)
	if err != nil {
		return Plan{}, err
	}
	return alreadyUndone(PlanSteps(run, Steps(recs), ms), recs), nil
}

// PlanSteps plans the given steps (see Build), newest first.
func PlanSteps(run string, steps []StepRecords, ms Manifests) Plan {
	p := Plan{Run: run, Steps: make([]Step, 0, len(steps))}
	sums := map[*manifest.Manifest]string{}
	for i := len(steps) - 1; i >= 0; i-- {
		s := planStep(steps[i], ms, sums)
		switch s.Action {
		case manifest.PlanCompensate:
			p.Summary.Compensate++
		case manifest.PlanSkip:
			p.Summary.Skip++
		case manifest.PlanUnrecoverable:
			p.Summary.Unrecoverable++
		case manifest.PlanNotUndone:
			p.Summary.NotUndone++
		}
		p.Steps = append(p.Steps, s)
	}
	return p
}

func planStep(sr StepRecords, ms Manifests, sums map[*manifest.Manifest]string) Step {
	in, out := sr.Intent, sr.Outcome
	s := Step{Step: in.Seq, Tool: in.Tool, Decision: in.Decision, ManifestVersion: in.ManifestVersion, ManifestChecksum: in.ManifestChecksum}
	m := ms.Manifest(in.Tool)
	if m != nil && in.ManifestChecksum != "" {
		sum, ok := sums[m]
		if !ok {
			sum, _ = manifest.Checksum(m) // a loaded manifest always encodes
			sums[m] = sum
		}
		if sum != in.ManifestChecksum {
			s.ManifestNote = fmt.Sprintf("the manifest of %s changed since the call (journaled version %s, checksum %s; now version %d, checksum %s): this plan uses the current manifest",
				in.Tool, in.ManifestVersion, in.ManifestChecksum, m.Version, sum)
		}
	} else if m == nil && in.ManifestChecksum != "" {
		s.ManifestNote = fmt.Sprintf("no manifest for %s is loaded now (the call ran under version %s, checksum %s)", in.Tool, in.ManifestVersion, in.ManifestChecksum)
	}
	if m != nil && m.Effect == manifest.ReadOnly {
		// Whatever its outcome, a read changed nothing (seed: "read_only: Skipped on rollback").
		s.Action, s.Reason = manifest.PlanSkip, "read_only: changes nothing"
		if out != nil {
			s.Status = string(out.Status)
		}
		return s
	}
	if out == nil {
		s.Action, s.Reason = manifest.PlanNotUndone, InFlightReason
		return s
	}
	s.Status = string(out.Status)
	journaled := func() *Compensation {
		if out.CompensationTool == "" {
			return nil
		}
		c := &Compensation{Tool: out.CompensationTool, Arguments: out.Handle}
		if m != nil && m.Compensation != nil && m.Compensation.Tool == c.Tool {
			c.Kind, c.Residue, c.RequiresApproval = m.Compensation.Kind, m.Compensation.Residue, m.Compensation.RequiresApproval
		}
		return c
	}
	switch out.Status {
	case store.Blocked:
		s.Action, s.Reason = manifest.PlanSkip, "blocked: the call never reached the upstream"
		if out.Note != "" {
			s.Reason += " (" + out.Note + ")"
		}
		return s
	case store.Uncertain:
		if m != nil && m.Effect == manifest.Idempotent {
			// Whether or not it acted, an idempotent call needs no undo (seed "Effects").
			s.Action, s.Reason = manifest.PlanSkip, manifest.IdempotentReason+" (the outcome is uncertain)"
			return s
		}
		s.Action, s.Reason, s.Compensation = manifest.PlanNotUndone, UncertainReason, journaled()
		return s
	}
	outcome := manifest.Succeeded // succeeded, and would_block (the call ran)
	if out.Status == store.Failed {
		outcome = manifest.Failed
	}
	if m == nil && out.CompensationTool == "" {
		if outcome == manifest.Failed {
			s.Action, s.Reason = manifest.PlanSkip, "the call failed: nothing to undo"
		} else {
			s.Action, s.Reason = manifest.PlanNotUndone, UnclassifiedReason
		}
		return s
	}
	if m != nil {
		// The manifest's own verdict for read_only, failed, irreversible and the effects
		// without a compensation (arguments are not needed for those).
		if ps := manifest.PlanStep(m, outcome, map[string]any{}, nil); ps.Action == manifest.PlanSkip || ps.Action == manifest.PlanNotUndone {
			s.Action, s.Reason = ps.Action, ps.Reason
			return s
		}
	}
	if missing, ok := unrecoverable(out.Note); ok {
		s.Action, s.Missing, s.Compensation = manifest.PlanUnrecoverable, missing, journaled()
		s.Reason = "a referenced value was missing when the call returned"
		if len(missing) > 0 {
			s.Reason += ": " + strings.Join(missing, ", ")
		}
		if s.Compensation != nil {
			s.Compensation.Arguments = nil // incomplete: never to be run as is
		}
		return s
	}
	if out.CompensationTool == "" {
		s.Action, s.Reason = manifest.PlanNotUndone, NoHandleReason
		return s
	}
	s.Action, s.Compensation = manifest.PlanCompensate, journaled()
	s.Reason = "run " + out.CompensationTool
	switch {
	case m == nil:
		s.Reason += "; kind and residue are unknown: no manifest for " + in.Tool + " is loaded now"
	case m.Compensation.Tool != out.CompensationTool:
		s.Reason += fmt.Sprintf("; the current manifest names %s instead, but the handle was journaled for %s", m.Compensation.Tool, out.CompensationTool)
	}
	return s
}

// unrecoverable finds the gateway's "unrecoverable: no value for a, b" note among the "; "
// separated parts of an outcome note and returns the references it lists.
func unrecoverable(note string) ([]string, bool) {
	for _, part := range strings.Split(note, "; ") {
		rest, ok := strings.CutPrefix(part, "unrecoverable")
		if !ok {
			continue
		}
		rest = strings.TrimPrefix(strings.TrimSpace(strings.TrimPrefix(rest, ":")), "no value for ")
		var refs []string
		for _, r := range strings.Split(rest, ", ") {
			if r = strings.TrimSpace(r); strings.HasPrefix(r, "$") {
				refs = append(refs, r)
			}
		}
		return refs, true
	}
	return nil, false
}

// DryRun checks each compensate step of p: the compensation tool is exposed by an upstream
// and its arguments pass the tool's input schema. It executes nothing. Compensations bypass
// allow/deny and scope (seed: `reversi.*` tools), so those are not checked.
func DryRun(p Plan, tools Tools) Plan {
	p.Checked, p.Ready = true, true
	steps := slices.Clone(p.Steps)
	for i := range steps {
		s := &steps[i]
		if s.Action != manifest.PlanCompensate || s.Compensation == nil {
			continue
		}
		c := &Check{Exposed: tools.Exposed(s.Compensation.Tool)}
		if !c.Exposed {
			c.Problem = "no upstream exposes " + s.Compensation.Tool + ": the compensation cannot run"
		} else {
			problem, unchecked := tools.CheckArguments(s.Compensation.Tool, s.Compensation.Arguments)
			c.ArgumentsValid = problem == ""
			if problem != "" {
				c.Problem = "the compensation's arguments do not match its input schema: " + problem
			}
			if unchecked {
				c.Note = s.Compensation.Tool + " publishes no usable input schema: the arguments were not checked"
			}
		}
		if c.Problem != "" {
			p.Ready = false
		}
		s.Check = c
	}
	p.Steps = steps
	return p
}

// Outlook is what a rollback could do for a call that has not been made yet.
type Outlook struct {
	Action       manifest.PlanAction `json:"action" jsonschema:"compensate, skip, unrecoverable or not_undone"`
	Reason       string              `json:"reason"`
	Compensation *Compensation       `json:"compensation,omitempty"`
	// FromResult lists the $result references filled in when the call returns.
	FromResult []string `json:"from_result,omitempty"`
	// Missing lists the $args references the arguments lack: the step would be unrecoverable.
	Missing []string `json:"missing,omitempty"`
}

// OutlookFor is the rollback outlook of a call of m's tool with args (nil when unknown: then
// only the manifest's verdict is given). m nil is a tool without a manifest.
func OutlookFor(m *manifest.Manifest, args map[string]any) Outlook {
	if m == nil {
		return Outlook{Action: manifest.PlanNotUndone, Reason: UnclassifiedReason}
	}
	a := any(map[string]any{})
	if args != nil {
		a = args
	}
	ps := manifest.PlanStep(m, manifest.Succeeded, a, nil)
	if ps.Action == manifest.PlanSkip || ps.Action == manifest.PlanNotUndone {
		return Outlook{Action: ps.Action, Reason: ps.Reason}
	}
	c := m.Compensation
	o := Outlook{Action: manifest.PlanCompensate, Reason: "run " + c.Tool,
		Compensation: &Compensation{Tool: c.Tool, Kind: c.Kind, Residue: c.Residue, RequiresApproval: c.RequiresApproval}}
	values, missing := manifest.ResolveMap(c.ArgumentMap, a, nil)
	for _, ref := range missing {
		if strings.HasPrefix(ref, "$result.") {
			o.FromResult = append(o.FromResult, ref)
		} else if args != nil {
			o.Missing = append(o.Missing, ref)
		}
	}
	if args != nil && len(values) > 0 {
		o.Compensation.Arguments = values
	}
	if len(o.Missing) > 0 {
		o.Action = manifest.PlanUnrecoverable
		o.Reason = "the arguments lack " + strings.Join(o.Missing, ", ") + ": the step would be marked unrecoverable"
	}
	return o
}
