package store

import (
	"context"
	"database/sql"
	"fmt"
)

// sqlAdvanceHighWater stores a mark only if it is newer than the stored one: the check and the
// write are one statement. When it changes no row, the stored mark is equal or newer.
const sqlAdvanceHighWater = `INSERT INTO high_water (source, sequence, revision, digest, updated) VALUES (?, ?, ?, ?, ?)
	ON CONFLICT (source) DO UPDATE SET sequence = excluded.sequence, revision = excluded.revision,
		digest = excluded.digest, updated = excluded.updated
	WHERE excluded.sequence > high_water.sequence`

// AdvanceHighWater implements Store. The batch is one durable write (fsynced before it
// returns) on the writer connection, whose transactions are IMMEDIATE: the file's write lock is
// held from the first statement, so no other process on the file writes between the check and
// the write. A refusal rolls the request's savepoint back, so nothing of the batch is stored.
func (s *SQLite) AdvanceHighWater(ctx context.Context, marks []HighWater) error {
	marks, err := prepareMarks(marks)
	if err != nil {
		return err
	}
	if err := s.check(); err != nil {
		return err
	}
	if len(marks) == 0 {
		return nil
	}
	return s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		now := tn(s.stamp())
		return advanceMarks(marks, func(h HighWater) (int64, error) {
			res, err := tx.ExecContext(ctx, sqlAdvanceHighWater, h.Source, h.Sequence, h.Revision, h.Digest, now)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		}, func(source string) (HighWater, error) {
			return scanHighWater(tx.QueryRowContext(ctx, `SELECT `+highWaterCols+` FROM high_water WHERE source = ?`, source))
		})
	})
}

// advanceMarks is AdvanceHighWater's loop over one SQL transaction (both SQL stores): upsert
// each mark with the dialect's conditional statement (upsert says how many rows it changed)
// and, when it changed none, read the stored mark to tell an equal mark from an older one.
func advanceMarks(marks []HighWater, upsert func(HighWater) (int64, error), stored func(source string) (HighWater, error)) error {
	var refused []Downgrade
	for _, h := range marks {
		n, err := upsert(h)
		if err != nil {
			return fmt.Errorf("store: advance high-water mark of %s: %w", h.Source, err)
		}
		if n == 1 {
			continue
		}
		s, err := stored(h.Source)
		if err != nil {
			return fmt.Errorf("store: read high-water mark of %s: %w", h.Source, err)
		}
		if h.olderThan(s) {
			refused = append(refused, Downgrade{Offered: h, Stored: s})
		}
	}
	if refused != nil {
		return &DowngradeError{Refused: refused}
	}
	return nil
}

const highWaterCols = `source, sequence, revision, digest, updated`

func scanHighWater(sc interface{ Scan(...any) error }) (HighWater, error) {
	var h HighWater
	var updated int64
	if err := sc.Scan(&h.Source, &h.Sequence, &h.Revision, &h.Digest, &updated); err != nil {
		return HighWater{}, err
	}
	h.Updated = nt(updated)
	return h, nil
}

// HighWaters implements Store.
func (s *SQLite) HighWaters(ctx context.Context) ([]HighWater, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rows, err := s.r.QueryContext(ctx, `SELECT `+highWaterCols+` FROM high_water ORDER BY source`)
	if err != nil {
		return nil, fmt.Errorf("store: read high-water marks: %w", err)
	}
	defer rows.Close()
	return scanHighWaters(rows)
}

// scanHighWaters reads rows of highWaterCols (both SQL stores); the caller closes rows.
func scanHighWaters(rows interface {
	Next() bool
	Scan(...any) error
	Err() error
}) ([]HighWater, error) {
	var out []HighWater
	for rows.Next() {
		h, err := scanHighWater(rows)
		if err != nil {
			return nil, fmt.Errorf("store: read high-water marks: %w", err)
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: read high-water marks: %w", err)
	}
	return out, nil
}
