package lint

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
	"github.com/reversi-gitops/reversi/pkg/policy"
)

// The policy codes (issue 21: "`reversi lint` reports CEL compile and type errors with the
// rule's path, rules that can never match, and `args.x` references the tool's input schema
// lacks (with an upstream)"):
//
//   - L040 error: a condition is not CEL (pkg/policy.ErrCELSyntax).
//   - L041 error: a condition does not type-check (pkg/policy.ErrCELType): an unknown variable,
//     field or function, or a result that is not a bool.
//   - L042 warning: a rule that can never match: a match.tools glob that matches no tool (no
//     manifest, and no upstream tool when one is given), or match parts that no manifest
//     satisfies together (effects, permissions, risk of the tools the globs select).
//   - L043 error (with an upstream): the condition reads args.<path> and no upstream tool the
//     rule matches has it in its input schema (same path rules as L017, upstream.go). A rule
//     matching several tools is reported only when none of them has the path.

// Policy lints decoded policies against the manifests (a valid set) and, when tools is not
// nil, the upstream's tools. Findings are sorted by rule, then code.
func Policy(ps []*apipolicy.Policy, ms []*manifest.Manifest, tools []UpstreamTool) []Finding {
	var out []Finding
	add := func(code string, p *apipolicy.Policy, rule, path string, args ...any) {
		f := newFinding(code, rule, path, args...)
		f.File, f.Line = p.File, p.Line(path)
		out = append(out, f)
	}

	infos, errs := policy.Inspect(ps)
	for _, e := range errs {
		var fe *manifest.FieldError
		if !errors.As(e, &fe) {
			continue
		}
		code := "L041"
		if errors.Is(e, policy.ErrCELSyntax) {
			code = "L040"
		}
		// "CEL type error at 2:11 of the condition: undefined field" becomes " at 2:11: undefined
		// field"; "CEL type error: the condition is of type int…" becomes ": the condition…".
		msg := fe.Message
		for _, k := range []error{policy.ErrCELSyntax, policy.ErrCELType} {
			msg = strings.TrimPrefix(msg, k.Error())
		}
		msg = strings.Replace(msg, " of the condition:", ":", 1)
		f := newFinding(code, ruleAt(ps, fe), fe.Path, msg)
		f.File, f.Line = fe.File, fe.Line
		out = append(out, f)
	}

	byName := make(map[string]*manifest.Manifest, len(ms))
	var names []string
	for _, m := range ms {
		byName[m.Tool] = m
		names = append(names, m.Tool)
	}
	schemas := map[string]any{}
	for _, t := range tools {
		schemas[t.Name] = normalise(t.InputSchema)
		if _, dup := byName[t.Name]; !dup {
			names = append(names, t.Name)
		}
	}

	for _, p := range ps {
		for i, r := range p.Rules {
			id := apipolicy.ID(p.Name, r.Name)
			rp := fmt.Sprintf("rules[%d]", i)
			globsMatch := true
			for j, g := range r.Match.Tools {
				if !slices.ContainsFunc(names, func(n string) bool { return apipolicy.GlobMatch(g, n) }) {
					add("L042", p, id, fmt.Sprintf("%s.match.tools[%d]", rp, j), fmt.Sprintf("match.tools[%d] %q matches no tool", j, g))
					globsMatch = false
				}
			}
			if globsMatch && r.Match.NeedsManifest() && !slices.ContainsFunc(ms, func(m *manifest.Manifest) bool { return r.Match.Matches(m.Tool, m) }) {
				add("L042", p, id, rp+".match", "no manifest matches every part of match ("+describeMatch(r.Match)+")")
			}
		}
	}

	if tools != nil {
		for _, info := range infos {
			var matched []string
			for _, t := range tools {
				if info.Rule.Match.Matches(t.Name, byName[t.Name]) {
					matched = append(matched, t.Name)
				}
			}
			if len(matched) == 0 {
				continue
			}
			for _, a := range info.Args {
				why := ""
				for _, t := range matched {
					w := missingPath(schemas[t], a)
					if w == "" {
						why = ""
						break
					}
					if why == "" {
						why = t + ": " + w
					}
				}
				if why != "" {
					add("L043", info.Policy, info.ID, info.Path+".condition", a, why)
				}
			}
		}
	}
	sortFindings(out)
	return out
}

// ruleAt names the rule an error's path points into ("rules[2].condition" → "<policy>/<rule>").
func ruleAt(ps []*apipolicy.Policy, fe *manifest.FieldError) string {
	var i int
	if _, err := fmt.Sscanf(fe.Path, "rules[%d]", &i); err == nil {
		for _, p := range ps {
			if p.Name == fe.Tool && i < len(p.Rules) {
				return apipolicy.ID(p.Name, p.Rules[i].Name)
			}
		}
	}
	return fe.Tool
}

func describeMatch(m apipolicy.Match) string {
	var parts []string
	if len(m.Tools) > 0 {
		parts = append(parts, "tools "+strings.Join(m.Tools, ", "))
	}
	if len(m.Effects) > 0 {
		es := make([]string, len(m.Effects))
		for i, e := range m.Effects {
			es[i] = string(e)
		}
		parts = append(parts, "effects "+strings.Join(es, ", "))
	}
	if len(m.Permissions) > 0 {
		parts = append(parts, "permissions "+strings.Join(m.Permissions, ", "))
	}
	if r := m.Risk; r != nil {
		if len(r.DataClass) > 0 {
			parts = append(parts, "risk.data_class "+strings.Join(r.DataClass, ", "))
		}
		if len(r.BlastRadius) > 0 {
			parts = append(parts, "risk.blast_radius "+strings.Join(r.BlastRadius, ", "))
		}
	}
	return strings.Join(parts, "; ")
}
