//go:build !linux

package store

import "os"

// fdatasync is fsync where the system has no fdatasync.
func fdatasync(f *os.File) error { return f.Sync() }

// unlinked reports whether f's file is gone from its name; without link counts, whether its
// name now names another file (or none).
func unlinked(f *os.File) bool {
	a, err := f.Stat()
	if err != nil {
		return true
	}
	b, err := os.Stat(f.Name())
	return err != nil || !os.SameFile(a, b)
}

// sharedCounters: elsewhere the commit counters are each process's own (no boot id to tell
// counters of an earlier boot).
func sharedCounters(string) (*syncCounters, error) { return nil, nil }
