package store

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fdatasync writes f's data and the metadata needed to read it (its size), not its times.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }

// unlinked reports whether f's file has no name left (or cannot be told). It asks for the
// link count alone (statx): a stat that returns the file's times marks them as read, and
// with multigrain timestamps (Linux 6.13+) the next write then stamps the inode with a fresh
// fine-grained time, which dirties it, so that every fdatasync also wrote the inode (ext4:
// one more device write per sync, a third of its CPU).
func unlinked(f *os.File) bool {
	var st unix.Statx_t
	switch err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_NLINK, &st); {
	case err == unix.ENOSYS: // before Linux 4.11 (and before multigrain timestamps)
		var st syscall.Stat_t
		return syscall.Fstat(int(f.Fd()), &st) != nil || st.Nlink == 0
	case err != nil:
		return true
	}
	return st.Mask&unix.STATX_NLINK == 0 || st.Nlink == 0
}

// syncCountersSize is the mapped size of syncCountersFile: a header (magic, boot id) and the
// counters, padded to a page.
const syncCountersSize = 4096

// syncMagic opens syncCountersFile's header; the counters of another format or boot are
// reset.
const syncMagic = "rvsync01"

// sharedCounters maps the counters of dir's syncCountersFile, creating the file if needed.
// The counters hold only within one boot (the page cache they speak of does not survive a
// reboot, and the file is not synced), so a file written under another boot id is reset. The
// caller holds the folder's writer lock. nil counters (and no error): the boot id cannot be
// read, so the counters stay the process's own.
func sharedCounters(dir string) (*syncCounters, error) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil || len(boot) < 32 {
		return nil, nil
	}
	f, err := os.OpenFile(filepath.Join(dir, syncCountersFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: data folder: %w", err)
	}
	defer f.Close() // the mapping outlives the descriptor
	if fi, err := f.Stat(); err != nil {
		return nil, fmt.Errorf("store: %s: %w", f.Name(), err)
	} else if fi.Size() < syncCountersSize {
		if err := f.Truncate(syncCountersSize); err != nil {
			return nil, fmt.Errorf("store: %s: %w", f.Name(), err)
		}
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, syncCountersSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("store: %s: %w", f.Name(), err)
	}
	// layout: magic [0:8], boot id [8:48], commits [48:56], synced [56:64]. The page stays
	// mapped until the process exits (never unmapped: a late reader, the flush timer of a
	// closed store, must not fault).
	header := append([]byte(syncMagic), make([]byte, 40)...)
	copy(header[8:], bytes.TrimSpace(boot))
	c := &syncCounters{
		commits: (*atomic.Uint64)(unsafe.Pointer(&mem[48])),
		synced:  (*atomic.Uint64)(unsafe.Pointer(&mem[56])),
	}
	if !bytes.Equal(mem[:48], header) {
		c.commits.Store(0)
		c.synced.Store(0)
		copy(mem, header)
	}
	return c, nil
}
