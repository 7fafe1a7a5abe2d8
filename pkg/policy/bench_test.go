package policy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
)

// benchPolicies writes 50 rules in 10 policies, a realistic mix: per service a deny on an
// argument, an approval over an amount, an advise on an effect, a limit per run, and a rule
// on the actor's groups and the environment; plus two content checks over every call's
// arguments and a time rule over irreversible tools.
func benchPolicies(tb testing.TB) []*apipolicy.Policy {
	tb.Helper()
	var b strings.Builder
	n := 0
	for svc := 0; svc < 10; svc++ {
		fmt.Fprintf(&b, "---\npolicy: svc%d\nrules:\n", svc)
		rules := []string{
			`{name: r%d, match: {tools: ["svc%d.delete*"]}, condition: 'has(args.id) && args.id.startsWith("prod-")', effect: deny, reason: no deleting prod}`,
			`{name: r%d, match: {tools: ["svc%d.create", "svc%d.update"]}, condition: 'args.?amount.orValue(0) > 1000', effect: require_approval, reason: big amounts, approval: {roles: [cfo], timeout: 1h}}`,
			`{name: r%d, match: {tools: ["svc%d.*"], effects: [compensable]}, condition: 'size(args) > 20', effect: advise, reason: many arguments}`,
			`{name: r%d, match: {tools: ["svc%d.delete*"]}, effect: limit, limit: {max: 5, per: run}}`,
			`{name: r%d, match: {tools: ["svc%d.*"], permissions: ["svc%d:admin"]}, condition: '!("admins" in actor.groups) && environment == "prod"', effect: deny, reason: admins only in prod}`,
		}
		for _, r := range rules {
			args := []any{n}
			for range strings.Count(r, "%d") - 1 {
				args = append(args, svc)
			}
			fmt.Fprintf(&b, "  - "+r+"\n", args...)
			n++
		}
	}
	ps, errs := apipolicy.ParseFile("bench.yaml", []byte(b.String()))
	if len(errs) > 0 || n != 50 {
		tb.Fatalf("%d rules: %v", n, errs)
	}
	// Replace three service rules by the cross-cutting ones, keeping 50.
	ps[0].Rules[2] = apipolicy.Rule{Name: "cards", Condition: "has_card_number(args)", Effect: apipolicy.Deny, Reason: "card"}
	ps[1].Rules[2] = apipolicy.Rule{Name: "keys", Condition: "has_secret(args)", Effect: apipolicy.Deny, Reason: "key"}
	ps[2].Rules[2] = apipolicy.Rule{Name: "friday", Match: apipolicy.Match{Effects: []manifest.Effect{manifest.Irreversible}},
		Condition: `environment == "prod" && now.getDayOfWeek("Europe/Paris") == 5`, Effect: apipolicy.Deny, Reason: "friday"}
	return ps
}

func benchInput() Input {
	return Input{
		Tool: "svc3.create",
		Args: map[string]any{"order_id": "o-123", "amount": 2500.0, "currency": "EUR",
			"note": "Customer asked for a refund of the duplicate charge on invoice 2026-12-04, reference 9812."},
		Manifest: &manifest.Manifest{Tool: "svc3.create", Effect: manifest.Compensable, Permission: "svc3:write",
			Approval: manifest.Approval{Required: true, Rules: &manifest.ApprovalRules{Roles: []string{"finance"}, Quorum: 2, OnTimeout: "deny"}}},
		Actor:       Actor{Principal: "agent-1", Groups: []string{"bots"}},
		Run:         Run{ID: "run-1", Steps: []Step{{Tool: "svc3.get", Status: "succeeded"}}},
		Gateway:     "gw",
		Environment: "prod",
		Now:         time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC),
		Counter:     NewMemoryCounter(),
	}
}

// BenchmarkEvaluate50Rules is the cost of one call's decision with 50 rules (issue 21: under
// 20 µs): go test ./pkg/policy -run '^$' -bench Evaluate50Rules -benchmem
func BenchmarkEvaluate50Rules(b *testing.B) {
	s, errs := Compile(benchPolicies(b))
	if len(errs) > 0 {
		b.Fatal(errs)
	}
	in := benchInput()
	ctx := context.Background()
	if res := s.Evaluate(ctx, in); res.Decision != apipolicy.DecisionRequireApproval {
		b.Fatalf("decision %s: %+v", res.Decision, res)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Evaluate(ctx, in)
	}
}

// BenchmarkEvaluate50ConditionsEvaluated is the worst case of the same size: 50 rules without a
// match, so every condition runs on every call (10 content checks over the arguments, 40
// comparisons of arguments, actor, run and time).
func BenchmarkEvaluate50ConditionsEvaluated(b *testing.B) {
	conds := []string{
		`has(args.id) && args.id.startsWith("prod-")`,
		`args.?amount.orValue(0) > 100000`,
		`!("admins" in actor.groups) && environment == "staging"`,
		`run.counts[?tool].orValue(0) > 100`,
		`now.getDayOfWeek("Europe/Paris") == 0`,
	}
	var rules []apipolicy.Rule
	for i := range 50 {
		c := conds[i%len(conds)]
		if i%5 == 4 {
			c = []string{"has_card_number(args)", "has_secret(args)"}[i/5%2]
		}
		rules = append(rules, apipolicy.Rule{Name: fmt.Sprintf("r%d", i), Condition: c, Effect: apipolicy.Deny, Reason: "x"})
	}
	s, errs := Compile([]*apipolicy.Policy{{Name: "worst", Rules: rules}})
	if len(errs) > 0 {
		b.Fatal(errs)
	}
	in := benchInput()
	ctx := context.Background()
	if res := s.Evaluate(ctx, in); res.Decision != apipolicy.DecisionAllow {
		b.Fatalf("decision %s: %+v", res.Decision, res.Fired)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Evaluate(ctx, in)
	}
}
