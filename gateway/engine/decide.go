package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/policy"
)

// Action is what the gateway does with a call.
type Action string

const (
	Allow         Action = "allow"          // forward it (possibly with violations, in advise/observe)
	Block         Action = "block"          // return isError with BlockedText()
	NeedsApproval Action = "needs_approval" // blocked until an approver decides ApprovalID
)

// Call is one `tools/call` as the engine sees it.
type Call struct {
	Run   string
	Actor string
	// ActorUID and ActorEmail are the actor's uid and e-mail (auth.Identity), "" when its
	// credential has none; a request for approval carries them (issue 16: an approver with
	// either is the actor under another name).
	ActorUID, ActorEmail string
	// Groups are the actor's groups (auth.Identity.Groups), the policy's actor.groups.
	Groups []string
	Tool   string
	Args   map[string]any // nil is treated as {}
	// Permissions overrides the engine's session scope for this session (e.g. capped by an
	// API key's max_permissions); nil uses the engine's.
	Permissions []string
}

// Decision is the engine's verdict on one call. Source: seed "MCP gateway", Modes and What
// happens to a call.
type Decision struct {
	Action Action
	// Mode is the mode the call was decided in: the engine's, or Observe for a shadow run.
	Mode Mode
	// Run is the run to journal under: the call's, or `<run>-reads` for an unclassified read
	// let through by unclassified_reads: observe (Shadow true).
	Run    string
	Shadow bool
	// Unclassified: the tool has no manifest.
	Unclassified bool
	Manifest     *manifest.Manifest // nil when unclassified
	// Violations are the broken rules, in the order checked. In enforce mode checking stops
	// at the first one; in advise and observe every check runs.
	Violations []string
	// Category is the kind of the first violation (CategoryApproval for NeedsApproval); ""
	// when no rule was broken. The gateway's metrics count blocks by it.
	Category Category
	// Reason is the violations joined with "; " (the text after "Blocked by Reversi: " or
	// the advisory prefix); for NeedsApproval, the approval text.
	Reason string
	// WouldBlock: the call runs although it broke a rule (advise, observe); journal it as
	// would_block.
	WouldBlock bool
	// Advisory is the extra text block of advise mode, "" otherwise.
	Advisory string
	// Notes are journaled with the call (deprecation, unclassified, unchecked schema, the
	// policy rules that fired).
	Notes []string
	// Policy lists the policy rules that fired for the call, in evaluation order (nil: none,
	// or no policy); PolicyDecision is the policy's decision ("" without a policy).
	Policy         []policy.Fired
	PolicyDecision apipolicy.Decision
	// PolicyTime is how long the policy took to decide the call (every evaluation of it, the
	// limits' counting included): reversi_gateway_policy_evaluation_seconds.
	PolicyTime time.Duration
	// ApprovalRequired: the manifest or a policy rule requires approval; Approval holds the
	// rules (nil for the manifest's `always`; a policy's merged with the manifest's by the
	// seed's rule: any listed role, the largest quorum, the shortest timeout). ApprovalID is the request the call waits for (NeedsApproval) or, for Allow,
	// the approved and unused request it is the retry of: the gateway passes it as
	// store.Intent.Approval, which consumes it with the intent (the engine consumes nothing).
	ApprovalRequired bool
	Approval         *manifest.ApprovalRules
	ApprovalID       string
	// ArgsDigest is "sha256:<hex>" of the arguments' canonical JSON (ledger and approvals).
	ArgsDigest string
	// Timeout is the manifest's timeout_ms (0: none). Retry is the manifest's retry, only for
	// read_only and idempotent tools (seed: Timeout and retry).
	Timeout time.Duration
	Retry   *manifest.Retry
	// Key is the rendered duplicate-call key ("" when the manifest declares none). KeyClaimed
	// says this call holds it: release it with Store.ReleaseKey when the call fails.
	Key        string
	KeyClaimed bool
}

// BlockedText is the text of the isError result: `Blocked by Reversi: <reason>`.
func (d Decision) BlockedText() string { return BlockedPrefix + d.Reason }

// JournalDecision is the Intent.Decision word: allow, block, needs_approval or would_block.
func (d Decision) JournalDecision() string {
	if d.Action == Allow && d.WouldBlock {
		return string(store.WouldBlock)
	}
	return string(d.Action)
}

// ArgsDigest is "sha256:" and the hex SHA-256 of the arguments' canonical JSON (nil is {}).
func ArgsDigest(args map[string]any) (string, error) {
	if args == nil {
		args = map[string]any{}
	}
	b, err := CanonicalSchemaJSON(args)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// NoManifestText is the violation of a tool without a manifest in enforce mode.
func NoManifestText(tool string) string {
	return "there is no manifest for " + tool + ": a tool without a manifest is blocked in enforce mode"
}

// ScopeText is the violation of a permission outside the session's scope.
func ScopeText(tool, permission string) string {
	return fmt.Sprintf("%s needs the permission %s, which is outside this session's scope", tool, permission)
}

// DuplicateText is the violation of a held duplicate-call key (seed "Tool manifests",
// Duplicate calls: "the second is refused while the first still stands").
func DuplicateText(tool string, h store.KeyHolder) string {
	return fmt.Sprintf("duplicate call: an earlier call of %s with the same key still stands (run %s, step %d)", tool, h.Run, h.Step)
}

// decider accumulates one decision. preview (Engine.Preview) makes it read-only: it neither
// claims the duplicate-call key nor queues an approval.
type decider struct {
	e           *Engine
	d           Decision
	preview     bool
	policyNotes int           // where the policy's notes start in d.Notes
	in          *policy.Input // what the policy step evaluated (nil: no policy ran)
}

// violate records a broken rule and reports whether checking stops (enforce mode).
func (x *decider) violate(c Category, text string) (stop bool) {
	x.d.Violations = append(x.d.Violations, text)
	if x.d.Category == "" {
		x.d.Category = c
	}
	return x.d.Mode == Enforce
}

// Decide decides one call, in the seed's order: manifest, draft, deprecation note, scope,
// requires, input schema, schema drift, allow/deny, approval, duplicate-call key. It writes to
// the Store only to queue an approval request (enforce mode) and to claim the duplicate-call
// key (only when the call will run). It never consumes an approval: an Allow with ApprovalID
// is consumed by the call's intent (store.Intent.Approval, issue 16), so a retry that loses
// the race for it is refused there.
func (e *Engine) Decide(ctx context.Context, c Call) Decision {
	x := &decider{e: e, d: Decision{Mode: e.mode, Run: c.Run}}
	x.decide(ctx, c)
	return x.finish()
}

func (x *decider) decide(ctx context.Context, c Call) {
	e, d := x.e, &x.d
	args := c.Args
	if args == nil {
		args = map[string]any{}
	}
	if digest, err := ArgsDigest(args); err == nil {
		d.ArgsDigest = digest
	} else if x.violate(CategoryOther, "the arguments are not JSON: "+err.Error()) {
		return
	}
	up := e.tools[c.Tool]

	// 1. Manifest and lifecycle.
	m := e.manifests[c.Tool]
	d.Manifest = m
	if m == nil {
		d.Unclassified = true
		switch {
		case e.mode != Enforce:
			d.Notes = append(d.Notes, UnclassifiedNote)
		case e.reads == ReadsObserve && up != nil && up.ReadOnlyHint:
			d.Mode, d.Shadow, d.Run = Observe, true, c.Run+ShadowRunSuffix
			d.Notes = append(d.Notes, UnclassifiedReadNote)
		default:
			if x.violate(CategoryNoManifest, NoManifestText(c.Tool)) {
				return
			}
		}
	} else {
		if err := manifest.CheckStatus(m); err != nil && x.violate(CategoryDraft, err.Error()) {
			return
		}
		if n := manifest.Note(m); n != "" {
			d.Notes = append(d.Notes, n)
		}
		if m.TimeoutMs != nil {
			d.Timeout = time.Duration(*m.TimeoutMs) * time.Millisecond
		}
		if m.Retry != nil && m.Effect.Retryable() {
			r := *m.Retry
			d.Retry = &r
		}
		// 2. Scope.
		inScope := e.scope[m.Permission]
		if c.Permissions != nil {
			inScope = slices.Contains(c.Permissions, m.Permission)
		}
		if !inScope && x.violate(CategoryScope, ScopeText(c.Tool, m.Permission)) {
			return
		}
		// 3. Requires.
		succeeded := func(tool string) bool { return e.succeeded != nil && e.succeeded(ctx, c.Run, tool) }
		if err := manifest.CheckRequires(m, succeeded); err != nil && x.violate(CategoryRequires, err.Error()) {
			return
		}
	}

	// 4. Input schema.
	if e.validate && up != nil && up.InputSchema != nil {
		if up.inputErr != nil {
			d.Notes = append(d.Notes, "the tool's input schema could not be compiled, so the arguments were not checked: "+up.inputErr.Error())
		} else if p := checkValue(up.input, args); p != "" && x.violate(CategorySchema, InputSchemaPrefix+p) {
			return
		}
	}
	// 5. Schema drift.
	if m != nil && m.SchemaHash != "" && up != nil && up.inputHash != "" && !hashMatches(m.SchemaHash, up.inputHash) {
		if x.violate(CategoryDrift, SchemaDriftText) {
			return
		}
	}
	// 6. Allow and deny.
	if text, ok := e.allowDeny(c.Tool); !ok && x.violate(CategoryAllowDeny, text) {
		return
	}
	// 7. Policy (seed: step 2, "policy, content checks"): it can only tighten.
	// A tool without a manifest gets here in advise and observe mode, and as a shadow read: the
	// policy's approval and limits apply to it too (issue 21: "it can only tighten").
	pol, stop := x.policy(ctx, c, m, args)
	if stop {
		return
	}
	// 8. Approval, the manifest's merged with the policy's.
	approvalReason := c.Tool + " requires approval (manifest)"
	if m != nil && m.Approval.Required {
		d.ApprovalRequired, d.Approval = true, m.Approval.Rules
	}
	if pol.Decision == apipolicy.DecisionRequireApproval {
		d.ApprovalRequired, d.Approval = true, pol.Approval
		approvalReason = c.Tool + " requires approval (policy): " + pol.Reason
	}
	if d.ApprovalRequired {
		if d.Mode != Enforce {
			x.violate(CategoryApproval, "approval required: "+c.Tool+" needs a person's approval")
		} else if len(d.Violations) == 0 {
			if !x.approval(ctx, c, m, approvalReason) {
				return
			}
		}
	}
	// 9. Limits: the call counts under every limit rule it matches, once nothing above holds
	// it (a held call counts on its approved retry).
	if len(pol.Counts) > 0 && !x.preview && (d.Mode != Enforce || len(d.Violations) == 0) {
		if x.takeLimits(ctx, pol.Counts) {
			return
		}
	}
	if m == nil {
		return
	}
	// 10. Duplicate-call key.
	key, err := manifest.DuplicateKey(m, args, c.Run, c.Actor)
	if err != nil {
		x.violate(CategoryDuplicate, err.Error())
		return
	}
	if key == "" {
		return
	}
	d.Key = key
	if d.Mode == Enforce && len(d.Violations) > 0 {
		return // the call will not run: claim nothing
	}
	if x.preview {
		x.previewKey(ctx, c, key)
		return
	}
	ok, holder, err := e.store.ClaimKey(ctx, key, c.Run, 0)
	switch {
	case err != nil:
		x.violate(CategoryDuplicate, "the duplicate-call key could not be checked: "+err.Error())
	case !ok:
		x.violate(CategoryDuplicate, DuplicateText(c.Tool, holder))
	default:
		d.KeyClaimed = true
	}
}

// approval handles a call that needs approval in enforce mode: an approved, unused request
// for the same run, tool and arguments lets it through (ApprovalID: the intent consumes it);
// a pending one keeps it waiting; a denied or expired one blocks it; otherwise a request is
// queued. It reports whether checking continues.
func (x *decider) approval(ctx context.Context, c Call, m *manifest.Manifest, reason string) bool {
	e, d := x.e, &x.d
	list, err := e.store.ListApprovals(ctx, store.ApprovalFilter{Run: c.Run})
	if err != nil {
		x.violate(CategoryApproval, "the approval queue could not be read: "+err.Error())
		return false
	}
	var latest *store.Approval
	for i := range list { // oldest first: prefer an approved, unused request
		a := &list[i]
		if a.Tool != c.Tool || a.ArgsDigest != d.ArgsDigest {
			continue
		}
		if a.State == store.ApprovalApproved && a.Consumed.IsZero() {
			d.ApprovalID = a.ID // consumed by the call's intent (store.Intent.Approval)
			return true
		}
		latest = a // a used approval, like a decision, is superseded by a later request
	}
	if latest != nil {
		switch latest.State {
		case store.ApprovalPending:
			d.Action, d.Category, d.ApprovalID = NeedsApproval, CategoryApproval, latest.ID
			d.Reason = PendingApprovalText(c.Tool, latest.ID)
			return false
		case store.ApprovalDenied, store.ApprovalExpired:
			x.violate(CategoryApproval, fmt.Sprintf("approval %s for this call was %s", latest.ID, latest.State))
			return false
		}
	}
	if x.preview {
		d.Action, d.Reason = NeedsApproval, PreviewApprovalText(c.Tool)
		return false
	}
	// Each new request is announced to the approvers (issue 24): an actor may not queue more
	// than MaxPendingApprovalsPerActor at once (an agent making held calls in a loop, each
	// with other arguments or in another run, would flood the approvers' channels).
	pending, err := e.store.ListApprovals(ctx, store.ApprovalFilter{State: store.ApprovalPending})
	if err != nil {
		x.violate(CategoryApproval, "the approval queue could not be read: "+err.Error())
		return false
	}
	mine := 0
	for i := range pending {
		if pending[i].Actor == c.Actor {
			mine++
		}
	}
	if mine >= MaxPendingApprovalsPerActor {
		x.violate(CategoryApproval, fmt.Sprintf("%s already has %d approval requests waiting for approvers (at most %d): wait for them to be decided or expire",
			c.Actor, mine, MaxPendingApprovalsPerActor))
		return false
	}
	req := store.ApprovalRequest{Tool: c.Tool, ArgsDigest: d.ArgsDigest, Run: c.Run, Actor: c.Actor, ActorUID: c.ActorUID, ActorEmail: c.ActorEmail,
		Reason: reason, ArgsPreview: ArgumentsPreview(m, c.Args)}
	if m != nil && m.Risk != nil {
		req.Risk = store.Risk{DataClass: m.Risk.DataClass, BlastRadius: m.Risk.BlastRadius, Environment: m.Risk.Environment}
	}
	timeout := DefaultApprovalTimeout
	if r := d.Approval; r != nil {
		req.Roles, req.Quorum, req.OnTimeout = r.Roles, r.Quorum, r.OnTimeout
		req.EscalateTo = r.EscalateTo
		if r.TimeoutMs != nil && *r.TimeoutMs > 0 {
			timeout = time.Duration(*r.TimeoutMs) * time.Millisecond
		}
	}
	req.Expires = e.now().Add(timeout)
	a, err := e.store.CreateApproval(ctx, req)
	if err != nil {
		x.violate(CategoryApproval, "the approval request could not be queued: "+err.Error())
		return false
	}
	d.Action, d.Category, d.ApprovalID = NeedsApproval, CategoryApproval, a.ID
	d.Reason = PendingApprovalText(c.Tool, a.ID)
	return false
}

// PendingApprovalText is the reason of a NeedsApproval decision.
func PendingApprovalText(tool, id string) string {
	return fmt.Sprintf("%s requires approval: request %s is waiting for an approver; retry the same call once it is approved", tool, id)
}

// finish applies the mode to the violations.
func (x *decider) finish() Decision {
	d := x.d
	if d.Action == NeedsApproval {
		return d
	}
	if len(d.Violations) == 0 {
		d.Action = Allow
		return d
	}
	d.Reason = strings.Join(d.Violations, "; ")
	if d.Mode == Enforce {
		d.Action = Block
		return d
	}
	d.Action, d.WouldBlock = Allow, true
	if d.Mode == Advise {
		d.Advisory = AdvisoryPrefix + d.Reason
	}
	return d
}
