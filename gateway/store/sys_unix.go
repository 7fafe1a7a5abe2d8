//go:build unix

package store

import (
	"os"
	"syscall"
)

// lockFile takes f's exclusive flock(2), blocking: the kernel queues the waiters.
func lockFile(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			return err
		}
	}
}

// unlockFile releases f's flock(2).
func unlockFile(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }
