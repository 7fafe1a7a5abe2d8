package policy

import (
	"fmt"
	"io/fs"
	"strings"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// ReadPaths reads every policy file given, and every *.json, *.yaml and *.yml file under every
// folder given, as manifest.ReadPaths does (recursively, lexical order, hidden entries skipped,
// each file once, at most manifest.MaxFileBytes each). A file holds one policy, several YAML
// documents, or a list of policies. It returns the policies that have no error of their own
// and every problem found, each a *FieldError with the file and line, sorted by file and line.
func ReadPaths(paths ...string) ([]*Policy, []error) {
	docs, errs := manifest.ReadPaths(paths...)
	return finish(docs, errs)
}

// ReadFS is ReadPaths for the folder dir of fsys (files named prefix + path in messages;
// links are refused, as manifest.ReadFS does): for policies held in a git commit.
func ReadFS(fsys fs.FS, dir, prefix string) ([]*Policy, []error) {
	docs, errs := manifest.ReadFS(fsys, dir, prefix)
	return finish(docs, errs)
}

// ParseFile reads the policies of one file's bytes (JSON by extension, else YAML).
func ParseFile(file string, data []byte) ([]*Policy, []error) {
	docs, errs := manifest.ParseFile(file, data)
	return finish(docs, errs)
}

func finish(docs []manifest.Document, errs []error) ([]*Policy, []error) {
	for _, e := range errs {
		// The shared reader labels an object after its `tool`, else "manifest #N": neither
		// names a policy, and file:line already locates the problem.
		if fe, ok := e.(*FieldError); ok && strings.HasPrefix(fe.Tool, "manifest #") {
			fe.Tool = ""
		}
	}
	ps, derrs := Decode(docs)
	errs = append(errs, derrs...)
	manifest.SortErrors(errs)
	return ps, errs
}

// Decode turns parsed documents into policies, strictly: every unknown field, wrong type,
// missing or contradictory field, and policy name used twice in the set is reported. It
// returns the policies without errors of their own, in document order, and every error.
func Decode(docs []manifest.Document) ([]*Policy, []error) {
	var out []*Policy
	var errs []error
	type place struct {
		file string
		line int
	}
	first := map[string]place{}
	for i := range docs {
		doc := &docs[i]
		p, es := decode(doc.Value, fmt.Sprintf("policy #%d", doc.Index+1), doc.Line)
		p.File = doc.File
		for _, e := range es {
			e.(*FieldError).File = doc.File
		}
		if p.Name != "" {
			if f, dup := first[p.Name]; dup {
				es = append(es, &FieldError{File: doc.File, Line: doc.Line("policy"), Tool: p.Name, Path: "policy",
					Message: fmt.Sprintf("duplicate policy name: also at %s:%d; give each policy its own name", f.file, f.line)})
			} else {
				first[p.Name] = place{doc.File, doc.Line("policy")}
			}
		}
		errs = append(errs, es...)
		if len(es) == 0 {
			out = append(out, p)
		}
	}
	return out, errs
}

// Validate reads one policy from a decoded value (map[string]any, []any, string, bool and
// numbers, as from JSON or YAML), strictly. It returns the policy, or nil and every error
// (each a *FieldError with the path; no file or line).
func Validate(raw any) (*Policy, []error) {
	p, errs := decode(manifest.NormaliseNumbers(raw), "policy", nil)
	if len(errs) > 0 {
		return nil, errs
	}
	return p, nil
}
