package proxy

import (
	"context"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/store"
)

// TestHostileRunProbes: another principal's run and a run that does not exist get the same text
// from the read tools, and both refusals are journaled; so are refused run ids at run opening
// (another principal's run, an invalid id).
func TestHostileRunProbes(t *testing.T) {
	h := startHostile(t, true, nil)
	owner := mustConnect(t, h.base+PathAgent, h.key("ci-bot"))
	call(t, owner, "memory.read_graph", map[string]any{})
	runs, err := h.store.ListRuns(context.Background(), store.RunFilter{Actor: "ci-bot"})
	if err != nil || len(runs) != 1 {
		t.Fatalf("runs: %v %v", runs, err)
	}
	run := runs[0].ID
	prober := mustConnect(t, h.base+PathAgent, h.key("other-bot"))
	got := map[string]string{}
	for _, id := range []string{run, "run-that-does-not-exist"} {
		msg := agentErr(t, prober, ToolGetRun, map[string]any{"run": id})
		got[id] = strings.ReplaceAll(msg, id, "<id>")
	}
	if got[run] != got["run-that-does-not-exist"] {
		t.Errorf("the texts differ: %q", got)
	}
	for _, id := range []string{run, "run-that-does-not-exist"} {
		if !containsAll(gatewayNotes(t, h.store), `refused a tools/call of other-bot to "reversi.get_run"`, id, "not found") {
			t.Errorf("the refusal for %s is not journaled: %q", id, gatewayNotes(t, h.store))
		}
	}
	for id, want := range map[string]string{run: "belongs to another principal", "Not_A_Valid_Id": "run id"} {
		cs := mustConnect(t, h.base+PathAgent, h.key("other-bot"), RunIDHeader, id)
		r := call(t, cs, "memory.read_graph", map[string]any{})
		if !r.IsError || !strings.Contains(r.Content[0].(*mcp.TextContent).Text, want) {
			t.Errorf("run id %s: %v", id, r.Content)
		}
		if !containsAll(gatewayNotes(t, h.store), `refused a tools/call of other-bot to "memory.read_graph": the run could not be opened`, id) {
			t.Errorf("the run id %s refusal is not journaled: %q", id, gatewayNotes(t, h.store))
		}
	}
	// An unknown tool too.
	if res, err := prober.CallTool(context.Background(), &mcp.CallToolParams{Name: "memory.no_such_tool"}); !refusedUnknown(res, err, "memory.no_such_tool") {
		t.Errorf("unknown tool: %v %v", res, err)
	}
	if !containsAll(gatewayNotes(t, h.store), `refused a tools/call of other-bot to "memory.no_such_tool": unknown tool`) {
		t.Errorf("the unknown tool is not journaled: %q", gatewayNotes(t, h.store))
	}
	h.stillServes(t)
}
