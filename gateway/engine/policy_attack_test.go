package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/policy"
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

// unclassifiedEngine is an engine with the fixture policy and no manifests at all, in mode,
// whose upstream offers tools (each a read by its own claim when readOnly).
func unclassifiedEngine(t *testing.T, mode Mode, reads UnclassifiedReads, readOnly bool, tools ...string) *Engine {
	t.Helper()
	st := store.NewMemory(func() time.Time { return thursday })
	t.Cleanup(func() { _ = st.Close() })
	var ts []Tool
	for _, n := range tools {
		ts = append(ts, Tool{Name: n, ReadOnlyHint: readOnly})
	}
	e, err := New(Config{Mode: mode, UnclassifiedReads: reads, Tools: ts, Store: st, Now: func() time.Time { return thursday },
		Policy: fixturePolicy(t), Environment: "prod", Gateway: "gw-1", Counter: policy.NewMemoryCounter()})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// Attack: the policy's limit never counted a call of a tool without a manifest (decide returned
// after the policy step when there was no manifest), so in observe mode (the seed's "observe
// first", before any manifest is written) the sixth deletion of a run was never would_block,
// and the policy could not be trialled before it was enforced.
func TestAttackPolicyLimitCountsUnclassifiedCalls(t *testing.T) {
	for _, mode := range []Mode{Observe, Advise} {
		e := unclassifiedEngine(t, mode, ReadsBlock, false, "memory.delete_relations")
		ctx := context.Background()
		for i := 1; i <= 6; i++ {
			d := e.Decide(ctx, Call{Run: "run-1", Actor: "a", Tool: "memory.delete_relations", Args: map[string]any{"relations": []any{}}})
			want := i == 6
			if d.Action != Allow || d.WouldBlock != want || want && !strings.Contains(d.Reason, "at most 5 calls") {
				t.Fatalf("%s: deletion %d: %s would_block=%v %q", mode, i, d.Action, d.WouldBlock, d.Reason)
			}
		}
	}
}

// Attack: a policy's require_approval on a tool without a manifest was dropped in advise and
// observe mode (nothing journaled it would have been held).
func TestAttackPolicyApprovalOnUnclassifiedToolWouldBlock(t *testing.T) {
	e := unclassifiedEngine(t, Observe, ReadsBlock, false, "stripe.refund")
	d := e.Decide(context.Background(), Call{Run: "run-1", Actor: "a", Tool: "stripe.refund", Args: map[string]any{"charge_id": "ch_1", "amount": 5000}})
	if d.Action != Allow || !d.WouldBlock || !d.ApprovalRequired || !strings.Contains(d.Reason, "approval required") {
		t.Fatalf("%s would_block=%v approval=%v %q", d.Action, d.WouldBlock, d.ApprovalRequired, d.Reason)
	}
}

// Attack: in enforce mode with unclassified_reads: observe, a tool without a manifest that its
// upstream (untrusted) calls read-only ran in a shadow observe run, where a policy deny was
// only would_block: an agent sent a card number (or anything a deny rule refuses) through any
// such tool. The shadow relaxes the missing manifest, not the policy: a policy deny or an
// exceeded limit blocks the shadow call.
func TestAttackPolicyDenyBlocksShadowRead(t *testing.T) {
	e := unclassifiedEngine(t, Enforce, ReadsObserve, true, "memory.search_nodes", "memory.delete_everything")
	ctx := context.Background()
	d := e.Decide(ctx, Call{Run: "run-1", Actor: "a", Tool: "memory.search_nodes", Args: map[string]any{"query": "4111 1111 1111 1111"}})
	if d.Action != Block || !d.Shadow || !strings.Contains(d.Reason, "card number") {
		t.Fatalf("card number through a shadow read: %s shadow=%v %q", d.Action, d.Shadow, d.Reason)
	}
	// The deletions limit matches by name: a sixth "read" named memory.delete_* is refused too.
	for i := 1; i <= 6; i++ {
		d := e.Decide(ctx, Call{Run: "run-1", Actor: "a", Tool: "memory.delete_everything"})
		if blocked := d.Action == Block; blocked != (i == 6) {
			t.Fatalf("shadow deletion %d: %s %q", i, d.Action, d.Reason)
		}
	}
	// The honest path: a clean shadow read still runs, in observe.
	d = e.Decide(ctx, Call{Run: "run-1", Actor: "a", Tool: "memory.search_nodes", Args: map[string]any{"query": "alice"}})
	if d.Action != Allow || !d.Shadow || d.Mode != Observe || d.WouldBlock {
		t.Fatalf("clean shadow read: %s shadow=%v %s %q", d.Action, d.Shadow, d.Mode, d.Reason)
	}
}
