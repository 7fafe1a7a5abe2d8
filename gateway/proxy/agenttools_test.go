package proxy

import (
	"context"
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/rollback"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// agentManifests: memoryManifests with create_relations undone by delete_relations (the
// whole relations array passes through, so the compensation matches delete_relations' input
// schema) and delete_entities needing two approvers holding ops.
const agentManifests = memoryManifests + `
- tool: memory.create_relations
  description: Create relations.
  effect: reversible
  permission: memory:write
  compensation:
    tool: memory.delete_relations
    kind: inverse
    argument_map:
      relations: $args.relations
- tool: memory.delete_relations
  description: Delete relations.
  effect: irreversible
  permission: memory:write
`

func loadAgentManifests(t *testing.T) []*manifest.Manifest {
	t.Helper()
	docs, errs := manifest.ReadPaths(writeFile(t, "memory.yaml", agentManifests))
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Fatalf("manifests: %v", errs)
	}
	for _, m := range ms {
		if m.Tool == "memory.delete_entities" {
			m.Risk = &manifest.Risk{BlastRadius: "high", DataClass: "internal"}
			m.Approval = manifest.Approval{Required: true, Rules: &manifest.ApprovalRules{Roles: []string{"ops"}, Quorum: 2, OnTimeout: "deny"}}
		}
	}
	return ms
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := t.TempDir() + "/" + name
	if err := osWriteFile(p, text); err != nil {
		t.Fatal(err)
	}
	return p
}

// agent calls a reversi.* tool and decodes its structuredContent, checking that the text
// block carries the same JSON.
func agent[T any](t *testing.T, cs *mcp.ClientSession, tool string, args any) T {
	t.Helper()
	res := call(t, cs, tool, args)
	if res.IsError {
		t.Fatalf("%s: %v", tool, texts(res))
	}
	var out, fromText T
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s structuredContent: %v\n%s", tool, err, b)
	}
	tx := texts(res)
	if len(tx) != 1 || json.Unmarshal([]byte(tx[0]), &fromText) != nil || !reflect.DeepEqual(out, fromText) {
		t.Fatalf("%s: the text block is not the structured JSON: %q", tool, tx)
	}
	return out
}

// agentErr calls a reversi.* tool that must fail and returns its text.
func agentErr(t *testing.T, cs *mcp.ClientSession, tool string, args any) string {
	t.Helper()
	res := call(t, cs, tool, args)
	if !res.IsError {
		t.Fatalf("%s %v: want an error, got %v", tool, args, texts(res))
	}
	return strings.Join(texts(res), "")
}

// ledgerSize is the number of records and approvals in the store, and the runs.
func ledgerSize(t *testing.T, st store.Store) (records, approvals, runs int) {
	t.Helper()
	ctx := context.Background()
	recs, err := st.SearchRecords(ctx, store.RecordSearch{})
	if err != nil {
		t.Fatal(err)
	}
	aps, err := st.ListApprovals(ctx, store.ApprovalFilter{})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := st.ListRuns(ctx, store.RunFilter{})
	if err != nil {
		t.Fatal(err)
	}
	return len(recs), len(aps), len(rs)
}

func TestAgentTools(t *testing.T) {
	cfg := memoryConfig(t, config.ModeAuto)
	cfg.Allow = []string{"memory.*"} // allow/deny must not hide the gateway's own tools
	f := start(t, cfg, loadAgentManifests(t))
	ctx := context.Background()

	// Another principal's run, with a step, in the same store.
	if _, err := f.store.CreateRun(ctx, store.Run{ID: "run-of-someone-else", Actor: "someone-else", Gateway: Name}); err != nil {
		t.Fatal(err)
	}
	step, _ := f.store.RecordIntent(ctx, store.Intent{Run: "run-of-someone-else", Tool: "memory.create_entities", Reason: "secret work"})
	if _, err := f.store.RecordOutcome(ctx, "run-of-someone-else", step, store.StepOutcome{Status: store.Succeeded}); err != nil {
		t.Fatal(err)
	}

	cs := f.client(t)
	// tools/list: every agent tool, with input and output schemas, read-only.
	listed := map[string]*mcp.Tool{}
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		listed[tool.Name] = tool
	}
	for _, name := range []string{ToolListRuns, ToolGetRun, ToolGetActionTrace, ToolPlanRollback, ToolDryRunRollback,
		ToolValidateManifest, ToolPreviewImpact, ToolSearch} {
		tool := listed[name]
		if tool == nil || tool.InputSchema == nil || tool.OutputSchema == nil || tool.Annotations == nil || !tool.Annotations.ReadOnlyHint {
			t.Errorf("tools/list: %s missing or without schemas/readOnlyHint: %+v", name, tool)
		}
	}
	if listed["memory.open_nodes"] != nil || listed["memory.read_graph"] == nil {
		t.Errorf("allow/deny filtering of upstream tools changed: %v", slices.Sorted(mapsKeys(listed)))
	}

	// preview_impact before the session has a run opens none, journals nothing.
	r0, a0, n0 := ledgerSize(t, f.store)
	p := agent[PreviewOut](t, cs, ToolPreviewImpact, map[string]any{"tool": "memory.create_entities",
		"arguments": map[string]any{"entities": []any{map[string]any{"name": "alice", "entityType": "person", "observations": []any{}}}}})
	if p.Decision != "allow" || p.Run != "" || p.Effect != "compensable" || p.Rollback.Action != manifest.PlanCompensate ||
		p.Rollback.Compensation.Tool != "memory.delete_entities" ||
		!reflect.DeepEqual(p.Rollback.Compensation.Arguments, map[string]any{"name": "alice", "type": "person"}) ||
		!slices.Equal(p.Rollback.FromResult, []string{"$result.entities.0.name"}) {
		t.Errorf("preview create_entities: %+v", p)
	}
	if r, a, n := ledgerSize(t, f.store); r != r0 || a != a0 || n != n0 {
		t.Fatalf("preview changed the store: records %d→%d approvals %d→%d runs %d→%d", r0, r, a0, a, n0, n)
	}

	// Real calls: a read, a reversible and a compensable change, a blocked call, an approved
	// irreversible one.
	if res := call(t, cs, "memory.read_graph", map[string]any{}); res.IsError {
		t.Fatal(texts(res))
	}
	alice := map[string]any{"entities": []any{map[string]any{"name": "alice", "entityType": "person", "observations": []any{"likes tea"}}}}
	if res := call(t, cs, "memory.create_entities", alice); res.IsError {
		t.Fatal(texts(res))
	}
	rel := map[string]any{"relations": []any{map[string]any{"from": "alice", "to": "alice", "relationType": "knows"}}}
	if res := call(t, cs, "memory.create_relations", rel); res.IsError {
		t.Fatal(texts(res))
	}
	if res := call(t, cs, "memory.search_nodes", map[string]any{"query": "alice"}); !res.IsError {
		t.Fatal("search_nodes (no manifest) was not blocked")
	}
	del := map[string]any{"entityNames": []any{"nobody"}}
	if res := call(t, cs, "memory.delete_entities", del); !res.IsError {
		t.Fatal("delete_entities was not held for approval")
	}

	// preview_impact of the held call: the pending request, the approvers; nothing changes.
	r0, a0, n0 = ledgerSize(t, f.store)
	pending, _ := f.store.ListApprovals(ctx, store.ApprovalFilter{State: store.ApprovalPending})
	if len(pending) != 1 {
		t.Fatalf("pending approvals %+v", pending)
	}
	p = agent[PreviewOut](t, cs, ToolPreviewImpact, map[string]any{"tool": "memory.delete_entities", "arguments": del})
	if p.Decision != "needs_approval" || p.Reason != engine.PendingApprovalText("memory.delete_entities", pending[0].ID) ||
		!p.Approval.Required || p.Approval.Request != pending[0].ID || !slices.Equal(p.Approval.Roles, []string{"ops"}) ||
		p.Approval.Quorum != 2 || p.Risk == nil || p.Risk.BlastRadius != "high" || p.Rollback.Action != manifest.PlanNotUndone ||
		p.Effect != "irreversible" || p.Run == "" {
		t.Errorf("preview delete_entities (pending): %+v", p)
	}
	// Other arguments: a new request would be queued, but the preview queues none.
	p = agent[PreviewOut](t, cs, ToolPreviewImpact, map[string]any{"tool": "memory.delete_entities",
		"arguments": map[string]any{"entityNames": []any{"someone"}}})
	if p.Decision != "needs_approval" || p.Reason != engine.PreviewApprovalText("memory.delete_entities") || p.Approval.Request != "" {
		t.Errorf("preview delete_entities (new): %+v", p)
	}
	p = agent[PreviewOut](t, cs, ToolPreviewImpact, map[string]any{"tool": "memory.search_nodes"})
	if p.Decision != "block" || p.Reason != engine.NoManifestText("memory.search_nodes") || !p.Unclassified ||
		p.Rollback.Action != manifest.PlanNotUndone {
		t.Errorf("preview search_nodes: %+v", p)
	}
	p = agent[PreviewOut](t, cs, ToolPreviewImpact, map[string]any{"tool": "memory.open_nodes", "arguments": map[string]any{"names": []any{"x"}}})
	if p.Decision != "block" || !strings.Contains(p.Reason, "allow rules") && !strings.Contains(p.Reason, "deny rule") {
		t.Errorf("preview open_nodes: %+v", p)
	}
	if r, a, n := ledgerSize(t, f.store); r != r0 || a != a0 || n != n0 {
		t.Fatalf("previews changed the store: records %d→%d approvals %d→%d runs %d→%d", r0, r, a0, a, n0, n)
	}
	if text := agentErr(t, cs, ToolPreviewImpact, map[string]any{"tool": "memory.nope"}); !strings.Contains(text, `unknown tool "memory.nope"`) {
		t.Errorf("preview of an unknown tool: %q", text)
	}

	// Approve (two ops) and retry: the irreversible call runs.
	for _, by := range []string{"ops-1", "ops-2"} {
		if _, err := f.store.Decide(ctx, pending[0].ID, store.Decision{By: by, Roles: []string{"ops"}, Approve: true}); err != nil {
			t.Fatal(err)
		}
	}
	if res := call(t, cs, "memory.delete_entities", del); res.IsError {
		t.Fatalf("delete_entities after approval: %v", texts(res))
	}

	// list_runs: only the own run, with counts per outcome.
	lr := agent[ListRunsOut](t, cs, ToolListRuns, map[string]any{})
	if len(lr.Runs) != 1 || lr.Runs[0].ID == "run-of-someone-else" || lr.Runs[0].Status != "active" ||
		lr.Runs[0].Counts != (Counts{Succeeded: 4, Blocked: 2}) || lr.Runs[0].Started.IsZero() {
		t.Fatalf("list_runs: %+v", lr)
	}
	run := lr.Runs[0].ID

	// get_run: the steps in order, intent and outcome folded.
	gr := agent[GetRunOut](t, cs, ToolGetRun, map[string]any{"run": run})
	var summary []string
	for _, s := range gr.Steps {
		summary = append(summary, s.Tool+" "+s.Decision+" "+s.Status)
	}
	want := []string{"memory.read_graph allow succeeded", "memory.create_entities allow succeeded",
		"memory.create_relations allow succeeded", "memory.search_nodes block blocked",
		"memory.delete_entities needs_approval blocked", "memory.delete_entities allow succeeded"}
	if !slices.Equal(summary, want) || gr.Run.ID != run || gr.Steps[1].CompensationTool != "memory.delete_entities" ||
		gr.Steps[1].Reason != "MCP tools/call memory.create_entities" || gr.Steps[3].Note != engine.NoManifestText("memory.search_nodes") ||
		gr.Steps[1].Finished.Before(gr.Steps[1].Time) {
		t.Fatalf("get_run steps:\n%q\n%+v", summary, gr.Steps)
	}

	// get_action_trace: the intent and outcome records of create_entities in full.
	tr := agent[TraceOut](t, cs, ToolGetActionTrace, map[string]any{"run": run, "step": gr.Steps[1].Seq})
	if len(tr.Records) != 2 || tr.Records[0].Kind != "intent" || !strings.HasPrefix(tr.Records[0].ArgsDigest, "sha256:") ||
		tr.Records[0].ManifestChecksum == "" || tr.Records[0].ManifestVersion != "1" || tr.Records[1].Kind != "outcome" ||
		!reflect.DeepEqual(tr.Records[1].Handle, map[string]any{"name": "alice", "type": "person", "created": "alice"}) {
		t.Fatalf("get_action_trace: %+v", tr)
	}
	if text := agentErr(t, cs, ToolGetActionTrace, map[string]any{"run": run, "step": tr.Records[1].Seq}); !strings.Contains(text, "has no step") {
		t.Errorf("trace of an outcome's seq: %q", text)
	}

	// plan_rollback: newest first.
	plan := agent[rollback.Plan](t, cs, ToolPlanRollback, map[string]any{"run": run})
	var actions []string
	for _, s := range plan.Steps {
		actions = append(actions, s.Tool+" "+string(s.Action))
	}
	wantActions := []string{"memory.delete_entities not_undone", "memory.delete_entities skip", "memory.search_nodes skip",
		"memory.create_relations compensate", "memory.create_entities compensate", "memory.read_graph skip"}
	if !slices.Equal(actions, wantActions) || plan.Summary != (rollback.Summary{Compensate: 2, Skip: 3, NotUndone: 1}) || plan.Checked {
		t.Fatalf("plan_rollback:\n%q\n%+v", actions, plan)
	}
	ce := plan.Steps[4]
	if ce.Compensation == nil || ce.Compensation.Tool != "memory.delete_entities" || ce.Compensation.Kind != "compensation" ||
		!reflect.DeepEqual(ce.Compensation.Arguments, map[string]any{"name": "alice", "type": "person", "created": "alice"}) ||
		ce.ManifestNote != "" || ce.ManifestChecksum == "" {
		t.Errorf("create_entities plan step: %+v", ce)
	}
	if s := plan.Steps[0]; s.Reason != "irreversible: no compensation is declared" {
		t.Errorf("irreversible plan step: %+v", s)
	}
	if s := plan.Steps[5]; s.Reason != "read_only: changes nothing" {
		t.Errorf("read plan step: %+v", s)
	}

	// dry_run_rollback: create_relations' inverse fits delete_relations; create_entities'
	// mapped arguments do not match delete_entities' input schema (it wants entityNames).
	dry := agent[rollback.Plan](t, cs, ToolDryRunRollback, map[string]any{"run": run})
	if !dry.Checked || dry.Ready || len(dry.Steps) != 6 {
		t.Fatalf("dry_run_rollback: %+v", dry)
	}
	if c := dry.Steps[3].Check; c == nil || !c.Exposed || !c.ArgumentsValid || c.Problem != "" ||
		!reflect.DeepEqual(dry.Steps[3].Compensation.Arguments, rel) {
		t.Errorf("create_relations dry run: %+v %+v", dry.Steps[3], c)
	}
	if c := dry.Steps[4].Check; c == nil || !c.Exposed || c.ArgumentsValid || !strings.Contains(c.Problem, "entityNames") {
		t.Errorf("create_entities dry run: %+v", c)
	}
	if dry.Steps[0].Check != nil || dry.Steps[5].Check != nil {
		t.Errorf("only compensate steps are checked: %+v", dry.Steps)
	}
	if res := call(t, cs, "memory.read_graph", map[string]any{}); !strings.Contains(strings.Join(texts(res), ""), "knows") {
		t.Errorf("the dry run executed something: the relation is gone: %v", texts(res))
	}

	// search.
	sr := agent[SearchOut](t, cs, ToolSearch, map[string]any{"what": "runs", "tool": "memory.create_entities"})
	if len(sr.Runs) != 1 || sr.Runs[0].ID != run {
		t.Errorf("search runs by tool: %+v", sr)
	}
	sr = agent[SearchOut](t, cs, ToolSearch, map[string]any{"what": "records", "status": "blocked"})
	if len(sr.Records) != 2 || sr.Records[0].Tool != "memory.delete_entities" || sr.Records[1].Tool != "memory.search_nodes" {
		t.Errorf("search blocked records (newest first): %+v", sr)
	}
	sr = agent[SearchOut](t, cs, ToolSearch, map[string]any{"what": "records", "text": "TOOLS/CALL MEMORY.READ", "limit": 1})
	if len(sr.Records) != 1 || sr.Records[0].Tool != "memory.read_graph" || sr.Records[0].Kind != "intent" {
		t.Errorf("search records by text: %+v", sr)
	}
	sr = agent[SearchOut](t, cs, ToolSearch, map[string]any{"what": "runs", "status": "active"})
	if len(sr.Runs) != 1 || sr.Runs[0].ID != run {
		t.Errorf("search runs by run status: %+v", sr)
	}
	if text := agentErr(t, cs, ToolSearch, map[string]any{"what": "everything"}); !strings.Contains(text, "what") {
		t.Errorf("bad what: %q", text)
	}
	if text := agentErr(t, cs, ToolSearch, map[string]any{"what": "runs", "limit": 201}); !strings.Contains(text, "limit") {
		t.Errorf("limit above 200: %q", text)
	}

	// Another principal's run is not found, with the text of a run that does not exist.
	for _, tool := range []string{ToolGetRun, ToolPlanRollback, ToolDryRunRollback} {
		other := agentErr(t, cs, tool, map[string]any{"run": "run-of-someone-else"})
		none := agentErr(t, cs, tool, map[string]any{"run": "run-that-never-was"})
		if other != strings.ReplaceAll(none, "run-that-never-was", "run-of-someone-else") || !strings.Contains(other, "not found") {
			t.Errorf("%s: another's run %q vs none %q", tool, other, none)
		}
	}
	if text := agentErr(t, cs, ToolGetActionTrace, map[string]any{"run": "run-of-someone-else", "step": 1}); !strings.Contains(text, "not found") {
		t.Errorf("trace of another's run: %q", text)
	}
	for _, what := range []string{"runs", "records"} {
		if sr := agent[SearchOut](t, cs, ToolSearch, map[string]any{"what": what, "text": "secret work"}); len(sr.Runs)+len(sr.Records) != 0 {
			t.Errorf("search %s found another's: %+v", what, sr)
		}
	}

	// validate_manifest: the store is unchanged by every read tool above.
	r0, a0, n0 = ledgerSize(t, f.store)
	vm := agent[ValidateOut](t, cs, ToolValidateManifest, map[string]any{"manifest": map[string]any{
		"tool": "crm.create", "effect": "compensable", "permission": "crm:write",
		"compensation": map[string]any{"tool": "crm.delete", "argument_map": map[string]any{"id": "$result.id"}}}})
	if !vm.Valid || len(vm.Errors) != 0 || len(vm.Checksum) != 64 || vm.Normalised["status"] != "approved" {
		t.Errorf("valid manifest: %+v", vm)
	}
	vm = agent[ValidateOut](t, cs, ToolValidateManifest, map[string]any{"manifest": map[string]any{
		"tool": "crm.create", "effect": "sometimes", "permission": "crm:write", "colour": "red"}})
	paths := []string{}
	for _, e := range vm.Errors {
		paths = append(paths, e.Path)
	}
	if vm.Valid || !slices.Contains(paths, "effect") || !slices.Contains(paths, "colour") || vm.Checksum != "" {
		t.Errorf("invalid manifest: %+v", vm)
	}
	if r, a, n := ledgerSize(t, f.store); r != r0 || a != a0 || n != n0 {
		t.Fatalf("read tools changed the store: records %d→%d approvals %d→%d runs %d→%d", r0, r, a0, a, n0, n)
	}
}

// TestReversiNameIsReserved: an upstream exposing a reversi.* name does not start.
func TestReversiNameIsReserved(t *testing.T) {
	cfg := memoryConfig(t, config.ModeAuto)
	cfg.Upstreams[0].Name = "reversi" // exposes reversi.read_graph, ...
	_, err := New(context.Background(), Options{Config: cfg, Store: store.NewMemory(nil)})
	if err == nil || !strings.Contains(err.Error(), "tool name clash") || !strings.Contains(err.Error(), "upstream reversi exposes reversi.") {
		t.Fatalf("err %v, want a clash with the gateway's own tools", err)
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func osWriteFile(p, text string) error { return os.WriteFile(p, []byte(text), 0o600) }
