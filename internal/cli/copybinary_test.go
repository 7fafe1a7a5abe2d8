package cli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Issue 23: `reversi copy-binary DEST` copies the running binary (here the test binary) to
// DEST, byte for byte, mode 0555, replacing an older copy and leaving no temporary file; the
// copy runs. A DEST in a folder that does not exist is an error naming it.
func TestCopyBinary(t *testing.T) {
	dir := t.TempDir()
	dest := filepath.Join(dir, "reversi")
	if err := os.WriteFile(dest, []byte("an older copy"), 0o555); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := Execute([]string{"copy-binary", dest}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dest)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the copy differs from %s (%d bytes, want %d): %v", self, len(got), len(want), err)
	}
	if st, err := os.Stat(dest); err != nil || st.Mode().Perm() != 0o555 {
		t.Errorf("mode %v, want 0555 (%v)", st.Mode(), err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the folder holds %v, want only the copy", entries)
	}
	if !strings.Contains(out.String(), "copied "+self+" to "+dest) {
		t.Errorf("output %q", out.String())
	}
	// The copy is the program: the test binary lists its tests.
	if b, err := exec.Command(dest, "-test.list", "TestCopyBinary").Output(); err != nil || !strings.Contains(string(b), "TestCopyBinary") {
		t.Errorf("running the copy: %v %s", err, b)
	}

	errb.Reset()
	missing := filepath.Join(dir, "nope", "reversi")
	if code := Execute([]string{"copy-binary", missing}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "copying to "+missing) {
		t.Errorf("a missing folder: exit %d, %q", code, errb.String())
	}
}

// A DEST that is a symlink is replaced, not followed: the file it pointed at is left as it was.
func TestCopyBinaryDestSymlink(t *testing.T) {
	dir, outside := t.TempDir(), filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(outside, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(dir, "reversi")
	if err := os.Symlink(outside, dest); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := Execute([]string{"copy-binary", dest}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if b, _ := os.ReadFile(outside); string(b) != "keep" {
		t.Errorf("the symlink's target was written: %d bytes", len(b))
	}
	if st, err := os.Lstat(dest); err != nil || !st.Mode().IsRegular() {
		t.Errorf("DEST is %v (%v), want a regular file", st.Mode(), err)
	}
}
