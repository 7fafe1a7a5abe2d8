package store

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// syncCountersFile, in the data folder, holds the commit counters the processes on the
// folder share (syncCounters).
const syncCountersFile = "sync.counters"

// walSync makes a database's commits durable by syncing its WAL file (see SQLite): the
// connections run with synchronous=NORMAL (a commit writes the WAL without syncing it) and a
// writer syncs after a commit that holds a durable write. One sync covers every commit
// before it, of this process or another one: the WAL is one file, written front to back
// until a restart, and a restart comes only after a checkpoint has synced everything.
//
// Commits are numbered (syncCounters.commits, counted after each commit) and a sync records
// the highest number it covers (synced): the number read before its fdatasync started, whose
// commits had all written their frames by then. A writer whose commit is number c skips its
// own sync when synced >= c: another process's sync covered it. Syncs of several processes
// are not queued behind one another (the kernel merges concurrent flushes of a file, and a
// queue of waiters woken one by one cost more than it saved).
type walSync struct {
	path   string // the -wal file
	ctr    *syncCounters
	shared bool // ctr is shared with the folder's other processes

	mu     sync.Mutex // one sync at a time in the process; f, closed
	f      *os.File   // opened on the first sync, reopened if the file was deleted
	closed bool

	lastLazy atomic.Uint64 // the number of this process's last lazy commit
	armed    atomic.Bool   // a flush of the lazy commits is due (timer)
	timer    *time.Timer
	syncs    atomic.Int64 // fdatasyncs done by this process (tests)
}

// syncCounters are the commit numbers: commits made, and the highest one a completed sync
// covers. Shared by the processes on a data folder (memory-mapped from syncCountersFile) where
// the system allows, else this process's own.
type syncCounters struct {
	commits, synced *atomic.Uint64
}

// localCounters are counters of this process alone.
func localCounters() *syncCounters {
	return &syncCounters{commits: new(atomic.Uint64), synced: new(atomic.Uint64)}
}

// newWALSync returns the syncer of the WAL at path, sharing counters through dir's
// syncCountersFile when it can (the caller holds the folder's writer lock, so that a reset of the
// counters cannot interleave with another process's open).
func newWALSync(dir, path string) (*walSync, error) {
	s := &walSync{path: path}
	ctr, err := sharedCounters(dir)
	if err != nil {
		return nil, err
	}
	s.ctr, s.shared = ctr, ctr != nil
	if ctr == nil {
		s.ctr = localCounters()
	}
	s.timer = time.AfterFunc(time.Hour, s.flush)
	s.timer.Stop()
	return s, nil
}

// committed numbers a commit that has just been made.
func (s *walSync) committed() uint64 { return s.ctr.commits.Add(1) }

// syncThrough returns once commit number c is durable, syncing the WAL unless a sync of this
// or another process has covered it. Errors: the WAL cannot be opened or synced (the commit
// may then be lost by a power loss); ErrClosed.
func (s *walSync) syncThrough(c uint64) error {
	if s.ctr.synced.Load() >= c {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.ctr.synced.Load() >= c {
		return nil // a sync covered it while this one waited for mu
	}
	through := s.ctr.commits.Load() // these commits have written their frames: the sync covers them
	if s.f != nil && unlinked(s.f) {
		s.f.Close() // deleted (the last connection closed it): sync the file SQLite writes now
		s.f = nil
	}
	if s.f == nil {
		f, err := os.OpenFile(s.path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("store: sync the WAL: %w", err)
		}
		s.f = f
	}
	if err := fdatasync(s.f); err != nil {
		return fmt.Errorf("store: sync the WAL %s: %w", s.path, err)
	}
	s.syncs.Add(1)
	for range 64 { // bounded: each failed swap is another process's larger number
		old := s.ctr.synced.Load()
		if old >= through || s.ctr.synced.CompareAndSwap(old, through) {
			break
		}
	}
	return nil
}

// unsynced reports whether a lazy commit of this process waits for a sync.
func (s *walSync) unsynced() bool { return s.ctr.synced.Load() < s.lastLazy.Load() }

// committedLazy notes lazy commit number c: it is synced within lazyFlushInterval.
func (s *walSync) committedLazy(c uint64) {
	s.lastLazy.Store(c) // one batch at a time: numbers only grow
	if s.armed.CompareAndSwap(false, true) {
		s.timer.Reset(lazyFlushInterval)
	}
}

// flush syncs the lazy commits that no durable write has synced yet.
func (s *walSync) flush() {
	s.armed.Store(false)
	if s.unsynced() && s.syncThrough(s.lastLazy.Load()) != nil && s.armed.CompareAndSwap(false, true) {
		s.timer.Reset(lazyFlushInterval) // try again
	}
}

// close syncs what is unsynced and releases the files (the counters stay readable).
func (s *walSync) close() error {
	s.timer.Stop()
	var err error
	if s.unsynced() {
		err = s.syncThrough(s.lastLazy.Load())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.f != nil {
		err = errors.Join(err, s.f.Close())
		s.f = nil
	}
	return err
}
