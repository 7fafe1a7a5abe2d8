package store

import (
	"os"
	"syscall"
)

// fdatasync writes f's data and the metadata needed to read it (its size), not its times.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// unlinked reports whether f's file has no name left (or cannot be told).
func unlinked(f *os.File) bool {
	var st syscall.Stat_t
	return syscall.Fstat(int(f.Fd()), &st) != nil || st.Nlink == 0
}
