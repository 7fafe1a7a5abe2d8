package manifest

import (
	"reflect"
	"testing"
)

// TestResolveWildcard covers the `*` segment (see Wildcard): server-memory's create_entities
// arguments mapped to delete_entities' list of names, and the cases that must be missing.
func TestResolveWildcard(t *testing.T) {
	args := map[string]any{
		"entities": []any{
			map[string]any{"name": "alice", "entityType": "person", "observations": []any{"a", "b"}},
			map[string]any{"name": "bob", "entityType": "person", "observations": []any{}},
		},
		"relations": []any{map[string]any{"from": "alice", "to": "bob", "relationType": "knows"}},
		"partial":   []any{map[string]any{"name": "x"}, map[string]any{"other": 1}},
		"nulls":     []any{map[string]any{"name": nil}},
		"empty":     []any{},
		"object":    map[string]any{"name": "x"},
	}
	for _, tc := range []struct {
		ref  string
		want any
		ok   bool
	}{
		{"$args.entities.*.name", []any{"alice", "bob"}, true},
		{"$args.entities.*.observations.0", nil, false}, // bob has none: missing, not guessed
		{"$args.entities.*.observations", []any{[]any{"a", "b"}, []any{}}, true},
		{"$args.relations.*.from", []any{"alice"}, true},
		{"$args.relations", args["relations"], true},
		{"$args.partial.*.name", nil, false},
		{"$args.nulls.*.name", nil, false},
		{"$args.empty.*.name", []any{}, true},
		{"$args.object.*", nil, false}, // * maps arrays only
		{"$args.entities.1.name", "bob", true},
		{"$result.entities.*.name", []any{"alice", "bob"}, true},
	} {
		got, ok := Resolve(tc.ref, args, args)
		if ok != tc.ok || (ok && !reflect.DeepEqual(got, tc.want)) {
			t.Errorf("Resolve(%s) = %#v, %v; want %#v, %v", tc.ref, got, ok, tc.want, tc.ok)
		}
	}
	// The step is planned with the mapped list; a missing element makes it unrecoverable.
	m := &Manifest{Tool: "mem.create_entities", Effect: Reversible, Compensation: &Compensation{
		Tool: "mem.delete_entities", Kind: KindInverse, ArgumentMap: map[string]string{"entityNames": "$args.entities.*.name"}}}
	ps := PlanStep(m, Succeeded, args, nil)
	if ps.Action != PlanCompensate || !reflect.DeepEqual(ps.Handle, map[string]any{"entityNames": []any{"alice", "bob"}}) {
		t.Errorf("plan %+v", ps)
	}
	ps = PlanStep(m, Succeeded, map[string]any{"entities": []any{map[string]any{"entityType": "x"}}}, nil)
	if ps.Action != PlanUnrecoverable || !reflect.DeepEqual(ps.Missing, []string{"$args.entities.*.name"}) {
		t.Errorf("plan without names %+v", ps)
	}
}

// TestWildcardReferenceValidates: the validator and the JSON schema accept `*` segments.
func TestWildcardReferenceValidates(t *testing.T) {
	raw := map[string]any{"tool": "mem.create_entities", "effect": "reversible", "permission": "mem:write",
		"compensation": map[string]any{"tool": "mem.delete_entities", "kind": "inverse",
			"argument_map": map[string]any{"entityNames": "$result.entities.*.name"},
			"verification": map[string]any{"tool": "mem.open_nodes", "arguments": map[string]any{"names": "$args.entities.*.name"},
				"expect": map[string]any{"entities": []any{}}}}}
	m, errs := Validate(raw)
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	if m.Compensation.ArgumentMap["entityNames"] != "$result.entities.*.name" {
		t.Errorf("argument_map %v", m.Compensation.ArgumentMap)
	}
}
