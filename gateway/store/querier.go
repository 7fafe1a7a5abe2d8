package store

import (
	"context"
	"database/sql"
	"fmt"
)

// querier runs statements: a transaction, a pool, or one connection, of database/sql
// (SQLite) or of pgx (Postgres, natively: database/sql's layer cost a fifth of its CPU per
// call). sqlStore's statements go through it and nothing else.
type querier interface {
	// exec runs a statement and returns how many rows it changed.
	exec(ctx context.Context, query string, args ...any) (int64, error)
	// query runs a statement that returns rows.
	query(ctx context.Context, query string, args ...any) (rows, error)
}

// rows are a statement's result rows (*sql.Rows has these methods; pgx's are adapted).
type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

// sqlQuerier is a querier of database/sql: *sql.DB, *sql.Tx or *sql.Conn.
type sqlQuerier struct {
	q interface {
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
		QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	}
}

func (s sqlQuerier) exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := s.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (s sqlQuerier) query(ctx context.Context, query string, args ...any) (rows, error) {
	r, err := s.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// flushedReads is a store's read querier: each statement first waits for the writes its
// store queued (QueueOutcome), so that a read sees every write whose method returned.
type flushedReads struct {
	w runner
	q querier
}

func (f flushedReads) exec(ctx context.Context, query string, args ...any) (int64, error) {
	if err := f.w.flush(ctx); err != nil {
		return 0, err
	}
	return f.q.exec(ctx, query, args...)
}

func (f flushedReads) query(ctx context.Context, query string, args ...any) (rows, error) {
	if err := f.w.flush(ctx); err != nil {
		return nil, err
	}
	return f.q.query(ctx, query, args...)
}

// oneRow is the first row of a statement that is run to its end.
type oneRow struct {
	rows rows
	err  error
}

// queryRow runs query on q and returns its first row. Unlike database/sql's QueryRow it steps
// the statement to its end before closing it: SQLite commits a statement outside a
// transaction (an INSERT ... RETURNING) when it is reset, but runs the WAL's automatic
// checkpoint only at its end, so a statement closed after its first row would let the WAL
// grow without bound.
func queryRow(ctx context.Context, q querier, query string, args ...any) *oneRow {
	r, err := q.query(ctx, query, args...)
	return &oneRow{rows: r, err: err}
}

// Scan reads the row into dest: sql.ErrNoRows when there is none; the statement's own error
// (a constraint, a failed commit) otherwise.
func (r *oneRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	for r.rows.Next() { // bounded: the statements read this way return one row
	}
	if err := r.rows.Err(); err != nil {
		return err
	}
	return r.rows.Close()
}

// collect runs a query on q and scans each row with scan. Errors are wrapped as
// "store: <what>: ...".
func collect[T any](ctx context.Context, q querier, what, query string, args []any, scan func(rows) (T, error)) ([]T, error) {
	r, err := q.query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("store: %s: %w", what, err)
	}
	defer r.Close()
	var out []T
	for r.Next() {
		v, err := scan(r)
		if err != nil {
			return nil, fmt.Errorf("store: %s: %w", what, err)
		}
		out = append(out, v)
	}
	if err := r.Err(); err != nil {
		return nil, fmt.Errorf("store: %s: %w", what, err)
	}
	return out, nil
}
