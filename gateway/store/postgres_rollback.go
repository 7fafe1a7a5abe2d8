package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// AppendRollback implements Store.
func (s *Postgres) AppendRollback(ctx context.Context, e RollbackEntry) (int64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	enc, err := encodeRollback(e)
	if err != nil {
		return 0, err
	}
	rec := rollbackRecord(e)
	err = s.tx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var kind string
		err := tx.QueryRow(ctx, `SELECT kind FROM records WHERE run = $1 AND seq = $2 AND run <> ''`, e.Run, e.Step).Scan(&kind)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && kind != string(KindIntent)) {
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
