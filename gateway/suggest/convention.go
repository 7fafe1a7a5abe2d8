package suggest

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// The mcp-compensate convention: how a server says which of its tools undoes another. The seed
// names the convention without defining it; no MCP specification does either. The only public
// text found is a community draft extension (`dev.chronomcp/compensate`, "Draft v0.2", not an
// MCP standard), so suggest-manifest reads three forms, all on the tool being undone:
//
//  1. `_meta["mcp-compensate"]`, Reversi's form: the undo tool's name (a string), or an object
//     {tool, argument_map (Reversi references such as $args.id, $result.id), kind
//     (compensation or inverse)}.
//  2. `_meta["dev.chronomcp/compensate"]`, the community draft: {reversibility (readonly,
//     compensable, irreversible), compensation: {toolName, parameterMapping}, notes}.
//     parameterMapping paths `$.input.x` become `$args.x`, and `$.output.structuredContent.x`
//     or `$.output.x` become `$result.x`; notes become the residue.
//  3. A line `mcp-compensate: <tool>` in the tool's description.
//
// Undo tool names are the upstream's own names, so they are looked up with the namespace of
// the tool being undone, on the same upstream.
const (
	MetaKey          = "mcp-compensate"
	CommunityMetaKey = "dev.chronomcp/compensate"
)

var (
	descriptionPattern = regexp.MustCompile(`(?im)^\s*mcp-compensate:\s*([A-Za-z0-9_.:/-]+)\s*$`)
	referencePattern   = regexp.MustCompile(`^\$(args|result)(\.[^.\s]+)+$`)
)

// convResult is what the convention said: the effect and undo, and a gap when part of it could
// not be used (ok stays true) or the whole could not be used (ok false, gap says why).
type convResult struct {
	effect manifest.Effect
	why    string
	comp   *compPlan
	gap    string
}

// convention reads the mcp-compensate convention of t. ok is false when t does not use it or
// what it says cannot be used (gap then says why, for the draft's comments).
func convention(t Tool, byName map[string]Tool) (r convResult, ok bool) {
	meta := map[string]any(t.Tool.Meta)
	if v, found := meta[MetaKey]; found {
		return reversiForm(t, v, byName)
	}
	if v, found := meta[CommunityMetaKey]; found {
		return communityForm(t, v, byName)
	}
	if m := descriptionPattern.FindStringSubmatch(t.Tool.Description); m != nil {
		return reversiForm(t, m[1], byName)
	}
	return convResult{}, false
}

// undoTool resolves the undo tool's upstream name to its exposed name on t's upstream.
func undoTool(t Tool, name string, byName map[string]Tool) (string, bool) {
	local := localName(t.Tool.Name)
	exposed := t.Tool.Name[:len(t.Tool.Name)-len(local)] + name
	for _, n := range []string{exposed, name} {
		if u, ok := byName[n]; ok && u.Upstream == t.Upstream && n != t.Tool.Name {
			return n, true
		}
	}
	return "", false
}

func reversiForm(t Tool, v any, byName map[string]Tool) (convResult, bool) {
	var name, kind string
	var refs map[string]any
	switch x := v.(type) {
	case string:
		name = x
	case map[string]any:
		name, _ = x["tool"].(string)
		kind, _ = x["kind"].(string)
		refs, _ = x["argument_map"].(map[string]any)
	}
	if name == "" {
		return convResult{gap: fmt.Sprintf("_meta[%q] does not name an undo tool", MetaKey)}, false
	}
	undo, found := undoTool(t, name, byName)
	if !found {
		return convResult{gap: fmt.Sprintf("the server names %s as the undo (mcp-compensate), but offers no such tool", name)}, false
	}
	c := &compPlan{tool: undo, kind: manifest.KindCompensation, why: "mcp-compensate names " + undo}
	r := convResult{effect: manifest.Compensable, comp: c, why: "the server names its undo tool (mcp-compensate)"}
	if kind == manifest.KindInverse {
		c.kind, r.effect = manifest.KindInverse, manifest.Reversible
	} else {
		c.residue = []string{fmt.Sprintf("TODO: describe what undoing with %s cannot take back", undo)}
	}
	if refs == nil {
		mapArguments(c, t.Tool, byName[undo].Tool)
		r.gap = "the convention gives no argument_map: it is guessed from shared argument names"
		return r, true
	}
	c.argMap = map[string]string{}
	for _, k := range sortedKeys(refs) {
		s, _ := refs[k].(string)
		if !referencePattern.MatchString(s) {
			c.todo = append(c.todo, fmt.Sprintf("TODO: %s: the server gives %v, which is not a $args or $result reference", k, refs[k]))
			continue
		}
		c.argMap[k] = s
	}
	requireMapped(c, byName[undo])
	return r, true
}

func communityForm(t Tool, v any, byName map[string]Tool) (convResult, bool) {
	x, _ := v.(map[string]any)
	rev, _ := x["reversibility"].(string)
	why := fmt.Sprintf("the server declares reversibility: %s (%s)", rev, CommunityMetaKey)
	switch rev {
	case "readonly":
		return convResult{effect: manifest.ReadOnly, why: why}, true
	case "irreversible":
		return convResult{effect: manifest.Irreversible, why: why}, true
	case "compensable":
	default:
		return convResult{gap: fmt.Sprintf("_meta[%q] has reversibility %q, which is not readonly, compensable or irreversible", CommunityMetaKey, rev)}, false
	}
	comp, _ := x["compensation"].(map[string]any)
	name, _ := comp["toolName"].(string)
	undo, found := undoTool(t, name, byName)
	if !found {
		return convResult{gap: fmt.Sprintf("the server names %q as the undo (%s), but offers no such tool", name, CommunityMetaKey)}, false
	}
	c := &compPlan{tool: undo, kind: manifest.KindCompensation, why: CommunityMetaKey + " names " + undo, argMap: map[string]string{}}
	if notes, _ := x["notes"].(string); strings.TrimSpace(notes) != "" {
		c.residue = []string{strings.TrimSpace(notes)}
		c.mapWhy = append(c.mapWhy, "residue taken from the server's notes: check it")
	} else {
		c.residue = []string{fmt.Sprintf("TODO: describe what undoing with %s cannot take back", undo)}
	}
	mapping, _ := comp["parameterMapping"].(map[string]any)
	for _, k := range sortedKeys(mapping) {
		s, _ := mapping[k].(string)
		ref, ok := communityRef(s)
		if !ok {
			c.todo = append(c.todo, fmt.Sprintf("TODO: %s: the server maps it from %q, which Reversi cannot read: use a $args or $result reference", k, s))
			continue
		}
		c.argMap[k] = ref
	}
	requireMapped(c, byName[undo])
	return convResult{effect: manifest.Compensable, why: why, comp: c}, true
}

// communityRef translates a restricted JSONPath of the community draft into a reference.
func communityRef(p string) (string, bool) {
	var ref string
	switch {
	case strings.HasPrefix(p, "$.input."):
		ref = "$args." + strings.TrimPrefix(p, "$.input.")
	case strings.HasPrefix(p, "$.output.structuredContent."):
		ref = "$result." + strings.TrimPrefix(p, "$.output.structuredContent.")
	case strings.HasPrefix(p, "$.output."):
		ref = "$result." + strings.TrimPrefix(p, "$.output.")
	default:
		return "", false
	}
	return ref, referencePattern.MatchString(ref)
}

// requireMapped adds a TODO for every required argument of the undo tool left unmapped.
func requireMapped(c *compPlan, undo Tool) {
	for _, k := range sortedKeys(requiredSet(undo.Tool.InputSchema)) {
		if _, ok := c.argMap[k]; !ok {
			c.todo = append(c.todo, fmt.Sprintf("TODO: %s (required by %s) is not mapped: map it to a $args or $result reference", k, undo.Tool.Name))
		}
	}
	if len(c.argMap) == 0 {
		c.argMap = nil
	}
}
