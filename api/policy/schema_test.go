package policy

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/schemas"
)

// schemas/policy.schema.json and the Go decoder agree: the fixtures pass both, every invalid
// case below is refused by both (except those marked go-only, which the schema must accept,
// so a stale mark fails), and every object of the schema is closed with the Go field list.

func policySchema(t *testing.T) (*jsonschema.Schema, map[string]any) {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schemas.PolicySchema))
	if err != nil {
		t.Fatal(err)
	}
	raw := doc.(map[string]any)
	c := jsonschema.NewCompiler()
	if err := c.AddResource(raw["$id"].(string), doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(raw["$id"].(string))
	if err != nil {
		t.Fatal(err)
	}
	return sch, raw
}

func asJSON(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

const okRule = "{name: r, effect: deny, reason: x}"

func TestPolicySchemaAgreesWithDecoder(t *testing.T) {
	sch, _ := policySchema(t)
	ps, errs := ReadPaths(fixtures)
	if len(errs) > 0 || len(ps) != 4 {
		t.Fatal(errs)
	}
	docs, _ := manifest.ReadPaths(fixtures)
	for _, d := range docs {
		if err := sch.Validate(asJSON(t, d.Value)); err != nil {
			t.Errorf("%s: the schema refuses a valid policy: %v", d.File, err)
		}
	}
	cases := []struct {
		name, yaml, goOnly string
	}{
		{"no name", "rules: [" + okRule + "]", ""},
		{"bad name", "policy: a/b\nrules: [" + okRule + "]", ""},
		{"unknown top field", "policy: p\nrule: []\nrules: [" + okRule + "]", ""},
		{"no rules", "policy: p\nrules: []", ""},
		{"allow effect", "policy: p\nrules: [{name: r, effect: allow}]", ""},
		{"deny without reason", "policy: p\nrules: [{name: r, effect: deny}]", ""},
		{"advise without reason", "policy: p\nrules: [{name: r, effect: advise}]", ""},
		{"empty reason", "policy: p\nrules: [{name: r, effect: deny, reason: ' '}]", ""},
		{"unknown rule field", "policy: p\nrules: [{name: r, effect: deny, reason: x, when: y}]", ""},
		{"unknown match field", "policy: p\nrules: [{name: r, effect: deny, reason: x, match: {tool: [a]}}]", ""},
		{"bad match effect", "policy: p\nrules: [{name: r, effect: deny, reason: x, match: {effects: [deleting]}}]", ""},
		{"bad blast radius", "policy: p\nrules: [{name: r, effect: deny, reason: x, match: {risk: {blast_radius: [huge]}}}]", ""},
		{"empty condition", "policy: p\nrules: [{name: r, effect: deny, reason: x, condition: ''}]", ""},
		{"limit without limit", "policy: p\nrules: [{name: r, effect: limit}]", ""},
		{"limit on deny", "policy: p\nrules: [{name: r, effect: deny, reason: x, limit: {max: 1, per: run}}]", ""},
		{"limit max 0", "policy: p\nrules: [{name: r, effect: limit, limit: {max: 0, per: run}}]", ""},
		{"limit per actor without window", "policy: p\nrules: [{name: r, effect: limit, limit: {max: 1, per: actor}}]", ""},
		{"limit bad scope", "policy: p\nrules: [{name: r, effect: limit, limit: {max: 1, per: day}}]", ""},
		{"limit bad window", "policy: p\nrules: [{name: r, effect: limit, limit: {max: 1, per: run, window: soon}}]", ""},
		{"approval on deny", "policy: p\nrules: [{name: r, effect: deny, reason: x, approval: {roles: [a]}}]", ""},
		{"approval required field", "policy: p\nrules: [{name: r, effect: require_approval, approval: {required: true}}]", ""},
		{"approval quorum without roles", "policy: p\nrules: [{name: r, effect: require_approval, approval: {quorum: 2}}]", ""},
		{"approval quorum 11", "policy: p\nrules: [{name: r, effect: require_approval, approval: {roles: [a], quorum: 11}}]", ""},
		{"approval escalate without escalate_to", "policy: p\nrules: [{name: r, effect: require_approval, approval: {on_timeout: escalate}}]", ""},
		{"test without expect", "policy: p\nrules: [" + okRule + "]\ntests: [{name: t, tool: a}]", ""},
		{"test bad expect", "policy: p\nrules: [" + okRule + "]\ntests: [{name: t, tool: a, expect: limit_exceeded}]", ""},
		{"test bad now", "policy: p\nrules: [" + okRule + "]\ntests: [{name: t, tool: a, expect: allow, now: '2026-12-04'}]", ""},
		{"test bad step status", "policy: p\nrules: [" + okRule + "]\ntests: [{name: t, tool: a, expect: allow, run: {steps: [{tool: a, status: ok}]}}]", ""},
		{"test unknown field", "policy: p\nrules: [" + okRule + "]\ntests: [{name: t, tool: a, expect: allow, expected: deny}]", ""},
		{"expect_approval without require_approval", "policy: p\nrules: [" + okRule + "]\ntests: [{name: t, tool: a, expect: allow, expect_approval: {quorum: 2}}]", ""},
		{"duplicate rule names", "policy: p\nrules: [" + okRule + ", " + okRule + "]", "uniqueness by a field"},
		{"bad glob", "policy: p\nrules: [{name: r, effect: deny, reason: x, match: {tools: ['[a']}}]", "path.Match syntax"},
		{"unknown expect rule", "policy: p\nrules: [" + okRule + "]\ntests: [{name: t, tool: a, expect: allow, expect_rules: [nope]}]", "names across fields"},
		{"fractional duration", "policy: p\nrules: [{name: r, effect: limit, limit: {max: 1, per: run, window: 1.0005s}}]", "exact milliseconds"},
	}
	goOnly := 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			docs, perrs := manifest.ParseFile("p.yaml", []byte(c.yaml))
			if len(perrs) > 0 || len(docs) != 1 {
				t.Fatalf("fixture: %v", perrs)
			}
			if _, errs := Decode(docs); len(errs) == 0 {
				t.Fatal("the decoder accepts the case")
			}
			err := sch.Validate(asJSON(t, docs[0].Value))
			if c.goOnly != "" {
				goOnly++
				if err != nil {
					t.Fatalf("marked go-only (%s) but the schema refuses it: drop the mark\n%v", c.goOnly, err)
				}
				return
			}
			if err == nil {
				t.Fatal("the schema accepts what the decoder refuses")
			}
		})
	}
	if goOnly < 3 {
		t.Errorf("only %d go-only cases", goOnly)
	}
}

// Every closed object lists exactly the Go decoder's fields, each described; the enums are Go's.
func TestPolicySchemaMirrorsGoFields(t *testing.T) {
	_, raw := policySchema(t)
	at := func(path ...string) map[string]any {
		var v any = raw
		for _, p := range path {
			v = v.(map[string]any)[p]
		}
		return v.(map[string]any)
	}
	objects := map[string]struct {
		obj    map[string]any
		fields []string
	}{
		"policy":          {raw, PolicyFields},
		"rule":            {at("$defs", "rule"), RuleFields},
		"match":           {at("$defs", "rule", "properties", "match"), MatchFields},
		"risk":            {at("$defs", "rule", "properties", "match", "properties", "risk"), RiskMatchFields},
		"approval":        {at("$defs", "rule", "properties", "approval"), manifest.ApprovalRuleFields},
		"limit":           {at("$defs", "rule", "properties", "limit"), LimitFields},
		"test":            {at("$defs", "test"), TestFields},
		"actor":           {at("$defs", "test", "properties", "actor"), ActorFields},
		"run":             {at("$defs", "test", "properties", "run"), RunFields},
		"step":            {at("$defs", "step"), StepFields},
		"expect_approval": {at("$defs", "test", "properties", "expect_approval"), ExpectApprovalFields},
	}
	for name, o := range objects {
		if o.obj["type"] != "object" || o.obj["additionalProperties"] != false {
			t.Errorf("%s: not a closed object", name)
		}
		var keys []string
		for k, p := range o.obj["properties"].(map[string]any) {
			keys = append(keys, k)
			if d, _ := p.(map[string]any)["description"].(string); strings.TrimSpace(d) == "" {
				t.Errorf("%s.%s has no description", name, k)
			}
		}
		if !slices.Equal(slices.Sorted(slices.Values(keys)), slices.Sorted(slices.Values(o.fields))) {
			t.Errorf("%s: schema fields %v, Go fields %v", name, slices.Sorted(slices.Values(keys)), o.fields)
		}
	}
	enum := func(m map[string]any) []string {
		var out []string
		for _, v := range m["enum"].([]any) {
			out = append(out, v.(string))
		}
		return out
	}
	strs := func(xs any) []string {
		var out []string
		switch x := xs.(type) {
		case []Effect:
			for _, e := range x {
				out = append(out, string(e))
			}
		case []LimitScope:
			for _, e := range x {
				out = append(out, string(e))
			}
		case []Decision:
			for _, e := range x {
				out = append(out, string(e))
			}
		case []manifest.Effect:
			for _, e := range x {
				out = append(out, string(e))
			}
		case []string:
			out = x
		}
		return out
	}
	for name, c := range map[string]struct {
		got  []string
		want any
	}{
		"effect":       {enum(at("$defs", "rule", "properties", "effect")), Effects},
		"per":          {enum(at("$defs", "rule", "properties", "limit", "properties", "per")), LimitScopes},
		"expect":       {enum(at("$defs", "test", "properties", "expect")), Decisions},
		"status":       {enum(at("$defs", "step", "properties", "status")), StepStatuses},
		"match effect": {enum(at("$defs", "rule", "properties", "match", "properties", "effects", "items")), manifest.Effects},
		"blast radius": {enum(at("$defs", "rule", "properties", "match", "properties", "risk", "properties", "blast_radius", "items")), manifest.BlastRadii},
		"on_timeout":   {enum(at("$defs", "rule", "properties", "approval", "properties", "on_timeout")), manifest.OnTimeouts},
	} {
		if !slices.Equal(c.got, strs(c.want)) {
			t.Errorf("enum %s: schema %v, Go %v", name, c.got, strs(c.want))
		}
	}
}
