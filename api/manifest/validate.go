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
	m, errs := decode(normaliseNumbers(raw), "manifest", nil)
	if len(errs) > 0 {
		return nil, errs
	}
	return m, nil
}

// ValidateDocuments validates every document and then the set as a whole (cross-manifest
// rules: compensation, requires, verification tool and replaced_by exist, the verification
// tool is read_only, no duplicate names). Errors carry the file and line. It returns the
// manifests that passed the single-manifest rules, in document order, and every error.
func ValidateDocuments(docs []Document) ([]*Manifest, []error) {
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
// their own still count as defined, so one typo does not cascade into "has no manifest".
func crossCheck(ms []*Manifest, locate func(i int, path string) (string, int)) []error {
	var errs []error
	add := func(i int, path, format string, args ...any) {
		file, line := locate(i, path)
		errs = append(errs, &FieldError{File: file, Line: line, Tool: ms[i].Tool, Path: path, Message: fmt.Sprintf(format, args...)})
	}
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
	missing := func(name string) string {
		return fmt.Sprintf("tool %q has no manifest: add its manifest or fix the name", name)
	}
	for i, m := range ms {
		for k, r := range m.Requires {
			if _, ok := byName[r.Tool]; !ok {
				add(i, indexPath("requires", k), "%s", missing(r.Tool))
			}
		}
		if m.ReplacedBy != "" {
			if _, ok := byName[m.ReplacedBy]; !ok {
				add(i, "replaced_by", "%s", missing(m.ReplacedBy))
			}
		}
		c := m.Compensation
		if c == nil {
			continue
		}
		if _, ok := byName[c.Tool]; c.Tool != "" && !ok {
			add(i, "compensation.tool", "%s", missing(c.Tool))
		}
		if v := c.Verification; v != nil && v.Tool != "" {
			j, ok := byName[v.Tool]
			switch {
			case !ok:
				add(i, "compensation.verification.tool", "%s", missing(v.Tool))
			case ms[j].Effect != ReadOnly && ms[j].Effect != "":
				add(i, "compensation.verification.tool", "%q is %s: a verification read-back must use a read_only tool", v.Tool, ms[j].Effect)
			}
		}
	}
	return errs
}

// normaliseNumbers converts the number types a Go caller may pass (int, int32, float32,
// json.Number from a decoder with UseNumber) to the int64/float64 the decoder expects,
// recursively. Decode with UseNumber to keep integers above 2^53 exact.
func normaliseNumbers(v any) any {
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
			out[k] = normaliseNumbers(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = normaliseNumbers(e)
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
