package engine

import (
	"fmt"
	"strings"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// Classification of the upstream's tools for the start banner and `reversi.classification`.
// Source: seed "MCP gateway" (../shared/seeds/003_0ebd38203277749f.txt), Observe first.

// Class is one banner line's kind.
type Class string

const (
	ClassOK    Class = "OK"    // a manifest covers the tool (effect and status shown)
	ClassNote  Class = "NOTE"  // no manifest; the server says read-only (unverified)
	ClassWarn  Class = "WARN"  // no manifest; treated as a change that could not be undone
	ClassBlock Class = "BLOCK" // no manifest and the server says it is destructive
)

// ToolClass is one upstream tool, classified.
type ToolClass struct {
	Tool   string
	Class  Class
	Detail string
	Effect manifest.Effect // "" without a manifest
	Status manifest.Status // "" without a manifest
}

// Line is the banner line: `WARN fs.write_file - no manifest; ...`. The tool name comes from
// an upstream: one that is not printable is quoted (Printable), so it cannot forge lines.
func (t ToolClass) Line() string {
	return fmt.Sprintf("%s %s - %s", t.Class, Printable(t.Tool), t.Detail)
}

// Classification is the banner's data.
type Classification struct {
	Mode                Mode
	Tools               []ToolClass // by tool name
	Classified          int         // tools with a manifest
	UnclassifiedReads   int         // NOTE
	UnclassifiedChanges int         // WARN and BLOCK
	Destructive         int         // BLOCK (also counted in UnclassifiedChanges)
}

// Classify classifies every upstream tool against the manifests.
func (e *Engine) Classify() Classification {
	c := Classification{Mode: e.mode}
	for _, name := range e.toolOrder {
		t := e.tools[name]
		tc := ToolClass{Tool: name}
		switch m := e.manifests[name]; {
		case m != nil:
			tc.Class, tc.Effect, tc.Status = ClassOK, m.Effect, m.Status
			tc.Detail = fmt.Sprintf("%s, %s", m.Effect, m.Status)
			c.Classified++
		case t.DestructiveHint:
			tc.Class, tc.Detail = ClassBlock, "no manifest and the server says it is destructive"
			c.UnclassifiedChanges++
			c.Destructive++
		case t.ReadOnlyHint:
			tc.Class, tc.Detail = ClassNote, "no manifest; the server says it is read-only (unverified)"
			c.UnclassifiedReads++
		default:
			tc.Class, tc.Detail = ClassWarn, "no manifest; treated as a change that could not be undone"
			c.UnclassifiedChanges++
		}
		c.Tools = append(c.Tools, tc)
	}
	return c
}

// Summary is the counts line: `0 classified, 0 unclassified reads, 9 unclassified changes,
// 0 destructive without a manifest.`
func (c Classification) Summary() string {
	return fmt.Sprintf("%d classified, %d unclassified reads, %d unclassified changes, %d destructive without a manifest.",
		c.Classified, c.UnclassifiedReads, c.UnclassifiedChanges, c.Destructive)
}

// Banner is the text printed on stderr at start: the mode line, one line per tool, the
// summary and, when tools lack a manifest, what happens to them and how to draft manifests.
func (c Classification) Banner(reads UnclassifiedReads) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Reversi gateway running in %s mode.\n", c.Mode)
	for _, t := range c.Tools {
		b.WriteString(t.Line() + "\n")
	}
	b.WriteString(c.Summary() + "\n")
	missing := c.UnclassifiedReads + c.UnclassifiedChanges
	if missing == 0 {
		return b.String()
	}
	they, run, are := "They", "run", "are"
	if missing == 1 {
		b.WriteString("1 tool has no manifest. ")
		they, run, are = "It", "runs", "is"
	} else {
		fmt.Fprintf(&b, "%d tools have no manifest. ", missing)
	}
	switch {
	case c.Mode != Enforce:
		fmt.Fprintf(&b, "%s %s (nothing is blocked) and %s journaled as unclassified.\n", they, run, are)
	case reads == ReadsObserve && c.UnclassifiedReads > 0:
		fmt.Fprintf(&b, "%s %s blocked, except server-claimed reads, which run in a shadow observe run (unverified).\n", they, are)
	default:
		fmt.Fprintf(&b, "%s %s blocked in enforce mode.\n", they, are)
	}
	b.WriteString("Draft manifests with: reversi suggest-manifest.\n")
	return b.String()
}

// Banner is the engine's start banner (Classify().Banner with its unclassified_reads).
func (e *Engine) Banner() string { return e.Classify().Banner(e.reads) }
