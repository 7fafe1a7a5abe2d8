package contracttest

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// The simulated run's identity: one run and one actor, so every idempotency scope (run, actor,
// global) sees the case's calls as the same run's.
const (
	simulatedRun   = "contract-test"
	simulatedActor = "contract-test"
)

// Result is the verdict on one case; Why says what did not match when it failed.
type Result struct {
	Name   string
	Passed bool
	Why    string
}

// Suite runs cases against one set of valid manifests.
type Suite struct {
	byTool map[string]*manifest.Manifest
}

// NewSuite indexes the manifests by tool name.
func NewSuite(ms []*manifest.Manifest) *Suite {
	s := &Suite{byTool: make(map[string]*manifest.Manifest, len(ms))}
	for _, m := range ms {
		s.byTool[m.Tool] = m
	}
	return s
}

// RunAll runs every case, in order.
func (s *Suite) RunAll(cases []Case) []Result {
	out := make([]Result, len(cases))
	for i := range cases {
		out[i] = s.Run(&cases[i])
	}
	return out
}

// run is the state of one simulated run: which tools succeeded and which duplicate-call keys
// still stand.
type run struct {
	succeeded map[string]bool
	standing  map[string]bool
}

// Run plays one case in a fresh simulated run, with no I/O:
//
//  1. every `after` tool (default: the manifest's requires) is called and succeeds; these calls
//     are not checked themselves, so a chain of requirements needs listing only its last link;
//  2. the case's call passes the gateway's manifest checks (manifest exists, not a draft,
//     requirements met, duplicate-call key buildable and not already standing). Scope, schema,
//     policy and approvals are not simulated: approvals are assumed granted;
//  3. it fails (`fail`) or succeeds with `result`, and the plan step, undo arguments,
//     verification and a second identical call are compared with the case's expectations.
func (s *Suite) Run(c *Case) Result {
	res := Result{Name: c.Name}
	fail := func(why string) Result { res.Why = why; return res }

	r := &run{succeeded: map[string]bool{}, standing: map[string]bool{}}
	m := s.byTool[c.Tool]
	after := c.After
	if after == nil && m != nil {
		for _, req := range m.Requires {
			after = append(after, req.Tool)
		}
	}
	for _, t := range after {
		if s.byTool[t] == nil {
			return fail(fmt.Sprintf("after: no manifest for %s", t))
		}
		r.succeeded[t] = true
	}

	key, reason := s.admit(r, m, c)
	switch {
	case reason != "" && c.ExpectBlocked == nil:
		return fail("the call was blocked: " + reason)
	case reason != "" && !strings.Contains(reason, *c.ExpectBlocked):
		return fail(fmt.Sprintf("expected the call to be blocked for %q, but it was blocked for: %s", *c.ExpectBlocked, reason))
	case reason != "":
		res.Passed = true
		return res
	case c.ExpectBlocked != nil:
		return fail(fmt.Sprintf("expected the call to be blocked for %q, but it ran", *c.ExpectBlocked))
	}

	outcome, result := manifest.Succeeded, c.Result
	if c.Fail != nil {
		outcome, result = manifest.Failed, nil
	}
	// A failed call frees its key; a succeeded (or uncertain) one still stands.
	if key != "" && outcome != manifest.Failed {
		r.standing[key] = true
	}

	var whys []string
	step := manifest.PlanStep(m, outcome, c.Args, result)
	if c.ExpectPlan != "" && step.Action != c.ExpectPlan {
		whys = append(whys, fmt.Sprintf("expected plan %s, got %s (%s)", c.ExpectPlan, step.Action, step.Reason))
	}
	if c.ExpectHandle != nil {
		switch {
		case step.Action != manifest.PlanCompensate:
			whys = append(whys, fmt.Sprintf("expected handle %s, but nothing is undone: plan %s (%s)", jsonText(c.ExpectHandle), step.Action, step.Reason))
		case !manifest.JSONEqual(c.ExpectHandle, step.Handle):
			whys = append(whys, fmt.Sprintf("expected handle %s, got %s", jsonText(c.ExpectHandle), jsonText(step.Handle)))
		}
	}
	if c.ExpectVerification != nil {
		if why := verificationWhy(m, step, c, result); why != "" {
			whys = append(whys, why)
		}
	}
	if c.ExpectVerified != nil {
		if why := verifiedWhy(m, c); why != "" {
			whys = append(whys, why)
		}
	}
	if c.ExpectDuplicate != nil {
		if why := s.duplicateWhy(r, m, c, outcome); why != "" {
			whys = append(whys, why)
		}
	}
	if len(whys) > 0 {
		return fail(strings.Join(whys, "; "))
	}
	res.Passed = true
	return res
}

// admit applies the gateway's per-call manifest checks in its order and returns the call's
// duplicate-call key ("" without idempotency) or the reason it is refused.
func (s *Suite) admit(r *run, m *manifest.Manifest, c *Case) (key, reason string) {
	if m == nil {
		return "", "no manifest for " + c.Tool
	}
	if err := manifest.CheckStatus(m); err != nil {
		return "", err.Error()
	}
	if err := manifest.CheckRequires(m, func(t string) bool { return r.succeeded[t] }); err != nil {
		return "", err.Error()
	}
	key, err := manifest.DuplicateKey(m, c.Args, simulatedRun, simulatedActor)
	if err != nil {
		return "", err.Error()
	}
	if key != "" && r.standing[key] {
		rendered, _ := manifest.RenderKey(m.Idempotency.Key, c.Args) // DuplicateKey just rendered it
		return "", fmt.Sprintf("a duplicate of an earlier %s call that still stands (key %s, scope %s)", m.Tool, rendered, m.Idempotency.Scope)
	}
	return key, ""
}

// verificationWhy compares the read-back's arguments. The read-back only follows an undo, so a
// plan that runs no undo fails the expectation with the plan's reason.
func verificationWhy(m *manifest.Manifest, step manifest.Step, c *Case, result any) string {
	want := jsonText(c.ExpectVerification)
	if m.Compensation == nil || m.Compensation.Verification == nil {
		return fmt.Sprintf("expected verification %s, but the manifest declares no verification", want)
	}
	if step.Action != manifest.PlanCompensate {
		return fmt.Sprintf("expected verification %s, but no undo runs, so no read-back either: plan %s (%s)", want, step.Action, step.Reason)
	}
	got, missing := manifest.VerificationArguments(m, c.Args, result)
	if len(missing) > 0 {
		return fmt.Sprintf("expected verification %s, but a referenced value was missing: %s", want, strings.Join(missing, ", "))
	}
	if !manifest.JSONEqual(c.ExpectVerification, got) {
		return fmt.Sprintf("expected verification %s, got %s", want, jsonText(got))
	}
	return ""
}

// verifiedWhy judges verify_with against the manifest's verification.expect.
func verifiedWhy(m *manifest.Manifest, c *Case) string {
	if m.Compensation == nil || m.Compensation.Verification == nil {
		return "expect_verified: the manifest declares no verification, so no read-back is checked"
	}
	mismatch := manifest.CheckExpect(m.Compensation.Verification.Expect, c.VerifyWith)
	switch {
	case *c.ExpectVerified && mismatch != "":
		return fmt.Sprintf("expected the read-back to be accepted, but it was refused (%s)", mismatch)
	case !*c.ExpectVerified && mismatch == "":
		return fmt.Sprintf("expected the read-back to be refused, but it was accepted (expect %s)", jsonText(m.Compensation.Verification.Expect))
	}
	return ""
}

// duplicateWhy makes a second identical call in the same run and compares whether it is
// refused as a duplicate. Status and requirements are unchanged since the first call, so only
// the duplicate-call key can refuse it.
func (s *Suite) duplicateWhy(r *run, m *manifest.Manifest, c *Case, first manifest.Outcome) string {
	_, reason := s.admit(r, m, c)
	const want = "expected a second identical call to be refused as a duplicate"
	switch {
	case *c.ExpectDuplicate && reason == "" && m.Idempotency == nil:
		return want + ", but the manifest declares no idempotency key"
	case *c.ExpectDuplicate && reason == "" && first == manifest.Failed:
		return want + ", but the first call failed, which frees its key"
	case *c.ExpectDuplicate && reason == "":
		return want + ", but it ran"
	case !*c.ExpectDuplicate && reason != "":
		return "expected a second identical call to run, but it was blocked: " + reason
	}
	return ""
}

// Uncovered returns, sorted, the tools that change something and that no case calls. Every
// status counts: a case calling a draft or deprecated tool covers it. Read-only tools are left
// out: their plan is always skip, with no undo, read-back or refusal for a case to check (the
// seed's example reports only stripe.refund, not the read-only stripe.get_charge).
func (s *Suite) Uncovered(cases []Case) []string {
	called := map[string]bool{}
	for _, c := range cases {
		called[c.Tool] = true
	}
	var out []string
	for t, m := range s.byTool {
		if m.Effect.Mutating() && !called[t] {
			out = append(out, t)
		}
	}
	sort.Strings(out)
	return out
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}
