package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	apipolicy "github.com/reversi-gitops/reversi/api/policy"
)

// hostileSet is one policy of n advise rules, each matching every call with a condition
// that runs to CostLimit: harmless-looking (advise never blocks), about 200 bytes a rule.
func hostileSet(t *testing.T, n int) []*apipolicy.Policy {
	t.Helper()
	cond := `[1,2,3,4,5,6,7,8,9,10].all(a, [1,2,3,4,5,6,7,8,9,10].all(b, [1,2,3,4,5,6,7,8,9,10].all(c, [1,2,3,4,5,6,7,8,9,10].all(d, a+b+c+d < 100))))`
	var b strings.Builder
	b.WriteString("policy: notes\nrules:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - {name: r%d, condition: '%s', effect: advise, reason: a note}\n", i, cond)
	}
	ps, errs := apipolicy.ParseFile("notes.yaml", []byte(b.String()))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return ps
}

// TestSetCostIsBounded (attack review of issue 21): CostLimit bounds one condition, and
// nothing bounded a call's sum over rules. A signed, approved policy of 3,000 such advise
// rules (590 KB, within shard 0's budget, so the controller renders it) made every call of
// every tool take about a minute of the gateway's CPU, with no context to stop it. A set whose
// worst case exceeds SetCostLimit is refused at compile (publish, registry load, controller
// and pod alike), naming the bound; the fixtures and the 50-rule benchmark stay far below.
func TestSetCostIsBounded(t *testing.T) {
	ps := hostileSet(t, 3000)
	start := time.Now()
	set, errs := Compile(ps)
	if set != nil || len(errs) == 0 || !errors.Is(errs[0], ErrSetCost) {
		if set != nil {
			in := benchInput()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			done := make(chan struct{})
			go func() { set.Evaluate(ctx, in); close(done) }()
			select {
			case <-done:
			case <-time.After(2 * time.Second):
				t.Fatalf("a hostile set compiled in %s, and one call's evaluation runs past 2 s", time.Since(start))
			}
		}
		t.Fatalf("a hostile set compiled: %v", errs)
	}
	t.Logf("refused: %v", errs[0])
	if set, errs := Compile(hostileSet(t, 10)); set == nil || len(errs) > 0 {
		t.Fatalf("ten costly rules are refused: %v", errs)
	}
	if set, errs := Compile(benchPolicies(t)); set == nil || len(errs) > 0 {
		t.Fatalf("the benchmark's 50 rules: %v", errs)
	}
}
