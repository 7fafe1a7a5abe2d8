package config

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// generated are the files and folders `make generate manifests` writes, relative to the
// repository root. A folder is compared file by file, in both directions (a CRD whose type
// was removed is stale too).
var generated = []string{
	"api/v1alpha1/zz_generated.deepcopy.go",
	"config/crd/bases",
	"config/rbac/role.yaml",
	"config/webhook/manifests.yaml",
	"config/namespaced/rbac.yaml",
	"config/namespaced/watched-namespace/role.yaml",
}

// TestGeneratedFilesAreCurrent runs `make generate manifests` (controller-gen and
// hack/namespaced-rbac, exactly as a developer does) on a copy of the repository and fails when
// the committed deepcopy code, CRDs or RBAC (config/namespaced's too) differ from what the Go
// types and markers give today.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is needed to run the generators: ", err)
	}
	work := t.TempDir()
	if err := copyTree(root, work); err != nil {
		t.Fatal(err)
	}
	// Start from nothing, so a file the generators no longer write is noticed.
	for _, g := range generated {
		if err := os.RemoveAll(filepath.Join(work, g)); err != nil {
			t.Fatal(err)
		}
	}
	began := time.Now()
	cmd := exec.Command("make", "--no-print-directory", "generate", "manifests")
	cmd.Dir = work
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make generate manifests: %v\n%s", err, out)
	}
	t.Logf("make generate manifests took %s", time.Since(began).Round(time.Millisecond))

	for _, g := range generated {
		want, err := readGenerated(filepath.Join(work, g))
		if err != nil {
			t.Fatalf("the generators did not write %s: %v", g, err)
		}
		have, err := readGenerated(filepath.Join(root, g))
		if err != nil {
			t.Errorf("%s: %v: run make generate manifests and commit the result", g, err)
			continue
		}
		for _, name := range union(want, have) {
			w, inWant := want[name]
			h, inHave := have[name]
			path := filepath.ToSlash(filepath.Join(g, name))
			switch {
			case !inHave:
				t.Errorf("%s is missing: run make generate manifests and commit the result", path)
			case !inWant:
				t.Errorf("%s is no longer generated: delete it (make generate manifests)", path)
			case !bytes.Equal(w, h):
				t.Errorf("%s is stale: run make generate manifests and commit the result\n%s", path, firstDifference(h, w))
			}
		}
	}
}

// readGenerated reads a file (keyed "") or every file under a folder (keyed by relative path).
func readGenerated(path string) (map[string][]byte, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	if !info.IsDir() {
		b, err := os.ReadFile(path)
		files[""] = b
		return files, err
	}
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(path, p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		files[filepath.ToSlash(rel)] = b
		return err
	})
	return files, err
}

func union(a, b map[string][]byte) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// firstDifference shows the first line where the committed file differs from the generated one.
func firstDifference(committed, generated []byte) string {
	c := strings.Split(string(committed), "\n")
	g := strings.Split(string(generated), "\n")
	for i := 0; i < max(len(c), len(g)); i++ {
		var cl, gl string
		if i < len(c) {
			cl = c[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if cl != gl || i >= len(c) || i >= len(g) {
			return fmt.Sprintf("line %d:\n  committed: %q\n  generated: %q", i+1, cl, gl)
		}
	}
	return "(the files differ only in their line endings)"
}

// copyTree copies the repository's sources (not .git, build output, node_modules or test
// binaries) to dst, so the generators can run without touching the working tree.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if rel != "." && (name == ".git" || name == "node_modules" || rel == "bin") {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() || strings.HasSuffix(name, ".test") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, info.Mode().Perm())
	})
}
