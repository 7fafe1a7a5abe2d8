package proxy

import (
	"slices"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/rollback"
)

// TestOperatorSuggestAndExecuteRollback: reversi.suggest_manifest drafts the exposed tools
// that have no manifest (drafts that validate, status draft); reversi.execute_rollback is a
// dry run unless confirmed, and confirmed it undoes an agent's create_relations on the upstream.
func TestOperatorSuggestAndExecuteRollback(t *testing.T) {
	f := startAuth(t)
	audrey := mustConnect(t, f.base+PathOperator, f.keys["audrey"])
	sg := agent[SuggestOut](t, audrey, ToolSuggestManifest, map[string]any{})
	// The drafts validate together with the manifests already served, as a reviewer runs them.
	docs, errs := manifest.ReadPaths(writeFile(t, "memory.yaml", agentManifests))
	var drafted []string
	for _, d := range sg.Drafts {
		drafted = append(drafted, d.Tool)
		ds, perrs := manifest.ParseFile(d.File, []byte(d.YAML))
		docs, errs = append(docs, ds...), append(errs, perrs...)
	}
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Errorf("the drafts do not validate with the served manifests: %v", errs)
	}
	for _, m := range ms {
		if slices.Contains(drafted, m.Tool) && m.Status != manifest.Draft {
			t.Errorf("draft of %s has status %s", m.Tool, m.Status)
		}
	}
	slices.Sort(drafted)
	if want := []string{"memory.add_observations", "memory.delete_observations", "memory.search_nodes"}; !slices.Equal(drafted, want) {
		t.Errorf("drafted %v, want %v", drafted, want)
	}
	if !slices.Contains(sg.Skipped, "memory.create_relations") {
		t.Errorf("skipped %v lacks a manifested tool", sg.Skipped)
	}

	// An agent creates a relation; an operator rolls its run back.
	bot := mustConnect(t, f.base+PathAgent, f.keys["ci-bot"])
	call(t, bot, "memory.create_entities", map[string]any{"entities": []any{
		map[string]any{"name": "a", "entityType": "t", "observations": []any{}},
		map[string]any{"name": "b", "entityType": "t", "observations": []any{}}}})
	rel := map[string]any{"from": "a", "to": "b", "relationType": "knows"}
	if res := call(t, bot, "memory.create_relations", map[string]any{"relations": []any{rel}}); res.IsError {
		t.Fatalf("create_relations: %v", texts(res))
	}
	runs := agent[ListRunsOut](t, audrey, ToolListRuns, map[string]any{})
	if len(runs.Runs) != 1 {
		t.Fatalf("runs: %+v", runs)
	}
	run := runs.Runs[0].ID
	if res := call(t, audrey, ToolExecuteRollback, map[string]any{"run": run}); !res.IsError ||
		!strings.Contains(strings.Join(texts(res), ""), "needs the operator role or higher") {
		t.Errorf("an auditor calling execute_rollback: %v", texts(res))
	}
	olga := mustConnect(t, f.base+PathOperator, f.keys["olga"])
	dry := agent[rollback.Result](t, olga, ToolExecuteRollback, map[string]any{"run": run})
	if dry.Confirmed || len(dry.Steps) != 0 || len(dry.Plan.Steps) != 2 || dry.Plan.Steps[0].Tool != "memory.create_relations" ||
		dry.Plan.Steps[0].Action != manifest.PlanCompensate {
		t.Fatalf("dry run: %+v", dry)
	}
	if g := call(t, bot, "memory.read_graph", map[string]any{}); !strings.Contains(strings.Join(texts(g), ""), "knows") {
		t.Fatalf("the dry run changed the graph: %v", texts(g))
	}
	done := agent[rollback.Result](t, olga, ToolExecuteRollback, map[string]any{"run": run, "confirm": true})
	if !done.Confirmed || len(done.Steps) == 0 {
		t.Fatalf("confirmed rollback: %+v", done)
	}
	if g := call(t, bot, "memory.read_graph", map[string]any{}); strings.Contains(strings.Join(texts(g), ""), "knows") {
		t.Errorf("the relation is still there after the rollback: %v", texts(g))
	}
}
