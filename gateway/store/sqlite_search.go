package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// textClause matches a record (columns of the records table, prefixed by p) against a
// RunSearch/RecordSearch Text; it takes the lowered needle six times.
func textClause(p string) string {
	var cols []string
	for _, c := range []string{"run", "tool", "reason", "note", "compensation_tool"} {
		cols = append(cols, "instr(lower("+p+c+"), ?) > 0")
	}
	return "(? = '' OR " + strings.Join(cols, " OR ") + ")"
}

func textArgs(text string) []any {
	n := asciiLower(text)
	return []any{n, n, n, n, n, n}
}

// SearchRuns implements Store.
func (s *SQLite) SearchRuns(ctx context.Context, f RunSearch) ([]Run, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	q := `SELECT ` + runCols + ` FROM runs WHERE id != '' AND (? = '' OR actor = ?) AND (? = '' OR status = ?)`
	args := []any{f.Actor, f.Actor, string(f.Status), string(f.Status)}
	if f.recordFilter() {
		q += ` AND EXISTS (SELECT 1 FROM records r WHERE r.run = runs.id AND (? = '' OR r.tool = ?) AND (? = '' OR r.status = ?) AND ` +
			textClause("r.") + `)`
		args = append(append(args, f.Tool, f.Tool, string(f.Outcome), string(f.Outcome)), textArgs(f.Text)...)
	}
	q += ` ORDER BY started DESC, id`
	if f.Limit > 0 {
		q += ` LIMIT ?`
		args = append(args, f.Limit)
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: search runs: %w", err)
	}
	defer rows.Close()
	var out []Run
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("store: search runs: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// SearchRecords implements Store.
func (s *SQLite) SearchRecords(ctx context.Context, f RecordSearch) ([]Record, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	limit := f.Limit
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	q := `SELECT ` + recordCols + ` FROM records WHERE (? = '' OR run IN (SELECT id FROM runs WHERE actor = ? AND id != ''))
		AND (? = '' OR run = ?) AND (? = '' OR tool = ?) AND (? = '' OR status = ?) AND ` + textClause("") + `
		ORDER BY time DESC, run, seq DESC LIMIT ?`
	args := append([]any{f.Actor, f.Actor, f.Run, f.Run, f.Tool, f.Tool, string(f.Status), string(f.Status)}, textArgs(f.Text)...)
	rows, err := s.r.QueryContext(ctx, q, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("store: search records: %w", err)
	}
	return scanRecords(rows)
}

// CountOutcomes implements Store.
func (s *SQLite) CountOutcomes(ctx context.Context, runs []string) (map[string]OutcomeCounts, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	out := make(map[string]OutcomeCounts, len(runs))
	const chunk = 500 // well under SQLite's limit on host parameters
	for start := 0; start < len(runs); start += chunk {
		ids := runs[start:min(start+chunk, len(runs))]
		args := make([]any, len(ids))
		for i, id := range ids {
			args[i] = id
		}
		rows, err := s.r.QueryContext(ctx, `SELECT id FROM runs WHERE id != '' AND id IN (?`+strings.Repeat(", ?", len(ids)-1)+`)`, args...)
		if err != nil {
			return nil, fmt.Errorf("store: count outcomes: %w", err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, fmt.Errorf("store: count outcomes: %w", err)
			}
			out[id] = OutcomeCounts{}
		}
		rows.Close()
		rows, err = s.r.QueryContext(ctx, `SELECT run, status, count(*) FROM records WHERE kind = 'outcome' AND run != '' AND run IN (?`+
			strings.Repeat(", ?", len(ids)-1)+`) GROUP BY run, status`, args...)
		if err != nil {
			return nil, fmt.Errorf("store: count outcomes: %w", err)
		}
		for rows.Next() {
			var run, status string
			var n int
			if err := rows.Scan(&run, &status, &n); err != nil {
				rows.Close()
				return nil, fmt.Errorf("store: count outcomes: %w", err)
			}
			if out[run] == nil {
				out[run] = OutcomeCounts{}
			}
			out[run][Status(status)] = n
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("store: count outcomes: %w", err)
		}
	}
	return out, nil
}

// HeldKey implements Store.
func (s *SQLite) HeldKey(ctx context.Context, key string) (KeyHolder, bool, error) {
	if err := s.check(); err != nil {
		return KeyHolder{}, false, err
	}
	h := KeyHolder{Key: key}
	var claimed int64
	err := s.r.QueryRowContext(ctx, `SELECT run, step, claimed FROM dup_keys WHERE key = ?`, key).Scan(&h.Run, &h.Step, &claimed)
	if errors.Is(err, sql.ErrNoRows) {
		return KeyHolder{}, false, nil
	}
	if err != nil {
		return KeyHolder{}, false, fmt.Errorf("store: read key: %w", err)
	}
	h.Claimed = nt(claimed)
	return h, true, nil
}
