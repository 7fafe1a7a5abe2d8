package lint

import (
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// The codes that compare manifests with the real tools (seed "Tool manifests", Lint: "With
// --upstream-cmd, --upstream-url or --gateway-config it also checks the manifests against the
// real tools' input schemas"): L017, L020, L027, L033, L034, L035.
//
// How an argument path is checked against an input schema (the seed does not say; this is the
// rule, and the reason a finding names what the schema does list):
//   - A path is split at '.': `$args.a.b.0.c` walks properties a, b, array index 0, property c.
//   - An object schema that lists `properties` (even none) is taken as the list of its
//     arguments: a name it does not list is reported, although JSON Schema allows unlisted
//     names when additionalProperties is absent. MCP servers rarely write additionalProperties:
//     false, and a manifest naming an argument the schema does not describe is almost always a
//     typo whose value will be missing.
//   - Nothing is reported where the schema allows names it does not list, on purpose:
//     additionalProperties true or a schema (followed), a matching patternProperties (followed),
//     or an object schema with neither properties nor additionalProperties: false (`{}`,
//     `{"type": "object"}`).
//   - An array index follows prefixItems[i], else items; a name on an array, or any step into
//     a string, number, boolean or null, is reported.
//   - allOf, anyOf, oneOf, then/else and local $ref (`#/$defs/x`) are followed: a path is
//     reported only when no branch can hold it. A remote $ref, a $ref cycle or a schema nested
//     deeper than 64 levels is never reported (cannot tell).

// UpstreamTool is one tool as an upstream offers it: its name as the gateway exposes it and
// its input schema (any JSON-encodable value).
type UpstreamTool struct {
	Name        string
	InputSchema any
}

// WithUpstream is Lint plus Upstream, sorted by tool, then code.
func WithUpstream(ms []*manifest.Manifest, tools []UpstreamTool) []Finding {
	out := append(Lint(ms), Upstream(ms, tools)...)
	sortFindings(out)
	return out
}

var (
	placeholderPattern = regexp.MustCompile(`\{\{([^{}]*)\}\}`)
)

// Upstream returns the findings that need the upstreams' tools (unsorted): per manifest whose
// tool an upstream offers, L017 (argument_map or verification reads a missing $args path),
// L020 (idempotency key placeholder), L027 (no schema_hash) and L033 (redaction path); L034 for
// a manifest no upstream offers; L035 for an upstream tool without a manifest (reported on the
// upstream's tool name).
func Upstream(ms []*manifest.Manifest, tools []UpstreamTool) []Finding {
	schemas := map[string]any{}
	for _, t := range tools {
		schemas[t.Name] = normalise(t.InputSchema)
	}
	var out []Finding
	have := map[string]bool{}
	for _, m := range ms {
		have[m.Tool] = true
		schema, offered := schemas[m.Tool]
		if !offered {
			out = append(out, newFinding("L034", m.Tool, "tool"))
			continue
		}
		check := func(code, field, ref, path string) {
			if why := missingPath(schema, path); why != "" {
				out = append(out, newFinding(code, m.Tool, field, field, ref, why))
			}
		}
		argsRefs := func(field string, refs map[string]string) {
			for _, k := range sortedStringKeys(refs) {
				if p, ok := strings.CutPrefix(refs[k], "$args."); ok {
					check("L017", field+"."+k, refs[k], p)
				}
			}
		}
		if c := m.Compensation; c != nil {
			argsRefs("compensation.argument_map", c.ArgumentMap)
			if v := c.Verification; v != nil {
				argsRefs("compensation.verification.arguments", v.Arguments)
			}
		}
		if id := m.Idempotency; id != nil {
			for _, ph := range placeholderPattern.FindAllStringSubmatch(id.Key, -1) {
				if p, ok := strings.CutPrefix(strings.TrimSpace(ph[1]), "args."); ok {
					check("L020", "idempotency.key", ph[0], p)
				}
			}
		}
		if a := m.Audit; a != nil {
			for i, r := range a.Redaction {
				if p, ok := strings.CutPrefix(r, "$args."); ok {
					check("L033", fmt.Sprintf("audit.redaction[%d]", i), r, p)
				}
			}
		}
		if m.SchemaHash == "" {
			out = append(out, newFinding("L027", m.Tool, "schema_hash"))
		}
	}
	for _, t := range tools {
		if !have[t.Name] {
			out = append(out, newFinding("L035", t.Name, ""))
		}
	}
	return out
}

// normalise turns a schema into plain JSON values (map[string]any, []any, ...).
func normalise(v any) any {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var out any
	if json.Unmarshal(b, &out) != nil {
		return nil
	}
	return out
}

// maxSchemaDepth bounds the walk ($ref cycles, absurd nesting): past it, nothing is reported.
const maxSchemaDepth = 64

// missingPath returns "" when the dotted argument path may exist under schema (see the rules at
// the top of this file), else why not, e.g. `no argument "entity_names"; it has entities`.
func missingPath(schema any, path string) string {
	if schema == nil {
		return "" // no schema: cannot tell
	}
	w := walker{root: schema}
	ok, why := w.check(schema, strings.Split(path, "."), "", 0)
	if ok {
		return ""
	}
	return why
}

type walker struct{ root any }

// verdict is what one schema says about one path segment.
type verdict int

const (
	neutral verdict = iota // says nothing about it (e.g. a branch with only `required`)
	open                   // allows it without describing it, or cannot tell
	found                  // describes it: children are the subschemas it leads to
	missing                // rules it out: why says how
)

// check reports whether segs can be found under node; at is the path walked so far.
func (w *walker) check(node any, segs []string, at string, depth int) (bool, string) {
	if len(segs) == 0 || depth > maxSchemaDepth {
		return true, ""
	}
	v, children, why := w.step(node, segs[0], at, depth)
	switch v {
	case neutral, open:
		return true, ""
	case missing:
		return false, why
	}
	next := join(at, segs[0])
	for _, c := range children {
		ok, cwhy := w.check(c, segs[1:], next, depth+1)
		if ok {
			return true, ""
		}
		if why == "" {
			why = cwhy
		}
	}
	return false, why
}

// step looks up one segment in node, its own keywords and its branches (allOf, anyOf, oneOf,
// then, else, a local $ref): open if any says open, else found (with every child) if any
// describes it, else missing if any rules it out, else neutral.
func (w *walker) step(node any, seg, at string, depth int) (verdict, []any, string) {
	if depth > maxSchemaDepth {
		return open, nil, ""
	}
	switch n := node.(type) {
	case bool:
		if n {
			return open, nil, ""
		}
		return missing, nil, fmt.Sprintf("the schema allows nothing at %s", where(at))
	case map[string]any:
		var branches []any
		for _, k := range []string{"allOf", "anyOf", "oneOf"} {
			if list, ok := n[k].([]any); ok {
				branches = append(branches, list...)
			}
		}
		for _, k := range []string{"then", "else"} {
			if s, ok := n[k]; ok {
				branches = append(branches, s)
			}
		}
		if ref, ok := n["$ref"].(string); ok {
			target, resolved := w.resolve(ref)
			if !resolved {
				return open, nil, "" // remote or broken reference: cannot tell
			}
			branches = append(branches, target)
		}
		v, children, why := local(n, seg, at)
		if v == open {
			return open, nil, ""
		}
		for _, b := range branches {
			bv, bchildren, bwhy := w.step(b, seg, at, depth+1)
			switch bv {
			case open:
				return open, nil, ""
			case found:
				v = found
				children = append(children, bchildren...)
			case missing:
				if v == neutral {
					v = missing
				}
				if why == "" {
					why = bwhy
				}
			}
		}
		return v, children, why
	}
	return open, nil, "" // not a schema: cannot tell
}

// local looks seg up in node's own keywords (type, properties, patternProperties,
// additionalProperties, prefixItems, items).
func local(n map[string]any, seg, at string) (verdict, []any, string) {
	types := typeSet(n["type"])
	props, hasProps := n["properties"].(map[string]any)
	prefix, hasPrefix := n["prefixItems"].([]any)
	items, hasItems := n["items"]
	if i, err := strconv.Atoi(seg); err == nil && i >= 0 && (types["array"] || hasPrefix || hasItems) {
		switch {
		case hasPrefix && i < len(prefix):
			return found, []any{prefix[i]}, ""
		case hasItems:
			return found, []any{items}, ""
		}
		return open, nil, ""
	}
	if c, ok := props[seg]; ok {
		return found, []any{c}, ""
	}
	if pp, ok := n["patternProperties"].(map[string]any); ok {
		var children []any
		for _, pat := range sortedKeys(pp) {
			if re, err := regexp.Compile(pat); err == nil && re.MatchString(seg) {
				children = append(children, pp[pat])
			}
		}
		if len(children) > 0 {
			return found, children, ""
		}
	}
	switch ap := n["additionalProperties"].(type) {
	case bool:
		if ap {
			return open, nil, ""
		}
	case map[string]any:
		return found, []any{ap}, ""
	}
	switch {
	case hasProps || n["additionalProperties"] == false:
		names := sortedKeys(props)
		has := "it lists none"
		if len(names) > 0 {
			has = "it has " + strings.Join(names, ", ")
		}
		return missing, nil, fmt.Sprintf("no argument %q at %s; %s", seg, where(at), has)
	case len(types) > 0 && !types["object"] && !types["array"]:
		return missing, nil, fmt.Sprintf("%s is %s, which has no field %q", where(at), strings.Join(sortedKeys(types), " or "), seg)
	case types["array"] && !types["object"]:
		return missing, nil, fmt.Sprintf("%s is an array: use an index, not %q", where(at), seg)
	case types["object"]:
		return open, nil, "" // an object schema that lists nothing: any name may be passed
	}
	return neutral, nil, ""
}

// resolve follows a local $ref (`#`, `#/$defs/x`, JSON pointer) within the root schema.
func (w *walker) resolve(ref string) (any, bool) {
	frag, ok := strings.CutPrefix(ref, "#")
	if !ok {
		return nil, false
	}
	frag, err := url.PathUnescape(frag)
	if err != nil {
		return nil, false
	}
	v := w.root
	if frag == "" {
		return v, true
	}
	for _, tok := range strings.Split(strings.TrimPrefix(frag, "/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch x := v.(type) {
		case map[string]any:
			if v, ok = x[tok]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}

func typeSet(v any) map[string]bool {
	out := map[string]bool{}
	switch t := v.(type) {
	case string:
		out[t] = true
	case []any:
		for _, x := range t {
			if s, ok := x.(string); ok {
				out[s] = true
			}
		}
	}
	if out["integer"] {
		out["number"] = true
		delete(out, "integer")
	}
	return out
}

func join(at, seg string) string {
	if at == "" {
		return seg
	}
	return at + "." + seg
}

// where names a place in the arguments for a message.
func where(at string) string {
	if at == "" {
		return "the top level"
	}
	return at
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func sortedStringKeys(m map[string]string) []string { return sortedKeys(m) }
