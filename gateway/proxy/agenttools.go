package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/rollback"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// The agent endpoint's read-only `reversi.*` tools (seed "MCP gateway", `reversi.*` tools, the
// agent table; issue 5). They are the gateway's own tools, not upstream tools: they are not
// decided by the engine, not journaled, not filtered by allow/deny, and they only ever show
// the principal's own runs (another principal's run is "not found", so its existence does not
// leak). None of them changes anything.

// AgentToolPrefix starts the names of the gateway's own tools. No upstream may expose a name
// with it.
const AgentToolPrefix = "reversi."

// Names of the agent tools.
const (
	ToolListRuns         = "reversi.list_runs"
	ToolGetRun           = "reversi.get_run"
	ToolGetActionTrace   = "reversi.get_action_trace"
	ToolPlanRollback     = "reversi.plan_rollback"
	ToolDryRunRollback   = "reversi.dry_run_rollback"
	ToolValidateManifest = "reversi.validate_manifest"
	ToolPreviewImpact    = "reversi.preview_impact"
	ToolSearch           = "reversi.search"
)

// Limits of list_runs, get_run and search (seed: "limit up to 200").
const (
	DefaultLimit = 50
	MaxLimit     = 200
)

// isAgentTool reports whether name is one of the gateway's own tools' namespace.
func isAgentTool(name string) bool { return strings.HasPrefix(name, AgentToolPrefix) }

// reservedName refuses an upstream tool exposed under the gateway's own namespace.
func reservedName(upstream, exposed string) error {
	if !isAgentTool(exposed) {
		return nil
	}
	return fmt.Errorf("tool name clash: upstream %s exposes %s, but %s* names are the gateway's own tools; rename the upstream or turn its namespacing on", upstream, exposed, AgentToolPrefix)
}

// principal is the principal of the session making req: the authenticated credential's
// (gateway/auth), or the config's actor when unauthenticated (seed: "the actor taken from the
// credential (or actor in the config when unauthenticated)").
func (g *Gateway) principal(req *mcp.CallToolRequest) string {
	if req == nil {
		return g.cfg.Actor
	}
	return g.principalOf(req.Extra)
}

// principalOf is principal for any request's extra (nil: unauthenticated).
func (g *Gateway) principalOf(extra *mcp.RequestExtra) string {
	if id := identityOf(extra); id != nil {
		return id.Principal
	}
	return g.cfg.Actor
}

// RunSummary is one run as list_runs and search show it.
type RunSummary struct {
	ID           string    `json:"id"`
	Started      time.Time `json:"started"`
	LastActivity time.Time `json:"last_activity"`
	Status       string    `json:"status" jsonschema:"active, idle or closed"`
	Environment  string    `json:"environment,omitempty" jsonschema:"the gateway's --environment when the run opened"`
	Counts       Counts    `json:"counts" jsonschema:"steps per outcome"`
}

// Counts are a run's steps per outcome.
type Counts struct {
	Succeeded  int `json:"succeeded"`
	Failed     int `json:"failed"`
	Uncertain  int `json:"uncertain"`
	Blocked    int `json:"blocked"`
	WouldBlock int `json:"would_block"`
}

// StepView is one step of a run: its intent and outcome folded together.
type StepView struct {
	Seq              int64     `json:"seq" jsonschema:"the step number (the intent record's seq)"`
	Tool             string    `json:"tool"`
	Reason           string    `json:"reason"`
	Decision         string    `json:"decision" jsonschema:"allow, block, needs_approval or would_block"`
	Mode             string    `json:"mode,omitempty"`
	Status           string    `json:"status" jsonschema:"the outcome; empty while the call has none"`
	Note             string    `json:"note,omitempty"`
	CompensationTool string    `json:"compensation_tool,omitempty"`
	Time             time.Time `json:"time" jsonschema:"when the intent was journaled"`
	Finished         time.Time `json:"finished,omitzero" jsonschema:"when the outcome was journaled"`
}

// RecordView is one ledger record in full. The call's arguments are never stored: only their
// digest and the values the manifest's argument_map names (handle).
type RecordView struct {
	Run              string         `json:"run"`
	Seq              int64          `json:"seq"`
	Kind             string         `json:"kind" jsonschema:"intent, outcome, reloaded, reload_failed or note"`
	Time             time.Time      `json:"time"`
	Step             int64          `json:"step,omitempty"`
	Tool             string         `json:"tool,omitempty"`
	ArgsDigest       string         `json:"args_digest,omitempty"`
	Reason           string         `json:"reason,omitempty"`
	IdempotencyKey   string         `json:"idempotency_key,omitempty"`
	ManifestVersion  string         `json:"manifest_version,omitempty"`
	ManifestChecksum string         `json:"manifest_checksum,omitempty"`
	Mode             string         `json:"mode,omitempty"`
	Decision         string         `json:"decision,omitempty"`
	Status           string         `json:"status,omitempty"`
	CompensationTool string         `json:"compensation_tool,omitempty"`
	Handle           map[string]any `json:"handle,omitempty" jsonschema:"the compensation arguments journaled with the outcome"`
	Note             string         `json:"note,omitempty"`
}

func recordView(r store.Record) RecordView {
	return RecordView{Run: r.Run, Seq: r.Seq, Kind: string(r.Kind), Time: r.Time, Step: r.Step, Tool: r.Tool,
		ArgsDigest: r.ArgsDigest, Reason: r.Reason, IdempotencyKey: r.IdempotencyKey, ManifestVersion: r.ManifestVersion,
		ManifestChecksum: r.ManifestChecksum, Mode: r.Mode, Decision: r.Decision, Status: string(r.Status),
		CompensationTool: r.CompensationTool, Handle: r.Handle, Note: r.Note}
}

// Inputs and outputs of the tools.
type (
	ListRunsIn struct {
		Limit int `json:"limit,omitempty" jsonschema:"how many runs, newest first (default 50, at most 200)"`
	}
	ListRunsOut struct {
		Runs []RunSummary `json:"runs"`
	}
	GetRunIn struct {
		Run string `json:"run" jsonschema:"the run id"`
	}
	GetRunOut struct {
		Run   RunSummary `json:"run"`
		Steps []StepView `json:"steps"`
	}
	TraceIn struct {
		Run  string `json:"run" jsonschema:"the run id"`
		Step int64  `json:"step" jsonschema:"the step number (seq of its intent)"`
	}
	TraceOut struct {
		Run     string       `json:"run"`
		Step    int64        `json:"step"`
		Records []RecordView `json:"records" jsonschema:"the step's intent, then its outcome"`
	}
	RunIn struct {
		Run string `json:"run" jsonschema:"the run id"`
	}
	ValidateIn struct {
		Manifest map[string]any `json:"manifest" jsonschema:"one manifest object (the seed's fields, snake_case)"`
	}
	FieldProblem struct {
		Path    string `json:"path" jsonschema:"the field path inside the manifest; empty for the whole manifest"`
		Message string `json:"message"`
	}
	ValidateOut struct {
		Valid  bool           `json:"valid"`
		Errors []FieldProblem `json:"errors"`
		// Normalised and Checksum are given for a valid manifest: every default stated.
		Normalised map[string]any `json:"normalised,omitempty"`
		Checksum   string         `json:"checksum,omitempty"`
	}
	PreviewIn struct {
		Tool      string         `json:"tool" jsonschema:"the tool's exposed name"`
		Arguments map[string]any `json:"arguments,omitempty" jsonschema:"the call's arguments (default {})"`
	}
	ApprovalView struct {
		Required   bool     `json:"required"`
		Roles      []string `json:"roles,omitempty" jsonschema:"an approver must hold one of these"`
		Quorum     int      `json:"quorum,omitempty" jsonschema:"distinct approvers needed"`
		TimeoutMs  int64    `json:"timeout_ms,omitempty"`
		OnTimeout  string   `json:"on_timeout,omitempty"`
		EscalateTo []string `json:"escalate_to,omitempty"`
		// Request is the existing request this call would wait for or use, if any.
		Request string `json:"request,omitempty"`
	}
	RiskView struct {
		DataClass   string `json:"data_class,omitempty"`
		BlastRadius string `json:"blast_radius,omitempty"`
		Environment string `json:"environment,omitempty"`
	}
	PreviewOut struct {
		Tool string `json:"tool"`
		// Decision is allow, needs_approval or block; in advise and observe a broken rule is
		// allow with would_block true.
		Decision     string           `json:"decision" jsonschema:"allow, needs_approval or block"`
		WouldBlock   bool             `json:"would_block" jsonschema:"advise/observe: the call runs but is journaled would_block"`
		Mode         string           `json:"mode"`
		Reason       string           `json:"reason,omitempty"`
		Violations   []string         `json:"violations,omitempty"`
		Notes        []string         `json:"notes,omitempty"`
		Unclassified bool             `json:"unclassified" jsonschema:"the tool has no manifest"`
		Effect       string           `json:"effect,omitempty"`
		Permission   string           `json:"permission,omitempty"`
		Risk         *RiskView        `json:"risk,omitempty"`
		Approval     ApprovalView     `json:"approval"`
		Rollback     rollback.Outlook `json:"rollback"`
		Run          string           `json:"run,omitempty" jsonschema:"the session's run the call was previewed in; empty for a run not opened yet"`
		// Policy lists the policy rules that fired, in evaluation order.
		Policy []PolicyRuleView `json:"policy,omitempty" jsonschema:"the policy rules that fired for the call"`
	}
	PolicyRuleView struct {
		Rule   string `json:"rule" jsonschema:"<policy>/<rule>"`
		Effect string `json:"effect" jsonschema:"deny, require_approval, advise or limit"`
		Reason string `json:"reason,omitempty"`
		Error  string `json:"error,omitempty" jsonschema:"why the condition could not be evaluated (the rule then applies)"`
	}
	SearchIn struct {
		What   string `json:"what" jsonschema:"runs or records"`
		Tool   string `json:"tool,omitempty" jsonschema:"exact tool name"`
		Status string `json:"status,omitempty" jsonschema:"an outcome (succeeded, failed, uncertain, blocked, would_block), or for runs also a run status (active, idle, closed)"`
		Text   string `json:"text,omitempty" jsonschema:"case-insensitive text in the run id, tool, reason, note or compensation tool"`
		Limit  int    `json:"limit,omitempty" jsonschema:"at most this many, newest first (default 50, at most 200)"`
	}
	SearchOut struct {
		What    string       `json:"what"`
		Runs    []RunSummary `json:"runs,omitempty"`
		Records []RecordView `json:"records,omitempty"`
	}
)

// schemaFor is T's inferred input schema, edited (bounds, enums, defaults).
func schemaFor[T any](edit func(props map[string]*jsonschema.Schema)) *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("schema of %T: %v", *new(T), err)) // fixed types: a programming error
	}
	if edit != nil {
		edit(s.Properties)
	}
	return s
}

func limitSchema(p *jsonschema.Schema) {
	lo, hi := 1.0, float64(MaxLimit)
	p.Minimum, p.Maximum = &lo, &hi
	p.Default = json.RawMessage(fmt.Sprint(DefaultLimit))
}

func nonEmpty(props map[string]*jsonschema.Schema, names ...string) {
	one := 1
	for _, n := range names {
		props[n].MinLength = &one
	}
}

// addAgentTools registers the agent tools on s (the agent server, or the operator one).
func (g *Gateway) addAgentTools(s *mcp.Server) {
	ro := &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true}
	open := false
	ro.OpenWorldHint = &open
	runSchema := func() *jsonschema.Schema {
		return schemaFor[RunIn](func(p map[string]*jsonschema.Schema) { nonEmpty(p, "run") })
	}
	addTool(s, &mcp.Tool{Name: ToolListRuns, Annotations: ro,
		Description: "Read your runs: id, start, last activity, status and steps per outcome, newest first.",
		InputSchema: schemaFor[ListRunsIn](func(p map[string]*jsonschema.Schema) { limitSchema(p["limit"]) })}, g.listRuns)
	addTool(s, &mcp.Tool{Name: ToolGetRun, Annotations: ro,
		Description: "Read one of your runs with its steps (intent and outcome of each call).",
		InputSchema: schemaFor[GetRunIn](func(p map[string]*jsonschema.Schema) { nonEmpty(p, "run") })}, g.getRun)
	addTool(s, &mcp.Tool{Name: ToolGetActionTrace, Annotations: ro,
		Description: "Read the ledger records of one step of your run in full (arguments are never stored, only their digest).",
		InputSchema: schemaFor[TraceIn](func(p map[string]*jsonschema.Schema) {
			nonEmpty(p, "run")
			one := 1.0
			p["step"].Minimum = &one
		})}, g.getActionTrace)
	addTool(s, &mcp.Tool{Name: ToolPlanRollback, Annotations: ro,
		Description: "What a rollback of your run would do, step by step, newest first. Executes nothing.",
		InputSchema: runSchema()}, g.planRollback)
	addTool(s, &mcp.Tool{Name: ToolDryRunRollback, Annotations: ro,
		Description: "The rollback plan of your run, with each compensation checked against the upstream (tool exposed, arguments valid). Executes nothing.",
		InputSchema: runSchema()}, g.dryRunRollback)
	addTool(s, &mcp.Tool{Name: ToolValidateManifest, Annotations: ro,
		Description: "Validate a manifest object: {valid, errors: [{path, message}]}.",
		InputSchema: schemaFor[ValidateIn](nil)}, g.validateManifest)
	addTool(s, &mcp.Tool{Name: ToolPreviewImpact, Annotations: ro,
		Description: "{tool, arguments?}: would this call be allowed, need approval or be blocked, with risk, approvers and rollback outlook. Executes nothing.",
		InputSchema: schemaFor[PreviewIn](func(p map[string]*jsonschema.Schema) { nonEmpty(p, "tool") })}, g.previewImpact)
	addTool(s, &mcp.Tool{Name: ToolSearch, Annotations: ro,
		Description: `Find your runs, or ledger records (what: "records"), by tool, status, text. limit up to 200.`,
		InputSchema: schemaFor[SearchIn](func(p map[string]*jsonschema.Schema) {
			p["what"].Enum = []any{"runs", "records"}
			var st []any
			for _, s := range store.Statuses {
				st = append(st, string(s))
			}
			p["status"].Enum = append(st, string(store.RunActive), string(store.RunIdle), string(store.RunClosed))
			limitSchema(p["limit"])
		})}, g.search)
}

// errNotFound is the answer for a run that does not exist or is another principal's.
func errNotFound(run string) error {
	return fmt.Errorf("run %q not found: reversi.list_runs lists your runs", run)
}

// ledgerErr wraps a store error for the agent.
func ledgerErr(err error) error {
	return fmt.Errorf("the ledger could not be read: %w; try again, or ask the gateway's operator", err)
}

// ownRun returns run id if it belongs to the principal of req; otherwise "not found", the
// same text and the same gateway journal note for a run that does not exist and for another
// principal's, so that neither tells whether the run exists.
func (g *Gateway) ownRun(ctx context.Context, req *mcp.CallToolRequest, id string) (store.Run, error) {
	r, err := g.store.GetRun(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !g.mayRead(req, r.Actor)) {
		err := errNotFound(id)
		g.journalRefusal(ctx, g.principal(req), req.Params.Name, err.Error())
		return store.Run{}, err
	}
	if err != nil {
		return store.Run{}, ledgerErr(err)
	}
	return r, nil
}

func limitOf(n int) (int, error) {
	switch {
	case n == 0:
		return DefaultLimit, nil
	case n < 0 || n > MaxLimit:
		return 0, fmt.Errorf("limit %d is out of range: give 1 to %d", n, MaxLimit)
	}
	return n, nil
}

// summaries adds the counts per outcome to runs.
func (g *Gateway) summaries(ctx context.Context, runs []store.Run) ([]RunSummary, error) {
	ids := make([]string, len(runs))
	for i, r := range runs {
		ids[i] = r.ID
	}
	counts, err := g.store.CountOutcomes(ctx, ids)
	if err != nil {
		return nil, ledgerErr(err)
	}
	out := make([]RunSummary, 0, len(runs))
	for _, r := range runs {
		c := counts[r.ID]
		out = append(out, RunSummary{ID: r.ID, Started: r.Started, LastActivity: r.LastActivity, Status: string(r.Status), Environment: r.Environment,
			Counts: Counts{Succeeded: c[store.Succeeded], Failed: c[store.Failed], Uncertain: c[store.Uncertain],
				Blocked: c[store.Blocked], WouldBlock: c[store.WouldBlock]}})
	}
	return out, nil
}

func (g *Gateway) listRuns(ctx context.Context, req *mcp.CallToolRequest, in ListRunsIn) (*mcp.CallToolResult, ListRunsOut, error) {
	limit, err := limitOf(in.Limit)
	if err != nil {
		return nil, ListRunsOut{}, err
	}
	runs, err := g.store.ListRuns(ctx, store.RunFilter{Actor: g.readScope(req), Limit: limit})
	if err != nil {
		return nil, ListRunsOut{}, ledgerErr(err)
	}
	sums, err := g.summaries(ctx, runs)
	return nil, ListRunsOut{Runs: sums}, err
}

func (g *Gateway) getRun(ctx context.Context, req *mcp.CallToolRequest, in GetRunIn) (*mcp.CallToolResult, GetRunOut, error) {
	r, err := g.ownRun(ctx, req, in.Run)
	if err != nil {
		return nil, GetRunOut{}, err
	}
	sums, err := g.summaries(ctx, []store.Run{r})
	if err != nil {
		return nil, GetRunOut{}, err
	}
	recs, err := g.store.Records(ctx, r.ID, 0, 0)
	if err != nil {
		return nil, GetRunOut{}, ledgerErr(err)
	}
	out := GetRunOut{Run: sums[0], Steps: []StepView{}}
	for _, s := range rollback.Steps(recs) {
		v := StepView{Seq: s.Intent.Seq, Tool: s.Intent.Tool, Reason: s.Intent.Reason, Decision: s.Intent.Decision,
			Mode: s.Intent.Mode, Time: s.Intent.Time}
		if o := s.Outcome; o != nil {
			v.Status, v.Note, v.CompensationTool, v.Finished = string(o.Status), o.Note, o.CompensationTool, o.Time
		}
		out.Steps = append(out.Steps, v)
	}
	return nil, out, nil
}

func (g *Gateway) getActionTrace(ctx context.Context, req *mcp.CallToolRequest, in TraceIn) (*mcp.CallToolResult, TraceOut, error) {
	r, err := g.ownRun(ctx, req, in.Run)
	if err != nil {
		return nil, TraceOut{}, err
	}
	recs, err := g.store.Records(ctx, r.ID, in.Step-1, 0)
	if err != nil {
		return nil, TraceOut{}, ledgerErr(err)
	}
	if len(recs) == 0 || recs[0].Seq != in.Step || recs[0].Kind != store.KindIntent {
		return nil, TraceOut{}, fmt.Errorf("run %s has no step %d: reversi.get_run lists its steps", r.ID, in.Step)
	}
	out := TraceOut{Run: r.ID, Step: in.Step, Records: []RecordView{recordView(recs[0])}}
	for _, rec := range recs[1:] {
		if rec.Kind == store.KindOutcome && rec.Step == in.Step {
			out.Records = append(out.Records, recordView(rec))
			break
		}
	}
	return nil, out, nil
}

func (g *Gateway) plan(ctx context.Context, req *mcp.CallToolRequest, run string) (rollback.Plan, error) {
	r, err := g.ownRun(ctx, req, run)
	if err != nil {
		return rollback.Plan{}, err
	}
	p, err := rollback.Build(ctx, g.store, g.engine.Load(), r.ID)
	if err != nil {
		return rollback.Plan{}, ledgerErr(err)
	}
	return p, nil
}

func (g *Gateway) planRollback(ctx context.Context, req *mcp.CallToolRequest, in RunIn) (*mcp.CallToolResult, rollback.Plan, error) {
	p, err := g.plan(ctx, req, in.Run)
	return nil, p, err
}

func (g *Gateway) dryRunRollback(ctx context.Context, req *mcp.CallToolRequest, in RunIn) (*mcp.CallToolResult, rollback.Plan, error) {
	p, err := g.plan(ctx, req, in.Run)
	if err != nil {
		return nil, p, err
	}
	return nil, rollback.DryRun(p, g.engine.Load()), nil
}

func (g *Gateway) validateManifest(_ context.Context, req *mcp.CallToolRequest, _ ValidateIn) (*mcp.CallToolResult, ValidateOut, error) {
	// Decode the raw arguments again with UseNumber: integers above 2^53 stay exact.
	var args struct {
		Manifest any `json:"manifest"`
	}
	dec := json.NewDecoder(bytes.NewReader(req.Params.Arguments))
	dec.UseNumber()
	if err := dec.Decode(&args); err != nil {
		return nil, ValidateOut{}, fmt.Errorf("the arguments are not JSON: %w", err)
	}
	m, errs := manifest.Validate(args.Manifest)
	out := ValidateOut{Valid: len(errs) == 0, Errors: []FieldProblem{}}
	for _, e := range errs {
		var fe *manifest.FieldError
		if errors.As(e, &fe) {
			out.Errors = append(out.Errors, FieldProblem{Path: fe.Path, Message: fe.Message})
		} else {
			out.Errors = append(out.Errors, FieldProblem{Message: e.Error()})
		}
	}
	if m != nil {
		b, err := json.Marshal(m)
		if err == nil {
			_ = json.Unmarshal(b, &out.Normalised)
		}
		out.Checksum = g.checksum(m)
	}
	return nil, out, nil
}

// previewRun names the run of a session that has not opened one yet: no run, approval or key
// can belong to it, so the preview sees a fresh run.
const previewRun = "(a run not opened yet)"

// peekRun returns the session's run without opening one: the run it already has, or the run
// it would continue (--run-id, Reversi-Run-Id) when that exists and is the principal's.
func (g *Gateway) peekRun(ctx context.Context, req *mcp.CallToolRequest) string {
	g.mu.Lock()
	id, ok := g.runs[req.Session]
	g.mu.Unlock()
	if ok {
		return id
	}
	id = g.runID
	if req.Extra != nil && req.Extra.Header != nil {
		if h := req.Extra.Header.Get(RunIDHeader); h != "" {
			id = h
		}
	}
	if id == "" {
		return ""
	}
	if r, err := g.store.GetRun(ctx, id); err == nil && r.Actor == g.principal(req) {
		return id
	}
	return ""
}

func (g *Gateway) previewImpact(ctx context.Context, req *mcp.CallToolRequest, in PreviewIn) (*mcp.CallToolResult, PreviewOut, error) {
	if isAgentTool(in.Tool) {
		return nil, PreviewOut{}, fmt.Errorf("%s is one of the gateway's own read tools, which change nothing and are always allowed; preview_impact previews upstream tools", in.Tool)
	}
	e := g.engine.Load()
	if !e.Exposed(in.Tool) {
		return nil, PreviewOut{}, fmt.Errorf("unknown tool %q: no upstream exposes it; tools/list shows the tools", in.Tool)
	}
	// The arguments as the call path reads them (plain json.Unmarshal), so that the digest
	// matches the real call's and an approval for it is found.
	var raw struct {
		Arguments map[string]any `json:"arguments"`
	}
	if err := json.Unmarshal(req.Params.Arguments, &raw); err != nil {
		return nil, PreviewOut{}, fmt.Errorf("the arguments are not JSON: %w", err)
	}
	var sent struct {
		Arguments json.RawMessage `json:"arguments"`
	}
	if json.Unmarshal(req.Params.Arguments, &sent) == nil {
		if err := engine.CheckDuplicateKeys(sent.Arguments); err != nil { // as the call path refuses it
			return nil, PreviewOut{Tool: in.Tool, Decision: string(engine.Block), Mode: string(e.Mode()), Reason: err.Error()}, nil
		}
	}
	run := g.peekRun(ctx, req)
	callRun := run
	if callRun == "" {
		callRun = previewRun
	}
	d := e.Preview(ctx, engine.Call{Run: callRun, Actor: g.principal(req), Tool: in.Tool, Args: raw.Arguments, Permissions: scopeOf(req, e)})
	out := PreviewOut{Tool: in.Tool, Decision: string(d.Action), WouldBlock: d.WouldBlock, Mode: string(d.Mode),
		Reason: d.Reason, Violations: d.Violations, Notes: d.Notes, Unclassified: d.Unclassified, Run: run,
		Approval: ApprovalView{Required: d.ApprovalRequired, Request: d.ApprovalID}}
	if d.Shadow {
		out.Run = run + engine.ShadowRunSuffix
	}
	m := d.Manifest
	if m != nil {
		out.Effect, out.Permission = string(m.Effect), m.Permission
		if r := m.Risk; r != nil {
			out.Risk = &RiskView{DataClass: r.DataClass, BlastRadius: r.BlastRadius, Environment: r.Environment}
		}
		if r := d.Approval; r != nil { // the manifest's, merged with the policy's
			out.Approval.Roles, out.Approval.Quorum, out.Approval.OnTimeout, out.Approval.EscalateTo = r.Roles, r.Quorum, r.OnTimeout, r.EscalateTo
			if r.TimeoutMs != nil {
				out.Approval.TimeoutMs = *r.TimeoutMs
			}
		} else if d.ApprovalRequired {
			out.Approval.Quorum = manifest.DefaultQuorum
		}
		if d.ApprovalRequired && out.Approval.TimeoutMs == 0 {
			out.Approval.TimeoutMs = engine.DefaultApprovalTimeout.Milliseconds()
		}
	}
	for _, f := range d.Policy {
		out.Policy = append(out.Policy, PolicyRuleView{Rule: f.Rule, Effect: string(f.Effect), Reason: f.Reason, Error: f.Error})
	}
	args := raw.Arguments
	if args == nil {
		args = map[string]any{} // as the call path resolves $args
	}
	out.Rollback = rollback.OutlookFor(m, args)
	return nil, out, nil
}

func (g *Gateway) search(ctx context.Context, req *mcp.CallToolRequest, in SearchIn) (*mcp.CallToolResult, SearchOut, error) {
	limit, err := limitOf(in.Limit)
	if err != nil {
		return nil, SearchOut{}, err
	}
	actor := g.readScope(req)
	status := store.Status(in.Status)
	outcome := in.Status == "" || validOutcome(status)
	switch in.What {
	case "runs":
		f := store.RunSearch{Actor: actor, Tool: in.Tool, Text: in.Text, Limit: limit}
		if outcome {
			f.Outcome = status
		} else {
			f.Status = store.RunStatus(in.Status)
		}
		runs, err := g.store.SearchRuns(ctx, f)
		if err != nil {
			return nil, SearchOut{}, ledgerErr(err)
		}
		sums, err := g.summaries(ctx, runs)
		return nil, SearchOut{What: in.What, Runs: sums}, err
	case "records":
		if !outcome {
			return nil, SearchOut{}, fmt.Errorf("status %q is a run status: records have outcomes (succeeded, failed, uncertain, blocked, would_block)", in.Status)
		}
		recs, err := g.store.SearchRecords(ctx, store.RecordSearch{Actor: actor, Tool: in.Tool, Status: status, Text: in.Text, Limit: limit})
		if err != nil {
			return nil, SearchOut{}, ledgerErr(err)
		}
		out := SearchOut{What: in.What}
		for _, r := range recs {
			out.Records = append(out.Records, recordView(r))
		}
		return nil, out, nil
	}
	return nil, SearchOut{}, fmt.Errorf(`what %q: give "runs" or "records"`, in.What)
}

func validOutcome(s store.Status) bool {
	for _, v := range store.Statuses {
		if v == s {
			return true
		}
	}
	return false
}
