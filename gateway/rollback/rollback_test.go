package rollback_test

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/rollback"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// manifests is a tool → manifest lookup (what *engine.Engine offers).
type manifests map[string]*manifest.Manifest

func (m manifests) Manifest(tool string) *manifest.Manifest { return m[tool] }

func mustValidate(t *testing.T, raw map[string]any) *manifest.Manifest {
	t.Helper()
	m, errs := manifest.Validate(raw)
	if len(errs) > 0 {
		t.Fatalf("manifest %v: %v", raw["tool"], errs)
	}
	return m
}

func charge(t *testing.T, version int) *manifest.Manifest {
	return mustValidate(t, map[string]any{"tool": "pay.charge", "effect": "compensable", "permission": "pay:write", "version": version,
		"compensation": map[string]any{"tool": "pay.refund", "residue": []any{"a refund line on the statement"},
			"argument_map": map[string]any{"charge_id": "$result.id"}}})
}

type step struct {
	tool, checksum, decision string
	out                      *store.StepOutcome
}

// ledger journals steps in a fresh run and returns the store.
func ledger(t *testing.T, steps []step) store.Store {
	t.Helper()
	st := store.NewMemory(nil)
	t.Cleanup(func() { _ = st.Close() })
	ctx := context.Background()
	if _, err := st.CreateRun(ctx, store.Run{ID: "r", Actor: "a"}); err != nil {
		t.Fatal(err)
	}
	var open []int64 // steps whose outcome comes after all intents (interleaved order)
	for _, s := range steps {
		n, err := st.RecordIntent(ctx, store.Intent{Run: "r", Tool: s.tool, ManifestVersion: "1", ManifestChecksum: s.checksum, Decision: s.decision})
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, n)
	}
	for i := len(steps) - 1; i >= 0; i-- { // outcomes in reverse: Steps must not depend on record order
		if o := steps[i].out; o != nil {
			if _, err := st.RecordOutcome(ctx, "r", open[i], *o); err != nil {
				t.Fatal(err)
			}
		}
	}
	return st
}

func TestPlan(t *testing.T) {
	cur := charge(t, 1)
	sum, _ := manifest.Checksum(cur)
	read := mustValidate(t, map[string]any{"tool": "pay.get", "effect": "read_only", "permission": "pay:read"})
	email := mustValidate(t, map[string]any{"tool": "mail.send", "effect": "irreversible", "permission": "mail:send"})
	ms := manifests{"pay.charge": cur, "pay.get": read, "mail.send": email}
	ok := func(o store.StepOutcome) *store.StepOutcome { return &o }
	handle := map[string]any{"charge_id": "ch_1"}
	st := ledger(t, []step{
		{tool: "pay.charge", checksum: sum, decision: "allow", out: ok(store.StepOutcome{Status: store.Succeeded, CompensationTool: "pay.refund", Handle: handle})},
		{tool: "pay.charge", checksum: "stale", decision: "would_block", out: ok(store.StepOutcome{Status: store.Succeeded, CompensationTool: "pay.refund", Handle: handle, Note: "would_block: x"})},
		{tool: "pay.charge", checksum: sum, decision: "allow", out: ok(store.StepOutcome{Status: store.Succeeded, CompensationTool: "pay.refund",
			Note: "manifest deprecated; unrecoverable: no value for $result.id"})},
		{tool: "pay.charge", checksum: sum, decision: "allow", out: ok(store.StepOutcome{Status: store.Failed})},
		{tool: "pay.charge", checksum: sum, decision: "allow", out: ok(store.StepOutcome{Status: store.Uncertain, CompensationTool: "pay.refund", Handle: handle})},
		{tool: "pay.charge", checksum: sum, decision: "block", out: ok(store.StepOutcome{Status: store.Blocked, Note: "denied"})},
		{tool: "pay.get", checksum: "x", decision: "allow", out: ok(store.StepOutcome{Status: store.Succeeded})},
		{tool: "mail.send", checksum: "x", decision: "allow", out: ok(store.StepOutcome{Status: store.Succeeded})},
		{tool: "fs.unknown", decision: "allow", out: ok(store.StepOutcome{Status: store.Succeeded})},
		{tool: "fs.unknown", decision: "allow", out: ok(store.StepOutcome{Status: store.Failed})},
		{tool: "gone.tool", checksum: "x", decision: "allow", out: ok(store.StepOutcome{Status: store.Succeeded, CompensationTool: "gone.undo", Handle: handle})},
		{tool: "pay.charge", checksum: sum, decision: "allow"}, // in flight
	})
	p, err := rollback.Build(context.Background(), st, ms, "r")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range p.Steps {
		got = append(got, s.Tool+" "+string(s.Action))
	}
	want := []string{"pay.charge not_undone", "gone.tool compensate", "fs.unknown skip", "fs.unknown not_undone",
		"mail.send not_undone", "pay.get skip", "pay.charge skip", "pay.charge not_undone", "pay.charge skip",
		"pay.charge unrecoverable", "pay.charge compensate", "pay.charge compensate"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("plan newest first:\n got %q\nwant %q", got, want)
	}
	if p.Summary != (rollback.Summary{Compensate: 3, Skip: 4, Unrecoverable: 1, NotUndone: 4}) {
		t.Errorf("summary %+v", p.Summary)
	}
	s := p.Steps
	if s[0].Reason != rollback.InFlightReason || s[0].Status != "" || s[0].Step != 12 {
		t.Errorf("in flight: %+v", s[0])
	}
	if !strings.Contains(s[1].Reason, "kind and residue are unknown") || s[1].Compensation.Tool != "gone.undo" ||
		!strings.Contains(s[1].ManifestNote, "no manifest for gone.tool is loaded now") {
		t.Errorf("manifest gone: %+v", s[1])
	}
	if s[3].Reason != rollback.UnclassifiedReason || s[2].Reason != "the call failed: nothing to undo" {
		t.Errorf("unclassified: %+v / %+v", s[3], s[2])
	}
	if s[4].Reason != "irreversible: no compensation is declared" || s[5].Reason != "read_only: changes nothing" {
		t.Errorf("irreversible / read: %+v / %+v", s[4], s[5])
	}
	if s[6].Reason != "blocked: the call never reached the upstream (denied)" {
		t.Errorf("blocked: %+v", s[6])
	}
	if s[7].Reason != rollback.UncertainReason || s[7].Compensation == nil || s[7].Compensation.Tool != "pay.refund" {
		t.Errorf("uncertain: %+v", s[7])
	}
	if s[8].Reason != "the call failed: nothing to undo" {
		t.Errorf("failed: %+v", s[8])
	}
	if !reflect.DeepEqual(s[9].Missing, []string{"$result.id"}) || s[9].Compensation == nil || s[9].Compensation.Arguments != nil {
		t.Errorf("unrecoverable: %+v", s[9])
	}
	stale := s[10]
	if stale.Decision != "would_block" || stale.Compensation == nil || !reflect.DeepEqual(stale.Compensation.Arguments, handle) ||
		!strings.Contains(stale.ManifestNote, "changed since the call (journaled version 1, checksum stale; now version 1, checksum "+sum) {
		t.Errorf("would_block with a changed manifest: %+v", stale)
	}
	first := s[11]
	if first.ManifestNote != "" || first.Compensation.Kind != "compensation" ||
		!reflect.DeepEqual(first.Compensation.Residue, []string{"a refund line on the statement"}) || first.Reason != "run pay.refund" {
		t.Errorf("compensate: %+v", first)
	}

	// DryRun against a real engine: pay.refund takes {charge_id: string}; gone.undo is not exposed.
	e, err := engine.New(engine.Config{Store: store.NewMemory(nil), Tools: []engine.Tool{{Name: "pay.refund", InputSchema: map[string]any{
		"type": "object", "required": []any{"charge_id"}, "properties": map[string]any{"charge_id": map[string]any{"type": "string"}}}}}})
	if err != nil {
		t.Fatal(err)
	}
	d := rollback.DryRun(p, e)
	if !d.Checked || d.Ready {
		t.Fatalf("dry run: %+v", d)
	}
	if c := d.Steps[1].Check; c == nil || c.Exposed || !strings.Contains(c.Problem, "no upstream exposes gone.undo") {
		t.Errorf("not exposed: %+v", c)
	}
	if c := d.Steps[11].Check; c == nil || !c.Exposed || !c.ArgumentsValid || c.Problem != "" {
		t.Errorf("valid compensation: %+v", c)
	}
	if d.Steps[7].Check != nil || p.Steps[11].Check != nil {
		t.Error("DryRun checked a non-compensate step or changed the plan it was given")
	}
	// Without the step whose tool is gone, the plan is ready.
	p.Steps = append(p.Steps[:1:1], p.Steps[2:]...)
	if d := rollback.DryRun(p, e); !d.Ready {
		t.Errorf("dry run without the gone tool: %+v", d)
	}
	// A handle that breaks the schema.
	bad := rollback.Plan{Steps: []rollback.Step{{Action: manifest.PlanCompensate, Compensation: &rollback.Compensation{Tool: "pay.refund", Arguments: map[string]any{"charge_id": 5}}}}}
	if d := rollback.DryRun(bad, e); d.Ready || d.Steps[0].Check.ArgumentsValid || !strings.Contains(d.Steps[0].Check.Problem, "charge_id") {
		t.Errorf("bad arguments: %+v", d.Steps[0].Check)
	}
}

func TestOutlook(t *testing.T) {
	m := mustValidate(t, map[string]any{"tool": "crm.create", "effect": "reversible", "permission": "crm:write",
		"compensation": map[string]any{"tool": "crm.delete", "kind": "inverse", "requires_approval": true,
			"argument_map": map[string]any{"name": "$args.name", "id": "$result.id"}}})
	o := rollback.OutlookFor(m, map[string]any{"name": "acme"})
	if o.Action != manifest.PlanCompensate || o.Compensation.Tool != "crm.delete" || o.Compensation.Kind != "inverse" ||
		!o.Compensation.RequiresApproval || !reflect.DeepEqual(o.Compensation.Arguments, map[string]any{"name": "acme"}) ||
		!reflect.DeepEqual(o.FromResult, []string{"$result.id"}) || len(o.Missing) != 0 {
		t.Errorf("outlook: %+v", o)
	}
	if o := rollback.OutlookFor(m, map[string]any{}); o.Action != manifest.PlanUnrecoverable || !reflect.DeepEqual(o.Missing, []string{"$args.name"}) {
		t.Errorf("outlook without the argument: %+v", o)
	}
	if o := rollback.OutlookFor(nil, nil); o.Action != manifest.PlanNotUndone || o.Reason != rollback.UnclassifiedReason {
		t.Errorf("outlook without a manifest: %+v", o)
	}
}

// TestPlanReadOnlyWhateverTheOutcome: a read changed nothing, so even an uncertain or
// unfinished read_only call is skipped, not left for a person to check.
func TestPlanReadOnlyWhateverTheOutcome(t *testing.T) {
	read := mustValidate(t, map[string]any{"tool": "pay.get", "effect": "read_only", "permission": "pay:read"})
	st := ledger(t, []step{
		{tool: "pay.get", checksum: "x", decision: "allow", out: &store.StepOutcome{Status: store.Uncertain}},
		{tool: "pay.get", checksum: "x", decision: "allow"}, // in flight
	})
	p, err := rollback.Build(context.Background(), st, manifests{"pay.get": read}, "r")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Steps) != 2 || p.Summary != (rollback.Summary{Skip: 2}) {
		t.Fatalf("plan %+v", p)
	}
	for _, s := range p.Steps {
		if s.Action != manifest.PlanSkip || s.Reason != "read_only: changes nothing" {
			t.Errorf("step %+v, want skip", s)
		}
	}
}
