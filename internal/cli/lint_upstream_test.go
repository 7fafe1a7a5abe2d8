package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/proxy"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// memoryHashes lists server-memory's tools and returns each one's schema_hash.
func memoryHashes(t *testing.T, cmd string, args []string) map[string]string {
	t.Helper()
	g, err := config.FromFlags(config.Flags{UpstreamCmd: cmd, UpstreamArgs: args})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tools, err := proxy.ListTools(ctx, g, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, tl := range tools {
		if out[tl.Tool.Name], err = engine.SchemaHash(tl.Tool.InputSchema); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// correctMemoryManifests are complete manifests for every server-memory tool, reading nested
// arguments (array indexes included) that the real schemas have.
const correctMemoryManifests = `
- tool: create_entities
  description: Create entities.
  effect: compensable
  permission: memory:write
  owner: kg-team
  risk: {data_class: internal}
  timeout_ms: 10s
  idempotency: {key: "entity-{{args.entities.0.name}}"}
  audit: {redaction: [$args.entities.0.observations]}
  compensation:
    tool: delete_entities
    residue: [relations to the entities are deleted too]
    argument_map: {entityNames: $args.entities.0.name}
    verification:
      tool: open_nodes
      arguments: {names: $args.entities.0.name}
      expect: {entities: []}
  schema_hash: %[1]s
- tool: create_relations
  description: Create relations.
  effect: reversible
  permission: memory:write
  owner: kg-team
  risk: {data_class: internal}
  timeout_ms: 10s
  compensation:
    tool: delete_relations
    kind: inverse
    argument_map: {relations: $args.relations}
    verification:
      tool: open_nodes
      arguments: {names: $args.relations.0.from}
      expect: {relations: []}
  schema_hash: %[2]s
- tool: add_observations
  description: Add observations.
  effect: compensable
  permission: memory:write
  owner: kg-team
  risk: {data_class: internal}
  timeout_ms: 10s
  compensation:
    tool: delete_observations
    residue: [none known]
    argument_map: {deletions: $args.observations}
    verification:
      tool: open_nodes
      arguments: {names: $args.observations.0.entityName}
      expect: {entities.0.observations: []}
  schema_hash: %[3]s
- {tool: delete_entities, description: Delete entities., effect: idempotent, permission: memory:write, owner: kg-team, risk: {data_class: internal}, timeout_ms: 10s, schema_hash: %[4]s}
- {tool: delete_observations, description: Delete observations., effect: idempotent, permission: memory:write, owner: kg-team, risk: {data_class: internal}, timeout_ms: 10s, schema_hash: %[5]s}
- {tool: delete_relations, description: Delete relations., effect: idempotent, permission: memory:write, owner: kg-team, risk: {data_class: internal}, timeout_ms: 10s, schema_hash: %[6]s}
- {tool: read_graph, effect: read_only, permission: memory:read, schema_hash: %[7]s}
- {tool: search_nodes, effect: read_only, permission: memory:read, schema_hash: %[8]s}
- {tool: open_nodes, effect: read_only, permission: memory:read, schema_hash: %[9]s}
`

func TestLintUpstreamMemory(t *testing.T) {
	cmd, args, _ := upstreams.Memory(t)
	h := memoryHashes(t, cmd, args)
	up := upstreamFlagsFor(cmd, args)
	upstreamCodes := []string{"L017", "L020", "L027", "L033", "L034", "L035"}

	// Correct manifests: no finding that needs the upstream.
	good := writeFile(t, "memory.yaml", fmt.Sprintf(correctMemoryManifests, h["create_entities"], h["create_relations"],
		h["add_observations"], h["delete_entities"], h["delete_observations"], h["delete_relations"], h["read_graph"],
		h["search_nodes"], h["open_nodes"]))
	code, out, errs := runCLI(append([]string{"lint", good}, up...)...)
	if code != 0 {
		t.Fatalf("lint of correct manifests: exit %d\n%s\n%s", code, out, errs)
	}
	for _, c := range upstreamCodes {
		if strings.Contains(out, " "+c+" ") {
			t.Errorf("false positive %s:\n%s", c, out)
		}
	}
	// Lint without the upstream is unchanged by the flags' existence.
	_, plain, _ := runCLI("lint", good)
	if plain != out {
		t.Errorf("with the upstream:\n%s\nwithout:\n%s", out, plain)
	}

	// A manifest naming missing arguments, a misnamed manifest, and tools without manifests.
	bad := writeFile(t, "bad.yaml", `
- tool: create_entities
  description: Create entities.
  effect: compensable
  permission: memory:write
  owner: kg-team
  risk: {data_class: internal}
  timeout_ms: 10s
  idempotency: {key: "entity-{{args.entity.name}}"}
  audit: {redaction: [$args.entities.0.secret]}
  compensation:
    tool: delete_entities
    residue: [relations go too]
    argument_map: {entityNames: $args.entityNames}
  schema_hash: `+h["create_entities"]+`
- {tool: delete_entities, description: Delete entities., effect: idempotent, permission: memory:write, owner: kg-team, risk: {data_class: internal}, timeout_ms: 10s, schema_hash: `+h["delete_entities"]+`}
- {tool: memory.read_graph, effect: read_only, permission: memory:read}
`)
	code, out, _ = runCLI(append([]string{"lint", bad}, up...)...)
	want := []string{
		`error L017 create_entities: compensation.argument_map.entityNames reads $args.entityNames, which the input schema lacks (no argument "entityNames" at the top level; it has entities)`,
		`error L020 create_entities: idempotency.key uses {{args.entity.name}}, which the input schema lacks (no argument "entity" at the top level; it has entities)`,
		`warning L033 create_entities: audit.redaction[0] names $args.entities.0.secret, which the input schema lacks (no argument "secret" at entities.0; it has entityType, name, observations)`,
		`warning L034 memory.read_graph: no upstream tool has this name`,
		`warning L035 read_graph: the upstream offers this tool, but no manifest describes it`,
		`warning L035 search_nodes: the upstream offers this tool, but no manifest describes it`,
	}
	if code != 1 {
		t.Errorf("exit %d, want 1 (errors)", code)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("no finding %q in\n%s", w, out)
		}
	}
	if strings.Contains(out, "L027 create_entities") || strings.Contains(out, "L027 memory.read_graph") {
		t.Errorf("L027 for a manifest with a hash, or one no upstream offers:\n%s", out)
	}
	if !strings.HasSuffix(out, "2 errors, 9 warnings, 1 notes\n") {
		t.Errorf("summary:\n%s", out)
	}
}

// Through gateway.yaml tools are named <upstream>.<tool>; a manifest without schema_hash is L027.
func TestLintGatewayConfig(t *testing.T) {
	dir := t.TempDir()
	cmd, args, env := upstreams.Memory(t)
	gw := fmt.Sprintf("upstreams:\n  - name: memory\n    command: %s\n    args: [%s]\n    env: {%s}\n", cmd, strings.Join(args, ", "), strings.Replace(env[0], "=", ": ", 1))
	if err := os.WriteFile(filepath.Join(dir, "gateway.yaml"), []byte(gw), 0o644); err != nil {
		t.Fatal(err)
	}
	m := writeFile(t, "m.yaml", "- {tool: memory.read_graph, effect: read_only, permission: memory:read}\n")
	code, out, errs := runCLI("lint", m, "--gateway-config", filepath.Join(dir, "gateway.yaml"))
	if code != 0 || !strings.Contains(out, "info L027 memory.read_graph: no schema_hash") || !strings.Contains(out, "warning L035 memory.open_nodes:") ||
		strings.Contains(out, "L034") {
		t.Errorf("exit %d\n%s\n%s", code, out, errs)
	}
	code, _, errs = runCLI("lint", m, "--gateway-config", "gw.yaml", "--upstream-cmd", "node")
	if code != 1 || !strings.Contains(errs, "not both") {
		t.Errorf("both: %d %q", code, errs)
	}
}

// lint --policy against the real server-memory: a condition reading an argument the tool's
// input schema lacks is L043 at its file:line; a correct one is not reported.
func TestLintPolicyUpstreamMemory(t *testing.T) {
	cmd, args, _ := upstreams.Memory(t)
	up := upstreamFlagsFor(cmd, args)
	ms := writeFile(t, "memory.yaml", `
- {tool: delete_entities, description: Delete entities., effect: irreversible, permission: memory:write}
- {tool: add_observations, description: Add observations., effect: idempotent, permission: memory:write}
`)
	pol := writeFile(t, "policy.yaml", `policy: memory
rules:
  - name: bulk-delete
    match: { tools: [delete_entities] }
    condition: "size(args.entityName) > 10"
    effect: deny
    reason: too many at once
  - name: cards
    match: { tools: [add_observations] }
    condition: "has_card_number(args.observations)"
    effect: deny
    reason: no cards
`)
	code, out, errs := runCLI(append([]string{"lint", ms, "--policy", pol}, up...)...)
	want := pol + `:5: memory/bulk-delete: rules[0].condition: the condition reads args.entityName, which no input schema of the tools it matches has (delete_entities: no argument "entityName" at the top level; it has entityNames)`
	if code != 1 || !strings.Contains(out, "error L043 "+want) || strings.Contains(out, "memory/cards") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s\nwant L043 %s", code, out, errs, want)
	}
}
