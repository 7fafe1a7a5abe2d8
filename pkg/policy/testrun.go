package policy

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
)

// TestResult is the verdict on one of a policy's own tests.
type TestResult struct {
	// Policy and Name name the test; File and Line locate it.
	Policy, Name string
	File         string
	Line         int
	Passed       bool
	// Why says what did not match when the test failed.
	Why string
	// Result is what the set decided.
	Result Result
}

// RunTests runs the tests of every policy of the set, in the set's order, against the whole
// set (a test checks what the gateway would decide with every policy loaded, so a rule of
// another policy that fires shows up). manifests give each call's manifest (a tool without
// one is called with none). Nothing is touched: limits count in a fresh MemoryCounter per
// test, fed by the test's earlier steps (every step but a blocked one counts under the limit
// rules it matches, at its `at` time or the test's now).
func (s *Set) RunTests(ctx context.Context, manifests []*manifest.Manifest) []TestResult {
	byTool := make(map[string]*manifest.Manifest, len(manifests))
	for _, m := range manifests {
		byTool[m.Tool] = m
	}
	var out []TestResult
	for _, p := range s.Policies() {
		for i := range p.Tests {
			out = append(out, s.runTest(ctx, p, i, byTool))
		}
	}
	return out
}

// countAll is a Counter that reports nothing counted: replaying a run's steps with it yields
// every limit counter a step counts under, whatever the limits.
type countAll struct{}

func (countAll) Count(context.Context, CountKey, time.Time) (int, error) { return 0, nil }
func (countAll) Add(context.Context, CountKey, time.Time) error          { return nil }

func (s *Set) runTest(ctx context.Context, p *apipolicy.Policy, i int, byTool map[string]*manifest.Manifest) TestResult {
	t := &p.Tests[i]
	path := fmt.Sprintf("tests[%d]", i)
	tr := TestResult{Policy: p.Name, Name: t.Name, File: p.File, Line: p.Line(path)}
	now := t.Time()
	actor := Actor{Principal: t.Actor.Principal, Groups: t.Actor.Groups}
	counter := NewMemoryCounter()
	run := Run{ID: t.Run.ID}
	if run.ID == "" {
		run.ID = "policy-test"
	}
	for _, st := range t.Run.Steps {
		if st.Status != "blocked" {
			at := now
			if st.At != "" {
				at, _ = time.Parse(time.RFC3339Nano, st.At)
			}
			res := s.Evaluate(ctx, Input{Tool: st.Tool, Args: st.Args, Manifest: byTool[st.Tool], Actor: actor, Run: run,
				Gateway: t.Gateway, Environment: t.Environment, Now: at, Counter: countAll{}})
			for _, k := range res.Counts {
				_ = counter.Add(ctx, k, at)
			}
		}
		run.Steps = append(run.Steps, Step{Tool: st.Tool, Status: st.Status})
	}
	res := s.Evaluate(ctx, Input{Tool: t.Tool, Args: t.Args, Manifest: byTool[t.Tool], Actor: actor, Run: run,
		Gateway: t.Gateway, Environment: t.Environment, Now: now, Counter: counter})
	tr.Result = res
	fail := func(format string, args ...any) TestResult {
		tr.Why = fmt.Sprintf(format, args...)
		return tr
	}
	if res.Decision != t.Expect {
		why := fmt.Sprintf("expected %s, got %s", t.Expect, res.Decision)
		if len(res.Fired) == 0 {
			return fail("%s (no rule fired)", why)
		}
		return fail("%s (%s)", why, describeFired(res.Fired))
	}
	if t.ExpectReason != "" && !strings.Contains(res.Reason, t.ExpectReason) &&
		!slices.ContainsFunc(res.Fired, func(f Fired) bool { return strings.Contains(f.Reason, t.ExpectReason) }) {
		return fail("expected a reason containing %q, got %q", t.ExpectReason, res.Reason)
	}
	if t.ExpectRules != nil {
		var want, got []string
		for _, r := range t.ExpectRules {
			if !strings.Contains(r, "/") {
				r = apipolicy.ID(p.Name, r)
			}
			want = append(want, r)
		}
		for _, f := range res.Fired {
			got = append(got, f.Rule)
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(slices.Compact(want), slices.Compact(got)) {
			return fail("expected rules %s to fire, got %s", list(want), list(got))
		}
	}
	if ea := t.ExpectApproval; ea != nil {
		if why := compareApproval(ea, res.Approval); why != "" {
			return fail("approval: %s", why)
		}
	}
	tr.Passed = true
	return tr
}

func describeFired(fs []Fired) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = fmt.Sprintf("%s %s: %s", f.Rule, f.Effect, f.Reason)
	}
	return strings.Join(parts, "; ")
}

func list(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// compareApproval compares the written fields of want with got; roles and escalate_to as sets.
func compareApproval(want *apipolicy.ExpectApproval, got *manifest.ApprovalRules) string {
	if got == nil {
		return "none was merged"
	}
	sameSet := func(a, b []string) bool {
		a, b = slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b))
		return slices.Equal(slices.Compact(a), slices.Compact(b))
	}
	var diffs []string
	if want.Roles != nil && !sameSet(want.Roles, got.Roles) {
		diffs = append(diffs, fmt.Sprintf("roles %s, want %s", list(got.Roles), list(want.Roles)))
	}
	if want.Quorum != nil && *want.Quorum != got.Quorum {
		diffs = append(diffs, fmt.Sprintf("quorum %d, want %d", got.Quorum, *want.Quorum))
	}
	if want.TimeoutMs != nil {
		switch {
		case got.TimeoutMs == nil:
			diffs = append(diffs, fmt.Sprintf("no timeout, want %s", formatMs(*want.TimeoutMs)))
		case *got.TimeoutMs != *want.TimeoutMs:
			diffs = append(diffs, fmt.Sprintf("timeout %s, want %s", formatMs(*got.TimeoutMs), formatMs(*want.TimeoutMs)))
		}
	}
	if want.OnTimeout != "" && want.OnTimeout != got.OnTimeout {
		diffs = append(diffs, fmt.Sprintf("on_timeout %s, want %s", got.OnTimeout, want.OnTimeout))
	}
	if want.EscalateTo != nil && !sameSet(want.EscalateTo, got.EscalateTo) {
		diffs = append(diffs, fmt.Sprintf("escalate_to %s, want %s", list(got.EscalateTo), list(want.EscalateTo)))
	}
	return strings.Join(diffs, "; ")
}

// Uncovered returns the IDs of the set's rules that fired in none of the results, in the
// set's order: rules no test shows doing anything.
func (s *Set) Uncovered(results []TestResult) []string {
	fired := map[string]bool{}
	for _, r := range results {
		for _, f := range r.Result.Fired {
			fired[f.Rule] = true
		}
	}
	var out []string
	for _, r := range s.Rules() {
		if !fired[r.ID] {
			out = append(out, r.ID)
		}
	}
	return out
}
