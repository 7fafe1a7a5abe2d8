package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// pgTextClause matches a record (columns of records, prefixed by p) against the lowered
// needle $n. translate() lowers ASCII letters only, as asciiLower and SQLite's lower() do, so
// that every store agrees on what matches whatever the database's locale; strpos takes the
// needle literally (no LIKE wildcards).
func pgTextClause(p string, n int) string {
	var cols []string
	for _, c := range []string{"run", "tool", "reason", "note", "compensation_tool"} {
		cols = append(cols, fmt.Sprintf("strpos(translate(%s%s, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz'), $%d) > 0", p, c, n))
	}
	return fmt.Sprintf("($%d = '' OR %s)", n, strings.Join(cols, " OR "))
}

// SearchRuns implements Store.
func (s *Postgres) SearchRuns(ctx context.Context, f RunSearch) ([]Run, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	q := `SELECT ` + pgRunCols + ` FROM runs WHERE id != '' AND ($1 = '' OR actor = $1) AND ($2 = '' OR status = $2)`
	args := []any{f.Actor, string(f.Status), pgLimit(f.Limit)}
	if f.recordFilter() {
		q += ` AND EXISTS (SELECT 1 FROM records r WHERE r.run = runs.id AND ($4 = '' OR r.tool = $4) AND ($5 = '' OR r.status = $5) AND ` +
			pgTextClause("r.", 6) + `)`
		args = append(args, f.Tool, string(f.Outcome), asciiLower(f.Text))
	}
	return s.queryRuns(ctx, "search runs", q+` ORDER BY started DESC, id LIMIT $3`, args...)
}

// SearchRecords implements Store.
func (s *Postgres) SearchRecords(ctx context.Context, f RecordSearch) ([]Record, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.queryRecords(ctx, "search records", `SELECT `+recordCols+` FROM records
		WHERE ($1 = '' OR run IN (SELECT id FROM runs WHERE actor = $1 AND id != ''))
		AND ($2 = '' OR run = $2) AND ($3 = '' OR tool = $3) AND ($4 = '' OR status = $4) AND `+pgTextClause("", 5)+`
		ORDER BY time DESC, run, seq DESC LIMIT $6`,
		f.Actor, f.Run, f.Tool, string(f.Status), asciiLower(f.Text), pgLimit(f.Limit))
}

// CountOutcomes implements Store.
func (s *Postgres) CountOutcomes(ctx context.Context, runs []string) (map[string]OutcomeCounts, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	out := make(map[string]OutcomeCounts, len(runs))
	if len(runs) == 0 {
		return out, nil
	}
	// one row per existing run: its status counts, or a NULL status when it has no outcome
	rows, err := s.pool.Query(ctx, `SELECT runs.id, c.status, coalesce(c.n, 0) FROM runs
		LEFT JOIN (SELECT run, status, count(*) AS n FROM records WHERE kind = 'outcome' AND run = ANY($1) GROUP BY run, status) c
		ON c.run = runs.id WHERE runs.id != '' AND runs.id = ANY($1)`, runs)
	if err != nil {
		return nil, fmt.Errorf("store: count outcomes: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var status *string
		var n int
		if err := rows.Scan(&id, &status, &n); err != nil {
			return nil, fmt.Errorf("store: count outcomes: %w", err)
		}
		if out[id] == nil {
			out[id] = OutcomeCounts{}
		}
		if status != nil {
			out[id][Status(*status)] = n
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: count outcomes: %w", err)
	}
	return out, nil
}

// HeldKey implements Store.
func (s *Postgres) HeldKey(ctx context.Context, key string) (KeyHolder, bool, error) {
	if err := s.check(); err != nil {
		return KeyHolder{}, false, err
	}
	h := KeyHolder{Key: key}
	var claimed int64
	err := s.pool.QueryRow(ctx, `SELECT run, step, claimed FROM dup_keys WHERE key = $1`, []byte(key)).Scan(&h.Run, &h.Step, &claimed)
	if errors.Is(err, pgx.ErrNoRows) {
		return KeyHolder{}, false, nil
	}
	if err != nil {
		return KeyHolder{}, false, fmt.Errorf("store: read key: %w", err)
	}
	h.Claimed = nt(claimed)
	return h, true, nil
}
