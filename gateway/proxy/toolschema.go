package proxy

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Portable schemas for the gateway's own reversi.* tools (issue 19). jsonschema-go infers a Go
// slice, map or pointer as `"type": ["null", X]`: legal JSON Schema, but a client that maps tool
// schemas onto a one-type dialect (the OpenAPI subset of Gemini's function declarations) may
// refuse the tool or drop the constraint, and `inspector --cli --strict` warns about each. The
// wire stays what it was; only its description changes:
//
//   - a property that is not required (its Go field has omitempty, so a nil value is left out,
//     never sent as null) gets the one type X;
//   - a required property, an array's items and a map's values, which can be null, become
//     `{"anyOf": [{"type": "null"}, {"type": X, ...}]}`, the spelling the Inspector suggests.

// addTool is mcp.AddTool with portable schemas: t.InputSchema (schemaFor[In] when nil) and the
// output schema inferred from Out, as mcp.AddTool infers it, both made portable. The SDK still
// validates arguments and results against them.
func addTool[In, Out any](s *mcp.Server, t *mcp.Tool, h mcp.ToolHandlerFor[In, Out]) {
	if t.InputSchema == nil {
		t.InputSchema = schemaFor[In](nil)
	}
	in, ok := t.InputSchema.(*jsonschema.Schema)
	if !ok {
		panic(fmt.Sprintf("tool %s: the input schema is a %T, not a *jsonschema.Schema", t.Name, t.InputSchema))
	}
	portable(in)
	rt := reflect.TypeFor[Out]()
	if rt.Kind() == reflect.Pointer { // the SDK sends a nil *T as T's zero value
		rt = rt.Elem()
	}
	out, err := jsonschema.ForType(rt, &jsonschema.ForOptions{})
	if err != nil {
		panic(fmt.Sprintf("tool %s: output schema of %v: %v", t.Name, rt, err)) // fixed types: a programming error
	}
	portable(out)
	t.OutputSchema = out
	mcp.AddTool(s, t, h)
}

// portable rewrites s and the schemas below it as described above.
func portable(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	for name, p := range s.Properties {
		portable(p)
		if x, ok := nullOr(p); ok {
			if slices.Contains(s.Required, name) {
				s.Properties[name] = anyOfNull(p, x)
			} else {
				p.Types, p.Type = nil, x
			}
		}
	}
	for _, sub := range []**jsonschema.Schema{&s.Items, &s.AdditionalProperties} {
		portable(*sub)
		if x, ok := nullOr(*sub); ok {
			*sub = anyOfNull(*sub, x)
		}
	}
	for _, l := range [][]*jsonschema.Schema{s.AnyOf, s.OneOf, s.AllOf, s.PrefixItems} {
		for _, sub := range l {
			portable(sub)
		}
	}
	for _, sub := range s.Defs {
		portable(sub)
	}
}

// nullOr reports X when s's types are exactly null and X.
func nullOr(s *jsonschema.Schema) (string, bool) {
	if s == nil || len(s.Types) != 2 || !slices.Contains(s.Types, "null") {
		return "", false
	}
	if s.Types[0] == "null" {
		return s.Types[1], true
	}
	return s.Types[0], true
}

// anyOfNull is s as anyOf null or s with the one type x; s's description stays on the whole.
func anyOfNull(s *jsonschema.Schema, x string) *jsonschema.Schema {
	branch := s.CloneSchemas()
	branch.Types, branch.Type, branch.Description = nil, x, ""
	return &jsonschema.Schema{Description: s.Description, AnyOf: []*jsonschema.Schema{{Type: "null"}, branch}}
}
