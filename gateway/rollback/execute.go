package rollback

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// This file executes a rollback: the compensate steps of the plan, newest first, each on the
// upstream that exposes the compensation tool, with the same idempotency key on every attempt
// and every resumption, then the read-back. Source: seed "MCP gateway" (`reversi.*` tools,
// execute_rollback: "Dry run unless confirm: true; with approve_compensations: true also
// approves compensations that need it. Calls each compensation on the upstream, newest first,
// 3 attempts with backoff, idempotency key in _meta["reversi/idempotency_key"], read-backs
// through the upstream"; Verification during rollback; "Compensations bypass allow/deny and
// scope"); seed "Tool manifests" (Compensation, Verification, `requires` "also creates rollback
// ordering"); issue 6.

// IdempotencyKeyMeta is the `_meta` key carrying a compensation's idempotency key.
const IdempotencyKeyMeta = "reversi/idempotency_key"

// ReasonMeta is the `_meta` key carrying why a call is made (seed: What happens to a call).
const ReasonMeta = "reversi/reason"

// Caller calls a tool directly on the upstream that exposes it, under its exposed name, with
// meta as the request's `_meta`. It bypasses the engine (allow/deny, scope, approval) and the
// call journal: the rollback journals its own records. A transport error or timeout is an
// error; an isError answer is a result. *proxy.Gateway is one.
type Caller interface {
	CallTool(ctx context.Context, tool string, args, meta map[string]any) (*mcp.CallToolResult, error)
}

// Env is what a rollback runs against.
type Env struct {
	Store     store.Store
	Manifests Manifests // the manifests that apply now (*engine.Engine)
	Tools     Tools     // the upstreams' tools (*engine.Engine)
	Caller    Caller
}

// Options of Execute.
type Options struct {
	// Confirm executes; false is a dry run that calls and writes nothing (seed: "Dry run
	// unless confirm: true").
	Confirm bool
	// ApproveCompensations lets compensations with requires_approval run without waiting for
	// the approval queue; the approval is noted on the step's records.
	ApproveCompensations bool
	// Operator is who runs the rollback, noted on the records ("" is "operator").
	Operator string
	// Attempts per compensation (0: 3) and the first delay between them (0: 500 ms), doubled
	// after every attempt (seed: "3 attempts with backoff").
	Attempts int
	Backoff  time.Duration
	// ApprovalTimeout is how long an approval request for a compensation stays pending when
	// the compensation tool's manifest sets no approval timeout (0: 24 h).
	ApprovalTimeout time.Duration
}

// Defaults of Options.
const (
	DefaultAttempts        = 3
	DefaultBackoff         = 500 * time.Millisecond
	DefaultApprovalTimeout = 24 * time.Hour
)

// Verification is the read-back of one compensated step.
type Verification struct {
	Tool      string         `json:"tool"`
	Arguments map[string]any `json:"arguments,omitempty"`
	Attempts  int            `json:"attempts"`
	// Mismatch is the first mismatch (verification_failed); Error why the read-back could not
	// run (unverified).
	Mismatch string `json:"mismatch,omitempty"`
	Error    string `json:"error,omitempty"`
}

// StepResult is what the rollback did with one step.
type StepResult struct {
	Step   int64               `json:"step"`
	Tool   string              `json:"tool"`
	Action manifest.PlanAction `json:"action"`
	// Status is the step's rollback status now: one of store.RollbackStatuses.
	Status       store.Status  `json:"status"`
	Reason       string        `json:"reason,omitempty"`
	Compensation *Compensation `json:"compensation,omitempty"`
	// IdempotencyKey is the compensation's key (the same in every attempt and resumption).
	IdempotencyKey string        `json:"idempotency_key,omitempty"`
	Attempts       int           `json:"attempts,omitempty" jsonschema:"compensation calls made by this rollback"`
	Verification   *Verification `json:"verification,omitempty"`
	Approval       string        `json:"approval,omitempty" jsonschema:"the approval request of a compensation that requires approval"`
	// Earlier is true when the status was reached by an earlier rollback of the run.
	Earlier bool   `json:"earlier,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Undone reports whether the step's compensation ran (verified, unverified, or compensated
// without a read-back).
func (s StepResult) Undone() bool {
	return s.Status == store.RollbackVerified || s.Status == store.RollbackUnverified || s.Status == store.RollbackCompensated
}

// StepRef names a step in a summary.
type StepRef struct {
	Step   int64        `json:"step"`
	Tool   string       `json:"tool"`
	Status store.Status `json:"status"`
	Reason string       `json:"reason,omitempty"`
}

// Outcome sums up a rollback: what was undone, the residue that remains (declared by the
// compensations that ran), and what is not undone.
type Outcome struct {
	Undone    []StepRef `json:"undone"`
	Residue   []string  `json:"residue"`
	NotUndone []StepRef `json:"not_undone"`
	Skipped   int       `json:"skipped"`
}

// Phases of a rollback (DESIGN.md, ReversiRun status.phase).
const (
	PhaseRolledBack          = "RolledBack"
	PhasePartiallyRolledBack = "PartiallyRolledBack"
)

// Result is a rollback's answer: the dry-run plan, and once confirmed every step's result.
type Result struct {
	Run       string       `json:"run"`
	Confirmed bool         `json:"confirmed"`
	Plan      Plan         `json:"plan"`
	Steps     []StepResult `json:"steps,omitempty"`
	Summary   *Outcome     `json:"summary,omitempty"`
	// Phase is RolledBack when every step is undone or had nothing to undo, otherwise
	// PartiallyRolledBack (confirmed only).
	Phase string `json:"phase,omitempty"`
	// OK is true when nothing failed, waits or stays not undone (confirmed), or when the plan
	// is ready (dry run).
	OK bool `json:"ok"`
}

// CompensationKey is the idempotency key of the compensation of one step: derived from the
// run, the step and the compensation tool only, so every attempt and every resumed rollback
// sends the same key (seed: "the idempotency key Reversi gives each compensation ... stays
// the same across retries so the downstream API can deduplicate").
func CompensationKey(run string, step int64, tool string) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d\x00%s", run, step, tool)))
	return "reversi-rb-" + hex.EncodeToString(sum[:16])
}

// approvalID is the id of the approval request of one step's compensation, so a resumed
// rollback finds the request it created.
func approvalID(run string, step int64) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d", run, step)))
	return "apr-rb-" + hex.EncodeToString(sum[:12])
}

// LastRollback returns, per step, the newest rollback record of recs.
func LastRollback(recs []store.Record) map[int64]store.Record {
	last := map[int64]store.Record{}
	for _, r := range recs {
		if r.Kind == store.KindRollback {
			if prev, ok := last[r.Step]; !ok || r.Seq > prev.Seq {
				last[r.Step] = r
			}
		}
	}
	return last
}

// alreadyUndone marks the compensate steps an earlier rollback undid as skip ("already
// undone"), as the plan tools show them.
func alreadyUndone(p Plan, recs []store.Record) Plan {
	last := LastRollback(recs)
	p.Steps = slices.Clone(p.Steps)
	for i := range p.Steps {
		s := &p.Steps[i]
		r, ok := last[s.Step]
		if !ok || s.Action != manifest.PlanCompensate {
			continue
		}
		switch r.Status {
		case store.RollbackVerified, store.RollbackUnverified, store.RollbackCompensated:
			s.Action, s.Reason = manifest.PlanSkip, fmt.Sprintf("already undone: %s by an earlier rollback (record %d)", r.Status, r.Seq)
			p.Summary.Compensate--
			p.Summary.Skip++
		}
	}
	return p
}

// Execute rolls back run. Unconfirmed, it returns the dry-run plan (DryRun, with the steps an
// earlier rollback undid marked skip) and touches nothing. Confirmed, it goes through the plan
// newest first and, for each step, appends rollback records to the ledger (store.KindRollback):
//
//   - skip, unrecoverable, not_undone: one record with the plan's verdict (not repeated by a
//     later rollback);
//   - compensate: `started` before the first attempt, then `failed` or `compensated`, then
//     `verified`, `verification_failed` or `unverified` when the manifest declares a
//     read-back. A compensation that requires approval creates a request in the store's
//     approval queue and is `waiting_approval` (or `denied`) unless ApproveCompensations.
//     A step that a later step `requires` is `held` while that later step is not undone
//     (newest first already puts the dependent step first; this keeps a failed dependent
//     from being stranded on a removed prerequisite).
//
// A rollback resumes where an earlier one stopped: steps undone are not called again, a
// compensation started but not finished (crash) or failed is called again with the same
// idempotency key, a compensated step whose read-back was not recorded is only read back.
// Errors: the store's (the ledger cannot be read or written); a run that does not exist is
// store.ErrNotFound. Step failures are in the Result, not errors.
func Execute(ctx context.Context, env Env, run string, o Options) (Result, error) {
	r, err := env.Store.GetRun(ctx, run)
	if err != nil {
		return Result{}, err
	}
	recs, err := env.Store.Records(ctx, run, 0, 0)
	if err != nil {
		return Result{}, err
	}
	steps := Steps(recs)
	plan := DryRun(PlanSteps(run, steps, env.Manifests), env.Tools)
	res := Result{Run: run, Confirmed: o.Confirm, Plan: alreadyUndone(plan, recs)}
	if !o.Confirm {
		res.OK = res.Plan.Ready
		return res, nil
	}
	x := &executor{env: env, run: r, o: o.withDefaults(), last: LastRollback(recs), intents: map[int64]store.Record{},
		dependents: dependents(steps, env.Manifests), done: map[int64]*StepResult{}}
	for _, s := range steps {
		x.intents[s.Intent.Seq] = s.Intent
	}
	sum := &Outcome{Undone: []StepRef{}, Residue: []string{}, NotUndone: []StepRef{}}
	for _, s := range plan.Steps {
		sr, err := x.step(ctx, s)
		if err != nil {
			return Result{}, err
		}
		res.Steps = append(res.Steps, sr)
		x.done[sr.Step] = &res.Steps[len(res.Steps)-1]
		ref := StepRef{Step: sr.Step, Tool: sr.Tool, Status: sr.Status, Reason: sr.Reason}
		switch {
		case sr.Undone():
			sum.Undone = append(sum.Undone, ref)
			if sr.Compensation != nil {
				for _, rs := range sr.Compensation.Residue {
					sum.Residue = append(sum.Residue, fmt.Sprintf("step %d %s: %s", sr.Step, sr.Tool, rs))
				}
			}
		case sr.Status == store.RollbackSkipped:
			sum.Skipped++
		default:
			if sr.Error != "" {
				ref.Reason = sr.Error
			}
			sum.NotUndone = append(sum.NotUndone, ref)
		}
	}
	res.Summary = sum
	res.OK = len(sum.NotUndone) == 0
	res.Phase = PhaseRolledBack
	if !res.OK {
		res.Phase = PhasePartiallyRolledBack
	}
	return res, nil
}

func (o Options) withDefaults() Options {
	if o.Attempts <= 0 {
		o.Attempts = DefaultAttempts
	}
	if o.Backoff <= 0 {
		o.Backoff = DefaultBackoff
	}
	if o.ApprovalTimeout <= 0 {
		o.ApprovalTimeout = DefaultApprovalTimeout
	}
	if o.Operator == "" {
		o.Operator = "operator"
	}
	return o
}

// dependents maps a step to the later steps that required it: for each succeeded step whose
// current manifest `requires` a tool, the newest earlier succeeded step of that tool (the one
// that satisfied the requirement when the call was made).
func dependents(steps []StepRecords, ms Manifests) map[int64][]int64 {
	ran := func(s StepRecords) bool {
		return s.Outcome != nil && (s.Outcome.Status == store.Succeeded || s.Outcome.Status == store.WouldBlock)
	}
	deps := map[int64][]int64{}
	for i, s := range steps {
		m := ms.Manifest(s.Intent.Tool)
		if m == nil || !ran(s) {
			continue
		}
		for _, req := range m.Requires {
			for j := i - 1; j >= 0; j-- {
				if steps[j].Intent.Tool == req.Tool && ran(steps[j]) {
					deps[steps[j].Intent.Seq] = append(deps[steps[j].Intent.Seq], s.Intent.Seq)
					break
				}
			}
		}
	}
	return deps
}

type executor struct {
	env        Env
	run        store.Run
	o          Options
	last       map[int64]store.Record
	intents    map[int64]store.Record
	dependents map[int64][]int64
	done       map[int64]*StepResult
}

// record appends a rollback record for sr's step.
func (x *executor) record(ctx context.Context, sr *StepResult, status store.Status, note string, args map[string]any) error {
	e := store.RollbackEntry{Run: x.run.ID, Step: sr.Step, Status: status, Note: note, IdempotencyKey: sr.IdempotencyKey, Arguments: args}
	if sr.Compensation != nil {
		e.Tool = sr.Compensation.Tool
	}
	// The step's risk, for the receivers' risk filters of its alert (issue 24).
	if m := x.manifest(sr.Tool); m != nil && m.Risk != nil {
		e.Risk = store.Risk{DataClass: m.Risk.DataClass, BlastRadius: m.Risk.BlastRadius, Environment: m.Risk.Environment}
	}
	// Written even if the caller gives up now: the compensation may already have acted.
	if _, err := x.env.Store.AppendRollback(context.WithoutCancel(ctx), e); err != nil {
		return fmt.Errorf("rollback of run %s: journal step %d (%s): %w", x.run.ID, sr.Step, status, err)
	}
	sr.Status = status
	return nil
}

// recordStarted appends the started record of sr's compensation (write-ahead). With approval,
// the record consumes that approval in its transaction (store.RollbackEntry.Approval): the
// compensation runs under it.
func (x *executor) recordStarted(ctx context.Context, sr *StepResult, note string, args map[string]any, approval string) error {
	e := store.RollbackEntry{Run: x.run.ID, Step: sr.Step, Status: store.RollbackStarted, Note: note, IdempotencyKey: sr.IdempotencyKey,
		Arguments: args, Approval: approval}
	if sr.Compensation != nil {
		e.Tool = sr.Compensation.Tool
	}
	if approval != "" {
		e.ArgsDigest = argsDigest(args)
	}
	if _, err := x.env.Store.AppendRollback(context.WithoutCancel(ctx), e); err != nil {
		return fmt.Errorf("rollback of run %s: journal step %d (%s): %w", x.run.ID, sr.Step, store.RollbackStarted, err)
	}
	sr.Status = store.RollbackStarted
	return nil
}

// once records a verdict that does not change between rollbacks only the first time.
func (x *executor) once(ctx context.Context, sr *StepResult, status store.Status, note string) error {
	if l, ok := x.last[sr.Step]; ok && l.Status == status {
		sr.Status, sr.Earlier = status, true
		return nil
	}
	return x.record(ctx, sr, status, note, nil)
}

func (x *executor) step(ctx context.Context, s Step) (StepResult, error) {
	sr := StepResult{Step: s.Step, Tool: s.Tool, Action: s.Action, Reason: s.Reason, Compensation: s.Compensation}
	var err error
	switch s.Action {
	case manifest.PlanSkip:
		err = x.once(ctx, &sr, store.RollbackSkipped, s.Reason)
	case manifest.PlanUnrecoverable:
		err = x.once(ctx, &sr, store.RollbackUnrecoverable, s.Reason)
	case manifest.PlanNotUndone:
		err = x.once(ctx, &sr, store.RollbackNotUndone, s.Reason)
	case manifest.PlanCompensate:
		err = x.compensate(ctx, &sr, s)
	default:
		err = fmt.Errorf("rollback of run %s: step %d has an unknown plan action %q", x.run.ID, s.Step, s.Action)
	}
	return sr, err
}

func (x *executor) compensate(ctx context.Context, sr *StepResult, s Step) error {
	c := s.Compensation
	sr.IdempotencyKey = CompensationKey(x.run.ID, s.Step, c.Tool)
	last, resumed := x.last[s.Step]
	if resumed {
		switch last.Status {
		case store.RollbackVerified, store.RollbackUnverified:
			sr.Status, sr.Earlier, sr.Reason = last.Status, true, "undone by an earlier rollback"
			return nil
		case store.RollbackCompensated:
			sr.Earlier, sr.Reason = true, "compensated by an earlier rollback"
			return x.verify(ctx, sr, s)
		case store.RollbackDenied:
			sr.Status, sr.Earlier, sr.Error = last.Status, true, last.Note
			return nil
		}
	}
	for _, d := range x.dependents[s.Step] {
		if dr := x.done[d]; dr != nil && dr.Action == manifest.PlanCompensate && !dr.Undone() {
			sr.Error = fmt.Sprintf("held: step %d (%s) requires this step and is not undone (%s); undo it first", d, dr.Tool, dr.Status)
			return x.once(ctx, sr, store.RollbackHeld, sr.Error)
		}
	}
	var approvalNote, approvalID string
	if c.RequiresApproval {
		if x.o.ApproveCompensations {
			approvalNote = "; approved by " + x.o.Operator + " (approve_compensations)"
		} else {
			ok, note, err := x.approval(ctx, sr, s)
			if err != nil || !ok {
				return err
			}
			approvalNote, approvalID = "; "+note, sr.Approval
		}
	}
	if !x.env.Tools.Exposed(c.Tool) {
		sr.Error = "no upstream exposes " + c.Tool + ": the compensation cannot run; reconnect the upstream and run the rollback again"
		return x.record(ctx, sr, store.RollbackFailed, sr.Error, nil)
	}
	note := "by " + x.o.Operator + approvalNote
	if resumed && last.Status == store.RollbackStarted {
		note = "resumed: an earlier attempt did not finish; same idempotency key; " + note
	}
	if err := x.recordStarted(ctx, sr, note, c.Arguments, approvalID); err != nil {
		return err
	}
	var timeout time.Duration
	if m := x.env.Manifests.Manifest(s.Tool); m != nil && m.Compensation != nil && m.Compensation.TimeoutMs != nil {
		timeout = time.Duration(*m.Compensation.TimeoutMs) * time.Millisecond
	}
	meta := map[string]any{IdempotencyKeyMeta: sr.IdempotencyKey,
		ReasonMeta: fmt.Sprintf("Reversi rollback of run %s, step %d (%s)", x.run.ID, s.Step, s.Tool)}
	var lastErr string
	wait := x.o.Backoff
	for i := 0; i < x.o.Attempts; i++ {
		if i > 0 {
			if err := sleep(ctx, wait); err != nil {
				lastErr = err.Error()
				break
			}
			wait *= 2
		}
		sr.Attempts++
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			cctx, cancel = context.WithTimeout(ctx, timeout)
		}
		res, err := x.env.Caller.CallTool(cctx, c.Tool, c.Arguments, meta)
		cancel()
		switch {
		case err != nil:
			lastErr = err.Error()
		case res.IsError:
			lastErr = "the compensation answered isError: " + resultText(res)
		default:
			lastErr = ""
		}
		if lastErr == "" {
			break
		}
	}
	if lastErr != "" {
		sr.Error = fmt.Sprintf("%s failed after %d attempt(s): %s; run the rollback again to retry with the same idempotency key", c.Tool, sr.Attempts, lastErr)
		return x.record(ctx, sr, store.RollbackFailed, sr.Error, nil)
	}
	if err := x.record(ctx, sr, store.RollbackCompensated, fmt.Sprintf("%s answered after %d attempt(s)", c.Tool, sr.Attempts), nil); err != nil {
		return err
	}
	x.releaseKey(ctx, s.Step)
	return x.verify(ctx, sr, s)
}

// releaseKey frees the duplicate-call key the undone step held (seed: Duplicate calls, "Once
// the first call is undone or failed, the key is free again").
func (x *executor) releaseKey(ctx context.Context, step int64) {
	key := x.intents[step].IdempotencyKey
	if key == "" {
		return
	}
	if h, ok, err := x.env.Store.HeldKey(ctx, key); err == nil && ok && h.Run == x.run.ID && h.Step == step {
		_ = x.env.Store.ReleaseKey(context.WithoutCancel(ctx), key)
	}
}

// approval consults (creating it the first time) the approval request of the step's
// compensation. ok is true when the compensation may run now.
func (x *executor) approval(ctx context.Context, sr *StepResult, s Step) (ok bool, note string, err error) {
	c := s.Compensation
	id := approvalID(x.run.ID, s.Step)
	sr.Approval = id
	digest := argsDigest(c.Arguments)
	a, err := x.env.Store.GetApproval(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		req := store.ApprovalRequest{ID: id, Tool: c.Tool, ArgsDigest: digest, Run: x.run.ID, Actor: x.run.Actor, Quorum: 1,
			Expires: time.Now().Add(x.o.ApprovalTimeout), OnTimeout: "deny",
			Reason: fmt.Sprintf("rollback of run %s step %d (%s): the compensation %s requires approval", x.run.ID, s.Step, s.Tool, c.Tool)}
		if m := x.env.Manifests.Manifest(c.Tool); m != nil && m.Approval.Rules != nil {
			r := m.Approval.Rules
			req.Roles, req.Quorum, req.OnTimeout, req.EscalateTo = r.Roles, r.Quorum, r.OnTimeout, r.EscalateTo
			if r.TimeoutMs != nil {
				req.Expires = time.Now().Add(time.Duration(*r.TimeoutMs) * time.Millisecond)
			}
		}
		a, err = x.env.Store.CreateApproval(ctx, req)
	}
	if err != nil {
		return false, "", fmt.Errorf("rollback of run %s: approval request %s: %w", x.run.ID, id, err)
	}
	switch a.State {
	case store.ApprovalApproved:
		if a.Tool != c.Tool || a.ArgsDigest != digest {
			return false, "", fmt.Errorf("rollback of run %s: approval %s: %w", x.run.ID, id, store.ErrMismatch)
		}
		return true, "approved in request " + id, nil // consumed by the started record (recordStarted)
	case store.ApprovalPending:
		sr.Error = fmt.Sprintf("the compensation %s requires approval: request %s is waiting for an approver (reversi approvals approve %s), then run the rollback again; or pass --approve-compensations", c.Tool, id, id)
		return false, "", x.once(ctx, sr, store.RollbackWaitingApproval, sr.Error)
	default:
		sr.Error = fmt.Sprintf("the compensation %s was not approved: request %s is %s", c.Tool, id, a.State)
		return false, "", x.record(ctx, sr, store.RollbackDenied, sr.Error, nil)
	}
}

// verify runs the read-back the current manifest declares for the step's compensation and
// records verified, verification_failed or unverified; without a read-back the step stays
// compensated.
func (x *executor) verify(ctx context.Context, sr *StepResult, s Step) error {
	c := s.Compensation
	m := x.env.Manifests.Manifest(s.Tool)
	if m == nil || m.Compensation == nil || m.Compensation.Tool != c.Tool || m.Compensation.Verification == nil {
		sr.Status = store.RollbackCompensated
		return nil
	}
	v := m.Compensation.Verification
	sr.Verification = &Verification{Tool: v.Tool}
	args, missing := VerificationArguments(m.Compensation, c.Arguments)
	if len(missing) > 0 {
		sr.Verification.Error = fmt.Sprintf("the read-back's arguments need %s, which the step did not journal (only the values argument_map names are kept): name them in argument_map too",
			strings.Join(missing, ", "))
		return x.record(ctx, sr, store.RollbackUnverified, sr.Verification.Error, nil)
	}
	sr.Verification.Arguments = args
	if !x.env.Tools.Exposed(v.Tool) {
		sr.Verification.Error = "no upstream exposes " + v.Tool + ": the read-back could not run"
		return x.record(ctx, sr, store.RollbackUnverified, sr.Verification.Error, args)
	}
	retries, wait := v.Retries, time.Duration(v.BackoffMs)*time.Millisecond
	if retries <= 0 {
		retries = manifest.DefaultVerifyRetries
	}
	if wait <= 0 {
		wait = time.Duration(manifest.DefaultVerifyBackoff) * time.Millisecond
	}
	meta := map[string]any{ReasonMeta: fmt.Sprintf("Reversi rollback of run %s, step %d (%s): read-back", x.run.ID, s.Step, s.Tool)}
	var first, lastErr string
	for i := 0; i < retries; i++ {
		if i > 0 {
			if err := sleep(ctx, wait); err != nil {
				lastErr = err.Error()
				break
			}
			wait *= 2
		}
		sr.Verification.Attempts++
		res, err := x.env.Caller.CallTool(ctx, v.Tool, args, meta)
		switch {
		case err != nil:
			lastErr = err.Error()
			continue
		case res.IsError:
			lastErr = "the read-back answered isError: " + resultText(res)
			continue
		}
		mismatch := manifest.CheckExpect(v.Expect, ResultValue(res))
		if mismatch == "" {
			return x.record(ctx, sr, store.RollbackVerified, fmt.Sprintf("%s matched after %d attempt(s)", v.Tool, sr.Verification.Attempts), args)
		}
		if first == "" {
			first = mismatch
		}
	}
	if first != "" {
		sr.Verification.Mismatch = first
		sr.Error = fmt.Sprintf("the read-back %s never matched (%d attempt(s)); first mismatch: %s", v.Tool, sr.Verification.Attempts, first)
		return x.record(ctx, sr, store.RollbackVerificationFailed, sr.Error, args)
	}
	sr.Verification.Error = "the read-back could not run: " + lastErr
	return x.record(ctx, sr, store.RollbackUnverified, sr.Verification.Error, args)
}

// VerificationArguments resolves a read-back's arguments at rollback time, when only the
// step's handle is left (arguments are not stored in the ledger; seed: Compensation). A
// verification reference resolves when argument_map names the same reference, or a prefix of
// it (then the rest of the path is followed into the journaled value, `*` included): with
// `entityNames: $args.entities.*.name` journaled, `names: $args.entities.*.name` resolves;
// with `relations: $args.relations`, `$args.relations.*.from` does. missing lists (sorted) the
// references that cannot be resolved so.
func VerificationArguments(c *manifest.Compensation, handle map[string]any) (map[string]any, []string) {
	out := map[string]any{}
	var missing []string
	names := make([]string, 0, len(c.ArgumentMap))
	for k := range c.ArgumentMap {
		names = append(names, k)
	}
	slices.Sort(names)
	for arg, ref := range c.Verification.Arguments {
		found := false
		for _, name := range names {
			base := c.ArgumentMap[name]
			val, ok := handle[name]
			if !ok {
				continue
			}
			if ref == base {
				out[arg], found = val, true
				break
			}
			if rest, ok := strings.CutPrefix(ref, base+"."); ok {
				if v, ok := manifest.LookupRef(val, rest); ok && v != nil {
					out[arg], found = v, true
					break
				}
			}
		}
		if !found {
			missing = append(missing, ref)
		}
	}
	slices.Sort(missing)
	return out, missing
}

// ResultValue is the value a read-back's `expect` is compared with: structuredContent, or a
// single text block holding JSON (as for `$result`, seed: What happens to a call); nil
// otherwise.
func ResultValue(res *mcp.CallToolResult) any {
	if res.StructuredContent != nil {
		b, err := json.Marshal(res.StructuredContent)
		if err == nil {
			var v any
			if json.Unmarshal(b, &v) == nil {
				return v
			}
		}
		return nil
	}
	if len(res.Content) != 1 {
		return nil
	}
	t, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		return nil
	}
	var v any
	if json.Unmarshal([]byte(t.Text), &v) != nil {
		return nil
	}
	return v
}

// resultText is the text of an isError result, shortened for a record.
func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	s := strings.Join(parts, " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	if s == "" {
		s = "(no text)"
	}
	return s
}

// argsDigest is the digest an approval request carries for the compensation's arguments.
func argsDigest(args map[string]any) string {
	b, _ := json.Marshal(args) // journaled values: always JSON; map keys are sorted
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// manifest is the manifest of tool that applies now (nil: none, or no manifests given).
func (x *executor) manifest(tool string) *manifest.Manifest {
	if x.env.Manifests == nil {
		return nil
	}
	return x.env.Manifests.Manifest(tool)
}
