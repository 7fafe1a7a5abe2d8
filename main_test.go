package main

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "reversi")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// Eight writer processes at once on one registry (six publishers, two approvers): flock and
// atomic renames mean no lost version and no torn index.json.
func TestConcurrentWriterProcesses(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	reg := filepath.Join(dir, "reg")
	if out, err := exec.Command(bin, "keygen", filepath.Join(dir, "k")).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	key := filepath.Join(dir, "k.key")
	var wg sync.WaitGroup
	outs := make([][]byte, 8)
	errs := make([]error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := []string{"manifests", "publish", "test/fixtures/manifests", "--registry", reg, "--by", fmt.Sprintf("w%d", w), "--key", key, "--note", fmt.Sprintf("note-%d", w)}
			if w >= 6 {
				args = []string{"manifests", "approve", "stripe.refund", "--registry", reg, "--by", "approver", "--key", key}
			}
			outs[w], errs[w] = exec.Command(bin, args...).CombinedOutput()
		}()
	}
	wg.Wait()
	approvals := 0
	for w := range 8 {
		switch {
		case errs[w] == nil && w >= 6:
			approvals++
		case errs[w] == nil:
		case w >= 6 && (strings.Contains(string(outs[w]), "no pending draft") || strings.Contains(string(outs[w]), "is not in the registry")):
			// an approver that ran before any draft, or right after another approval
		default:
			t.Fatalf("writer %d: %v\n%s", w, errs[w], outs[w])
		}
	}
	hist, err := exec.Command(bin, "manifests", "history", "stripe.refund", "--registry", reg).Output()
	if err != nil {
		t.Fatal(err)
	}
	for w := 0; w < 6; w++ {
		if !strings.Contains(string(hist), fmt.Sprintf("- note-%d\n", w)) {
			t.Errorf("lost the version of writer %d:\n%s", w, hist)
		}
	}
	if n := strings.Count(string(hist), "\n"); n != 6+approvals {
		t.Errorf("%d versions, want %d:\n%s", n, 6+approvals, hist)
	}
	out, err := exec.Command(bin, "manifests", "verify", "--registry", reg, "--trust", filepath.Join(dir, "k.pub")).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "ok: 3 tools, ") {
		t.Fatalf("verify: %v\n%s", err, out)
	}
}

// TestBinary builds the real `reversi` binary and runs the seed's three pipeline commands on
// the seed's fixtures, checking stdout and the process exit codes.
func TestBinary(t *testing.T) {
	bin := buildBinary(t)
	run := func(args ...string) (string, int) {
		out, err := exec.Command(bin, args...).Output()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return string(out), 0
		case errors.As(err, &ee):
			return string(out), ee.ExitCode()
		}
		t.Fatal(err)
		return "", -1
	}
	if out, code := run("validate", "test/fixtures/manifests"); code != 0 || out != "ok: 3 tool manifests valid\n" {
		t.Errorf("validate: exit %d, %q", code, out)
	}
	if out, code := run("lint", "--strict", "test/fixtures/manifests"); code != 1 || !strings.HasSuffix(out, "0 errors, 2 warnings, 1 notes\n") {
		t.Errorf("lint --strict: exit %d, %q", code, out)
	}
	if out, code := run("test", "test/fixtures/tests/payments.test.yaml", "-m", "test/fixtures/manifests"); code != 0 || !strings.HasSuffix(out, "not covered by any test: stripe.refund\n3 passed\n") {
		t.Errorf("test: exit %d, %q", code, out)
	}
	if _, code := run("validate", "test/fixtures/tests"); code != 1 {
		t.Errorf("validate of non-manifests: exit %d, want 1", code)
	}
	if _, code := run("no-such-command"); code != 1 {
		t.Errorf("unknown command: exit %d, want 1", code)
	}
}
