package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/auth"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// The operator endpoint's tools (seed "MCP gateway", `reversi.*` tools, the operator table;
// issue 7). They live on their own MCP server, served only at /operator/mcp, so the agent
// endpoint does not know them ("calling one by name fails with unknown tool"). Each needs a
// role; a principal sees (tools/list) and may call only the tools its role reaches.

// Names of the operator tools.
const (
	ToolClassification = "reversi.classification"
	ToolListApprovals  = "reversi.list_approvals"
	ToolExportEvidence = "reversi.export_evidence"
	ToolApproveAction  = "reversi.approve_action"
	ToolDenyAction     = "reversi.deny_action"
	ToolHalt           = "reversi.halt"
	ToolResume         = "reversi.resume"
	ToolReload         = "reversi.reload"
)

// OperatorRoles is the role each operator-endpoint tool needs (the agent read tools need
// auditor there). Source: the seed's operator table.
var OperatorRoles = map[string]auth.Role{
	ToolListRuns: auth.Auditor, ToolGetRun: auth.Auditor, ToolGetActionTrace: auth.Auditor,
	ToolPlanRollback: auth.Auditor, ToolDryRunRollback: auth.Auditor, ToolValidateManifest: auth.Auditor,
	ToolPreviewImpact: auth.Auditor, ToolSearch: auth.Auditor,
	ToolClassification: auth.Auditor, ToolListApprovals: auth.Auditor, ToolExportEvidence: auth.Auditor,
	ToolApproveAction: auth.Approver, ToolDenyAction: auth.Approver,
	ToolHalt: auth.Admin, ToolResume: auth.Admin, ToolReload: auth.Admin,
	ToolSuggestManifest: auth.Auditor, ToolExecuteRollback: auth.Operator,
}

// EvidenceSigningPrefix is prepended to an evidence payload's digest to form the message its
// Ed25519 signature covers: "reversi-evidence-v1\n" + "sha256:<hex of payload>".
const EvidenceSigningPrefix = "reversi-evidence-v1\n"

// Operator tool inputs and outputs.
type (
	ToolClassView struct {
		Tool   string `json:"tool"`
		Class  string `json:"class" jsonschema:"OK, NOTE, WARN or BLOCK"`
		Detail string `json:"detail"`
		Effect string `json:"effect,omitempty"`
		Status string `json:"status,omitempty"`
	}
	ClassificationOut struct {
		Mode                string          `json:"mode"`
		Tools               []ToolClassView `json:"tools"`
		Classified          int             `json:"classified"`
		UnclassifiedReads   int             `json:"unclassified_reads"`
		UnclassifiedChanges int             `json:"unclassified_changes"`
		Destructive         int             `json:"destructive"`
		Banner              string          `json:"banner" jsonschema:"the banner text the gateway printed at start, for the tools now served"`
	}
	ListApprovalsIn struct {
		Run   string `json:"run,omitempty" jsonschema:"only this run's requests"`
		State string `json:"state,omitempty" jsonschema:"pending, approved, denied or expired"`
		Limit int    `json:"limit,omitempty" jsonschema:"at most this many, oldest first (default 50, at most 200)"`
	}
	DecisionView struct {
		By       string    `json:"by"`
		Roles    []string  `json:"roles"`
		Decision string    `json:"decision" jsonschema:"approve or deny"`
		Comment  string    `json:"comment,omitempty"`
		At       time.Time `json:"at"`
	}
	ApprovalOut struct {
		ID         string         `json:"id"`
		Tool       string         `json:"tool"`
		Run        string         `json:"run"`
		Actor      string         `json:"actor"`
		State      string         `json:"state" jsonschema:"pending, approved, denied or expired"`
		Reason     string         `json:"reason,omitempty"`
		Roles      []string       `json:"roles" jsonschema:"an approver must hold one of these; empty: anyone but the actor"`
		Quorum     int            `json:"quorum"`
		Approvals  int            `json:"approvals" jsonschema:"distinct principals that approved"`
		Decisions  []DecisionView `json:"decisions"`
		Created    time.Time      `json:"created"`
		Expires    time.Time      `json:"expires"`
		OnTimeout  string         `json:"on_timeout,omitempty"`
		EscalateTo []string       `json:"escalate_to,omitempty"`
		Escalated  bool           `json:"escalated"`
		Decided    time.Time      `json:"decided,omitzero"`
		Consumed   time.Time      `json:"consumed,omitzero" jsonschema:"when the approved retry went through"`
	}
	ListApprovalsOut struct {
		Approvals []ApprovalOut `json:"approvals"`
	}
	ExportEvidenceIn struct {
		Run string `json:"run,omitempty" jsonschema:"one run; empty: every run and the gateway's own journal"`
	}
	// ExportEvidenceOut carries the evidence as Payload, the exact JSON bytes that are
	// digested and signed, so a verifier checks the bytes it received (no re-encoding).
	ExportEvidenceOut struct {
		Payload   string `json:"payload" jsonschema:"JSON: {gateway, exported_at, exported_by, run?, records}"`
		Digest    string `json:"digest" jsonschema:"sha256:<hex> of payload"`
		Records   int    `json:"records"`
		Signed    bool   `json:"signed"`
		Algorithm string `json:"algorithm,omitempty" jsonschema:"Ed25519"`
		KeyID     string `json:"key_id,omitempty" jsonschema:"the signing key's id (reversi keygen)"`
		Signature string `json:"signature,omitempty" jsonschema:"base64 Ed25519 signature of \"reversi-evidence-v1\\n\" + digest"`
	}
	EvidencePayload struct {
		Gateway    string       `json:"gateway"`
		ExportedAt time.Time    `json:"exported_at"`
		ExportedBy string       `json:"exported_by"`
		Run        string       `json:"run,omitempty"`
		Records    []RecordView `json:"records"`
	}
	DecideIn struct {
		ID      string `json:"id" jsonschema:"the approval request id (apr-...)"`
		Comment string `json:"comment,omitempty" jsonschema:"why; kept with the decision"`
	}
	HaltIn struct {
		Reason string `json:"reason" jsonschema:"why the gateway is halted; agents see it on every blocked call"`
	}
	HaltOut struct {
		Halted bool      `json:"halted"`
		By     string    `json:"by,omitempty"`
		Reason string    `json:"reason,omitempty"`
		Since  time.Time `json:"since,omitzero"`
	}
	Empty     struct{}
	ReloadOut struct {
		Changed          bool   `json:"changed"`
		Tools            int    `json:"tools" jsonschema:"manifests now served"`
		PolicyChecksum   string `json:"policy_checksum" jsonschema:"checksum of the policy set served (empty without a policy)"`
		ManifestChecksum string `json:"manifest_checksum" jsonschema:"sha256:<hex> digest of the manifests served"`
		Error            string `json:"error,omitempty" jsonschema:"why the reload was refused; the previous manifests keep serving"`
	}
)

// haltState is the kill switch (seed: `reversi.halt`, `reversi.resume`). It is in memory: a
// restarted gateway starts serving.
type haltState struct {
	mu     sync.Mutex
	on     bool
	by     string
	reason string
	since  time.Time
}

func (h *haltState) get() HaltOut {
	h.mu.Lock()
	defer h.mu.Unlock()
	return HaltOut{Halted: h.on, By: h.by, Reason: h.reason, Since: h.since}
}

// haltedText is the reason every upstream call is blocked while halted; ok false when not.
func (g *Gateway) haltedText() (string, bool) {
	s := g.sec.halt.get()
	if !s.Halted {
		return "", false
	}
	return fmt.Sprintf("the gateway is halted (kill switch) by %s since %s: %s; no upstream call runs until an admin calls reversi.resume",
		s.By, s.Since.Format(time.RFC3339), s.Reason), true
}

// addOperatorServer builds the operator endpoint's MCP server: the agent read tools (any run)
// and the operator tools, each filtered by role.
func (g *Gateway) addOperatorServer(pageSize int) {
	s := mcp.NewServer(&mcp.Implementation{Name: Name + "-operator", Version: Version}, &mcp.ServerOptions{PageSize: pageSize})
	g.addAgentTools(s)
	ro := &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true}
	closed := false
	ro.OpenWorldHint = &closed
	change := &mcp.ToolAnnotations{OpenWorldHint: &closed}
	addTool(s, &mcp.Tool{Name: ToolClassification, Annotations: ro,
		Description: "Every upstream tool, classified against the manifests (OK, NOTE, WARN, BLOCK), plus the banner text."}, g.classification)
	addTool(s, &mcp.Tool{Name: ToolListApprovals, Annotations: ro,
		Description: "Read approval requests (any run), oldest first, with their decisions.",
		InputSchema: schemaFor[ListApprovalsIn](func(p map[string]*jsonschema.Schema) {
			p["state"].Enum = []any{"pending", "approved", "denied", "expired"}
			limitSchema(p["limit"])
		})}, g.listApprovals)
	addTool(s, &mcp.Tool{Name: ToolExportEvidence, Annotations: ro,
		Description: "Ledger records as JSON evidence, signed with the gateway's --signing-key (Ed25519) when it has one."}, g.exportEvidence)
	decide := schemaFor[DecideIn](func(p map[string]*jsonschema.Schema) { nonEmpty(p, "id") })
	addTool(s, &mcp.Tool{Name: ToolApproveAction, Annotations: change, InputSchema: decide,
		Description: "Approve an approval request as yourself; the agent's retry of the same call then passes once the quorum is met."},
		g.decider(true))
	addTool(s, &mcp.Tool{Name: ToolDenyAction, Annotations: change, InputSchema: decide,
		Description: "Deny an approval request as yourself: one deny denies it."}, g.decider(false))
	addTool(s, &mcp.Tool{Name: ToolHalt, Annotations: change,
		Description: "Kill switch: block every upstream call (journaled as blocked, with your reason) until reversi.resume.",
		InputSchema: schemaFor[HaltIn](func(p map[string]*jsonschema.Schema) { nonEmpty(p, "reason") })}, g.haltTool)
	addTool(s, &mcp.Tool{Name: ToolResume, Annotations: change,
		Description: "Lift the kill switch: upstream calls are decided as usual again."}, g.resumeTool)
	addTool(s, &mcp.Tool{Name: ToolReload, Annotations: change,
		Description: "Re-read manifests and policy now. Returns {changed, tools, policy_checksum, error?}."}, g.reloadTool)
	g.addSuggestAndRollbackTools(s)
	s.AddReceivingMiddleware(g.callMiddleware, g.roleMiddleware, discoverMiddleware)
	g.sec.opServer = s
}

// roleMiddleware limits the operator endpoint by role: tools/list shows only the tools the
// principal's role reaches, and a call to another is refused naming the role it needs.
func (g *Gateway) roleMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		var id *auth.Identity
		if ex := req.GetExtra(); ex != nil {
			id = auth.FromTokenInfo(ex.TokenInfo)
		}
		reaches := func(tool string) bool {
			need, ok := OperatorRoles[tool]
			return ok && id != nil && id.Role.AtLeast(need)
		}
		switch method {
		case "tools/call":
			cr, ok := req.(*mcp.CallToolRequest)
			if !ok || reaches(cr.Params.Name) {
				break
			}
			need, known := OperatorRoles[cr.Params.Name]
			if !known {
				break // the server answers unknown tool
			}
			role := "no role"
			if id != nil {
				role = "the " + string(id.Role) + " role"
			}
			return textResult(fmt.Sprintf("%s needs the %s role or higher; %s has %s", cr.Params.Name, need, principalOf(id), role)), nil
		case "tools/list":
			res, err := next(ctx, method, req)
			lr, ok := res.(*mcp.ListToolsResult)
			if err != nil || !ok {
				return res, err
			}
			out := *lr
			out.Tools = nil
			for _, t := range lr.Tools {
				if reaches(t.Name) {
					out.Tools = append(out.Tools, t)
				}
			}
			if out.Tools == nil {
				out.Tools = []*mcp.Tool{}
			}
			return &out, nil
		}
		return next(ctx, method, req)
	}
}

func (g *Gateway) classification(context.Context, *mcp.CallToolRequest, Empty) (*mcp.CallToolResult, ClassificationOut, error) {
	e := g.engine.Load()
	c := e.Classify()
	out := ClassificationOut{Mode: string(c.Mode), Tools: []ToolClassView{}, Classified: c.Classified,
		UnclassifiedReads: c.UnclassifiedReads, UnclassifiedChanges: c.UnclassifiedChanges, Destructive: c.Destructive,
		Banner: e.Banner()}
	for _, t := range c.Tools {
		out.Tools = append(out.Tools, ToolClassView{Tool: t.Tool, Class: string(t.Class), Detail: t.Detail,
			Effect: string(t.Effect), Status: string(t.Status)})
	}
	return nil, out, nil
}

func approvalOut(a store.Approval) ApprovalOut {
	o := ApprovalOut{ID: a.ID, Tool: a.Tool, Run: a.Run, Actor: a.Actor, State: string(a.State), Reason: a.Reason,
		Roles: append([]string{}, a.Roles...), Quorum: a.Quorum, Decisions: []DecisionView{}, Created: a.Created,
		Expires: a.Expires, OnTimeout: a.OnTimeout, EscalateTo: a.EscalateTo, Escalated: a.Escalated,
		Decided: a.Decided, Consumed: a.Consumed}
	for _, d := range a.Decisions {
		v := DecisionView{By: d.By, Roles: append([]string{}, d.Roles...), Decision: "deny", Comment: d.Comment, At: d.At}
		if d.Approve {
			v.Decision = "approve"
			o.Approvals++
		}
		o.Decisions = append(o.Decisions, v)
	}
	return o
}

func (g *Gateway) listApprovals(ctx context.Context, _ *mcp.CallToolRequest, in ListApprovalsIn) (*mcp.CallToolResult, ListApprovalsOut, error) {
	limit, err := limitOf(in.Limit)
	if err != nil {
		return nil, ListApprovalsOut{}, err
	}
	as, err := g.store.ListApprovals(ctx, store.ApprovalFilter{Run: in.Run, State: store.ApprovalState(in.State), Limit: limit})
	if err != nil {
		return nil, ListApprovalsOut{}, ledgerErr(err)
	}
	out := ListApprovalsOut{Approvals: []ApprovalOut{}}
	for _, a := range as {
		out.Approvals = append(out.Approvals, approvalOut(a))
	}
	return nil, out, nil
}

func (g *Gateway) exportEvidence(ctx context.Context, req *mcp.CallToolRequest, in ExportEvidenceIn) (*mcp.CallToolResult, ExportEvidenceOut, error) {
	runs := []string{in.Run}
	if in.Run == "" {
		all, err := g.store.ListRuns(ctx, store.RunFilter{})
		if err != nil {
			return nil, ExportEvidenceOut{}, ledgerErr(err)
		}
		runs = []string{store.GatewayJournal}
		for i := len(all) - 1; i >= 0; i-- { // oldest first
			runs = append(runs, all[i].ID)
		}
	} else if _, err := g.store.GetRun(ctx, in.Run); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, ExportEvidenceOut{}, fmt.Errorf("run %q not found: reversi.list_runs lists the runs", in.Run)
		}
		return nil, ExportEvidenceOut{}, ledgerErr(err)
	}
	p := EvidencePayload{Gateway: g.name, ExportedAt: time.Now().UTC(), ExportedBy: g.principal(req), Run: in.Run, Records: []RecordView{}}
	for _, run := range runs {
		recs, err := g.store.Records(ctx, run, 0, 0)
		if err != nil {
			return nil, ExportEvidenceOut{}, ledgerErr(err)
		}
		for _, r := range recs {
			p.Records = append(p.Records, recordView(r))
		}
	}
	payload, err := json.Marshal(p)
	if err != nil {
		return nil, ExportEvidenceOut{}, err
	}
	sum := sha256.Sum256(payload)
	out := ExportEvidenceOut{Payload: string(payload), Digest: "sha256:" + hex.EncodeToString(sum[:]), Records: len(p.Records)}
	if s := g.sec.signer; s != nil {
		sig, err := s.Sign([]byte(EvidenceSigningPrefix + out.Digest))
		if err != nil {
			return nil, ExportEvidenceOut{}, fmt.Errorf("the evidence could not be signed: %w", err)
		}
		out.Signed, out.Algorithm, out.KeyID, out.Signature = true, "Ed25519", s.KeyID, base64.StdEncoding.EncodeToString(sig)
	}
	return nil, out, nil
}

// decider is approve_action (approve true) or deny_action: store.Decide as the authenticated
// principal, with its role and groups as the roles held.
func (g *Gateway) decider(approve bool) mcp.ToolHandlerFor[DecideIn, ApprovalOut] {
	verb := "deny"
	if approve {
		verb = "approve"
	}
	return func(ctx context.Context, req *mcp.CallToolRequest, in DecideIn) (*mcp.CallToolResult, ApprovalOut, error) {
		id := identity(req)
		if id == nil {
			return nil, ApprovalOut{}, errors.New("only an authenticated principal can decide")
		}
		a, err := g.store.Decide(ctx, in.ID, store.Decision{By: id.Principal, UID: id.UID, Email: id.Email, Roles: id.ApproverRoles(), Approve: approve, Comment: in.Comment})
		if err != nil {
			return nil, ApprovalOut{}, g.decideErr(ctx, verb, in.ID, id, err)
		}
		return nil, approvalOut(a), nil
	}
}

// decideErr says why a decision was refused and what to do.
func (g *Gateway) decideErr(ctx context.Context, verb, id string, who *auth.Identity, err error) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("cannot %s %s: no such approval request; reversi.list_approvals lists them", verb, id)
	case errors.Is(err, store.ErrNotPending):
		a, gerr := g.store.GetApproval(ctx, id)
		if gerr == nil {
			return fmt.Errorf("cannot %s %s: it is already %s", verb, id, a.State)
		}
		return fmt.Errorf("cannot %s %s: it is no longer pending", verb, id)
	case errors.Is(err, store.ErrNotAllowed):
		a, gerr := g.store.GetApproval(ctx, id)
		switch {
		case gerr != nil:
		case slices.ContainsFunc(a.Decisions, func(d store.Decision) bool { return d.By == who.Principal }):
			return fmt.Errorf("cannot %s %s: %s has already decided it; the quorum (%d) counts distinct principals, so another approver must decide", verb, id, who.Principal, a.Quorum)
		case a.Actor == who.Principal && verb == "approve":
			return fmt.Errorf("cannot approve %s: %s opened the run that asks for it, and nobody approves their own request", id, who.Principal)
		case len(a.Roles) > 0:
			return fmt.Errorf("cannot %s %s: it needs an approver holding one of the roles %s, and %s holds %s",
				verb, id, strings.Join(a.Roles, ", "), who.Principal, strings.Join(who.ApproverRoles(), ", "))
		}
		return fmt.Errorf("cannot %s %s: %w", verb, id, err)
	}
	return fmt.Errorf("cannot %s %s: %w", verb, id, err)
}

func (g *Gateway) haltTool(ctx context.Context, req *mcp.CallToolRequest, in HaltIn) (*mcp.CallToolResult, HaltOut, error) {
	if strings.TrimSpace(in.Reason) == "" {
		return nil, HaltOut{}, errors.New("give a reason: agents read it on every blocked call")
	}
	h := &g.sec.halt
	who := g.principal(req)
	h.mu.Lock()
	was, prevBy, prev := h.on, h.by, h.reason
	h.on, h.by, h.reason, h.since = true, who, in.Reason, time.Now().UTC()
	since := h.since
	h.mu.Unlock()
	// Journaled with its alert.halted in one transaction (issue 24); the same principal
	// halting again with the same reason changes nothing and announces nothing.
	if !was || prevBy != who || prev != in.Reason {
		note := fmt.Sprintf("halted by %s: %s", who, in.Reason)
		a := g.alert(store.NoticeAlertHalted, store.SeverityCritical, "Halted", fmt.Sprintf("the kill switch is on: %s halted the gateway (%s); "+
			"every upstream call is blocked until an admin calls reversi.resume", who, in.Reason))
		a.Actor, a.Since = who, since
		g.journalAlert(ctx, store.KindNote, note, a)
	}
	g.warn("halted by %s: %s", who, in.Reason)
	return nil, h.get(), nil
}

func (g *Gateway) resumeTool(ctx context.Context, req *mcp.CallToolRequest, _ Empty) (*mcp.CallToolResult, HaltOut, error) {
	h := &g.sec.halt
	who := g.principal(req)
	h.mu.Lock()
	was, by, reason, since := h.on, h.by, h.reason, h.since
	h.on, h.by, h.reason, h.since = false, "", "", time.Time{}
	h.mu.Unlock()
	if was {
		a := g.alert(store.NoticeAlertResumed, store.SeverityWarning, "Resumed", fmt.Sprintf("the kill switch is off: %s resumed the gateway, "+
			"halted by %s since %s (%s, %s ago); upstream calls run again", who, by, since.Format(time.RFC3339), reason,
			time.Since(since).Round(time.Second)))
		a.Actor, a.Since = who, since
		g.journalAlert(ctx, store.KindNote, "resumed by "+who, a)
		g.warn("resumed by %s", who)
	}
	return nil, h.get(), nil
}

// journalNote appends a note to the gateway's own journal.
func (g *Gateway) journalNote(ctx context.Context, note string) {
	if _, err := g.store.AppendEvent(context.WithoutCancel(ctx), store.Event{Run: store.GatewayJournal, Kind: store.KindNote, Note: note}); err != nil {
		g.warn("journal %q: %v", note, err)
	}
}

func (g *Gateway) reloadTool(ctx context.Context, _ *mcp.CallToolRequest, _ Empty) (*mcp.CallToolResult, ReloadOut, error) {
	r := g.Reload(ctx)
	out := ReloadOut{Changed: r.Changed, Tools: r.Tools, PolicyChecksum: r.PolicyChecksum, ManifestChecksum: r.Checksum}
	if r.Err != nil {
		out.Error = r.Err.Error()
	}
	return nil, out, nil
}

// blockHalted journals and answers an upstream call made while the gateway is halted.
func (g *Gateway) blockHalted(ctx context.Context, run, tool, reason string) (*mcp.CallToolResult, bool) {
	text, halted := g.haltedText()
	if !halted {
		return nil, false
	}
	g.journalBlocked(ctx, store.Intent{Run: run, Tool: tool, Reason: reason, Decision: string(engine.Block), Mode: string(g.mode)}, text)
	return textResult(engine.BlockedPrefix + text), true
}
