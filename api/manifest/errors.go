package manifest

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// FieldError is one problem found in a manifest: where it is and what to do about it.
//
// File and Line are empty/zero when the manifest did not come from a file (Validate on a
// decoded object). Tool is the manifest's `tool` value, or a label such as
// "manifest #3" when the name itself is missing (other readers of the same files, such as
// contract tests, put their object's label there: `case "name"`). Path is the field path inside the
// manifest ("compensation.argument_map.charge_id", "requires[1]"); empty for the whole
// manifest.
type FieldError struct {
	File    string
	Line    int
	Tool    string
	Path    string
	Message string
	// Rule is the sentinel of a rule callers treat apart (ErrDraftReference), else nil.
	Rule error
}

// ErrDraftReference is the Rule of a FieldError for an enforced manifest that names a tool
// which is only a draft (errors.Is works on the FieldError). Loads refuse it; registry writers
// only warn, since approving the tools of a set one by one passes through such a state.
var ErrDraftReference = errors.New("an enforced manifest names a tool that is only a draft")

// Unwrap returns Rule.
func (e *FieldError) Unwrap() error { return e.Rule }

// Error renders "file:line: tool: path: message", leaving out the parts that are unknown.
func (e *FieldError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	}
	if e.Tool != "" {
		b.WriteString(printable(e.Tool))
		b.WriteString(": ")
	}
	if e.Path != "" {
		b.WriteString(printable(e.Path))
		b.WriteString(": ")
	}
	b.WriteString(e.Message)
	return b.String()
}

// errorList collects FieldErrors for one manifest so that every problem is reported at once.
type errorList struct {
	tool string
	line func(path string) int
	errs []error
}

func (l *errorList) add(path, format string, args ...any) {
	fe := &FieldError{Tool: l.tool, Path: path, Message: fmt.Sprintf(format, args...)}
	if l.line != nil {
		fe.Line = l.line(path)
	}
	l.errs = append(l.errs, fe)
}

// joinPath appends a field name to a path.
func joinPath(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// indexPath appends an array index to a path.
func indexPath(path string, i int) string {
	return fmt.Sprintf("%s[%d]", path, i)
}

// SortErrors orders errors by file, then line, keeping the order of equal positions; errors
// that are not *FieldError go last. Readers fix a file top to bottom.
func SortErrors(errs []error) {
	slices.SortStableFunc(errs, func(a, b error) int {
		fa, okA := a.(*FieldError)
		fb, okB := b.(*FieldError)
		switch {
		case !okA || !okB:
			return cmp.Compare(boolInt(!okA), boolInt(!okB))
		case fa.File != fb.File:
			return cmp.Compare(fa.File, fb.File)
		}
		return cmp.Compare(fa.Line, fb.Line)
	})
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// printable quotes text taken from the input when it holds control characters, so a key or
// name cannot forge a line of output (such as a fake "ok:" line).
func printable(s string) string {
	if strings.ContainsFunc(s, unicode.IsControl) {
		return strconv.Quote(s)
	}
	return s
}
