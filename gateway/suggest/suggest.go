// Package suggest drafts tool manifests for upstream MCP tools that have none: the logic behind
// `reversi suggest-manifest` and the operator tool `reversi.suggest_manifest`.
//
// Source: seed "Tool manifests" (../shared/seeds/000_0a534b082ba0ade1.txt), "Draft manifests
// from a running server" and "Schema drift"; issue 6. The seed fixes what a draft holds
// (`status: draft`, a confidence, comments saying what was guessed, `schema_hash`, a `TODO`
// residue where the undo needs describing) and what it is made from (names, descriptions, input
// schemas, the annotations readOnlyHint, destructiveHint and idempotentHint, and the
// `mcp-compensate` convention). The rules below are this package's; each draft's comments say
// which one applied.
//
// Effect, in order (the first that applies):
//  1. The mcp-compensate convention (see convention.go): the server names the undo tool, or
//     declares the tool read-only or irreversible.
//  2. readOnlyHint: true → read_only.
//  3. No annotations and a name that reads (get_, list_, read_, search_ …) → read_only.
//  4. A sibling tool that undoes it by name (create_X/delete_X, add_X/remove_X, …, see
//     names.go) → compensable, with that tool as compensation, an argument_map from the
//     arguments and result fields both share, and a TODO residue.
//  5. destructiveHint: false and idempotentHint: true → idempotent.
//  6. Anything else → irreversible (approval: always): destructiveHint true, MCP's default
//     destructiveHint when absent, or simply no known undo. Failing closed: a reviewer can only
//     loosen it.
//
// Confidence:
//   - high: the effect and the undo come from the mcp-compensate convention, the undo tool
//     exists, every mapping was understood, every required argument of the undo is mapped, and
//     the annotations do not contradict it.
//   - medium: the effect comes from the server's annotations (or the convention with a gap),
//     the name does not contradict them, and, with a compensation, every required argument of
//     the undo tool is mapped.
//   - low: the effect is guessed from the name alone, the name contradicts the annotations
//     (readOnlyHint on create_X, no readOnlyHint on get_X, destructiveHint: false on delete_X),
//     or the undo misses a required argument (marked TODO).
//
// Permission: `<namespace>:read` for read_only tools, `<namespace>:write` for the rest, where
// the namespace is the exposed name's prefix (`memory.create_entities` → memory), else the
// upstream's name from gateway.yaml, else the server's own name from initialize without
// "server"/"mcp" words (`memory-server` → memory).
package suggest

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/engine"
)

// Tool is one upstream tool as the gateway exposes it.
type Tool struct {
	// Upstream is the upstream's name in gateway.yaml (config.FlagUpstreamName for
	// --upstream-cmd and --upstream-url).
	Upstream string
	// Server is the server's own name from its initialize answer (serverInfo.name); may be "".
	Server string
	// Tool is the tool with Name set to the exposed name (`<upstream>.<tool>` when namespaced).
	Tool *mcp.Tool
}

// Confidence says how much of a draft is the server's own claim rather than a guess.
type Confidence string

const (
	Low    Confidence = "low"
	Medium Confidence = "medium"
	High   Confidence = "high"
)

// Draft is one drafted manifest.
type Draft struct {
	// Tool is the exposed tool name, the manifest's `tool`.
	Tool string
	// File is the file name to write it to: `<tool>.yaml`, with '/' and ':' replaced by '_'.
	File string
	// Confidence is low, medium or high (see the package documentation).
	Confidence Confidence
	// Guesses says what was guessed, one sentence each; the YAML carries them as comments.
	Guesses []string
	// YAML is the file's content: a manifest with `status: draft` and comments.
	YAML []byte
	// Manifest is YAML as the validator reads it (single-manifest rules passed).
	Manifest *manifest.Manifest
}

// Refused is an upstream tool no draft could be written for, and why.
type Refused struct {
	Tool   string
	Reason string
}

// Result is what Suggest found: the drafts, the tools skipped because they already have a
// manifest, and the tools that cannot have one.
type Result struct {
	Drafts  []Draft
	Skipped []string
	Refused []Refused
}

// Drafts returns a draft for every tool in tools whose exposed name has no manifest in ms, in
// the order of tools. See Suggest.
func Drafts(tools []Tool, ms []*manifest.Manifest) []Draft { return Suggest(tools, ms).Drafts }

var toolNamePattern = regexp.MustCompile(`^[A-Za-z0-9_.:/-]{1,128}$`)

// Suggest drafts a manifest for every tool in tools without one in ms (matched by exposed
// name; a manifest of any status counts), in the order of tools. A tool whose name cannot be a
// manifest's `tool` (seed: letters, digits and `_ . : / -`, up to 128 characters), or whose
// input schema cannot be hashed, is Refused. Distinct names whose file names collide after
// replacing '/' and ':' (`a/b`, `a_b`) get a numeric suffix (`a_b-2.yaml`).
func Suggest(tools []Tool, ms []*manifest.Manifest) Result {
	have := map[string]bool{}
	for _, m := range ms {
		have[m.Tool] = true
	}
	byName := map[string]Tool{}
	for _, t := range tools {
		byName[t.Tool.Name] = t
	}
	var res Result
	files := map[string]bool{}
	for _, t := range tools {
		name := t.Tool.Name
		switch {
		case have[name]:
			res.Skipped = append(res.Skipped, name)
			continue
		case !toolNamePattern.MatchString(name):
			res.Refused = append(res.Refused, Refused{name, "the name is not a valid manifest tool name (letters, digits and _ . : / -, up to 128 characters)"})
			continue
		}
		d, err := draftOne(t, byName)
		if err != nil {
			res.Refused = append(res.Refused, Refused{name, err.Error()})
			continue
		}
		base := strings.NewReplacer("/", "_", ":", "_").Replace(name)
		d.File = base + ".yaml"
		for i := 2; files[d.File]; i++ {
			d.File = fmt.Sprintf("%s-%d.yaml", base, i)
		}
		files[d.File] = true
		res.Drafts = append(res.Drafts, d)
	}
	return res
}

// plan is what draftOne decided, before rendering.
type plan struct {
	tool        Tool
	effect      manifest.Effect
	effectWhy   string
	permission  string
	permWhy     string
	comp        *compPlan
	confidence  Confidence
	confWhy     []string
	hash        string
	description string
}

// compPlan is a proposed compensation.
type compPlan struct {
	tool    string
	why     string
	kind    string // manifest.KindCompensation or KindInverse
	residue []string
	argMap  map[string]string
	mapWhy  []string // comments on argument_map
	todo    []string // what the reviewer must still map
}

func draftOne(t Tool, byName map[string]Tool) (Draft, error) {
	hash, err := engine.SchemaHash(t.Tool.InputSchema)
	if err != nil {
		return Draft{}, fmt.Errorf("the input schema cannot be hashed: %w", err)
	}
	p := &plan{tool: t, hash: hash, description: strings.TrimSpace(t.Tool.Description)}
	decideEffect(p, byName)
	p.permission, p.permWhy = guessPermission(t, p.effect)
	data, guesses := render(p)
	docs, errs := manifest.ParseFile(p.tool.Tool.Name+".yaml", data)
	if len(errs) == 0 && len(docs) != 1 {
		errs = []error{fmt.Errorf("%d documents", len(docs))}
	}
	var m *manifest.Manifest
	if len(errs) == 0 {
		m, errs = manifest.Validate(docs[0].Value)
	}
	if len(errs) > 0 {
		// A bug of this package, not of the upstream: say so rather than write a bad draft.
		return Draft{}, fmt.Errorf("suggest: the draft does not validate (please report): %v", errs)
	}
	return Draft{Tool: t.Tool.Name, Confidence: p.confidence, Guesses: guesses, YAML: data, Manifest: m}, nil
}

// decideEffect applies the package's effect and confidence rules to p.
func decideEffect(p *plan, byName map[string]Tool) {
	t := p.tool.Tool
	a := t.Annotations
	verb, _ := splitVerb(localName(t.Name))
	contradiction := nameContradicts(verb, a)

	conv, ok := convention(p.tool, byName)
	if ok {
		p.effect, p.effectWhy, p.comp = conv.effect, conv.why, conv.comp
		p.confidence = High
		if conv.gap != "" {
			p.confidence = Medium
			p.confWhy = append(p.confWhy, conv.gap)
		}
		if a != nil && a.ReadOnlyHint != (conv.effect == manifest.ReadOnly) {
			p.confidence = Medium
			p.confWhy = append(p.confWhy, fmt.Sprintf("the convention says %s but readOnlyHint is %v", conv.effect, a.ReadOnlyHint))
		}
		if p.comp != nil && len(p.comp.todo) > 0 {
			p.confidence = Medium
		}
		return
	}

	fromName := a == nil
	p.confidence = Medium
	if conv.gap != "" {
		// The server's own undo claim does not hold together: trust the rest less too.
		p.confidence = Low
		p.confWhy = append(p.confWhy, conv.gap)
	}
	if fromName {
		p.confidence = Low
		p.confWhy = append(p.confWhy, "the server gives no annotations: the effect is guessed from the name")
	} else if contradiction != "" {
		p.confidence = Low
		p.confWhy = append(p.confWhy, contradiction)
	}

	switch {
	case a != nil && a.ReadOnlyHint:
		p.effect, p.effectWhy = manifest.ReadOnly, "readOnlyHint: true"
		return
	case a == nil && readVerbs[verb]:
		p.effect, p.effectWhy = manifest.ReadOnly, fmt.Sprintf("the name starts with %q, which reads", verb)
		return
	}
	if c := sibling(p.tool, byName); c != nil {
		p.effect = manifest.Compensable
		p.effectWhy = "an undo tool was found by name (" + c.why + ")"
		p.comp = c
		if len(c.todo) > 0 {
			p.confidence = Low
			p.confWhy = append(p.confWhy, "the undo misses a required argument: see the TODO")
		}
		return
	}
	switch {
	case a != nil && a.DestructiveHint != nil && !*a.DestructiveHint && a.IdempotentHint:
		p.effect, p.effectWhy = manifest.Idempotent, "destructiveHint: false and idempotentHint: true, and no undo tool was found"
	case a != nil && a.DestructiveHint != nil && *a.DestructiveHint:
		p.effect, p.effectWhy = manifest.Irreversible, "destructiveHint: true and no undo tool was found"
	case a != nil && a.DestructiveHint == nil:
		p.effect, p.effectWhy = manifest.Irreversible, "destructiveHint is not set (MCP's default is destructive) and no undo tool was found"
	case a != nil:
		p.effect, p.effectWhy = manifest.Irreversible, "destructiveHint: false but not idempotent, and no undo tool was found"
	default:
		p.effect, p.effectWhy = manifest.Irreversible, "no annotations and no undo tool was found: assumed irreversible"
	}
}

// nameContradicts says how the tool's verb contradicts its annotations, or "".
func nameContradicts(verb string, a *mcp.ToolAnnotations) string {
	switch {
	case a == nil:
		return ""
	case a.ReadOnlyHint && writeVerbs[verb]:
		return fmt.Sprintf("readOnlyHint: true, but the name starts with %q, which changes things", verb)
	case !a.ReadOnlyHint && readVerbs[verb]:
		return fmt.Sprintf("the name starts with %q, which reads, but readOnlyHint is not set", verb)
	case a.DestructiveHint != nil && !*a.DestructiveHint && destroyVerbs[verb]:
		return fmt.Sprintf("destructiveHint: false, but the name starts with %q, which takes something away", verb)
	}
	return ""
}

// sibling finds a tool of the same upstream that undoes t by name, and maps its arguments.
func sibling(t Tool, byName map[string]Tool) *compPlan {
	name := t.Tool.Name
	local := localName(name)
	prefix := name[:len(name)-len(local)]
	verb, _ := splitVerb(local)
	for _, inv := range inverseVerbs[verb] {
		cand := prefix + withVerb(local, inv)
		u, ok := byName[cand]
		if !ok || u.Upstream != t.Upstream || cand == name {
			continue
		}
		if u.Tool.Annotations != nil && u.Tool.Annotations.ReadOnlyHint {
			continue // a read-only tool undoes nothing
		}
		c := &compPlan{tool: cand, kind: manifest.KindCompensation,
			why: fmt.Sprintf("%s/%s naming convention: %s", verb, inv, cand)}
		mapArguments(c, t.Tool, u.Tool)
		c.residue = []string{fmt.Sprintf("TODO: describe what undoing with %s cannot take back, or make it kind: inverse with no residue if it restores the exact prior state", cand)}
		return c
	}
	return nil
}

// mapArguments proposes an argument_map for undo from the call of t: each argument of undo's
// input schema that t's input schema has too comes from $args, one that t's output schema has
// from $result, and an identifier-like argument (`id`, `x_id`, `xId`) from $result.id when the
// output has `id`. A required argument left over is a TODO.
func mapArguments(c *compPlan, t, undo *mcp.Tool) {
	in := properties(t.InputSchema)
	out := properties(t.OutputSchema)
	undoProps := properties(undo.InputSchema)
	required := requiredSet(undo.InputSchema)
	c.argMap = map[string]string{}
	for _, k := range sortedKeys(undoProps) {
		switch _, inArgs := in[k]; {
		case inArgs:
			c.argMap[k] = "$args." + k
		case out[k] != nil:
			c.argMap[k] = "$result." + k
			c.mapWhy = append(c.mapWhy, fmt.Sprintf("%s from the result's %s (outputSchema)", k, k))
		case idLike(k) && out["id"] != nil:
			c.argMap[k] = "$result.id"
			c.mapWhy = append(c.mapWhy, fmt.Sprintf("%s from the result's id (outputSchema)", k))
		case required[k]:
			c.todo = append(c.todo, fmt.Sprintf("TODO: %s (required by %s) has no matching argument or result field: map it to a $args or $result reference", k, undo.Name))
		}
	}
	if len(c.argMap) == 0 {
		c.argMap = nil
	}
}

// guessPermission is the package's permission rule.
func guessPermission(t Tool, e manifest.Effect) (perm, why string) {
	ns, from := "", ""
	local := localName(t.Tool.Name)
	switch {
	case len(local) < len(t.Tool.Name):
		ns, from = strings.TrimRight(t.Tool.Name[:len(t.Tool.Name)-len(local)], "./:"), "the tool's namespace"
	case t.Upstream != "" && t.Upstream != config.FlagUpstreamName:
		ns, from = t.Upstream, "the upstream's name"
	case t.Server != "":
		ns, from = serverNamespace(t.Server), "the server's name "+t.Server
	}
	if ns == "" {
		ns, from = "tools", "nothing (no namespace, upstream or server name)"
	}
	access := "write"
	if e == manifest.ReadOnly {
		access = "read"
	}
	return ns + ":" + access, fmt.Sprintf("guessed from %s and the effect", from)
}

// serverNamespace turns a server name such as "memory-server" or "secure-filesystem-server"
// into a permission namespace ("memory", "secure-filesystem"): lowercase, without the words
// server and mcp, anything but letters, digits, '-' and '_' replaced by '-'.
func serverNamespace(s string) string {
	parts := strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_')
	})
	var keep []string
	for _, p := range parts {
		if p != "server" && p != "mcp" && p != "modelcontextprotocol" {
			keep = append(keep, p)
		}
	}
	return strings.Join(keep, "-")
}

// jsonMap converts a schema (any JSON-encodable value) to a map, nil when it is not an object.
func jsonMap(v any) map[string]any {
	if v == nil {
		return nil
	}
	if m, ok := v.(map[string]any); ok {
		return m
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m
}

// properties is a schema's top-level `properties`.
func properties(schema any) map[string]any {
	p, _ := jsonMap(schema)["properties"].(map[string]any)
	return p
}

func requiredSet(schema any) map[string]bool {
	out := map[string]bool{}
	list, _ := jsonMap(schema)["required"].([]any)
	for _, r := range list {
		if s, ok := r.(string); ok {
			out[s] = true
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
