package cli

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/rollback"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// failingManifests: a read-back that can never match (the author assumed an empty graph), a
// compensation whose argument_map names a result field server-memory does not return, and an
// irreversible tool.
const failingManifests = `
- tool: mem.read_graph
  description: Read the whole knowledge graph.
  effect: read_only
  permission: mem:read
- tool: mem.create_entities
  description: Create entities.
  effect: reversible
  permission: mem:write
  compensation:
    tool: mem.delete_entities
    kind: inverse
    argument_map:
      entityNames: $result.entities.*.name
    verification:
      tool: mem.read_graph
      expect: { entities: [] }
      retries: 2
      backoff_ms: 20ms
- tool: mem.add_observations
  description: Add observations.
  effect: compensable
  permission: mem:write
  compensation:
    tool: mem.delete_observations
    residue: [the observations were visible while they existed]
    argument_map:
      deletions: $result.deletions
- tool: mem.delete_entities
  description: Delete entities.
  effect: idempotent
  permission: mem:admin
- tool: mem.delete_observations
  description: Delete observations; nothing keeps them.
  effect: irreversible
  permission: mem:write
`

// TestRollbackReportsWhatItCannotUndo is issue 6's second acceptance: a compensation whose
// read-back never matches ends verification_failed with the mismatch in the ledger, an
// irreversible step is reported not undone and a step missing a $result value unrecoverable;
// the rollback exits 1 and says PartiallyRolledBack.
func TestRollbackReportsWhatItCannotUndo(t *testing.T) {
	f := newRollbackFixture(t, failingManifests)
	f.seedGraph(t)
	// observe: the irreversible call runs (journaled would_block) instead of waiting for approval
	cfg := f.config(t, "gateway.yaml", "observe", "")
	for i, r := range f.agentRun(t, cfg, "run-bad",
		mcp.CallToolParams{Name: "mem.create_entities", Arguments: map[string]any{"entities": []any{
			map[string]any{"name": "dave", "entityType": "person", "observations": []any{}}}}},
		mcp.CallToolParams{Name: "mem.add_observations", Arguments: map[string]any{"observations": []any{
			map[string]any{"entityName": "dave", "contents": []any{"tall"}}}}},
		mcp.CallToolParams{Name: "mem.delete_observations", Arguments: map[string]any{"deletions": []any{
			map[string]any{"entityName": "carol", "observations": []any{"was here first"}}}}},
	) {
		if r.IsError {
			t.Fatalf("call %d: %+v", i, r.Content[0])
		}
	}
	out, errOut, code := reversiInProcess("rollback", "run-bad", "--confirm", "--config", cfg, "--data", f.data, "--manifests", f.manifests)
	t.Logf("rollback:\n%s%s", out, errOut)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	for _, want := range []string{
		"step 5 mem.delete_observations: not_undone (irreversible: no compensation is declared)",
		"step 3 mem.add_observations: unrecoverable (a referenced value was missing when the call returned: $result.deletions)",
		"step 1 mem.create_entities: verification_failed (mem.delete_entities; 1 attempt(s); key ",
		`read-back mem.read_graph mismatch: entities: expected [], got [{"entityType":"person","name":"carol"`,
		"undone: 0 step(s)", "not undone: 3 step(s)", "PartiallyRolledBack",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	recs := f.rollbackRecords(t, "run-bad")
	if got := statuses(recs[1]); got != "started,compensated,verification_failed" {
		t.Errorf("create_entities records %s", got)
	}
	if n := recs[1][2].Note; !strings.Contains(n, "first mismatch: entities: expected [], got [") {
		t.Errorf("verification_failed note %q", n)
	}
	if got := statuses(recs[3]) + "|" + statuses(recs[5]); got != "unrecoverable|not_undone" {
		t.Errorf("records of steps 3 and 5: %s", got)
	}
	// The compensation itself ran: dave is gone; the read-back was retried.
	if g := f.graphJSON(t); strings.Contains(g, "dave") {
		t.Errorf("dave was not deleted: %s", g)
	}
	if n := countCalls(upstreams.ReadMetaCalls(t, f.metaLog), "read_graph"); n < 2 {
		t.Errorf("read-backs %d, want 2 (retries: 2)", n)
	}
}

func countCalls(calls []upstreams.MetaCall, name string) int {
	n := 0
	for _, c := range calls {
		if c.Name == name {
			n++
		}
	}
	return n
}

// TestRollbackResumesAfterCrashes is issue 6's third acceptance. The rollback runs in a
// process of its own while the upstream never answers the first compensation: the process is
// killed mid-compensation (its `started` record has no outcome). The next rollback resumes that
// step with the same key, then its upstream dies on the next compensation (3 attempts fail).
// The third completes. The graph read directly equals the graph before the run, and the
// upstream saw each compensation's idempotency key unchanged in every attempt it received.
func TestRollbackResumesAfterCrashes(t *testing.T) {
	f := newRollbackFixture(t, upstreams.MemoryRollbackManifests)
	before := f.seedGraph(t)
	cfg := f.config(t, "gateway.yaml", "enforce", "")
	for i, r := range f.agentRun(t, cfg, "run-crash", agentCalls[:2]...) {
		if r.IsError {
			t.Fatalf("call %d: %+v", i, r.Content[0])
		}
	}

	// 1. The upstream swallows delete_relations; the rollback process is killed while waiting.
	hang := f.config(t, "hang.yaml", "enforce", "hang:delete_relations")
	cmd := exec.Command(os.Args[0], "rollback", "run-crash", "--confirm", "--config", hang, "--data", f.data, "--manifests", f.manifests)
	cmd.Env = append(os.Environ(), cliExecEnv+"=1")
	var cout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &cout, &cout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for countCalls(upstreams.ReadMetaCalls(t, f.metaLog), "delete_relations") == 0 {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("delete_relations never reached the upstream:\n%s", cout.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if got := statuses(f.rollbackRecords(t, "run-crash")[3]); got != "started" {
		t.Fatalf("after the kill, step 3's rollback records are %q, want started", got)
	}

	// 2. Resumed; the upstream dies on the first delete_entities.
	exit := f.config(t, "exit.yaml", "enforce", "exit:delete_entities")
	out, errOut, code := reversiInProcess("rollback", "run-crash", "--confirm", "--config", exit, "--data", f.data, "--manifests", f.manifests)
	t.Logf("second rollback:\n%s%s", out, errOut)
	if code != 1 || !strings.Contains(out, "step 3 mem.create_relations: verified") ||
		!strings.Contains(out, "step 1 mem.create_entities: failed (mem.delete_entities; 3 attempt(s)") || !strings.Contains(out, "PartiallyRolledBack") {
		t.Fatalf("second rollback: exit %d", code)
	}

	// 3. Completes.
	out, errOut, code = reversiInProcess("rollback", "run-crash", "--confirm", "--config", cfg, "--data", f.data, "--manifests", f.manifests)
	t.Logf("third rollback:\n%s%s", out, errOut)
	if code != 0 || !strings.Contains(out, "step 1 mem.create_entities: verified (mem.delete_entities; 1 attempt(s)") || !strings.Contains(out, "RolledBack") {
		t.Fatalf("third rollback: exit %d", code)
	}
	if after := f.graphJSON(t); after != before {
		t.Fatalf("graph after the rollback differs from before the run:\nbefore %s\nafter  %s", before, after)
	}
	recs := f.rollbackRecords(t, "run-crash")
	if got := statuses(recs[3]); got != "started,started,compensated,verified" {
		t.Errorf("step 3 records %s", got)
	}
	if n := recs[3][1].Note; !strings.HasPrefix(n, "resumed: an earlier attempt did not finish; same idempotency key") {
		t.Errorf("resumed note %q", n)
	}
	if got := statuses(recs[1]); got != "started,failed,started,compensated,verified" {
		t.Errorf("step 1 records %s", got)
	}
	// The upstream's view: every compensation call carried its step's one key.
	want := map[string]string{
		"delete_relations": rollback.CompensationKey("run-crash", 3, "mem.delete_relations"),
		"delete_entities":  rollback.CompensationKey("run-crash", 1, "mem.delete_entities"),
	}
	seen := map[string]int{}
	for _, c := range upstreams.ReadMetaCalls(t, f.metaLog) {
		w, ok := want[c.Name]
		if !ok {
			continue
		}
		seen[c.Name]++
		if got := c.Meta[rollback.IdempotencyKeyMeta]; got != w {
			t.Errorf("%s call %d reached the upstream with key %v, want %s", c.Name, seen[c.Name], got, w)
		}
	}
	// delete_relations: one swallowed, one that completed. delete_entities: at least one lost
	// to the exiting upstream and one that completed; the gateway restarts a lost upstream, so
	// a later attempt of the second rollback may reach (and lose) a restarted process too.
	if seen["delete_relations"] != 2 || seen["delete_entities"] < 2 || seen["delete_entities"] > 4 {
		t.Errorf("compensation calls received by the upstreams: %v, want delete_relations 2 and delete_entities 2 to 4", seen)
	}
}
