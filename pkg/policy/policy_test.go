package policy

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
)

func parse(t *testing.T, src string) []*apipolicy.Policy {
	t.Helper()
	ps, errs := apipolicy.ParseFile("p.yaml", []byte(src))
	if len(errs) > 0 {
		t.Fatalf("parse: %v", errs)
	}
	return ps
}

func compile(t *testing.T, src string) *Set {
	t.Helper()
	s, errs := Compile(parse(t, src))
	if len(errs) > 0 {
		t.Fatalf("compile: %v", errs)
	}
	return s
}

// Syntax and type errors carry the file, the line of the condition (plus the line inside a
// multi-line condition), the policy and the rule's path, and are told apart by errors.Is.
// No set is returned.
func TestCompileErrors(t *testing.T) {
	ps := parse(t, `policy: p
rules:
  - name: syntax
    condition: "args.amount >"
    effect: deny
    reason: x
  - name: undeclared
    condition: "argz.amount > 1"
    effect: deny
    reason: x
  - name: field
    condition: |
      manifest.effect == "irreversible" &&
        manifest.efect == "x"
    effect: deny
    reason: x
  - name: not-bool
    condition: "json_size(args)"
    effect: deny
    reason: x
  - name: fine
    condition: "has_card_number(args) && now.getDayOfWeek() == 5 && 'bots' in actor.groups && run.counts['x'] > 1"
    effect: deny
    reason: x
`)
	s, errs := Compile(ps)
	if s != nil {
		t.Error("a set was returned despite errors")
	}
	type want struct {
		kind error
		text string
	}
	wants := []want{
		{ErrCELSyntax, "p.yaml:4: p: rules[0].condition: CEL syntax error at 1:14 of the condition:"},
		{ErrCELType, "p.yaml:8: p: rules[1].condition: CEL type error at 1:1 of the condition: undeclared reference to 'argz'"},
		{ErrCELType, "p.yaml:14: p: rules[2].condition: CEL type error at 2:11 of the condition: undefined field 'efect'"},
		{ErrCELType, "p.yaml:18: p: rules[3].condition: CEL type error: the condition is of type int; it must be a bool"},
	}
	if len(errs) != len(wants) {
		t.Fatalf("%d errors, want %d: %v", len(errs), len(wants), errs)
	}
	for i, w := range wants {
		if !errors.Is(errs[i], w.kind) || !strings.HasPrefix(errs[i].Error(), w.text) {
			t.Errorf("error %d: %v\nwant %v %s", i, errs[i], w.kind, w.text)
		}
	}
	// Inspect still describes the rule that compiles, with the arguments it reads.
	infos, errs2 := Inspect(ps)
	if len(errs2) != 4 || len(infos) != 1 || infos[0].ID != "p/fine" || infos[0].Line != 21 {
		t.Errorf("Inspect: %+v %v", infos, errs2)
	}
}

// argPaths finds every argument path a condition reads, in every syntax.
func TestArgPaths(t *testing.T) {
	s := compile(t, `policy: p
rules:
  - name: r
    condition: 'has(args.a.b) && args["c"] > 1 && args.?d.orValue(0) > 0 && args.items[0].id == "x" && size(args) > 0 && args.a.b.c == 1'
    effect: deny
    reason: x
`)
	if got := s.Rules()[0].Args; !slices.Equal(got, []string{"a.b.c", "c", "d", "items.0.id"}) {
		t.Errorf("args %v", got)
	}
}

var refund = &manifest.Manifest{Tool: "stripe.refund", Effect: manifest.Idempotent, Permission: "payments:write",
	Risk:     &manifest.Risk{DataClass: "financial", BlastRadius: "high"},
	Approval: manifest.Approval{Required: true, Rules: &manifest.ApprovalRules{Roles: []string{"finance"}, Quorum: 2, TimeoutMs: ms(15 * time.Minute), OnTimeout: "deny"}}}

func ms(d time.Duration) *int64 { v := d.Milliseconds(); return &v }

// The strongest effect decides; every fired rule is listed; advice is kept whatever the
// decision; the approval merges the manifest's with every approval rule that fired.
func TestEvaluateCombinesEffects(t *testing.T) {
	s := compile(t, `policy: b
rules:
  - name: cfo
    match: { tools: [stripe.refund] }
    condition: "args.amount > 1000"
    effect: require_approval
    reason: big refund
    approval: { roles: [cfo], timeout: 1h }
  - name: legal
    match: { risk: { data_class: [financial] } }
    condition: "args.amount > 5000"
    effect: require_approval
    approval: { roles: [legal], quorum: 3, timeout: 5m, on_timeout: escalate, escalate_to: [ceo] }
  - name: note
    match: { permissions: ["payments:*"] }
    effect: advise
    reason: payments are watched
  - name: never-on-weekends
    condition: "now.getDayOfWeek() == 0"
    effect: deny
    reason: not on Sunday
---
policy: a
rules:
  - name: prod-only-bots
    condition: 'environment == "prod" && !("bots" in actor.groups)'
    effect: deny
    reason: only bots in prod
`)
	thursday := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	in := Input{Tool: "stripe.refund", Args: map[string]any{"amount": 1500.0}, Manifest: refund, Actor: Actor{Groups: []string{"bots"}}, Environment: "prod", Now: thursday}
	res := s.Evaluate(context.Background(), in)
	if res.Decision != apipolicy.DecisionRequireApproval || res.Reason != "big refund" || !slices.Equal(res.Advice, []string{"payments are watched"}) {
		t.Fatalf("%+v", res)
	}
	if a := res.Approval; !slices.Equal(a.Roles, []string{"finance", "cfo"}) || a.Quorum != 2 || *a.TimeoutMs != 15*60000 || a.OnTimeout != "deny" {
		t.Errorf("approval %+v", a)
	}
	in.Args["amount"] = int64(6000)
	res = s.Evaluate(context.Background(), in)
	if a := res.Approval; !slices.Equal(a.Roles, []string{"finance", "cfo", "legal"}) || a.Quorum != 3 || *a.TimeoutMs != 5*60000 ||
		a.OnTimeout != "deny" || a.EscalateTo != nil || res.Reason != "big refund; rule b/legal requires approval" {
		t.Errorf("approval %+v, reason %q", a, res.Reason)
	}
	// A deny anywhere wins; policies run by name (a before b).
	in.Actor.Groups = nil
	in.Now = thursday.AddDate(0, 0, 3) // Sunday
	res = s.Evaluate(context.Background(), in)
	var fired []string
	for _, f := range res.Fired {
		fired = append(fired, f.Rule)
	}
	if res.Decision != apipolicy.DecisionDeny || res.Reason != "only bots in prod; not on Sunday" || res.Approval != nil ||
		!slices.Equal(fired, []string{"a/prod-only-bots", "b/cfo", "b/legal", "b/note", "b/never-on-weekends"}) {
		t.Errorf("%+v", res)
	}
	// Nothing fires for a read without a manifest on a Thursday.
	res = s.Evaluate(context.Background(), Input{Tool: "stripe.get", Actor: Actor{Groups: []string{"bots"}}, Now: thursday})
	if res.Decision != apipolicy.DecisionAllow || len(res.Fired) != 0 || res.Reason != "" {
		t.Errorf("%+v", res)
	}
	var nilSet *Set
	if nilSet.Evaluate(context.Background(), in).Decision != apipolicy.DecisionAllow || nilSet.Checksum() != "" {
		t.Error("a nil set must allow")
	}
}

// A condition that cannot be evaluated fires its rule at the rule's own strength, and says
// why: deny denies, approval is required, advise only notes. A hostile condition is stopped
// by the cost limit and fails closed too.
func TestEvaluateFailsClosed(t *testing.T) {
	s := compile(t, `policy: p
rules:
  - name: d
    match: { tools: [deny.*] }
    condition: "args.amount > 1000"
    effect: deny
    reason: too much
  - name: a
    match: { tools: [approve.*] }
    condition: "args.amount > 1000"
    effect: require_approval
  - name: n
    match: { tools: [advise.*] }
    condition: "args.amount > 1000"
    effect: advise
    reason: big
  - name: spin
    match: { tools: [spin.*] }
    condition: "[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, [1,2,3,4,5,6,7,8,9,10].all(e, a+b+c+d+e > 0)))))"
    effect: deny
    reason: spun
  - name: guarded
    match: { tools: [guarded.*] }
    condition: "has(args.amount) && args.amount > 1000"
    effect: deny
    reason: guarded
`)
	eval := func(tool string, args map[string]any) Result {
		return s.Evaluate(context.Background(), Input{Tool: tool, Args: args})
	}
	if r := eval("deny.x", nil); r.Decision != apipolicy.DecisionDeny || !strings.Contains(r.Reason, "rule p/d could not evaluate its condition (no such key: amount), so it applies: too much") || r.Fired[0].Error == "" {
		t.Errorf("deny: %+v", r)
	}
	if r := eval("deny.x", map[string]any{"amount": "lots"}); r.Decision != apipolicy.DecisionDeny {
		t.Errorf("a string amount: %+v", r)
	}
	if r := eval("approve.x", nil); r.Decision != apipolicy.DecisionRequireApproval || r.Approval == nil || r.Approval.Quorum != 1 {
		t.Errorf("approval: %+v", r)
	}
	if r := eval("advise.x", nil); r.Decision != apipolicy.DecisionAdvise || !strings.Contains(r.Advice[0], "could not evaluate") {
		t.Errorf("advise: %+v", r)
	}
	start := time.Now()
	if r := eval("spin.x", nil); r.Decision != apipolicy.DecisionDeny || !strings.Contains(r.Reason, "cost limit") {
		t.Errorf("spin: %+v", r)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the cost limit took %v to stop the condition", d)
	}
	if r := eval("guarded.x", nil); r.Decision != apipolicy.DecisionAllow {
		t.Errorf("has() guard: %+v", r)
	}
}

// The manifest, actor, run, gateway and environment variables carry the call's facts.
func TestVariables(t *testing.T) {
	s := compile(t, `policy: p
rules:
  - name: all
    condition: >-
      tool == "stripe.refund" && manifest.found && manifest.effect == "idempotent" &&
      manifest.permission == "payments:write" && manifest.risk.data_class == "financial" &&
      manifest.approval_required && actor.principal == "agent-1" && "bots" in actor.groups &&
      run.id == "r1" && size(run.steps) == 3 && run.counts["stripe.refund"] == 2 &&
      run.outcomes["failed"] == 1 && run.steps[2].tool == "stripe.get" && gateway == "gw" &&
      environment == "prod" && now == timestamp("2026-12-04T10:00:00Z")
    effect: advise
    reason: all facts seen
  - name: no-manifest
    condition: "!manifest.found && manifest.effect == ''"
    effect: advise
    reason: no manifest
`)
	in := Input{Tool: "stripe.refund", Manifest: refund, Actor: Actor{Principal: "agent-1", Groups: []string{"bots"}},
		Run:     Run{ID: "r1", Steps: []Step{{"stripe.refund", "succeeded"}, {"stripe.refund", "failed"}, {"stripe.get", "succeeded"}}},
		Gateway: "gw", Environment: "prod", Now: time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)}
	if r := s.Evaluate(context.Background(), in); !slices.Equal(r.Advice, []string{"all facts seen"}) {
		t.Errorf("%+v", r)
	}
	in.Manifest = nil
	if r := s.Evaluate(context.Background(), in); !slices.Equal(r.Advice, []string{"no manifest"}) {
		t.Errorf("%+v", r)
	}
}

type failingCounter struct{}

func (failingCounter) Count(context.Context, CountKey, time.Time) (int, error) {
	return 0, errors.New("store down")
}
func (failingCounter) Add(context.Context, CountKey, time.Time) error {
	return errors.New("store down")
}

// A limit admits max calls per scope and window, then denies with its bound; recording skips
// denied calls; no counter, or a failing one, denies.
func TestLimits(t *testing.T) {
	s := compile(t, `policy: l
rules:
  - name: run
    match: { tools: ["memory.delete_*"] }
    effect: limit
    limit: { max: 2, per: run }
  - name: actor
    match: { tools: ["mail.send"] }
    effect: limit
    limit: { max: 1, per: actor, window: 1h }
    reason: one mail an hour
`)
	ctx := context.Background()
	c := NewMemoryCounter()
	t0 := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	call := func(tool, run, actor string, at time.Time) Result {
		res := s.Evaluate(ctx, Input{Tool: tool, Run: Run{ID: run}, Actor: Actor{Principal: actor}, Now: at, Counter: c})
		if err := Record(ctx, c, res, at); err != nil {
			t.Fatal(err)
		}
		return res
	}
	for i := range 2 {
		if r := call("memory.delete_entities", "r1", "a", t0); r.Decision != apipolicy.DecisionAllow || len(r.Counts) != 1 {
			t.Fatalf("deletion %d: %+v", i+1, r)
		}
	}
	r := call("memory.delete_relations", "r1", "a", t0)
	if r.Decision != apipolicy.DecisionDeny || r.Reason != "at most 2 calls of rule l/run per run" {
		t.Errorf("third deletion: %+v", r)
	}
	if n, _ := c.Count(ctx, CountKey{Rule: "l/run", Scope: apipolicy.PerRun, Subject: "r1"}, time.Time{}); n != 2 {
		t.Errorf("a denied call was counted: %d", n)
	}
	if r := call("memory.delete_entities", "r2", "a", t0); r.Decision != apipolicy.DecisionAllow {
		t.Errorf("another run: %+v", r)
	}
	if r := call("mail.send", "r1", "a", t0); r.Decision != apipolicy.DecisionAllow {
		t.Errorf("first mail: %+v", r)
	}
	if r := call("mail.send", "r9", "a", t0.Add(59*time.Minute)); r.Decision != apipolicy.DecisionDeny ||
		r.Reason != "one mail an hour (at most 1 call of rule l/actor per actor within 1h)" {
		t.Errorf("second mail within the hour, other run: %+v", r)
	}
	if r := call("mail.send", "r9", "b", t0.Add(59*time.Minute)); r.Decision != apipolicy.DecisionAllow {
		t.Errorf("another actor: %+v", r)
	}
	if r := call("mail.send", "r9", "a", t0.Add(61*time.Minute)); r.Decision != apipolicy.DecisionAllow {
		t.Errorf("after the window: %+v", r)
	}
	if r := s.Evaluate(ctx, Input{Tool: "mail.send"}); r.Decision != apipolicy.DecisionDeny || !strings.Contains(r.Reason, "no counter is configured") {
		t.Errorf("no counter: %+v", r)
	}
	if r := s.Evaluate(ctx, Input{Tool: "mail.send", Counter: failingCounter{}}); r.Decision != apipolicy.DecisionDeny || !strings.Contains(r.Reason, "counting failed: store down") {
		t.Errorf("failing counter: %+v", r)
	}
}

// The seed's merge rule, and the choices for on_timeout and escalate_to.
func TestMergeApproval(t *testing.T) {
	finance := &manifest.ApprovalRules{Roles: []string{"finance"}, Quorum: 2, TimeoutMs: ms(15 * time.Minute), OnTimeout: "escalate", EscalateTo: []string{"cfo"}}
	cfo := &manifest.ApprovalRules{Roles: []string{"cfo", "finance"}, Quorum: 1, TimeoutMs: ms(time.Hour), OnTimeout: "escalate", EscalateTo: []string{"ceo"}}
	strict := &manifest.ApprovalRules{Quorum: 1, OnTimeout: "deny"}
	m := MergeApproval(finance, cfo)
	if !slices.Equal(m.Roles, []string{"finance", "cfo"}) || m.Quorum != 2 || *m.TimeoutMs != 15*60000 || m.OnTimeout != "escalate" || !slices.Equal(m.EscalateTo, []string{"cfo", "ceo"}) {
		t.Errorf("%+v", m)
	}
	if m := MergeApproval(finance, cfo, strict); m.OnTimeout != "deny" || m.EscalateTo != nil {
		t.Errorf("deny must win: %+v", m)
	}
	if m := MergeApproval(nil, nil); m.Quorum != 1 || m.Roles != nil || m.TimeoutMs != nil || m.OnTimeout != "deny" {
		t.Errorf("no rules: %+v", m)
	}
	if m := MergeApproval(nil, cfo); m.OnTimeout != "escalate" || *m.TimeoutMs != 3600000 {
		t.Errorf("nil adds nothing: %+v", m)
	}
	if finance.Roles[0] != "finance" || len(finance.Roles) != 1 || *finance.TimeoutMs != 15*60000 {
		t.Error("an input was modified")
	}
}

// The compiled matcher decides as apipolicy.Match.Matches for every glob shape.
func TestMatcherAgreesWithMatch(t *testing.T) {
	globs := []string{"*", "stripe.refund", "stripe.*", "stripe", "*.delete_*", "fs/x", "fs/*", "a?c", "[ab].x", `st\*`, "", "memory.delete_*"}
	names := []string{"stripe.refund", "stripe.refund/x", "stripe", "stripe.", "stripe.a/b", "memory.delete_entities", "fs", "fs/x", "fs/x/y", "abc", "a.x", "st*", "", "/", "x/"}
	perms := []string{"payments:write", "payments:read", "mail:send"}
	for _, g := range globs {
		for _, n := range names {
			m := apipolicy.Match{Tools: []string{g}}
			mt := newMatcher(m)
			if got, want := mt.matches(n, nil), m.Matches(n, nil); got != want {
				t.Errorf("glob %q name %q: compiled %v, Match %v", g, n, got, want)
			}
		}
	}
	for _, e := range manifest.Effects {
		for _, p := range perms {
			mf := &manifest.Manifest{Tool: "t", Effect: e, Permission: p, Risk: &manifest.Risk{DataClass: "pii", BlastRadius: "high"}}
			for _, m := range []apipolicy.Match{
				{Effects: []manifest.Effect{manifest.Irreversible, manifest.Compensable}},
				{Permissions: []string{"payments:*"}},
				{Risk: &apipolicy.RiskMatch{DataClass: []string{"pii"}, BlastRadius: []string{"low"}}},
				{Risk: &apipolicy.RiskMatch{BlastRadius: []string{"high"}}, Permissions: []string{"mail:send"}},
			} {
				mt := newMatcher(m)
				if mt.matches("t", mf) != m.Matches("t", mf) || mt.matches("t", nil) != m.Matches("t", nil) {
					t.Errorf("%+v on %+v", m, mf)
				}
			}
		}
	}
}

// RunTests reports what did not match, and Uncovered the rules no test fires.
func TestRunTestsFailures(t *testing.T) {
	s := compile(t, `policy: p
rules:
  - name: cfo
    match: { tools: [stripe.refund] }
    condition: "args.amount > 1000"
    effect: require_approval
    reason: big
    approval: { roles: [cfo], timeout: 1h }
  - name: never-fires
    match: { tools: [nothing] }
    effect: deny
    reason: x
tests:
  - name: wrong decision
    tool: stripe.refund
    args: { amount: 5 }
    expect: deny
  - name: wrong reason
    tool: stripe.refund
    args: { amount: 5000 }
    expect: require_approval
    expect_reason: CFO
  - name: wrong approval
    tool: stripe.refund
    args: { amount: 5000 }
    expect: require_approval
    expect_approval: { roles: [cfo, legal], quorum: 3, timeout: 10m }
  - name: wrong rules
    tool: stripe.refund
    args: { amount: 5000 }
    expect: require_approval
    expect_rules: [never-fires]
  - name: right
    tool: stripe.refund
    args: { amount: 5000 }
    expect: require_approval
    expect_rules: [cfo]
    expect_approval: { roles: [finance, cfo], quorum: 2, timeout: 15m }
`)
	results := s.RunTests(context.Background(), []*manifest.Manifest{refund})
	want := []string{
		"expected deny, got allow (no rule fired)",
		`expected a reason containing "CFO", got "big"`,
		"approval: roles finance, cfo, want cfo, legal; quorum 2, want 3; timeout 15m, want 10m",
		"expected rules p/never-fires to fire, got p/cfo",
		"",
	}
	for i, r := range results {
		if r.Why != want[i] || r.Passed != (want[i] == "") || r.Line == 0 {
			t.Errorf("%s (line %d): passed %v, why %q, want %q", r.Name, r.Line, r.Passed, r.Why, want[i])
		}
	}
	if un := s.Uncovered(results); !slices.Equal(un, []string{"p/never-fires"}) {
		t.Errorf("uncovered %v", un)
	}
}

func ExampleMergeApproval() {
	fifteen, hour := int64(15*60000), int64(60*60000)
	m := MergeApproval(&manifest.ApprovalRules{Roles: []string{"finance"}, Quorum: 2, TimeoutMs: &fifteen, OnTimeout: "deny"},
		&manifest.ApprovalRules{Roles: []string{"cfo"}, Quorum: 1, TimeoutMs: &hour, OnTimeout: "deny"})
	fmt.Println(m.Roles, m.Quorum, time.Duration(*m.TimeoutMs)*time.Millisecond, m.OnTimeout)
	// Output: [finance cfo] 2 15m0s deny
}

// Conditions CEL bounds statically below CostLimit run untracked; the others are tracked.
func TestCostTrackingOnlyWhereUnbounded(t *testing.T) {
	s := compile(t, `policy: p
rules:
  - { name: simple, condition: "args.?amount.orValue(0) > 1000 && now.getDayOfWeek() == 5", effect: deny, reason: x }
  - { name: regex, condition: "args.note.matches('a+b')", effect: deny, reason: x }
  - { name: list, condition: "'admins' in actor.groups", effect: deny, reason: x }
`)
	if s.rules[0].staticCost == 0 || s.rules[0].staticCost > CostLimit || s.rules[1].staticCost != 0 || s.rules[2].staticCost != 0 {
		t.Errorf("static costs %d %d %d", s.rules[0].staticCost, s.rules[1].staticCost, s.rules[2].staticCost)
	}
}
