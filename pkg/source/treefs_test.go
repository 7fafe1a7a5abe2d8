package source

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"

	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// An objects-only fetch checks nothing out, and FS serves the commit's files: fs.FS
// conformance (fstest.TestFS), contents, and links recorded but never followed.
func TestObjectsOnlyFS(t *testing.T) {
	repo := sourcetest.NewRepo(t)
	repo.WriteFile("reg/a.yaml", "tool: a\n")
	repo.WriteFile("reg/sub/b.json", "{}\n")
	if err := os.Symlink("/etc/passwd", filepath.Join(repo.Dir, "reg", "evil.yaml")); err != nil {
		t.Fatal(err)
	}
	repo.Commit("files")
	a, err := Fetch(context.Background(), Options{URL: repo.FileURL(), Ref: Ref{Branch: "main"}, AllowFileURLs: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Cleanup()
	if _, err := os.Stat(filepath.Join(a.Dir, "reg")); err == nil {
		t.Fatal("files were checked out")
	}
	files, err := a.FS()
	if err != nil {
		t.Fatal(err)
	}
	if err := fstest.TestFS(files, "reg/a.yaml", "reg/sub/b.json", "reg/evil.yaml"); err != nil {
		t.Fatal(err)
	}
	if b, _ := fs.ReadFile(files, "reg/a.yaml"); string(b) != "tool: a\n" {
		t.Fatalf("a.yaml = %q", b)
	}
	fi, err := fs.Stat(files, "reg/evil.yaml")
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("link: %v %v", fi, err)
	}
	if b, _ := fs.ReadFile(files, "reg/evil.yaml"); len(b) != 0 {
		t.Fatalf("the link was followed: %q", b)
	}
}
