package upstreams

// MemoryRollbackManifests describe server-memory with its tools namespaced `mem.` (gateway
// upstream "mem"): reads, and create_entities and create_relations undone by their delete
// tools (`$args.entities.*.name` maps the created objects to names), read back with
// open_nodes. The rollback tests of internal/cli and test/e2e/runs share it (issues 6 and 8).
const MemoryRollbackManifests = `
- tool: mem.read_graph
  description: Read the whole knowledge graph.
  effect: read_only
  permission: mem:read
- tool: mem.open_nodes
  description: Read entities by name.
  effect: read_only
  permission: mem:read
- tool: mem.create_entities
  description: Create entities (existing names are left alone and not returned).
  effect: reversible
  permission: mem:write
  compensation:
    tool: mem.delete_entities
    kind: inverse
    argument_map:
      entityNames: $result.entities.*.name
    verification:
      tool: mem.open_nodes
      arguments: { names: $result.entities.*.name }
      expect: { entities: [] }
      retries: 3
      backoff_ms: 50ms
- tool: mem.create_relations
  description: Create relations between existing entities.
  effect: reversible
  permission: mem:write
  requires: [mem.create_entities]
  compensation:
    tool: mem.delete_relations
    kind: inverse
    argument_map:
      relations: $result.relations
    verification:
      tool: mem.open_nodes
      arguments: { names: $result.relations.*.from }
      expect: { relations: [] }
      backoff_ms: 50ms
- tool: mem.delete_entities
  description: Delete entities and their relations.
  effect: idempotent
  permission: mem:admin
- tool: mem.delete_relations
  description: Delete relations.
  effect: idempotent
  permission: mem:admin
`
