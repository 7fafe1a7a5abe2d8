package store

import (
	"context"
	"errors"
	"fmt"
)

// AppendRollback implements Store.
func (m *Memory) AppendRollback(_ context.Context, e RollbackEntry) (int64, error) {
	enc, err := encodeRollback(e)
	if err != nil {
		return 0, err
	}
	if err := m.lock(); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	r, err := m.getRun(e.Run)
	if err != nil {
		return 0, err
	}
	if e.Step > int64(len(r.records)) || r.records[e.Step-1].Kind != KindIntent {
		return 0, fmt.Errorf("%w: step %d in run %s", ErrNotFound, e.Step, e.Run)
	}
	if e.Approval != "" {
		a, ok := m.approvals[e.Approval]
		if !ok {
			return 0, fmt.Errorf("%w: approval %s", ErrNotFound, e.Approval)
		}
		work := cloneApproval(a)
		if err := work.consume(e.Run, e.Tool, e.ArgsDigest, m.now()); err != nil && !errors.Is(err, ErrConsumed) {
			return 0, err
		}
		*a = work
	}
	rec := rollbackRecord(e)
	rec.Handle, _ = decodeHandle(enc) // a deep copy
	return m.appendLocked(r, rec).Seq, nil
}
