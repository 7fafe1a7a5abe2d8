package lint

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
)

type obj = map[string]any

// absent removes a default field in tool().
var absent = struct{}{}

// tool builds a raw manifest that is clean for its effect (no finding of its own), then
// applies key/value overrides; a value of absent deletes the key.
func tool(name string, effect manifest.Effect, kv ...any) obj {
	m := obj{"tool": name, "description": "Does " + name + ".", "effect": string(effect), "permission": "p:read"}
	if effect.Mutating() {
		m["permission"] = "p:write"
		m["owner"] = "team@example.com"
		m["risk"] = obj{"data_class": "internal"}
		m["timeout_ms"] = "5s"
	}
	verification := obj{"tool": "check", "arguments": obj{"id": "$result.id"}, "expect": obj{"done": true}}
	switch effect {
	case manifest.Reversible:
		m["compensation"] = obj{"tool": "undo", "kind": "inverse", "argument_map": obj{"id": "$result.id"}, "verification": verification}
	case manifest.Compensable:
		m["compensation"] = obj{"tool": "undo", "residue": []any{"a notice was sent"}, "argument_map": obj{"id": "$result.id"}, "verification": verification}
	case manifest.Irreversible:
		m["risk"] = obj{"data_class": "internal", "blast_radius": "low"}
		m["audit"] = obj{"evidence_export": "required"}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == absent {
			delete(m, kv[i].(string))
		} else {
			m[kv[i].(string)] = kv[i+1]
		}
	}
	return m
}

// set validates raws plus the clean tools `undo` (idempotent) and `check` (read_only, the
// read-back) that tool()'s compensations name. Invalid fixtures fail the test: lint only
// ever sees valid sets.
func set(t *testing.T, raws ...obj) []*manifest.Manifest {
	t.Helper()
	raws = append(raws, tool("undo", manifest.Idempotent), tool("check", manifest.ReadOnly))
	var ms []*manifest.Manifest
	for _, r := range raws {
		m, errs := manifest.Validate(r)
		if len(errs) > 0 {
			t.Fatalf("fixture %v is invalid: %v", r["tool"], errs)
		}
		ms = append(ms, m)
	}
	if errs := manifest.ValidateSet(ms); len(errs) > 0 {
		t.Fatalf("fixture set is invalid: %v", errs)
	}
	return ms
}

func lines(fs []Finding) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.String()
	}
	return out
}

func TestLint(t *testing.T) {
	cases := []struct {
		name string
		raws []obj
		want []string
	}{
		{"clean tools of every effect", []obj{
			tool("a.read", manifest.ReadOnly),
			tool("a.idem", manifest.Idempotent),
			tool("a.rev", manifest.Reversible),
			tool("a.comp", manifest.Compensable),
			tool("a.irrev", manifest.Irreversible),
		}, nil},

		{"L010 mutating tool without description", []obj{tool("t", manifest.Idempotent, "description", absent)}, []string{
			"warning L010 t: mutating tool has no description: reviewers cannot tell what it changes",
		}},
		{"L010 blank description counts as none", []obj{tool("t", manifest.Idempotent, "description", "  ")}, []string{
			"warning L010 t: mutating tool has no description: reviewers cannot tell what it changes",
		}},
		{"L010 L012 L022 not for read_only", []obj{tool("t", manifest.ReadOnly, "description", absent)}, nil},

		{"L011 no owner, no oncall", []obj{tool("t", manifest.Idempotent, "owner", absent)}, []string{
			"warning L011 t: mutating tool has no owner: nobody is named to ask when it misbehaves",
		}},
		{"L011 an oncall is someone to ask", []obj{tool("t", manifest.Idempotent, "owner", absent, "oncall", "t-oncall")}, nil},

		{"L012 no risk", []obj{tool("t", manifest.Idempotent, "risk", absent)}, []string{
			"warning L012 t: no risk.data_class: policy and retention cannot treat sensitive data differently",
		}},
		{"L012 risk without data_class", []obj{tool("t", manifest.Idempotent, "risk", obj{"blast_radius": "low"})}, []string{
			"warning L012 t: no risk.data_class: policy and retention cannot treat sensitive data differently",
		}},

		{"L013 compensable without residue", []obj{tool("t", manifest.Compensable, "compensation",
			obj{"tool": "undo", "argument_map": obj{"id": "$args.id"}, "verification": obj{"tool": "check", "expect": obj{"x": 1}}})}, []string{
			"warning L013 t: compensable but the compensation declares no residue: a reviewer cannot see what a rollback leaves behind",
		}},

		{"L014 compensation tools that are not idempotent", []obj{
			tool("r1", manifest.Reversible, "compensation", obj{"tool": "r2", "argument_map": obj{"id": "$args.id"}, "verification": obj{"tool": "check", "expect": obj{"x": 1}}}),
			tool("r2", manifest.Reversible, "compensation", obj{"tool": "r1", "argument_map": obj{"id": "$args.id"}, "verification": obj{"tool": "check", "expect": obj{"x": 1}}}),
		}, []string{
			"warning L014 r1: compensation tool r2 is reversible, not idempotent: rollback retries it, so a retry may repeat the undo",
			"warning L014 r2: compensation tool r1 is reversible, not idempotent: rollback retries it, so a retry may repeat the undo",
		}},
		{"L014 a read_only compensation tool is safe to retry", []obj{
			tool("t", manifest.Reversible, "compensation", obj{"tool": "check", "argument_map": obj{"id": "$args.id"}, "verification": obj{"tool": "check", "expect": obj{"x": 1}}}),
		}, nil},

		{"L015 irreversible, no blast_radius, no approvers", []obj{tool("t", manifest.Irreversible, "risk", obj{"data_class": "pii"})}, []string{
			"warning L015 t: irreversible with no risk.blast_radius and no approval roles: nothing tells an approver how much it can break, and anyone may approve it",
		}},
		{"L015 approval without roles is still no approvers", []obj{tool("t", manifest.Irreversible, "risk", obj{"data_class": "pii"}, "approval", obj{"timeout": "1h"})}, []string{
			"warning L015 t: irreversible with no risk.blast_radius and no approval roles: nothing tells an approver how much it can break, and anyone may approve it",
		}},
		{"L015 roles are enough", []obj{tool("t", manifest.Irreversible, "risk", obj{"data_class": "pii"}, "approval", obj{"roles": []any{"ops"}})}, nil},

		{"L016 undo not verified", []obj{tool("t", manifest.Reversible, "compensation", obj{"tool": "undo", "argument_map": obj{"id": "$args.id"}})}, []string{
			"info L016 t: the undo is not verified: an API can answer ok and do nothing, and the rollback still counts as done",
		}},

		{"L019 read-only tool shares a permission with mutating tools", []obj{
			tool("peek", manifest.ReadOnly, "permission", "p:write"),
			tool("other.read", manifest.ReadOnly, "permission", "p:write"),
		}, []string{
			"warning L019 other.read: read-only tool shares permission p:write with mutating tools undo: a scope that allows the read also allows the change",
			"warning L019 peek: read-only tool shares permission p:write with mutating tools undo: a scope that allows the read also allows the change",
		}},
		{"L019 names every mutating tool, sorted", []obj{
			tool("peek", manifest.ReadOnly, "permission", "p:write"),
			tool("a.write", manifest.Idempotent),
		}, []string{
			"warning L019 peek: read-only tool shares permission p:write with mutating tools a.write, undo: a scope that allows the read also allows the change",
		}},
		{"L019 read-only tools may share with each other", []obj{tool("peek", manifest.ReadOnly)}, nil},

		{"L021 irreversible without audit", []obj{tool("t", manifest.Irreversible, "audit", absent)}, []string{
			"info L021 t: irreversible without audit.evidence_export: required: what it did cannot be undone, so evidence of it should not be optional",
		}},
		{"L021 optional evidence", []obj{tool("t", manifest.Irreversible, "audit", obj{"evidence_export": "optional"})}, []string{
			"info L021 t: irreversible without audit.evidence_export: required: what it did cannot be undone, so evidence of it should not be optional",
		}},

		{"L022 mutating without timeout", []obj{tool("t", manifest.Idempotent, "timeout_ms", absent)}, []string{
			"info L022 t: no timeout_ms: a hung call is only bounded by the gateway default",
		}},

		{"L023 two-tool cycle", []obj{
			tool("a", manifest.Idempotent, "requires", []any{"b"}),
			tool("b", manifest.Idempotent, "requires", []any{obj{"tool": "a"}}),
		}, []string{
			"error L023 a: requires forms a cycle a -> b -> a: no tool in it can be called, since each waits for another to succeed first",
		}},
		{"L023 named from its smallest tool, entered elsewhere", []obj{
			tool("a", manifest.Idempotent, "requires", []any{"m"}),
			tool("m", manifest.Idempotent, "requires", []any{"c"}),
			tool("c", manifest.Idempotent, "requires", []any{"m"}),
		}, []string{
			"error L023 c: requires forms a cycle c -> m -> c: no tool in it can be called, since each waits for another to succeed first",
		}},
		{"L023 overlapping cycles each once", []obj{
			tool("a", manifest.Idempotent, "requires", []any{"b"}),
			tool("b", manifest.Idempotent, "requires", []any{"a", "c"}),
			tool("c", manifest.Idempotent, "requires", []any{"a"}),
		}, []string{
			"error L023 a: requires forms a cycle a -> b -> a: no tool in it can be called, since each waits for another to succeed first",
			"error L023 a: requires forms a cycle a -> b -> c -> a: no tool in it can be called, since each waits for another to succeed first",
		}},
		{"L023 a diamond is no cycle", []obj{
			tool("a", manifest.Idempotent, "requires", []any{"b", "c"}),
			tool("b", manifest.Idempotent, "requires", []any{"d"}),
			tool("c", manifest.Idempotent, "requires", []any{"d"}),
			tool("d", manifest.Idempotent),
		}, nil},

		{"L024 draft", []obj{tool("t", manifest.ReadOnly, "status", "draft")}, []string{
			"warning L024 t: draft manifest: calls to the tool are blocked until a reviewer approves it",
		}},
		{"L024 deprecated is no draft", []obj{tool("t", manifest.ReadOnly, "status", "deprecated")}, nil},

		{"L030 reversible with residue", []obj{tool("t", manifest.Reversible, "compensation",
			obj{"tool": "undo", "residue": []any{"a log line"}, "argument_map": obj{"id": "$args.id"}, "verification": obj{"tool": "check", "expect": obj{"x": 1}}})}, []string{
			"warning L030 t: declared reversible but the compensation lists residue: a true inverse leaves nothing behind, so the effect and the residue contradict each other",
		}},

		{"L031 compensable with an exact inverse, and no L013", []obj{tool("t", manifest.Compensable, "compensation",
			obj{"tool": "undo", "kind": "inverse", "argument_map": obj{"id": "$args.id"}, "verification": obj{"tool": "check", "expect": obj{"x": 1}}})}, []string{
			"warning L031 t: declared compensable but the compensation is an exact inverse: make it reversible if the undo restores the exact prior state, else use kind: compensation and list the residue",
		}},

		{"L032 no argument_map", []obj{tool("t", manifest.Reversible, "compensation",
			obj{"tool": "undo", "verification": obj{"tool": "check", "expect": obj{"x": 1}}})}, []string{
			"info L032 t: compensation takes no arguments from the call: the undo cannot tell which change to take back",
		}},
		{"L032 empty argument_map", []obj{tool("t", manifest.Reversible, "compensation",
			obj{"tool": "undo", "argument_map": obj{}, "verification": obj{"tool": "check", "expect": obj{"x": 1}}})}, []string{
			"info L032 t: compensation takes no arguments from the call: the undo cannot tell which change to take back",
		}},

		{"sorted by tool, then code", []obj{
			tool("z", manifest.Irreversible, "owner", absent, "risk", absent, "timeout_ms", absent, "audit", absent, "description", absent),
			tool("b", manifest.Idempotent, "timeout_ms", absent, "status", "draft"),
		}, []string{
			"info L022 b: no timeout_ms: a hung call is only bounded by the gateway default",
			"warning L024 b: draft manifest: calls to the tool are blocked until a reviewer approves it",
			"warning L010 z: mutating tool has no description: reviewers cannot tell what it changes",
			"warning L011 z: mutating tool has no owner: nobody is named to ask when it misbehaves",
			"warning L012 z: no risk.data_class: policy and retention cannot treat sensitive data differently",
			"warning L015 z: irreversible with no risk.blast_radius and no approval roles: nothing tells an approver how much it can break, and anyone may approve it",
			"info L021 z: irreversible without audit.evidence_export: required: what it did cannot be undone, so evidence of it should not be optional",
			"info L022 z: no timeout_ms: a hung call is only bounded by the gateway default",
		}},
	}
	covered := map[string]bool{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := lines(Lint(set(t, tc.raws...)))
			if !slices.Equal(got, tc.want) {
				t.Errorf("findings:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
		for _, w := range tc.want {
			covered[strings.Fields(w)[1]] = true
		}
	}
	// Every code of the table has a case that triggers it (the upstream codes in upstream_test.go).
	for code := range Rules {
		if !covered[code] && !upstreamCodes[code] && !policyCodes[code] {
			t.Errorf("no case triggers %s", code)
		}
	}
}

func TestFindingFields(t *testing.T) {
	fs := Lint(set(t, tool("a", manifest.Idempotent, "requires", []any{"b"}), tool("b", manifest.Idempotent, "requires", []any{"a"})))
	want := Finding{Level: Error, Code: "L023", Tool: "a", Path: "requires",
		Message: "requires forms a cycle a -> b -> a: no tool in it can be called, since each waits for another to succeed first"}
	if len(fs) != 1 || fs[0] != want {
		t.Fatalf("findings = %+v, want [%+v]", fs, want)
	}
}

// The seed's own example: payments.yaml gives L011, L012 and L022 for stripe.refund only.
func TestSeedExample(t *testing.T) {
	const file = "../../test/fixtures/manifests/payments.yaml"
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	docs, perrs := manifest.ParseFile(file, data)
	if len(perrs) > 0 {
		t.Fatal(perrs)
	}
	ms, errs := manifest.ValidateDocuments(docs)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	fs := Lint(ms)
	got := append(lines(fs), Summary(fs))
	want := []string{
		"warning L011 stripe.refund: mutating tool has no owner: nobody is named to ask when it misbehaves",
		"warning L012 stripe.refund: no risk.data_class: policy and retention cannot treat sensitive data differently",
		"info L022 stripe.refund: no timeout_ms: a hung call is only bounded by the gateway default",
		"0 errors, 2 warnings, 1 notes",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestSummary(t *testing.T) {
	fs := []Finding{{Level: Error}, {Level: Warning}, {Level: Warning}, {Level: Info}, {Level: Error}, {Level: Error}}
	if got, want := Summary(fs), "3 errors, 2 warnings, 1 notes"; got != want {
		t.Errorf("Summary = %q, want %q", got, want)
	}
	// Plural words even for one and zero, as in the seed's "1 notes".
	if got, want := Summary([]Finding{{Level: Error}}), "1 errors, 0 warnings, 0 notes"; got != want {
		t.Errorf("Summary = %q, want %q", got, want)
	}
}

func TestRulesTable(t *testing.T) {
	for code, r := range Rules {
		if r.Level != Error && r.Level != Warning && r.Level != Info {
			t.Errorf("%s: level %q", code, r.Level)
		}
		if r.What == "" || r.Why == "" {
			t.Errorf("%s: message needs a what and a why", code)
		}
	}
	// The seed's levels.
	want := map[string]Level{
		"L010": Warning, "L011": Warning, "L012": Warning, "L013": Warning, "L014": Warning,
		"L015": Warning, "L016": Info, "L019": Warning, "L021": Info, "L022": Info,
		"L023": Error, "L024": Warning, "L030": Warning, "L031": Warning, "L032": Info,
		"L017": Error, "L020": Error, "L027": Info, "L033": Warning, "L034": Warning, "L035": Warning,
		// The policy codes (issue 21; the levels are the project's).
		"L040": Error, "L041": Error, "L042": Warning, "L043": Error,
	}
	if len(Rules) != len(want) {
		t.Errorf("Rules has %d codes, want %d", len(Rules), len(want))
	}
	for code, lvl := range want {
		if Rules[code].Level != lvl {
			t.Errorf("%s level = %q, want %q (seed)", code, Rules[code].Level, lvl)
		}
	}
}
