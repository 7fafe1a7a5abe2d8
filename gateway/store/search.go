package store

import (
	"context"
	"fmt"
	"strings"
)

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

// textClause matches a record (columns of records, prefixed by p) against the lowered needle
// in parameter n: "" matches everything, otherwise the needle is in the run id, tool, reason,
// note or compensation tool, lowered as asciiLower does.
func (s *sqlStore) textClause(p, n string) string {
	var cols []string
	for _, c := range []string{"run", "tool", "reason", "note", "compensation_tool"} {
		cols = append(cols, s.d.textMatch(p+c, n))
	}
	return "(" + n + " = '' OR " + strings.Join(cols, " OR ") + ")"
}

// SearchRuns implements Store.
func (s *sqlStore) SearchRuns(ctx context.Context, f RunSearch) ([]Run, error) {
	q := &query{}
	actor, status := q.arg(f.Actor), q.arg(string(f.Status))
	q.add(`SELECT `+runCols+` FROM runs WHERE id <> '' AND (`, actor, ` = '' OR actor = `, actor, `) AND (`,
		status, ` = '' OR status = `, status, `)`)
	if f.recordFilter() {
		tool, outcome := q.arg(f.Tool), q.arg(string(f.Outcome))
		q.add(` AND EXISTS (SELECT 1 FROM records r WHERE r.run = runs.id AND (`, tool, ` = '' OR r.tool = `, tool, `) AND (`,
			outcome, ` = '' OR r.status = `, outcome, `) AND `, s.textClause("r.", q.arg(asciiLower(f.Text))), `)`)
	}
	q.add(` ORDER BY started DESC, id`)
	return s.queryRuns(ctx, "search runs", q.limit(f.Limit))
}

// SearchRecords implements Store.
func (s *sqlStore) SearchRecords(ctx context.Context, f RecordSearch) ([]Record, error) {
	q := &query{}
	actor, run, tool, status := q.arg(f.Actor), q.arg(f.Run), q.arg(f.Tool), q.arg(string(f.Status))
	q.add(`SELECT `+recordCols+` FROM records WHERE (`, actor, ` = '' OR run IN (SELECT id FROM runs WHERE actor = `, actor,
		` AND id <> '')) AND (`, run, ` = '' OR run = `, run, `) AND (`, tool, ` = '' OR tool = `, tool, `) AND (`,
		status, ` = '' OR status = `, status, `) AND `, s.textClause("", q.arg(asciiLower(f.Text))),
		` ORDER BY time DESC, run, seq DESC`)
	return s.queryRecords(ctx, "search records", q.limit(f.Limit))
}

// countChunk bounds the run ids of one CountOutcomes statement (well under every database's
// limit on parameters).
const countChunk = 500

// CountOutcomes implements Store.
func (s *sqlStore) CountOutcomes(ctx context.Context, runs []string) (map[string]OutcomeCounts, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	out := make(map[string]OutcomeCounts, len(runs))
	for start := 0; start < len(runs); start += countChunk {
		ids := runs[start:min(start+countChunk, len(runs))]
		q := &query{}
		in := q.placeholders(ids)
		q.add(`SELECT id, '', 0 FROM runs WHERE id <> '' AND id IN (`, in, `)
			UNION ALL SELECT run, status, count(*) FROM records WHERE kind = 'outcome' AND run <> '' AND run IN (`, in, `)
			GROUP BY run, status`)
		if err := s.countInto(ctx, q, out); err != nil {
			return nil, fmt.Errorf("store: count outcomes: %w", err)
		}
	}
	return out, nil
}

// countInto reads rows of (run, status, count): a status "" says that the run exists.
func (s *sqlStore) countInto(ctx context.Context, q *query, out map[string]OutcomeCounts) error {
	rows, err := s.r.query(ctx, q.sql.String(), q.args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var run, status string
		var n int
		if err := rows.Scan(&run, &status, &n); err != nil {
			return err
		}
		if out[run] == nil {
			out[run] = OutcomeCounts{}
		}
		if status != "" {
			out[run][Status(status)] = n
		}
	}
	return rows.Err()
}
