package store

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// fdatasync writes f's data and the metadata needed to read it (its size), not its times.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// unlinked reports whether f's file has no name left (or cannot be told).
func unlinked(f *os.File) bool {
	var st syscall.Stat_t
	return syscall.Fstat(int(f.Fd()), &st) != nil || st.Nlink == 0
}

// syncCountersSize is the mapped size of syncLockFile: a header (magic, boot id) and the
// counters, padded to a page.
const syncCountersSize = 4096

// syncMagic opens syncLockFile's header; the counters of another format or boot are reset.
const syncMagic = "rvsync01"

// sharedCounters maps the counters of dir's syncLockFile, creating the file if needed. The
// counters hold only within one boot (the page cache they speak of does not survive a
// reboot, and the file is not synced), so a file written under another boot id is reset. The
// caller holds the folder's writer lock. It returns the file (for its flock) and the
// counters; nil counters (and no error) when the boot id cannot be read.
func sharedCounters(dir string) (*os.File, *syncCounters, error) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil || len(boot) < 32 {
		return nil, nil, nil // no boot id: no counters that survive a reboot safely
	}
	f, err := os.OpenFile(filepath.Join(dir, syncLockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("store: data folder: %w", err)
	}
	fail := func(err error) (*os.File, *syncCounters, error) {
		f.Close()
		return nil, nil, fmt.Errorf("store: %s: %w", f.Name(), err)
	}
	if fi, err := f.Stat(); err != nil {
		return fail(err)
	} else if fi.Size() < syncCountersSize {
		if err := f.Truncate(syncCountersSize); err != nil {
			return fail(err)
		}
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, syncCountersSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return fail(err)
	}
	// layout: magic [0:8], boot id [8:48], commits [48:56], synced [56:64]
	header := append([]byte(syncMagic), make([]byte, 40)...)
	copy(header[8:], bytes.TrimSpace(boot))
	// The page stays mapped until the process exits (never unmapped: a late reader, the
	// flush timer of a closed store, must not fault).
	c := &syncCounters{
		commits: (*atomic.Uint64)(unsafe.Pointer(&mem[48])),
		synced:  (*atomic.Uint64)(unsafe.Pointer(&mem[56])),
	}
	if !bytes.Equal(mem[:48], header) {
		c.commits.Store(0)
		c.synced.Store(0)
		copy(mem, header)
	}
	return f, c, nil
}
