package gateway

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// dupManifests are manifests for server-memory (upstream "mem") whose create_entities
// declares a duplicate-call key over the first entity's name with the given scope.
func dupManifests(scope string) string {
	return fmt.Sprintf(`
- tool: mem.create_entities
  description: Create entities.
  effect: compensable
  permission: mem:write
  compensation:
    tool: mem.delete_entities
    argument_map:
      entityNames: $args.entities.0.name
  idempotency: { key: "entity-{{args.entities.0.name}}", scope: %s }
- tool: mem.delete_entities
  description: Delete entities.
  effect: irreversible
  permission: mem:write
`, scope)
}

// dupGateway describes gateways over one data folder and one server-memory graph file.
type dupGateway struct {
	cfg, manifests, data string
}

func newDupGateway(t *testing.T, scope, graph string) dupGateway {
	dir := t.TempDir()
	node, args, _ := upstreams.MemoryAt(t, graph)
	cfg := "mode: enforce\nupstreams:\n" + upstreamYAML("mem", node, args, []string{"MEMORY_FILE_PATH=" + graph})
	return dupGateway{cfg: writeFile(t, dir, "gateway.yaml", cfg), manifests: writeFile(t, dir, "m.yaml", dupManifests(scope)),
		data: filepath.Join(dir, "data")}
}

// session starts one gateway process over stdio: one session, one run (id run) of actor.
func (g dupGateway) session(t *testing.T, actor, run string) *proc {
	return startStdio(t, bins.reversi, "gateway", "--config", g.cfg, "--manifests", g.manifests,
		"--store", "sqlite", "--data", g.data, "--actor", actor, "--run-id", run)
}

func entity(name string) map[string]any {
	return map[string]any{"entities": []any{map[string]any{"name": name, "entityType": "person", "observations": []any{}}}}
}

// wantPass and wantDuplicate check one create_entities call's result.
func wantPass(t *testing.T, p *proc, name, why string) {
	t.Helper()
	if res := call(t, p.cs, "mem.create_entities", entity(name)); res.IsError {
		t.Fatalf("%s: create_entities %s: %s", why, name, text(res))
	}
}

func wantDuplicate(t *testing.T, p *proc, name, holderRun, why string) {
	t.Helper()
	res := call(t, p.cs, "mem.create_entities", entity(name))
	want := engine.BlockedPrefix + "duplicate call: an earlier call of mem.create_entities with the same key still stands (run " + holderRun + ","
	if !res.IsError || !strings.HasPrefix(text(res), want) {
		t.Fatalf("%s: create_entities %s: want %q..., got %+v", why, name, want, res)
	}
}

// TestDuplicateKeys (seed "Tool manifests" 000, Duplicate calls; issue 5): through the gateway
// processes, against server-memory, with the key in the SQLite store that successive gateway
// processes share: the second identical call is refused while the first stands; scope run
// lets another run pass, actor another actor, global nobody.
func TestDuplicateKeys(t *testing.T) {
	for _, tc := range []struct {
		scope                        string
		otherRunPass, otherActorPass bool
	}{
		{"run", true, true},
		{"actor", false, true},
		{"global", false, false},
	} {
		t.Run(tc.scope, func(t *testing.T) {
			g := newDupGateway(t, tc.scope, filepath.Join(t.TempDir(), "graph.jsonl"))
			p1 := g.session(t, "alice", "run-1")
			wantPass(t, p1, "ada", "first call")
			wantDuplicate(t, p1, "ada", "run-1", "same call, same run")
			wantPass(t, p1, "grace", "another key in the same run")
			p1.close()

			p2 := g.session(t, "alice", "run-2")
			if tc.otherRunPass {
				wantPass(t, p2, "ada", "scope "+tc.scope+", another run of the same actor")
			} else {
				wantDuplicate(t, p2, "ada", "run-1", "scope "+tc.scope+", another run of the same actor")
			}
			p2.close()

			p3 := g.session(t, "bob", "run-3")
			if tc.otherActorPass {
				wantPass(t, p3, "grace", "scope "+tc.scope+", another actor")
			} else {
				wantDuplicate(t, p3, "grace", "run-1", "scope "+tc.scope+", another actor")
			}
			p3.close()

			// The refusals are journaled as blocked, with the reason.
			var blocked int
			for _, r := range outcomes(records(t, openLedger(t, g.data)), "mem.create_entities") {
				if r.Status == store.Blocked {
					blocked++
					if !strings.Contains(r.Note, "duplicate call") {
						t.Errorf("blocked record without the duplicate reason: %+v", r)
					}
				}
			}
			want := 1
			if !tc.otherRunPass {
				want++
			}
			if !tc.otherActorPass {
				want++
			}
			if blocked != want {
				t.Errorf("%d blocked records, want %d", blocked, want)
			}
		})
	}
}

// TestDuplicateKeyFreedByFailure: a first call the upstream fails (isError: server-memory
// cannot write its graph file because its folder is missing) frees the key, so the same call
// runs again; once it succeeded the key holds.
func TestDuplicateKeyFreedByFailure(t *testing.T) {
	graphDir := filepath.Join(t.TempDir(), "not-yet")
	g := newDupGateway(t, "global", filepath.Join(graphDir, "graph.jsonl"))
	p := g.session(t, "alice", "run-f")
	res := call(t, p.cs, "mem.create_entities", entity("ada"))
	if !res.IsError || strings.HasPrefix(text(res), engine.BlockedPrefix) {
		t.Fatalf("first call: want the upstream's failure, got %+v", res)
	}
	if err := os.MkdirAll(graphDir, 0o700); err != nil {
		t.Fatal(err)
	}
	wantPass(t, p, "ada", "the same call after the first failed")
	wantDuplicate(t, p, "ada", "run-f", "the same call after one succeeded")
	p.close()

	var statuses []store.Status
	for _, r := range outcomes(records(t, openLedger(t, g.data)), "mem.create_entities") {
		statuses = append(statuses, r.Status)
	}
	if fmt.Sprint(statuses) != "[failed succeeded blocked]" {
		t.Fatalf("ledger outcomes %v, want [failed succeeded blocked]", statuses)
	}
}
