package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// callPath is one tools/call on its way through handle's steps (DESIGN.md, The call path;
// seed: What happens to a call). Each step reads what the earlier ones set.
type callPath struct {
	g    *Gateway
	req  *mcp.CallToolRequest
	name string // the exposed tool name

	// decode
	r      *route // nil when no upstream exposes name now
	reason string
	run    string
	args   map[string]any

	// decide
	e  *engine.Engine // the engine that decided, also the one that checks the result
	d  engine.Decision
	in store.Intent

	// journalIntent, forward
	step   int64
	res    *mcp.CallToolResult
	resRaw json.RawMessage // the upstream's result bytes (stdio pass-through), nil otherwise
	resEnv envelopeMembers // resRaw's own envelope members
	ferr   error

	// journalOutcome
	out store.StepOutcome
}

// decode reads what the decision needs: the route, the reason (_meta["reversi/reason"]), the
// session's run (opened on its first call), the kill switch, and the arguments as a JSON
// object without a key given twice (the raw arguments are forwarded: a key given twice would be
// checked on the last value here and may be read on the first upstream).
func (c *callPath) decode(ctx context.Context) *mcp.CallToolResult {
	g, req := c.g, c.req
	c.r = g.route(c.name)
	c.reason = "MCP tools/call " + c.name
	if s, ok := req.Params.Meta[ReasonMeta].(string); ok && strings.TrimSpace(s) != "" {
		c.reason = clip(s, maxReasonBytes) // journaled with every record of the call
	}
	run, err := g.runFor(ctx, req)
	if err != nil {
		text := "the run could not be opened: " + err.Error()
		g.journalRefusal(ctx, g.principal(req), c.name, text)
		return textResult(engine.BlockedPrefix + text)
	}
	c.run = run
	if res, halted := g.blockHalted(ctx, run, c.name, c.reason); halted {
		return res
	}
	if raw := req.Params.Arguments; len(raw) > 0 && string(raw) != "null" {
		err := engine.CheckDuplicateKeys(raw)
		if err == nil {
			if err = json.Unmarshal(raw, &c.args); err != nil {
				err = fmt.Errorf("the arguments are not a JSON object: %w", err)
			}
		}
		if err != nil {
			text := err.Error()
			g.journalBlocked(ctx, store.Intent{Run: run, Tool: c.name, Reason: c.reason, Decision: string(engine.Block),
				Mode: string(g.engine.Load().Mode())}, text)
			return textResult(engine.BlockedPrefix + text)
		}
	}
	return nil
}

// decide has the engine decide the call (manifest, scope, schema, drift, allow/deny, approval,
// duplicate key) and builds its intent; a call it does not allow is journaled blocked.
func (c *callPath) decide(ctx context.Context) *mcp.CallToolResult {
	g, req := c.g, c.req
	c.e = g.engine.Load()
	call := engine.Call{Run: c.run, Actor: g.principal(req), Tool: c.name, Args: c.args, Permissions: scopeOf(req, c.e)}
	if id := identity(req); id != nil {
		call.ActorUID, call.ActorEmail = id.UID, id.Email
	}
	c.d = c.e.Decide(ctx, call)
	d := c.d
	if d.Shadow {
		if err := g.ensureRun(ctx, d.Run, g.principal(req)); err != nil {
			g.releaseKey(ctx, d)
			return textResult(engine.BlockedPrefix + "the shadow run could not be opened: " + err.Error())
		}
	}
	c.in = store.Intent{Run: d.Run, Tool: c.name, ArgsDigest: d.ArgsDigest, Reason: c.reason, IdempotencyKey: d.Key,
		HoldsKey: d.KeyClaimed, Mode: string(d.Mode), Decision: d.JournalDecision()}
	if m := d.Manifest; m != nil {
		c.in.ManifestVersion = fmt.Sprint(m.Version)
		c.in.ManifestChecksum = g.checksum(m)
	}
	if d.Action != engine.Allow {
		// The notes name the policy rules that fired (the decision's reason only their text).
		g.journalBlocked(ctx, c.in, strings.Join(append([]string{d.Reason}, d.Notes...), "; "))
		return textResult(d.BlockedText())
	}
	if d.ApprovalID != "" && d.Mode == engine.Enforce {
		c.in.Approval = d.ApprovalID // consumed with the intent, once (issue 16)
	}
	return nil
}

// journalIntent writes the intent ahead: it is durable before the upstream sees the call. An
// approval that cannot be consumed with it blocks the call; a tool gone since the SDK
// dispatched the call fails it.
func (c *callPath) journalIntent(ctx context.Context) *mcp.CallToolResult {
	g, in := c.g, c.in
	step, err := g.store.RecordIntent(ctx, in)
	if err != nil {
		g.releaseKey(ctx, c.d)
		if in.Approval != "" && (errors.Is(err, store.ErrConsumed) || errors.Is(err, store.ErrMismatch) ||
			errors.Is(err, store.ErrNotApproved) || errors.Is(err, store.ErrNotFound)) {
			res := g.refuseApproval(ctx, in, err)
			c.d.Action, c.d.Category, c.d.Reason = engine.Block, engine.CategoryApproval, res.Content[0].(*mcp.TextContent).Text
			return res
		}
		return textResult(engine.BlockedPrefix + "the call could not be journaled, so it was not forwarded: " + err.Error())
	}
	c.step = step
	if c.r == nil { // the upstream dropped the tool since the server dispatched the call
		g.releaseKey(ctx, c.d)
		g.outcome(ctx, c.d.Run, step, store.StepOutcome{Status: store.Failed, Note: "no upstream exposes " + c.name})
		return textResult("no upstream exposes " + c.name)
	}
	return nil
}

// journalOutcome journals what forward got: the status (failed when never sent, uncertain when
// the upstream may have acted), the notes, the result's check against the output schema (a
// breaking structuredContent is dropped from what the agent gets), and the compensation handle
// of the manifest's argument_map. A failed call releases its duplicate-call key.
func (c *callPath) journalOutcome(ctx context.Context) {
	g, d, ferr := c.g, c.d, c.ferr
	notes := append([]string(nil), d.Notes...)
	if d.WouldBlock {
		notes = append(notes, "would_block: "+d.Reason)
	}
	var result any
	switch {
	case errors.Is(ferr, ErrUpstreamDown): // never sent: nothing happened upstream
		c.out.Status = store.Failed
		notes = append(notes, "not forwarded: "+ferr.Error())
	case errors.Is(ferr, ErrCallCancelled): // the upstream may have acted
		c.out.Status = store.Uncertain
		notes = append(notes, ferr.Error())
	case ferr != nil:
		c.out.Status = store.Uncertain
		notes = append(notes, "the upstream did not answer: "+ferr.Error())
		if cause := context.Cause(ctx); cause != nil && !errors.Is(ferr, cause) {
			notes = append(notes, "cancelled: "+cause.Error()) // the session's end (limits.go)
		}
	case c.res.IsError:
		c.out.Status = store.Failed
	default:
		c.out.Status = store.Succeeded
		note, ok := c.e.CheckResult(c.name, c.res.StructuredContent)
		if note != "" {
			notes = append(notes, note)
		}
		if ok {
			result = resultFor(d.Manifest, c.res, c.resRaw)
		} else {
			// Clients that validate would discard the whole result: drop only the part that
			// breaks the advertised schema.
			res := *c.res
			res.StructuredContent = nil
			c.res = &res
			c.resRaw = g.editRaw(c.name, c.resRaw, func(raw json.RawMessage) (json.RawMessage, error) {
				return rawEdit(raw, map[string]json.RawMessage{"structuredContent": nil})
			})
		}
	}
	if m := d.Manifest; m != nil {
		ps := manifest.PlanStep(m, manifest.Outcome(c.out.Status), anyArgs(c.args), result)
		switch ps.Action {
		case manifest.PlanCompensate:
			c.out.CompensationTool, c.out.Handle = ps.Tool, ps.Handle
		case manifest.PlanUnrecoverable:
			c.out.CompensationTool = ps.Tool
			notes = append(notes, "unrecoverable: no value for "+strings.Join(ps.Missing, ", "))
		}
	}
	c.out.Note = strings.Join(notes, "; ")
	if c.out.Status == store.Failed { // uncertain keeps the key: the upstream may have acted
		g.releaseKey(ctx, d)
	}
	g.outcome(ctx, d.Run, c.step, c.out)
}

// reply is what the agent gets: the upstream's result (its bytes, when passed through), with
// the advisory appended in advise mode, or the gateway's text when the call did not complete.
func (c *callPath) reply(ctx context.Context) *mcp.CallToolResult {
	if errors.Is(c.ferr, ErrUpstreamDown) {
		return textResult(fmt.Sprintf("Reversi: %s was not called: %v", c.name, c.ferr))
	}
	if c.ferr != nil {
		return textResult(fmt.Sprintf("Reversi: the call to %s did not complete (%v); its outcome is uncertain: the upstream may have acted", c.name, c.ferr))
	}
	res, resRaw := c.res, c.resRaw
	if adv := c.d.Advisory; adv != "" {
		r := *res
		r.Content = append(append([]mcp.Content(nil), res.Content...), &mcp.TextContent{Text: adv})
		res = &r
		resRaw = c.g.editRaw(c.name, resRaw, func(raw json.RawMessage) (json.RawMessage, error) { return rawAppendText(raw, adv) })
	}
	if resRaw != nil {
		passThrough(ctx, res, resRaw, c.resEnv)
	}
	return res
}
