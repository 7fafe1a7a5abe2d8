package store

import "strings"

// Queries for the read tools of the agent and operator endpoints (seed "MCP gateway",
// `reversi.*` tools: list_runs with counts per outcome, search by tool, status and text,
// preview_impact's side-effect-free look at a duplicate-call key).

// RunSearch selects runs for SearchRuns. Empty fields match everything. Tool, Outcome and
// Text select runs that have at least one ledger record matching all three of them (Tool
// exactly, Outcome as the record's Status, Text as a case-insensitive ASCII substring of the
// record's run id, tool, reason, note or compensation tool). Limit <= 0 means no limit.
type RunSearch struct {
	Actor   string
	Status  RunStatus
	Tool    string
	Outcome Status
	Text    string
	Limit   int
}

// recordFilter reports whether the search has a record condition.
func (f RunSearch) recordFilter() bool { return f.Tool != "" || f.Outcome != "" || f.Text != "" }

// RecordSearch selects ledger records for SearchRecords. Empty fields match everything;
// Actor limits the search to the runs that actor opened (the gateway-level journal has no
// actor, so it is searched only when Actor is empty). Text is as in RunSearch. Limit <= 0
// means no limit.
type RecordSearch struct {
	Actor  string
	Run    string
	Tool   string
	Status Status
	Text   string
	Limit  int
}

// OutcomeCounts is how many steps of a run ended in each Status (steps without an outcome are
// not counted).
type OutcomeCounts map[Status]int

// matchRecord applies a record search's conditions (not Actor or Limit) to one record.
func matchRecord(r *Record, tool string, status Status, text string) bool {
	if tool != "" && r.Tool != tool {
		return false
	}
	if status != "" && r.Status != status {
		return false
	}
	if text == "" {
		return true
	}
	needle := asciiLower(text)
	for _, f := range []string{r.Run, r.Tool, r.Reason, r.Note, r.CompensationTool} {
		if strings.Contains(asciiLower(f), needle) {
			return true
		}
	}
	return false
}

// asciiLower lowers ASCII letters only, as SQLite's lower() does without ICU, so that both
// stores agree on what matches.
func asciiLower(s string) string {
	return strings.Map(func(r rune) rune {
		if 'A' <= r && r <= 'Z' {
			return r + ('a' - 'A')
		}
		return r
	}, s)
}
