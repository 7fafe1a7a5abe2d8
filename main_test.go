package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBinary builds the real `reversi` binary and runs the seed's three pipeline commands on
// the seed's fixtures, checking stdout and the process exit codes.
func TestBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "reversi")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
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
