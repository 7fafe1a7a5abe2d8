package engine

import (
	"context"
	"strings"
	"testing"

	apipolicy "github.com/reversi-gitops/reversi/api/policy"
)

// nested puts v under n levels of {"a": …} inside the observations an agent sends.
func nested(n int, v any) map[string]any {
	for range n {
		v = map[string]any{"a": v}
	}
	return map[string]any{"entityName": "alice", "contents": []any{"fine"}, "extra": v}
}

// Attack: a card number hidden deeper than the content checks walked (they stopped at 64
// levels and answered "nothing found", while the gateway accepts a message nested up to 1000
// levels) passed the content policy. Within the gateway's nesting the card is found; past what
// a check can walk the rule fails closed.
func TestAttackPolicyCardNumberNestedDeep(t *testing.T) {
	f := newPolicyEngine(t, Enforce, "prod", thursday)
	ctx := context.Background()
	for _, depth := range []int{70, 900, 1200} {
		args := map[string]any{"observations": []any{nested(depth, "pays with 4111 1111 1111 1111")}}
		d := f.e.Decide(ctx, Call{Run: "run-1", Actor: "a", Tool: "memory.add_observations", Args: args})
		if d.Action != Block || d.PolicyDecision != apipolicy.DecisionDeny || !strings.Contains(d.Reason, "card number") {
			t.Errorf("a card number %d levels deep: %s %s %q", depth, d.Action, d.PolicyDecision, d.Reason)
		}
	}
	// The honest path: nested arguments without a card pass.
	args := map[string]any{"observations": []any{nested(70, "order 4111 1111 1111 1112")}}
	if d := f.e.Decide(ctx, Call{Run: "run-1", Actor: "a", Tool: "memory.add_observations", Args: args}); d.Action != Allow {
		t.Errorf("nested arguments without a card: %s %q", d.Action, d.Reason)
	}
}
