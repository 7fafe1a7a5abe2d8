package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The seed's example: its manifests and cases give exactly its output.
func TestTestSeedExample(t *testing.T) {
	var out, errb bytes.Buffer
	code := Execute([]string{"test", "../../test/fixtures/tests/payments.test.yaml", "-m", "../../test/fixtures/manifests"}, &out, &errb)
	want := `ok a charge is refunded with the right arguments, and the read-back is checked
ok a failed charge leaves nothing to undo
ok the same order twice is refused
not covered by any test: stripe.refund
3 passed
`
	if code != 0 || out.String() != want || errb.Len() != 0 {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s\nwant stdout:\n%s", code, out.String(), errb.String(), want)
	}
}

func writeCaseFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestTestFailures(t *testing.T) {
	dir := t.TempDir()
	cases := filepath.Join(dir, "failing.test.yaml")
	writeCaseFile(t, cases, `- name: refund amount
  tool: stripe.create_charge
  args: { order_id: o1, amount: 2500 }
  result: { id: ch_1 }
  expect_handle: { charge_id: ch_1, amount: 100 }
- name: no id returned
  tool: stripe.create_charge
  args: { order_id: o1, amount: 2500 }
  result: {}
  expect_plan: compensate
- name: refund runs
  tool: stripe.refund
  args: { charge_id: ch_1 }
  expect_plan: skip
- name: unknown tool
  tool: stripe.void
  expect_blocked: no manifest for stripe.void
`)
	var out, errb bytes.Buffer
	code := Execute([]string{"test", cases, "--manifests", "../../test/fixtures/manifests"}, &out, &errb)
	want := `FAIL refund amount: expected handle {"amount":100,"charge_id":"ch_1"}, got {"amount":2500,"charge_id":"ch_1"}
FAIL no id returned: expected plan compensate, got unrecoverable (a referenced value was missing: $result.id)
ok refund runs
ok unknown tool
2 passed, 2 failed
`
	if code != 1 || out.String() != want || errb.Len() != 0 {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s\nwant stdout:\n%s", code, out.String(), errb.String(), want)
	}
}

// A broken case file is reported with every error, and nothing runs.
func TestTestCaseFileErrors(t *testing.T) {
	dir := t.TempDir()
	cases := filepath.Join(dir, "bad.yaml")
	writeCaseFile(t, cases, "- name: typo\n  tool: stripe.refund\n  expect_plna: skip\n- tool: stripe.refund\n")
	var out, errb bytes.Buffer
	code := Execute([]string{"test", cases, "-m", "../../test/fixtures/manifests"}, &out, &errb)
	if code != 1 || out.Len() != 0 {
		t.Fatalf("exit %d, stdout %q: want exit 1 and nothing run", code, out.String())
	}
	for _, want := range []string{
		cases + `:3: case "typo": expect_plna: unknown field`,
		cases + ":4: case #2: name: required",
		"invalid: 2 errors\n",
	} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
}

func TestTestInvalidManifests(t *testing.T) {
	dir := t.TempDir()
	writeCaseFile(t, filepath.Join(dir, "m.yaml"), "tool: x\neffect: compensable\npermission: p\n")
	var out, errb bytes.Buffer
	code := Execute([]string{"test", "../../test/fixtures/tests", "-m", dir}, &out, &errb)
	if code != 1 || out.Len() != 0 || !strings.Contains(errb.String(), "compensation: required") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
}

// Without FILES and -m, cases come from tests/ next to reversi.config.yaml and manifests from
// its manifests: setting, also when run from a subfolder.
func TestTestDefaultFiles(t *testing.T) {
	dir := t.TempDir()
	seed, err := os.ReadFile("../../test/fixtures/manifests/payments.yaml")
	if err != nil {
		t.Fatal(err)
	}
	writeCaseFile(t, filepath.Join(dir, "reversi.config.yaml"), "manifests: manifests\n")
	writeCaseFile(t, filepath.Join(dir, "manifests", "payments.yaml"), string(seed))
	writeCaseFile(t, filepath.Join(dir, "tests", "refund.test.yaml"), "name: refund needs no undo\ntool: stripe.refund\nexpect_plan: skip\n")
	writeCaseFile(t, filepath.Join(dir, "tests", "more", "charge.json"), `[{"name": "charge fails", "tool": "stripe.create_charge", "args": {"order_id": "o1"}, "fail": "declined", "expect_plan": "skip"}]`)
	writeCaseFile(t, filepath.Join(dir, "tests", "README.md"), "not a case file")
	t.Chdir(filepath.Join(dir, "manifests"))
	t.Setenv("REVERSI_CONFIG", "")

	var out, errb bytes.Buffer
	code := Execute([]string{"test"}, &out, &errb)
	want := "ok charge fails\nok refund needs no undo\n2 passed\n"
	if code != 0 || out.String() != want || errb.Len() != 0 {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s\nwant stdout:\n%s", code, out.String(), errb.String(), want)
	}
}

// Without a config, ./tests is read; without it either, the command says what to do.
func TestTestDefaultFilesWithoutConfig(t *testing.T) {
	fixtureManifests, err := filepath.Abs("../../test/fixtures/manifests")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Chdir(dir)
	t.Setenv("REVERSI_CONFIG", "")
	var out, errb bytes.Buffer
	code := Execute([]string{"test", "-m", fixtureManifests}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "no test files: pass files or folders, or put cases under tests") {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}

	writeCaseFile(t, filepath.Join(dir, "manifests", "m.yaml"), "tool: notes.delete\neffect: idempotent\npermission: notes:write\n")
	writeCaseFile(t, filepath.Join(dir, "tests", "a.yml"), "name: delete\ntool: notes.delete\n")
	out.Reset()
	errb.Reset()
	code = Execute([]string{"test"}, &out, &errb)
	if code != 0 || out.String() != "ok delete\n1 passed\n" {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
}
