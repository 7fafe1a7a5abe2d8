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
	for _, r := range s.rules {
		if strings.Contains(r.r.Condition, name) {
			return true
		}
	}
	return false
}

// ReadsRun reports whether a rule that matches a call of tool (manifest m, nil when none)
// may read the `run` variable, so that the caller reads the run's steps only then (a read of
// the store per call). It looks for the identifier in the condition's text: a CEL expression
// names every variable it reads, so a condition that never spells "run" cannot read it (a
// word such as "runtime" only costs a read).
func (s *Set) ReadsRun(tool string, m *manifest.Manifest) bool {
	if s == nil {
		return false
	}
	for _, r := range s.rules {
		if strings.Contains(r.r.Condition, "run") && r.match.matches(tool, m) {
			return true
		}
	}
	return false
}
