package policy

import (
	"strings"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// ReadsVariable reports whether any rule's condition may read the variable name (the
// identifier appears in its text; see ReadsRun).
func (s *Set) ReadsVariable(name string) bool {
	if s == nil {
		return false
	}
	return len(readers(s.rules, name)) > 0
}

// ReadsRun reports whether a rule that matches a call of tool (manifest m, nil when none)
// may read the `run` variable, so that the caller reads the run's steps only then (a read of
// the store per call). A rule may read it when the identifier appears in its condition's text
// (found once, at Compile): a CEL expression names every variable it reads, so a condition
// that never spells "run" cannot read it (a word such as "runtime" only costs a read).
func (s *Set) ReadsRun(tool string, m *manifest.Manifest) bool {
	if s == nil {
		return false
	}
	for _, r := range s.runReaders {
		if r.match.matches(tool, m) {
			return true
		}
	}
	return false
}

// readers are the rules whose condition's text names the variable name.
func readers(rules []*rule, name string) []*rule {
	var out []*rule
	for _, r := range rules {
		if strings.Contains(r.r.Condition, name) {
			out = append(out, r)
		}
	}
	return out
}
