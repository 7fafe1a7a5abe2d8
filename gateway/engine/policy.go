package engine

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/pkg/policy"
)

// PolicyNotePrefix starts the note journaled for each policy rule that fired.
const PolicyNotePrefix = "policy "

// input is the policy input of call c (manifest m, arguments args).
func (x *decider) input(ctx context.Context, c Call, m *manifest.Manifest, args map[string]any) (policy.Input, error) {
	e := x.e
	in := policy.Input{Tool: c.Tool, Args: args, Manifest: m, Actor: policy.Actor{Principal: c.Actor, Groups: c.Groups},
		Run: policy.Run{ID: c.Run}, Gateway: e.gateway, Environment: e.environment, Now: e.now(), Counter: e.counter}
	if e.runSteps != nil && e.policy.ReadsRun(c.Tool, m) {
		steps, err := e.runSteps(ctx, c.Run)
		if err != nil {
			return in, err
		}
		in.Run.Steps = steps
	}
	return in, nil
}

// policy runs the policy set on the call: a deny (or a limit reached) is a violation, an
// approval rule makes the call need approval (merged with the manifest's), advice and every
// rule that fired become notes. stop: checking ends (enforce mode, denied).
func (x *decider) policy(ctx context.Context, c Call, m *manifest.Manifest, args map[string]any) (res policy.Result, stop bool) {
	e, d := x.e, &x.d
	if e.policy == nil || e.policy.Len() == 0 {
		return res, false
	}
	in, err := x.input(ctx, c, m, args)
	if err != nil {
		d.PolicyDecision = apipolicy.DecisionDeny
		return res, x.violate(CategoryPolicy, "the policy could not read the run's steps: "+err.Error())
	}
	x.in = &in
	start := time.Now()
	res = e.policy.Evaluate(ctx, in)
	d.PolicyTime += time.Since(start)
	x.policyNotes = len(d.Notes)
	x.notePolicy(res)
	if res.Decision == apipolicy.DecisionDeny {
		x.unshadow()
		return res, x.violate(CategoryPolicy, res.Reason)
	}
	if res.Decision == apipolicy.DecisionRequireApproval && x.unshadow() {
		// A tool without a manifest cannot be held for approval: it is refused.
		return res, x.violate(CategoryPolicy, "approval required: "+c.Tool+" needs a person's approval ("+res.Reason+
			"), and a tool without a manifest cannot be held for approval: write its manifest")
	}
	return res, false
}

// unshadow decides a shadow read (an unclassified read run in observe by unclassified_reads:
// observe) in the engine's own mode again, and reports whether it was one: the shadow relaxes
// the missing manifest, never the policy, so a policy that refuses or holds the call blocks it
// in enforce mode (journaled in the shadow run). Before, an upstream that called any tool
// read-only let a deny rule's calls through as would_block.
func (x *decider) unshadow() bool {
	if !x.d.Shadow || x.d.Mode == x.e.mode {
		return false
	}
	x.d.Mode = x.e.mode
	return true
}

// notePolicy records what the policy decided on the decision, replacing what an earlier
// evaluation of the call recorded (the notes from x.policyNotes on).
func (x *decider) notePolicy(res policy.Result) {
	d := &x.d
	d.Notes = d.Notes[:x.policyNotes]
	d.PolicyDecision, d.Policy = res.Decision, res.Fired
	for _, f := range res.Fired {
		note := PolicyNotePrefix + f.Rule + ": " + string(f.Effect)
		if f.Reason != "" {
			note += ": " + f.Reason
		}
		d.Notes = append(d.Notes, note)
	}
}

// takeLimits counts the call under the limit rules it matches (counts: the counters of the
// policy step's evaluation, made with input x.in). Counting and checking are one step per limit
// key in this process (limitLocks): of concurrent calls of one run only as many as the limit
// allows get through. The policy is evaluated again under the locks, so the count it checks
// includes every call that took a place before. stop: the call is refused (enforce mode).
func (x *decider) takeLimits(ctx context.Context, counts []policy.CountKey) (stop bool) {
	e, in := x.e, *x.in
	start := time.Now()
	defer func() { x.d.PolicyTime += time.Since(start) }()
	unlock := processLimits.lock(counts)
	defer unlock()
	res := e.policy.Evaluate(ctx, in)
	if res.Decision == apipolicy.DecisionDeny {
		x.notePolicy(res)
		x.unshadow()
		return x.violate(CategoryPolicy, res.Reason)
	}
	if err := policy.Record(ctx, e.counter, res, in.Now); err != nil {
		return x.violate(CategoryPolicy, "the policy's limit could not be counted: "+err.Error())
	}
	return false
}

// processLimits serialises the count-and-take of each limit key within the process, across
// engines (a reload builds a new one while calls of the old one still decide).
var processLimits limitLocks

// limitLocks holds one lock per limit key that calls are taking now.
type limitLocks struct {
	mu   sync.Mutex
	held map[policy.CountKey]*keyLock
}

type keyLock struct {
	mu   sync.Mutex
	refs int
}

// lock takes the locks of keys (in a fixed order, so two calls never wait on each other) and
// returns their release.
func (l *limitLocks) lock(keys []policy.CountKey) (unlock func()) {
	keys = slices.Clone(keys)
	slices.SortFunc(keys, func(a, b policy.CountKey) int {
		return cmp.Or(cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Subject, b.Subject))
	})
	keys = slices.Compact(keys)
	taken := make([]*keyLock, 0, len(keys))
	for _, k := range keys {
		l.mu.Lock()
		if l.held == nil {
			l.held = map[policy.CountKey]*keyLock{}
		}
		kl := l.held[k]
		if kl == nil {
			kl = &keyLock{}
			l.held[k] = kl
		}
		kl.refs++
		l.mu.Unlock()
		kl.mu.Lock()
		taken = append(taken, kl)
	}
	return func() {
		for i := len(taken) - 1; i >= 0; i-- {
			taken[i].mu.Unlock()
			l.mu.Lock()
			if taken[i].refs--; taken[i].refs == 0 {
				delete(l.held, keys[i]) // bounded by the calls waiting now
			}
			l.mu.Unlock()
		}
	}
}
