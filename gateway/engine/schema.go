package engine

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// Schema checks. Source: seed "MCP gateway" (../shared/seeds/003_0ebd38203277749f.txt), Schema
// validation and Schema drift; seed "Tool manifests" (000), Schema drift; issue 5 (full JSON
// Schema with santhosh-tekuri/jsonschema/v6, including $ref, unlike the seed's subset).

// Texts of the seed's schema notes and violations.
const (
	InputSchemaPrefix  = "arguments do not match the tool's input schema: "
	OutputSchemaPrefix = "result does not match the tool's output schema: "
	SchemaDriftText    = "the tool's input schema changed since its manifest was approved: review the manifest again"
	// MaxProblems is how many schema problems a violation or note lists ("first five problems").
	MaxProblems = 5
	// SchemaHashLength is the length of SchemaHash's result, in hex digits.
	SchemaHashLength = 12
)

// CanonicalSchemaJSON is a schema as compact JSON with object keys sorted at every level, no
// HTML escaping and numbers exactly as written. schema may be any JSON-encodable value (a
// decoded map, json.RawMessage, or an SDK schema struct).
func CanonicalSchemaJSON(schema any) ([]byte, error) {
	return manifest.CanonicalJSONOf(schema)
}

// SchemaHash is the manifest's `schema_hash` of an upstream input schema: the first 12
// lowercase hex digits of the SHA-256 of CanonicalSchemaJSON(schema). The seeds only say "a
// short hash of the upstream tool's input schema"; this is the definition suggest-manifest and
// the engine share.
func SchemaHash(schema any) (string, error) {
	b, err := CanonicalSchemaJSON(schema)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:SchemaHashLength], nil
}

// hashMatches compares a manifest's schema_hash with the full hex SHA-256 of the upstream
// schema: the 12-digit form and the full 64-digit form are both accepted, in any case.
func hashMatches(manifestHash, fullHex string) bool {
	h := strings.ToLower(strings.TrimSpace(manifestHash))
	return h == fullHex[:SchemaHashLength] || h == fullHex
}

// compileSchema compiles one upstream schema. Remote references are never loaded: only the
// document itself (and the built-in meta-schemas) can be referenced.
func compileSchema(tool, which string, schema any) (*jsonschema.Schema, error) {
	b, err := json.Marshal(schema)
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	loc := "urn:reversi:tool:" + url.PathEscape(tool) + ":" + which
	c := jsonschema.NewCompiler()
	c.UseLoader(jsonschema.SchemeURLLoader{})
	if err := c.AddResource(loc, doc); err != nil {
		return nil, err
	}
	return c.Compile(loc)
}

// checkValue validates v (a JSON-like value) against sch and returns "" or the first
// MaxProblems problems as `<instance location>: <problem>` joined with "; ", with a count of
// the rest. Decoded JSON is validated as is; other Go values go through JSON first (jsonValue).
func checkValue(sch *jsonschema.Schema, v any) string {
	inst, err := jsonValue(v)
	if err != nil {
		return "the value is not JSON: " + err.Error()
	}
	err = sch.Validate(inst)
	if err == nil {
		return ""
	}
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return err.Error()
	}
	var leaves []*jsonschema.ValidationError
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			leaves = append(leaves, e)
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	sortProblems(leaves)
	problems := make([]string, 0, MaxProblems)
	for i, l := range leaves {
		if i == MaxProblems {
			break
		}
		problems = append(problems, fmt.Sprintf("%s: %s", instanceLocation(l.InstanceLocation), problemText(l)))
	}
	text := strings.Join(problems, "; ")
	if rest := len(leaves) - MaxProblems; rest > 0 {
		text += fmt.Sprintf(" (and %d more)", rest)
	}
	return text
}

// problemText is the library's English text of one leaf error, without its location.
func problemText(e *jsonschema.ValidationError) string {
	out := (&jsonschema.ValidationError{ErrorKind: e.ErrorKind}).BasicOutput()
	if out.Error == nil {
		return e.Error()
	}
	return out.Error.String()
}

// instanceLocation writes a JSON pointer to the value ("/" for the whole value).
func instanceLocation(tokens []string) string {
	if len(tokens) == 0 {
		return "/"
	}
	var sb strings.Builder
	for _, t := range tokens {
		sb.WriteByte('/')
		t = strings.ReplaceAll(t, "~", "~0")
		sb.WriteString(strings.ReplaceAll(t, "/", "~1"))
	}
	return sb.String()
}

// fullHash is the lowercase hex SHA-256 of b.
func fullHash(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// CheckResult checks a result's structuredContent against the tool's outputSchema (seed:
// Schema validation). ok is false when it does not match; note is then the journal note
// `result does not match the tool's output schema: ...` (first five problems), and the result
// must not be used to build compensation arguments. With validate_schemas off, no output
// schema, or no structuredContent, it returns "", true. A schema that did not compile gives a
// note with ok true: the result could not be checked, not found wrong.
func (e *Engine) CheckResult(tool string, structuredContent any) (note string, ok bool) {
	t := e.tools[tool]
	if !e.validate || t == nil || t.OutputSchema == nil || structuredContent == nil {
		return "", true
	}
	if t.outputErr != nil {
		return "the tool's output schema could not be compiled, so the result was not checked: " + t.outputErr.Error(), true
	}
	if p := checkValue(t.output, structuredContent); p != "" {
		return OutputSchemaPrefix + p, false
	}
	return "", true
}
