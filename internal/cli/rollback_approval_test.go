package cli

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// TestRollbackWaitsForApproval: a compensation with requires_approval creates a request in the
// store's approval queue and waits (nothing reaches the upstream, exit 1); once approved, the
// next rollback runs it. Seed "MCP gateway", execute_rollback ("with approve_compensations:
// true also approves compensations that need it").
func TestRollbackWaitsForApproval(t *testing.T) {
	f := newRollbackFixture(t, strings.Replace(upstreams.MemoryRollbackManifests, "    kind: inverse\n    argument_map:\n      entityNames",
		"    kind: inverse\n    requires_approval: true\n    argument_map:\n      entityNames", 1))
	before := f.seedGraph(t)
	cfg := f.config(t, "gateway.yaml", "enforce", "")
	f.agentRun(t, cfg, "run-apr", agentCalls[0])

	out, _, code := reversiInProcess("rollback", "run-apr", "--confirm", "--config", cfg, "--data", f.data, "--manifests", f.manifests)
	id := regexp.MustCompile(`request (apr-rb-[0-9a-f]+) is waiting for an approver`).FindStringSubmatch(out)
	if code != 1 || id == nil || !strings.Contains(out, "step 1 mem.create_entities: waiting_approval") {
		t.Fatalf("first rollback: exit %d\n%s", code, out)
	}
	if n := countCalls(upstreams.ReadMetaCalls(t, f.metaLog), "delete_entities"); n != 0 {
		t.Fatalf("the compensation ran %d time(s) before approval", n)
	}
	st, err := store.OpenSQLite(f.data, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := st.Decide(context.Background(), id[1], store.Decision{By: "oncall-bob", Approve: true})
	st.Close()
	if err != nil || a.State != store.ApprovalApproved || a.Tool != "mem.delete_entities" || a.Run != "run-apr" {
		t.Fatalf("approve %s: %+v %v", id[1], a, err)
	}
	out, _, code = reversiInProcess("rollback", "run-apr", "--confirm", "--config", cfg, "--data", f.data, "--manifests", f.manifests)
	if code != 0 || !strings.Contains(out, "step 1 mem.create_entities: verified") {
		t.Fatalf("after approval: exit %d\n%s", code, out)
	}
	if got := statuses(f.rollbackRecords(t, "run-apr")[1]); got != "waiting_approval,started,compensated,verified" {
		t.Errorf("records %s", got)
	}
	if after := f.graphJSON(t); after != before {
		t.Errorf("graph after %s, before %s", after, before)
	}

	// --approve-compensations runs it at once.
	f.agentRun(t, cfg, "run-apr2", agentCalls[0])
	out, _, code = reversiInProcess("rollback", "run-apr2", "--confirm", "--approve-compensations", "--operator", "ops-ann",
		"--config", cfg, "--data", f.data, "--manifests", f.manifests)
	if code != 0 || !strings.Contains(out, "step 1 mem.create_entities: verified") {
		t.Fatalf("--approve-compensations: exit %d\n%s", code, out)
	}
	if r := f.rollbackRecords(t, "run-apr2")[1]; !strings.Contains(r[0].Note, "approved by ops-ann (approve_compensations)") {
		t.Errorf("started note %q", r[0].Note)
	}
}
