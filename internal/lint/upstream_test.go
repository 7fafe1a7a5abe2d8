package lint

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
)

func decodeSchema(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// The path rules of upstream.go, one schema feature each.
func TestMissingPath(t *testing.T) {
	const entities = `{"type":"object","properties":{"entities":{"type":"array","items":{"type":"object",
		"properties":{"name":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}}}}}},"required":["entities"]}`
	cases := []struct {
		name, schema, path string
		missing            string // substring of why; "" means found or cannot tell
	}{
		{"top-level", entities, "entities", ""},
		{"typo", entities, "entity", `no argument "entity" at the top level; it has entities`},
		{"index then field", entities, "entities.0.name", ""},
		{"index then typo", entities, "entities.3.nme", `no argument "nme" at entities.3; it has name, tags`},
		{"name on an array", entities, "entities.name", "entities is an array: use an index"},
		{"into a string", entities, "entities.0.name.x", `entities.0.name is string, which has no field "x"`},
		{"nested index", entities, "entities.0.tags.1", ""},
		{"empty properties", `{"type":"object","properties":{}}`, "x", `no argument "x" at the top level; it lists none`},
		{"object without properties", `{"type":"object"}`, "anything.deep", ""},
		{"empty schema", `{}`, "x", ""},
		{"additionalProperties true", `{"type":"object","properties":{"a":{}},"additionalProperties":true}`, "b.c", ""},
		{"additionalProperties schema", `{"type":"object","properties":{"a":{}},"additionalProperties":{"type":"object","properties":{"v":{}}}}`, "b.w", `no argument "w" at b`},
		{"additionalProperties false", `{"type":"object","additionalProperties":false}`, "a", `no argument "a"`},
		{"patternProperties", `{"type":"object","properties":{},"patternProperties":{"^x_":{"type":"string"}}}`, "x_1", ""},
		{"local ref", `{"type":"object","properties":{"o":{"$ref":"#/$defs/O"}},"$defs":{"O":{"type":"object","properties":{"id":{}}}}}`, "o.id", ""},
		{"local ref typo", `{"type":"object","properties":{"o":{"$ref":"#/$defs/O"}},"$defs":{"O":{"type":"object","properties":{"id":{}}}}}`, "o.idd", `no argument "idd" at o; it has id`},
		{"remote ref", `{"type":"object","properties":{"o":{"$ref":"https://example.invalid/s.json"}}}`, "o.zz", ""},
		{"ref cycle", `{"$ref":"#"}`, "a.b", ""},
		{"anyOf either branch", `{"anyOf":[{"type":"object","properties":{"a":{}}},{"type":"object","properties":{"b":{}}}]}`, "b", ""},
		{"anyOf no branch", `{"anyOf":[{"type":"object","properties":{"a":{}}},{"type":"object","properties":{"b":{}}}]}`, "c", `no argument "c"`},
		{"allOf with required only", `{"type":"object","properties":{"a":{}},"allOf":[{"required":["a"]}]}`, "z", `no argument "z"`},
		{"prefixItems", `{"type":"object","properties":{"p":{"type":"array","prefixItems":[{"type":"object","properties":{"k":{}}}]}}}`, "p.0.k", ""},
		{"false schema", `{"type":"object","properties":{"a":false}}`, "a.b", "the schema allows nothing at a"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := missingPath(decodeSchema(t, c.schema), c.path)
			if (c.missing == "") != (got == "") || !strings.Contains(got, c.missing) {
				t.Errorf("missingPath(%s) = %q, want %q", c.path, got, c.missing)
			}
		})
	}
}

// upstreamCodes are the codes TestUpstreamCodes triggers (TestLint checks the others).
var upstreamCodes = map[string]bool{"L017": true, "L020": true, "L027": true, "L033": true, "L034": true, "L035": true}

func TestUpstreamCodes(t *testing.T) {
	docs, errs := manifest.ParseFile("m.yaml", []byte(`
- tool: shop.order
  description: Order.
  effect: compensable
  permission: shop:write
  owner: o
  risk: {data_class: x}
  timeout_ms: 1s
  idempotency: {key: "o-{{args.sku}}-{{args.qty}}"}
  audit: {redaction: [$args.card, $result.card]}
  compensation:
    tool: shop.cancel
    residue: [an email]
    argument_map: {id: $result.id, sku: $args.skus}
- tool: shop.cancel
  description: Cancel.
  effect: idempotent
  permission: shop:write
  owner: o
  risk: {data_class: x}
  timeout_ms: 1s
  schema_hash: abc
- tool: shop.gone
  effect: read_only
  permission: shop:read
`))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	ms, errs := manifest.ValidateDocuments(docs)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	tools := []UpstreamTool{
		{Name: "shop.order", InputSchema: decodeSchema(t, `{"type":"object","properties":{"sku":{"type":"string"}}}`)},
		{Name: "shop.cancel", InputSchema: decodeSchema(t, `{"type":"object","properties":{"id":{}}}`)},
		{Name: "shop.list", InputSchema: decodeSchema(t, `{"type":"object"}`)},
	}
	var got []string
	for _, f := range Upstream(ms, tools) {
		got = append(got, f.Code+" "+f.Tool+" "+f.Path)
	}
	want := []string{
		"L017 shop.order compensation.argument_map.sku",
		"L020 shop.order idempotency.key",
		"L033 shop.order audit.redaction[0]",
		"L027 shop.order schema_hash",
		"L034 shop.gone tool",
		"L035 shop.list ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("findings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	all := WithUpstream(ms, tools)
	for i := 1; i < len(all); i++ {
		if all[i-1].Tool > all[i].Tool {
			t.Fatalf("not sorted by tool: %v", all)
		}
	}
	if f := all[0]; f.String() == "" || Rules[f.Code].Level != f.Level {
		t.Errorf("finding %+v", f)
	}
}
