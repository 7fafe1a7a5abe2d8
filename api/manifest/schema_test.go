package manifest

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/reversi-gitops/reversi/schemas"
)

// schemas/manifest.schema.json and the Go validator must agree on every single-manifest
// fixture of the rule table: the schema refuses what Validate refuses, except the rules
// marked go-only, which the schema must accept (so a stale mark fails).

func manifestSchema(t *testing.T) (*jsonschema.Schema, map[string]any) {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schemas.ManifestSchema))
	if err != nil {
		t.Fatal(err)
	}
	raw := doc.(map[string]any)
	id := raw["$id"].(string)
	c := jsonschema.NewCompiler()
	if err := c.AddResource(id, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(id)
	if err != nil {
		t.Fatal(err)
	}
	return sch, raw
}

// asJSON turns a parsed document into what a JSON reader would give the schema.
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

func singleDoc(t *testing.T, y string) Document {
	t.Helper()
	docs, err := ParseFile(rulesFile, []byte(y))
	if err != nil || len(docs) != 1 {
		t.Fatalf("fixture: %v (%d documents)", err, len(docs))
	}
	return docs[0]
}

func TestSchemaAgreesWithValidator(t *testing.T) {
	sch, _ := manifestSchema(t)
	n, goOnly := 0, 0
	for _, c := range ruleCases() {
		if c.kind != single {
			continue
		}
		n++
		if c.goOnly != "" {
			goOnly++
		}
		t.Run(c.name, func(t *testing.T) {
			d := singleDoc(t, c.yaml)
			_, goErrs := Validate(d.Value)
			if len(goErrs) == 0 {
				t.Fatal("Validate accepts the fixture")
			}
			err := sch.Validate(asJSON(t, d.Value))
			if c.goOnly != "" {
				if err != nil {
					t.Fatalf("marked go-only (%s) but the schema refuses it now: drop the mark\n%v", c.goOnly, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("the schema accepts what Validate refuses: %v", goErrs)
			}
			ve, ok := err.(*jsonschema.ValidationError)
			if !ok {
				t.Fatalf("schema error %T: %v", err, err)
			}
			if !samePlace(goErrs, leaves(ve)) {
				t.Errorf("the schema refuses something else than Validate:\nGo: %v\nschema: %v", goErrs, err)
			}
		})
	}
	if n < 150 || goOnly < 10 {
		t.Errorf("only %d single-manifest cases (%d go-only)", n, goOnly)
	}
}

func TestSchemaAcceptsValid(t *testing.T) {
	sch, _ := manifestSchema(t)
	seed, err := os.ReadFile("../../test/fixtures/manifests/payments.yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs, perrs := ParseFile("payments.yaml", seed)
	if len(perrs) > 0 || len(docs) != 3 {
		err := perrs
		t.Fatalf("seed fixture: %v, %d manifests", err, len(docs))
	}
	valid := map[string]any{}
	for _, d := range docs {
		valid["seed "+d.Value.(map[string]any)["tool"].(string)] = d.Value
	}
	for name, y := range validCases() {
		valid[name] = singleDoc(t, y).Value
	}
	for name, v := range valid {
		t.Run(name, func(t *testing.T) {
			if _, errs := Validate(v); len(errs) > 0 {
				t.Fatalf("Validate: %v", errs)
			}
			if err := sch.Validate(asJSON(t, v)); err != nil {
				t.Fatalf("the schema refuses a valid manifest: %v", err)
			}
		})
	}
}

// leaves are the innermost schema errors: the ones that name a keyword and a value.
func leaves(e *jsonschema.ValidationError) []*jsonschema.ValidationError {
	if len(e.Causes) == 0 {
		return []*jsonschema.ValidationError{e}
	}
	var out []*jsonschema.ValidationError
	for _, c := range e.Causes {
		out = append(out, leaves(c)...)
	}
	return out
}

// samePlace reports whether some schema error is about the same field as some Go error: one
// location contains the other, or both are fields of the same object.
func samePlace(goErrs []error, schemaErrs []*jsonschema.ValidationError) bool {
	for _, ge := range goErrs {
		g := pathSegments(ge.(*FieldError).Path)
		for _, se := range schemaErrs {
			s := se.InstanceLocation
			switch {
			case isPrefix(s, g), isPrefix(g, s):
				return true
			case len(s) == len(g) && len(s) > 0 && slices.Equal(s[:len(s)-1], g[:len(g)-1]):
				return true
			}
		}
	}
	return false
}

// pathSegments splits a FieldError path ("requires[1].tool") into JSON pointer tokens.
func pathSegments(p string) []string {
	p = strings.NewReplacer("[", ".", "]", "").Replace(p)
	if p == "" {
		return nil
	}
	return strings.Split(p, ".")
}

func isPrefix(a, b []string) bool { return len(a) <= len(b) && slices.Equal(a, b[:len(a)]) }

// Every object of the schema is closed and lists exactly the fields the Go decoder knows,
// each with a description; every enumeration is the Go one.
func TestSchemaMirrorsGoFields(t *testing.T) {
	_, raw := manifestSchema(t)
	at := func(path ...any) map[string]any {
		var v any = raw
		for _, p := range path {
			switch p := p.(type) {
			case string:
				v = v.(map[string]any)[p]
			case int:
				v = v.([]any)[p]
			}
		}
		return v.(map[string]any)
	}
	defs := at("$defs")
	objects := map[string]struct {
		obj    map[string]any
		fields []string
	}{
		"manifest":     {raw, manifestFields},
		"approval":     {at("$defs", "approvalRules"), approvalFields},
		"compensation": {at("$defs", "compensation"), compensationFields},
		"verification": {at("$defs", "verification"), verificationFields},
		"requirement":  {at("$defs", "requirement", "anyOf", 1), requirementFields},
		"risk":         {at("properties", "risk"), riskFields},
		"retry":        {at("properties", "retry"), retryFields},
		"idempotency":  {at("properties", "idempotency"), idempotencyFields},
		"audit":        {at("properties", "audit"), auditFields},
	}
	for name, o := range objects {
		if o.obj["type"] != "object" || o.obj["additionalProperties"] != false {
			t.Errorf("%s: not a closed object", name)
		}
		props := o.obj["properties"].(map[string]any)
		var keys []string
		for k, p := range props {
			keys = append(keys, k)
			p := p.(map[string]any)
			if ref, ok := p["$ref"].(string); ok && p["description"] == nil {
				p = defs[strings.TrimPrefix(ref, "#/$defs/")].(map[string]any)
			}
			if d, _ := p["description"].(string); d == "" {
				t.Errorf("%s.%s has no description", name, k)
			}
		}
		if !slices.Equal(slices.Sorted(slices.Values(keys)), slices.Sorted(slices.Values(o.fields))) {
			t.Errorf("%s: schema fields %v, Go fields %v", name, slices.Sorted(slices.Values(keys)), o.fields)
		}
	}
	if n := countClosed(raw); n != len(objects) {
		t.Errorf("%d closed objects in the schema, %d checked here", n, len(objects))
	}

	enums := map[string]struct {
		got  any
		want []string
	}{
		"effect":          {at("properties", "effect")["enum"], effectNames()},
		"status":          {at("properties", "status")["enum"], statusNames()},
		"blast_radius":    {at("properties", "risk", "properties", "blast_radius")["enum"], BlastRadii},
		"on_timeout":      {at("$defs", "approvalRules", "properties", "on_timeout")["enum"], OnTimeouts},
		"scope":           {at("properties", "idempotency", "properties", "scope")["enum"], IdempotencyScopes},
		"evidence_export": {at("properties", "audit", "properties", "evidence_export")["enum"], EvidenceExports},
		"kind":            {at("$defs", "compensation", "properties", "kind")["enum"], Kinds},
	}
	for name, e := range enums {
		var got []string
		for _, v := range e.got.([]any) {
			got = append(got, v.(string))
		}
		if !slices.Equal(got, e.want) {
			t.Errorf("enum %s: schema %v, Go %v", name, got, e.want)
		}
	}
	if n := at("$defs", "toolName")["maxLength"]; n != json.Number("128") || MaxToolNameLength != 128 {
		t.Errorf("tool name maxLength %v, Go %d", n, MaxToolNameLength)
	}
}

// countClosed counts the schemas with additionalProperties: false anywhere in v.
func countClosed(v any) int {
	n := 0
	switch x := v.(type) {
	case map[string]any:
		if x["additionalProperties"] == false {
			n++
		}
		for _, c := range x {
			n += countClosed(c)
		}
	case []any:
		for _, c := range x {
			n += countClosed(c)
		}
	}
	return n
}

// The schema's whitespace is Go's: the patterns, compiled with the Go engine the library uses,
// refuse exactly the runes unicode.IsSpace names (ECMA's \s differs: it has U+FEFF, not U+0085,
// which is why the schema lists the class instead of writing \s).
func TestSchemaWhitespaceIsUnicode(t *testing.T) {
	_, raw := manifestSchema(t)
	pattern := func(path ...string) *regexp.Regexp {
		var v any = raw
		for _, p := range path {
			v = v.(map[string]any)[p]
		}
		return regexp.MustCompile(v.(map[string]any)["pattern"].(string))
	}
	permission := pattern("properties", "permission")
	reference := pattern("$defs", "reference")
	key := pattern("properties", "idempotency", "properties", "key")
	expect := pattern("$defs", "verification", "properties", "expect", "propertyNames")
	for r := rune(0); r < 0x10000; r++ {
		if r >= 0xD800 && r <= 0xDFFF {
			continue
		}
		s, space := string(r), unicode.IsSpace(r)
		if permission.MatchString("a"+s) == space {
			t.Errorf("permission with %U", r)
		}
		if reference.MatchString("$args.a"+s) != referencePattern.MatchString("$args.a"+s) {
			t.Errorf("reference with %U", r)
		}
		if key.MatchString("{{args.a"+s+"b}}") != argsPlaceholder.MatchString("args.a"+s+"b") {
			t.Errorf("idempotency key with %U", r)
		}
		if expect.MatchString("a"+s+"b") != validDottedPath("a"+s+"b") {
			t.Errorf("expect path with %U", r)
		}
	}
}
