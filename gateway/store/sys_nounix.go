//go:build !unix

package store

import "os"

// lockFile does nothing without flock(2): writers of several processes then meet in SQLite's
// busy handler only.
func lockFile(*os.File) error { return nil }

func unlockFile(*os.File) error { return nil }
