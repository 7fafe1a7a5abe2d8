package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// pgAdvanceHighWater stores a mark only if it is newer than the stored one: the check and the
// write are one statement. On a conflict the stored row is locked whether or not it is
// updated, so the SELECT that follows a no-change in the same transaction reads a row no other
// replica can change before this transaction ends.
const pgAdvanceHighWater = `INSERT INTO high_water AS h (source, sequence, revision, digest, updated) VALUES ($1, $2, $3, $4, $5)
	ON CONFLICT (source) DO UPDATE SET sequence = excluded.sequence, revision = excluded.revision,
		digest = excluded.digest, updated = excluded.updated
	WHERE excluded.sequence > h.sequence`

// AdvanceHighWater implements Store. The batch is one transaction, committed synchronously;
// marks are written in Source order, so concurrent batches lock rows in one order and cannot
// deadlock. A refusal rolls the transaction back: nothing of the batch is stored.
func (s *Postgres) AdvanceHighWater(ctx context.Context, marks []HighWater) error {
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
	return s.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		now := tn(s.stamp())
		return advanceMarks(marks, func(h HighWater) (int64, error) {
			tag, err := tx.Exec(ctx, pgAdvanceHighWater, h.Source, h.Sequence, h.Revision, h.Digest, now)
			return tag.RowsAffected(), err
		}, func(source string) (HighWater, error) {
			return scanHighWater(tx.QueryRow(ctx, `SELECT `+highWaterCols+` FROM high_water WHERE source = $1`, source))
		})
	})
}

// HighWaters implements Store.
func (s *Postgres) HighWaters(ctx context.Context) ([]HighWater, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT `+highWaterCols+` FROM high_water ORDER BY source`)
	if err != nil {
		return nil, fmt.Errorf("store: read high-water marks: %w", err)
	}
	defer rows.Close()
	return scanHighWaters(rows)
}
