package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Memory is a Store that keeps everything in process memory: nothing survives the process. It
// is the SQLite store on an in-memory database (the same statements and rules, no file, no
// fsync), whose one connection serves the writer and the reads in turn. Recover completes every
// intent without an outcome: no other instance can share its data. The zero value is not
// usable: use NewMemory.
//
// Why SQLite rather than maps: the maps were a third copy of every rule (numbering, keys,
// approvals, search) that drifted from the SQL stores. The price is CPU, not time that tests
// notice: about 50 µs per journaled call (intent and outcome, each one statement) against
// 7-20 for the maps (BenchmarkCallPair, BenchmarkMemoryCall), gateway/engine's tests 0.05 s
// -> 0.14 s.
type Memory struct {
	sqlStore
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory store. A nil clock means time.Now. It panics if SQLite
// cannot create an in-memory database (out of memory).
func NewMemory(clock Clock) *Memory {
	if clock == nil {
		clock = time.Now
	}
	m, err := openMemory(clock)
	if err != nil {
		panic(fmt.Sprintf("store: in-memory database: %v", err))
	}
	return m
}

func openMemory(clock Clock) (*Memory, error) {
	// Every connection to ":memory:" is a database of its own: the pool has exactly one.
	db, err := sql.Open("sqlite", "file::memory:?_pragma=foreign_keys(1)&_txlock=immediate")
	if err != nil {
		return nil, err
	}
	oneConnection(db)
	if err := createSchema(db, sqliteDialect); err != nil {
		db.Close()
		return nil, err
	}
	w, err := newWriter(db, nil, nil)
	if err != nil {
		db.Close()
		return nil, err
	}
	m := &Memory{sqlStore{d: sqliteDialect, r: flushedReads{w, sqlQuerier{db}}, w: w, now: clock, instance: newID("mem-"), inst: memInstances{}}}
	m.release = db.Close
	return m, nil
}

// memInstances: a memory store is the only instance on its data, and Recover runs when the
// gateway starts (or a test says so): every instance found is gone.
type memInstances struct{}

func (memInstances) usable() error { return nil }

func (memInstances) lockDead(_ context.Context, ids []string) (map[string]bool, func(), error) {
	dead := make(map[string]bool, len(ids))
	for _, id := range ids {
		dead[id] = true
	}
	return dead, func() {}, nil
}

func (memInstances) close() error { return nil }
