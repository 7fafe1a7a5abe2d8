package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// MaxSummaryCount caps each count of SummarizeNotifications: a count that reaches it means
// "at least this many" (the count stops reading there, so a summary costs the same however
// large the outbox grows).
const MaxSummaryCount = 10000

// NotificationSummary is what a gateway reports about its outbox (issue 24: dead letters
// "visible as a condition"): how many rows are dead, how many are pending after at least one
// failed attempt, and the newest dead row. Counts stop at MaxSummaryCount.
type NotificationSummary struct {
	// Dead counts the dead letters (NotificationDead).
	Dead int
	// Retrying counts the pending rows whose last attempt failed (Attempts >= 1): rows that
	// were not tried yet are not counted, so a held call does not change the summary.
	Retrying int
	// LastDead is the newest dead row (by Created, then ID); nil when Dead is 0.
	LastDead *Notification
}

// NotificationSummarizer is implemented by the SQL stores (SQLite, Postgres, Memory).
type NotificationSummarizer interface {
	// SummarizeNotifications summarizes the rows of the receivers named in sinks (the ones
	// configured now: rows dead-lettered because their receiver was removed are not counted).
	// No sinks: an empty summary, without a query. Errors: the store's (ErrClosed, the
	// database's), wrapped as "store: summarize notifications: ...".
	SummarizeNotifications(ctx context.Context, sinks []string) (NotificationSummary, error)
}

var _ NotificationSummarizer = (*sqlStore)(nil)

// SummarizeNotifications implements NotificationSummarizer with three bounded reads: the
// retrying count uses the index of pending rows; the dead count reads at most
// MaxSummaryCount matching rows, from the index of dead rows, which also gives the newest
// dead row.
// Source: issue 24.
func (s *sqlStore) SummarizeNotifications(ctx context.Context, sinks []string) (NotificationSummary, error) {
	var sum NotificationSummary
	if err := s.check(); err != nil {
		return sum, err
	}
	if len(sinks) == 0 {
		return sum, nil
	}
	count := func(where string) (int, error) {
		q := &query{}
		in := q.placeholders(sinks)
		q.add(`SELECT count(*) FROM (SELECT 1 FROM notifications WHERE `, where, ` AND sink IN (`, in, `) LIMIT `, q.arg(int64(MaxSummaryCount)), `) c`)
		var n int
		if err := queryRow(ctx, s.r, q.sql.String(), q.args...).Scan(&n); err != nil {
			return 0, fmt.Errorf("store: summarize notifications: %w", err)
		}
		return n, nil
	}
	var err error
	if sum.Dead, err = count(`state = 'dead'`); err != nil {
		return NotificationSummary{}, err
	}
	if sum.Retrying, err = count(`state = 'pending' AND attempts > 0`); err != nil {
		return NotificationSummary{}, err
	}
	if sum.Dead == 0 {
		return sum, nil
	}
	q := &query{}
	in := q.placeholders(sinks)
	q.add(`SELECT `+notificationCols+` FROM notifications WHERE state = 'dead' AND sink IN (`, in, `) ORDER BY created DESC, id DESC LIMIT 1`)
	n, err := scanNotification(queryRow(ctx, s.r, q.sql.String(), q.args...))
	switch {
	case errors.Is(err, sql.ErrNoRows): // counted, then gone: no row to name
	case err != nil:
		return NotificationSummary{}, fmt.Errorf("store: summarize notifications: %w", err)
	default:
		sum.LastDead = &n
	}
	return sum, nil
}
