package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
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

// The four rules of issue 21: every policy test passes, one line each, every rule covered.
func TestTestPolicyFixtures(t *testing.T) {
	fixtures, err := filepath.Abs("../../test/fixtures/policy")
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir()) // no tests/ folder: only the policy's tests run
	t.Setenv("REVERSI_CONFIG", "")
	var out, errb bytes.Buffer
	code := Execute([]string{"test", "--policy", filepath.Join(fixtures, "policy"), "-m", filepath.Join(fixtures, "manifests")}, &out, &errb)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if code != 0 || errb.Len() != 0 || len(lines) != 24 || lines[23] != "23 passed" {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	for _, want := range []string{
		"ok policy payments: a refund of 1,500 needs finance and the CFO",
		"ok policy change-freeze: an e-mail on a Friday in prod is denied",
		"ok policy content: a 16-digit number that fails the Luhn check passes",
		"ok policy deletions: the sixth deletion in a run is blocked",
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("no line %q", want)
		}
	}
	// The fixture folder's reversi.config.yaml names both: plain `reversi test` there is the same.
	t.Chdir(fixtures)
	out.Reset()
	if code := Execute([]string{"test"}, &out, &errb); code != 0 || !strings.HasSuffix(out.String(), "\n23 passed\n") {
		t.Errorf("from the config: exit %d\n%s%s", code, out.String(), errb.String())
	}
}

// Contract cases and policy tests run together; a failing policy test says why, a rule no
// test fires is listed, and the exit code is 1.
func TestTestPolicyFailuresAndCoverage(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "p.yaml")
	writeCaseFile(t, pol, `policy: refunds
rules:
  - name: big
    match: { tools: [stripe.refund] }
    condition: "args.amount > 100"
    effect: deny
    reason: refunds over 100 are not allowed
  - name: unused
    match: { tools: [stripe.void] }
    effect: advise
    reason: voids are noted
tests:
  - name: a big refund is denied
    tool: stripe.refund
    args: { amount: 500 }
    expect: deny
    expect_reason: over 100
  - name: a small refund is held (wrong on purpose)
    tool: stripe.refund
    args: { amount: 5 }
    expect: require_approval
`)
	var out, errb bytes.Buffer
	code := Execute([]string{"test", "../../test/fixtures/tests/payments.test.yaml", "-m", "../../test/fixtures/manifests", "--policy", pol}, &out, &errb)
	want := `ok a charge is refunded with the right arguments, and the read-back is checked
ok a failed charge leaves nothing to undo
ok the same order twice is refused
ok policy refunds: a big refund is denied
FAIL policy refunds: a small refund is held (wrong on purpose): expected require_approval, got allow (no rule fired)
not covered by any test: stripe.refund
not covered by any test: rule refunds/unused
4 passed, 1 failed
`
	if code != 1 || out.String() != want || errb.Len() != 0 {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s\nwant stdout:\n%s", code, out.String(), errb.String(), want)
	}
}

// A policy that does not compile is reported like an invalid manifest, with file:line and the
// rule's path, and nothing runs.
func TestTestInvalidPolicy(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "p.yaml")
	writeCaseFile(t, pol, "policy: p\nrules:\n  - name: r\n    condition: \"args.amount >\"\n    effect: deny\n    reason: x\n    approvl: {}\n")
	var out, errb bytes.Buffer
	code := Execute([]string{"test", "../../test/fixtures/tests", "-m", "../../test/fixtures/manifests", "--policy", pol}, &out, &errb)
	if code != 1 || out.Len() != 0 || !strings.Contains(errb.String(), pol+":7: p: rules[0].approvl: unknown field") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	writeCaseFile(t, pol, "policy: p\nrules:\n  - name: r\n    condition: \"args.amount >\"\n    effect: deny\n    reason: x\n")
	out.Reset()
	errb.Reset()
	code = Execute([]string{"test", "../../test/fixtures/tests", "-m", "../../test/fixtures/manifests", "--policy", pol}, &out, &errb)
	if code != 1 || out.Len() != 0 || !strings.Contains(errb.String(), pol+":4: p: rules[0].condition: CEL syntax error at 1:14") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
}
