package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/policy"
)

// fixtures is test/fixtures/policy: the manifests and the policies of issue 21's four rules.
var fixtures = filepath.Join("..", "..", "test", "fixtures", "policy")

func fixtureManifests(t *testing.T) []*manifest.Manifest {
	t.Helper()
	docs, errs := manifest.ReadPaths(filepath.Join(fixtures, "manifests"))
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Fatal(errs)
	}
	return ms
}

func fixturePolicy(t *testing.T) *policy.Set {
	t.Helper()
	set, errs := policy.Load(filepath.Join(fixtures, "policy"))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return set
}

type policyFixture struct {
	st      *store.Memory
	e       *Engine
	now     time.Time
	counter *policy.MemoryCounter
}

// gateCounter injects the worst interleaving of concurrent counts: each Count reads its
// number, then waits until want callers have read theirs (or 30 ms pass) before it returns, so
// calls counting at the same time all count before any of them adds.
type gateCounter struct {
	*policy.MemoryCounter
	want int

	mu      sync.Mutex
	waiting int
	open    chan struct{}
}

func (c *gateCounter) Count(ctx context.Context, key policy.CountKey, since time.Time) (int, error) {
	n, err := c.MemoryCounter.Count(ctx, key, since)
	c.mu.Lock()
	if c.open == nil {
		c.open = make(chan struct{})
	}
	open := c.open
	if c.waiting++; c.waiting == c.want {
		close(open)
		c.waiting, c.open = 0, nil // the next round
	}
	c.mu.Unlock()
	select {
	case <-open:
	case <-time.After(30 * time.Millisecond):
	}
	return n, err
}

// newPolicyEngine builds an engine over the fixture manifests and policies in mode, in
// environment env, at now.
func newPolicyEngine(t *testing.T, mode Mode, env string, now time.Time, counter ...policy.Counter) policyFixture {
	t.Helper()
	st := store.NewMemory(func() time.Time { return now })
	t.Cleanup(func() { _ = st.Close() })
	c := policy.NewMemoryCounter()
	var pc policy.Counter = c
	if len(counter) > 0 {
		pc = counter[0]
	}
	e, err := New(Config{Manifests: fixtureManifests(t), Mode: mode, Store: st, Now: func() time.Time { return now },
		Policy: fixturePolicy(t), Environment: env, Gateway: "gw-1", Counter: pc})
	if err != nil {
		t.Fatal(err)
	}
	return policyFixture{st: st, e: e, now: now, counter: c}
}

var (
	friday   = time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	thursday = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
)

// A refund over 1,000 needs finance and the CFO: the request the call waits for carries the
// merged rules (any listed role, the largest quorum, the shortest timeout), and an approval
// by those roles lets the retry through.
func TestPolicyMergesApproval(t *testing.T) {
	f := newPolicyEngine(t, Enforce, "prod", thursday)
	ctx := context.Background()
	args := map[string]any{"charge_id": "ch_1", "amount": 1500}
	d := f.e.Decide(ctx, Call{Run: "run-1", Actor: "agent-1", Tool: "stripe.refund", Args: args})
	if d.Action != NeedsApproval || !d.ApprovalRequired || d.Approval == nil {
		t.Fatalf("decision %+v", d)
	}
	a, err := f.st.GetApproval(ctx, d.ApprovalID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Roles, []string{"finance", "cfo"}) || a.Quorum != 2 || !a.Expires.Equal(thursday.Add(15*time.Minute)) ||
		!strings.Contains(a.Reason, "policy") || !strings.Contains(a.Reason, "CFO") {
		t.Fatalf("request %+v", a)
	}
	if len(d.Policy) != 1 || d.Policy[0].Rule != "payments/large-refund-needs-cfo" || !slices.ContainsFunc(d.Notes, func(n string) bool {
		return strings.HasPrefix(n, "policy payments/large-refund-needs-cfo: require_approval")
	}) {
		t.Fatalf("fired %+v, notes %q", d.Policy, d.Notes)
	}
	for _, by := range []string{"fin-1", "cfo-1"} {
		roles := []string{"finance"}
		if by == "cfo-1" {
			roles = []string{"cfo"}
		}
		if _, err := f.st.Decide(ctx, a.ID, store.Decision{By: by, Roles: roles, Approve: true}); err != nil {
			t.Fatal(err)
		}
	}
	if ok := f.e.Decide(ctx, Call{Run: "run-1", Actor: "agent-1", Tool: "stripe.refund", Args: args}); ok.Action != Allow || ok.ApprovalID != a.ID {
		t.Fatalf("retry: %+v", ok)
	}
	// 1,000 keeps the manifest's own request: finance alone.
	small := f.e.Decide(ctx, Call{Run: "run-1", Actor: "agent-1", Tool: "stripe.refund", Args: map[string]any{"charge_id": "ch_1", "amount": 1000}})
	sa, err := f.st.GetApproval(ctx, small.ApprovalID)
	if err != nil || !reflect.DeepEqual(sa.Roles, []string{"finance"}) || len(small.Policy) != 0 {
		t.Fatalf("small refund: %+v %+v %v", small, sa, err)
	}
}

// An irreversible call in prod on a Friday is denied with the rule's reason; on a Thursday,
// or in staging, the policy lets it through to the manifest's own approval.
func TestPolicyDeniesWithReason(t *testing.T) {
	ctx := context.Background()
	c := Call{Run: "run-1", Actor: "agent-1", Tool: "mail.send", Args: map[string]any{"to": "a@example.com"}}
	d := newPolicyEngine(t, Enforce, "prod", friday).e.Decide(ctx, c)
	if d.Action != Block || d.Category != CategoryPolicy || !strings.Contains(d.BlockedText(), "Blocked by Reversi: no irreversible call in prod on a Friday") {
		t.Fatalf("friday: %+v", d)
	}
	for name, f := range map[string]policyFixture{"thursday": newPolicyEngine(t, Enforce, "prod", thursday), "staging": newPolicyEngine(t, Enforce, "staging", friday)} {
		if d := f.e.Decide(ctx, c); d.Action != NeedsApproval || len(d.Policy) != 0 {
			t.Fatalf("%s: %+v", name, d)
		}
	}
}

// A card number anywhere in the arguments blocks the call; a number failing the Luhn check
// does not.
func TestPolicyContentChecks(t *testing.T) {
	f := newPolicyEngine(t, Enforce, "prod", thursday)
	ctx := context.Background()
	obs := func(text string) map[string]any {
		return map[string]any{"observations": []any{map[string]any{"entityName": "alice", "contents": []any{text}}}}
	}
	d := f.e.Decide(ctx, Call{Run: "run-1", Actor: "a", Tool: "memory.add_observations", Args: obs("pays with 4111 1111 1111 1111")})
	if d.Action != Block || !strings.Contains(d.Reason, "card number") {
		t.Fatalf("card: %+v", d)
	}
	if d := f.e.Decide(ctx, Call{Run: "run-1", Actor: "a", Tool: "memory.add_observations", Args: obs("order 4111 1111 1111 1112")}); d.Action != Allow {
		t.Fatalf("not a card: %+v", d)
	}
}

// The sixth deletion of a run is blocked, also when the calls come at once: counting and
// taking a place are one step, so of ten concurrent deletions exactly five pass. Another run
// has its own five.
func TestPolicyLimitIsExactUnderConcurrency(t *testing.T) {
	f := newPolicyEngine(t, Enforce, "prod", thursday, &gateCounter{MemoryCounter: policy.NewMemoryCounter(), want: 10})
	ctx := context.Background()
	del := func(run string, i int) Decision {
		return f.e.Decide(ctx, Call{Run: run, Actor: "a", Tool: "memory.delete_relations",
			Args: map[string]any{"relations": []any{map[string]any{"from": "x", "to": "y", "relationType": string(rune('a' + i))}}}})
	}
	var wg sync.WaitGroup
	ds := make([]Decision, 10)
	for i := range ds {
		wg.Add(1)
		go func() { defer wg.Done(); ds[i] = del("run-1", i) }()
	}
	wg.Wait()
	allowed := 0
	for _, d := range ds {
		switch {
		case d.Action == Allow:
			allowed++
		case d.Category != CategoryPolicy || !strings.Contains(d.Reason, "at most 5 calls of rule deletions/at-most-5-deletions-per-run per run"):
			t.Fatalf("refused otherwise: %+v", d)
		}
	}
	if allowed != 5 {
		t.Fatalf("%d of 10 concurrent deletions passed, want 5", allowed)
	}
	if d := del("run-2", 0); d.Action != Allow {
		t.Fatalf("another run: %+v", d)
	}
	// Reads are not limited; a preview counts nothing.
	if d := f.e.Decide(ctx, Call{Run: "run-1", Actor: "a", Tool: "memory.read_graph"}); d.Action != Allow {
		t.Fatalf("read: %+v", d)
	}
	for range 3 {
		if p := f.e.Preview(ctx, Call{Run: "run-3", Actor: "a", Tool: "memory.delete_relations", Args: map[string]any{"relations": []any{}}}); p.Action != Allow {
			t.Fatalf("preview: %+v", p)
		}
	}
	for i := range 5 {
		if d := del("run-3", i); d.Action != Allow {
			t.Fatalf("run-3 deletion %d after previews: %+v", i+1, d)
		}
	}
}

// In advise and observe a policy denial runs, journaled would_block with the rule's reason.
func TestPolicyWouldBlock(t *testing.T) {
	for _, mode := range []Mode{Advise, Observe} {
		f := newPolicyEngine(t, mode, "prod", friday)
		d := f.e.Decide(context.Background(), Call{Run: "run-1", Actor: "a", Tool: "memory.delete_entities", Args: map[string]any{"entityNames": []any{"x"}}})
		if d.Action != Allow || !d.WouldBlock || d.JournalDecision() != "would_block" || !strings.Contains(d.Reason, "Friday") {
			t.Fatalf("%s: %+v", mode, d)
		}
		if mode == Advise && !strings.Contains(d.Advisory, "Friday") {
			t.Fatalf("advisory %q", d.Advisory)
		}
	}
}

// A limit rule without a counter cannot be enforced, so it denies (fails closed).
func TestPolicyLimitWithoutCounterDenies(t *testing.T) {
	st := store.NewMemory(nil)
	defer st.Close()
	e, err := New(Config{Manifests: fixtureManifests(t), Store: st, Policy: fixturePolicy(t)})
	if err != nil {
		t.Fatal(err)
	}
	d := e.Decide(context.Background(), Call{Run: "run-1", Actor: "a", Tool: "memory.delete_relations", Args: map[string]any{"relations": []any{}}})
	if d.Action != Block || !strings.Contains(d.Reason, "no counter") {
		t.Fatalf("%+v", d)
	}
}

// A rule that reads `run` on a run whose steps cannot be read (the store failed, or the run is
// past the gateway's bound) denies the call: the policy fails closed. Calls no such rule
// matches do not read the run at all.
func TestPolicyRunUnreadableDenies(t *testing.T) {
	dir := t.TempDir()
	src := "policy: runs\nrules:\n  - name: three-deletions\n    match: { tools: [\"memory.delete_*\"] }\n" +
		"    condition: 'run.steps.size() >= 3'\n    effect: deny\n    reason: three deletions are enough\n"
	if err := os.WriteFile(filepath.Join(dir, "runs.yaml"), []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	set, errs := policy.Load(dir)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	st := store.NewMemory(nil)
	defer st.Close()
	reads := 0
	e, err := New(Config{Manifests: fixtureManifests(t), Store: st, Policy: set, Counter: policy.NewMemoryCounter(),
		RunSteps: func(context.Context, string) ([]policy.Step, error) { reads++; return nil, errors.New("too long") }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	d := e.Decide(ctx, Call{Run: "run-1", Actor: "a", Tool: "memory.delete_relations", Args: map[string]any{"relations": []any{}}})
	if d.Action != Block || d.Category != CategoryPolicy || !strings.Contains(d.Reason, "could not read the run's steps: too long") {
		t.Fatalf("%+v", d)
	}
	if d := e.Decide(ctx, Call{Run: "run-1", Actor: "a", Tool: "memory.read_graph"}); d.Action != Allow || reads != 1 {
		t.Fatalf("a call no run rule matches: %+v, %d reads", d, reads)
	}
}
