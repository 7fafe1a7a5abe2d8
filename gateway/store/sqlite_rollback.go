package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// AppendRollback implements Store.
func (s *SQLite) AppendRollback(ctx context.Context, e RollbackEntry) (int64, error) {
	enc, err := encodeRollback(e)
	if err != nil {
		return 0, err
	}
	rec := rollbackRecord(e)
	err = s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var kind string
		err := tx.QueryRowContext(ctx, `SELECT kind FROM records WHERE run = ? AND seq = ? AND run != ''`, e.Run, e.Step).Scan(&kind)
		if errors.Is(err, sql.ErrNoRows) || (err == nil && kind != string(KindIntent)) {
			return fmt.Errorf("%w: step %d in run %q", ErrNotFound, e.Step, e.Run)
		}
		if err != nil {
			return fmt.Errorf("store: rollback record: %w", err)
		}
		if e.Approval != "" {
			if _, err := s.consumeTx(ctx, tx, e.Approval, e.Run, e.Tool, e.ArgsDigest, true); err != nil {
				return err
			}
		}
		return s.appendTx(ctx, tx, &rec, enc)
	})
	return rec.Seq, err
}
