package source_test

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/pkg/source"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// ATTACK (git pusher; memory exhaustion through the source): the limits bound the bytes of the
// files under spec.path and the inflated bytes of a pack, but not how many files there are.
// Empty files cost nothing against either limit: one commit with 640,000 entries under
// spec.path (8 trees of 80,000 entries, each tree 2.6 MB, all naming the one empty blob)
// passes every check, and Artifact.FS builds an in-memory node per entry: ~470 MiB of heap;
// 20 such trees (1.6 million entries, ~53 MiB of trees, under the 64 MiB pack limit) held
// 1180 MiB, more than the controller's 1 GiB memory limit. Without verify.commit (a registry that relies on writer
// signatures) anyone who can push makes the controller — which also serves the Approval
// webhook — read it; the controller pays this on every reconcile of that revision.
func TestManyEmptyFilesUnderPathAreNotBounded(t *testing.T) {
	sourcetest.RequireTools(t, "git", "python3")
	r := sourcetest.NewRepo(t)
	git := func(stdin []byte, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Stdin = r.Dir, bytes.NewReader(stdin)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@x", "GIT_COMMITTER_NAME=a", "GIT_COMMITTER_EMAIL=a@x")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	const trees, entries = 8, 80000
	empty := git(nil, "hash-object", "-w", "--stdin")
	var sub strings.Builder
	for d := 0; d < trees; d++ {
		var lines bytes.Buffer
		for i := 0; i < entries; i++ {
			fmt.Fprintf(&lines, "100644 blob %s\ta%05d\n", empty, i)
		}
		fmt.Fprintf(&sub, "040000 tree %s\td%02d\n", git(lines.Bytes(), "mktree"), d)
	}
	reg := git([]byte(sub.String()), "mktree")
	root := git([]byte("040000 tree "+reg+"\treg\n"), "mktree")
	commit := git(nil, "commit-tree", root, "-m", "a few files")
	git(nil, "update-ref", "refs/heads/main", commit)

	a := fetch(t, source.Options{URL: r.FileURL(), AllowFileURLs: true, Path: "reg", Ref: source.Ref{Branch: "main"}})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	files, err := a.FS()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(files)
	if err != nil {
		t.Logf("refused: %v", err)
		return
	}
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 64<<20 {
		t.Fatalf("Artifact.FS of %d empty files under reg/ holds %d MiB of heap (limit 64 MiB of files): bound the number of entries under spec.path (e.g. --source-max-files, default 10,000) and count tree bytes against the total",
			trees*entries, grew>>20)
	}
}

// The honest path: MaxFiles counts every entry under Path (the folder leading to it, folders,
// files), nothing outside it; a registry at the limit reads whole, one more entry is
// ErrTooLarge naming the limit; empty files count against MaxTotalBytes too.
func TestFilesUnderPathAreCounted(t *testing.T) {
	r := sourcetest.NewRepo(t)
	for i := 0; i < 10; i++ {
		r.WriteFile(fmt.Sprintf("reg/tools/t%d.yaml", i), "tool")
	}
	r.WriteFile("reg/a.yaml", "a")
	r.WriteFile("reg/empty.yaml", "")
	for i := 0; i < 50; i++ {
		r.WriteFile(fmt.Sprintf("other/f%d", i), "")
	}
	r.Commit("a registry")
	const entries = 1 + 1 + 10 + 2 // reg, reg/tools, its files, reg's own files
	o := source.Options{URL: r.FileURL(), AllowFileURLs: true, Path: "reg", Ref: source.Ref{Branch: "main"}, MaxFiles: entries}
	files, err := fetch(t, o).FS()
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, fetch(t, o), "reg/tools/t9.yaml"); got != "tool" {
		t.Fatalf("t9.yaml = %q", got)
	}
	if list, err := fs.ReadDir(files, "reg/tools"); err != nil || len(list) != 10 {
		t.Fatalf("reg/tools lists %d entries (%v), want 10", len(list), err)
	}
	if b, err := fs.ReadFile(files, "reg/empty.yaml"); err != nil || len(b) != 0 {
		t.Fatalf("empty.yaml: %q %v", b, err)
	}

	o.MaxFiles = entries - 1
	_, err = fetch(t, o).FS()
	assertKind(t, err, source.ErrTooLarge, fmt.Sprintf("more than %d files and folders under reg", entries-1), "--source-max-files")

	// 50 empty files hold no bytes of content, but each costs 256 bytes and its path.
	o = source.Options{URL: r.FileURL(), AllowFileURLs: true, Path: "other", Ref: source.Ref{Branch: "main"}, MaxTotalBytes: 4096}
	_, err = fetch(t, o).FS()
	assertKind(t, err, source.ErrTooLarge, "under other total more than the 4 KiB limit", "counts 256 bytes")

	if source.DefaultMaxFiles < 10*10_000 {
		t.Fatalf("DefaultMaxFiles %d is too low for a registry of 10,000 files", source.DefaultMaxFiles)
	}
}
