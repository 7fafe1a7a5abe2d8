package manifest

import (
	"encoding/json"
	"fmt"
)

// Validate reads one raw manifest object (as decoded from JSON or YAML into map[string]any,
// []any, string, bool and numbers), applies defaults and normalisation, and checks every
// single-manifest rule. It returns the normalised manifest and every error found (each a
// *FieldError with the tool and field path); the manifest is nil when there are errors.
// The shape is the seed's Python SDK `validate_manifest`.
// Source: seed "Tool manifests", Fields and "What the validator enforces".
func Validate(raw any) (*Manifest, []error) {
	m, errs := decode(NormaliseNumbers(raw), "manifest", nil)
	if len(errs) > 0 {
		return nil, errs
	}
	return m, nil
}

// ValidateDocuments validates every document and then the set as a whole (cross-manifest
// rules: compensation, requires, verification tool and replaced_by exist, and are not only a
// draft when the manifest naming them is not a draft; the verification tool is read_only; no
// duplicate names). Errors carry the file and line. It returns the
// manifests that passed the single-manifest rules, in document order, and every error.
func ValidateDocuments(docs []Document) ([]*Manifest, []error) {
	return validateDocuments(docs, "")
}

// ValidateDocumentsAs is ValidateDocuments for files about to be published with status
// (`reversi manifests publish --status` decides, whatever `status:` the files say): each
// manifest gets that status (and, unless deprecated, no replaced_by, as the registry writes
// it) before the cross-manifest rules, so they judge the versions that will be written.
func ValidateDocumentsAs(docs []Document, status Status) ([]*Manifest, []error) {
	return validateDocuments(docs, status)
}

func validateDocuments(docs []Document, status Status) ([]*Manifest, []error) {
	var errs []error
	all := make([]*Manifest, len(docs))
	valid := make([]bool, len(docs))
	for i := range docs {
		doc := &docs[i]
		m, es := decode(doc.Value, fmt.Sprintf("manifest #%d", doc.Index+1), doc.Line)
		for _, e := range es {
			e.(*FieldError).File = doc.File
		}
		errs = append(errs, es...)
		if status != "" {
			m.Status = status
			if status != Deprecated {
				m.ReplacedBy = ""
			}
		}
		all[i] = m
		valid[i] = len(es) == 0
	}
	errs = append(errs, crossCheck(all, func(i int, path string) (string, int) {
		return docs[i].File, docs[i].Line(path)
	})...)
	var out []*Manifest
	for i, m := range all {
		if valid[i] {
			out = append(out, m)
		}
	}
	return out, errs
}

// ValidateSet checks the cross-manifest rules on manifests that each passed Validate.
// Errors are *FieldError values with the tool and path (no file).
func ValidateSet(ms []*Manifest) []error {
	return crossCheck(ms, func(int, string) (string, int) { return "", 0 })
}

// crossCheck applies the rules that need every manifest loaded. Manifests with errors of
// their own still count as defined, so one typo does not cascade into "has no manifest". A
// manifest whose status is draft stands for a tool that has only a draft (a registry passes
// a draft-only tool's newest draft; a tool with an enforced version passes that version).
func crossCheck(ms []*Manifest, locate func(i int, path string) (string, int)) []error {
	var errs []error
	addRule := func(rule error, i int, path, format string, args ...any) {
		file, line := locate(i, path)
		errs = append(errs, &FieldError{File: file, Line: line, Tool: ms[i].Tool, Path: path, Message: fmt.Sprintf(format, args...), Rule: rule})
	}
	add := func(i int, path, format string, args ...any) { addRule(nil, i, path, format, args...) }
	byName := map[string]int{}
	for i, m := range ms {
		if m.Tool == "" {
			continue
		}
		if j, dup := byName[m.Tool]; dup {
			file, line := locate(j, "tool")
			where := file
			if line > 0 {
				where = fmt.Sprintf("%s:%d", file, line)
			}
			if where == "" {
				where = fmt.Sprintf("manifest #%d", j+1)
			}
			add(i, "tool", "duplicate tool name: also defined at %s; keep one manifest per tool", where)
			continue
		}
		byName[m.Tool] = i
	}
	// check reports a reference to a tool that has no manifest, or (from a manifest that is
	// enforced) to one that is only a draft: a draft is not enforced, so an approved tool's
	// rollback would run a tool nobody approved. A draft's own references are to drafts freely.
	check := func(i int, path, field, name string) (int, bool) {
		j, ok := byName[name]
		switch {
		case !ok:
			add(i, path, "tool %q has no manifest: add its manifest or fix the name", name)
			return 0, false
		case ms[j].Status == Draft && ms[i].Status != Draft:
			addRule(ErrDraftReference, i, path, "%s", draftReference(name, field))
			return 0, false
		}
		return j, true
	}
	for i, m := range ms {
		for k, r := range m.Requires {
			check(i, indexPath("requires", k), "requires", r.Tool)
		}
		if m.ReplacedBy != "" {
			check(i, "replaced_by", "replaced_by", m.ReplacedBy)
		}
		c := m.Compensation
		if c == nil {
			continue
		}
		if c.Tool != "" {
			check(i, "compensation.tool", "compensation.tool", c.Tool)
		}
		if v := c.Verification; v != nil && v.Tool != "" {
			const p = "compensation.verification.tool"
			if j, ok := check(i, p, p, v.Tool); ok && ms[j].Effect != ReadOnly && ms[j].Effect != "" {
				add(i, p, "%q is %s: a verification read-back must use a read_only tool", v.Tool, ms[j].Effect)
			}
		}
	}
	return errs
}

// draftReference is the message for an enforced manifest whose field (compensation.tool,
// requires, compensation.verification.tool or replaced_by) names a tool that is only a draft.
// Plain files, registry loads, registry writers, rendered bundles and the controller all
// report this one text (seed: "Once all manifests are loaded: the compensation tool, every
// required tool, the verification tool and replaced_by must exist"; a draft "is simply absent
// from the loaded registry").
func draftReference(tool, field string) string {
	return fmt.Sprintf("tool %q is only a draft: drafts are not enforced, so %s cannot use it; approve %s first (reversi manifests approve %s, or status: approved in plain files)",
		tool, field, printable(tool), printable(tool))
}

// NormaliseNumbers converts the number types a Go caller may pass (int, int32, float32,
// json.Number from a decoder with UseNumber) to the int64/float64 the decoder expects,
// recursively. Decode with UseNumber to keep integers above 2^53 exact.
func NormaliseNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = NormaliseNumbers(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = NormaliseNumbers(e)
		}
		return out
	case int:
		return int64(x)
	case int32:
		return int64(x)
	case float32:
		return float64(x)
	case []string:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = e
		}
		return out
	case map[string]string:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = e
		}
		return out
	}
	return v
}
