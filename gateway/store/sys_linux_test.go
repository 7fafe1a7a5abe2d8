package store

import (
	"os"
	"path/filepath"
	"testing"
)

// TestUnlinked: unlinked tells a file that still has its name from one that was deleted (the
// WAL walSync reopens).
func TestUnlinked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if unlinked(f) {
		t.Fatal("a file with its name is unlinked")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if !unlinked(f) {
		t.Fatal("a deleted file is not unlinked")
	}
}
