package store

import (
	"context"
	"fmt"
	"time"
)

// LimitKey names one counter of a policy limit rule (pkg/policy.CountKey): the rule
// ("<policy>/<rule>"), its scope (run, actor or gateway) and the subject counted in it (the
// run id, the principal or the gateway's name).
type LimitKey struct {
	Rule, Scope, Subject string
}

// CountCalls implements Store.
func (s *sqlStore) CountCalls(ctx context.Context, key LimitKey, since time.Time) (int, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	from := int64(0)
	if !since.IsZero() {
		from = tn(since)
	}
	var n int
	if err := queryRow(ctx, s.r, `SELECT COUNT(*) FROM limit_calls WHERE rule = $1 AND scope = $2 AND subject = $3 AND time >= $4`,
		key.Rule, key.Scope, key.Subject, from).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count calls: %w", err)
	}
	return n, nil
}

// AddCall implements Store. It is written lazily: the call's intent, written after it and
// durable before the upstream sees the call, makes it durable too (one log, in order).
func (s *sqlStore) AddCall(ctx context.Context, key LimitKey, at time.Time) error {
	if err := s.check(); err != nil {
		return err
	}
	return s.write(ctx, lazy|single, func(ctx context.Context, tx querier) error {
		if _, err := tx.exec(ctx, `INSERT INTO limit_calls (rule, scope, subject, time) VALUES ($1, $2, $3, $4)`,
			key.Rule, key.Scope, key.Subject, tn(at)); err != nil {
			return fmt.Errorf("store: add call: %w", err)
		}
		return nil
	})
}
