package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidateSeedExample(t *testing.T) {
	code, out, errs := runCLI("validate", seedManifests)
	if code != 0 || out != "ok: 3 tool manifests valid\n" || errs != "" {
		t.Fatalf("exit %d stdout %q stderr %q", code, out, errs)
	}
}

// Every problem in every file is printed at once, each with file, line, tool and path, and
// nothing is reported valid.
func TestValidateReportsEveryError(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(`- tool: pay.charge
  effect: compensable
  permission: pay write
  retry: {attempts: 3}
  compensation:
    tool: pay.refund
    kind: inverse
    residue: [statement]
    argument_map: {id: result.id}
- tool: mail.send
  effect: irreversible
  permission: mail:send
  approval: never
  efect: typo
`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "b.json"), []byte(`{"tool": "x", "tool": "y"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI("validate", dir)
	if code != 1 || out != "" {
		t.Fatalf("exit %d stdout %q", code, out)
	}
	if lines := strings.Split(errs, "\n"); !strings.HasPrefix(lines[0], filepath.Join(dir, "a.yaml")+":3:") || !strings.HasPrefix(lines[7], filepath.Join(dir, "b.json")) {
		t.Errorf("errors not ordered by file and line:\n%s", errs)
	}
	a := filepath.Join(dir, "a.yaml")
	for _, want := range []string{
		a + `:3: pay.charge: permission: "pay write" is not a permission`,
		a + `:4: pay.charge: retry: only read_only and idempotent tools may retry`,
		a + `:8: pay.charge: compensation.residue: kind: inverse restores the exact prior state`,
		a + `:9: pay.charge: compensation.argument_map.id: "result.id" is not a reference`,
		a + `:6: pay.charge: compensation.tool: tool "pay.refund" has no manifest`,
		a + `:13: mail.send: approval: an irreversible tool cannot set approval: never`,
		a + `:14: mail.send: efect: unknown field`,
		filepath.Join(dir, "b.json") + `:1: x: tool: duplicate key "tool"`,
		filepath.Join(dir, "b.json") + `:1: x: effect: required`,
		"invalid: 10 errors",
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q\nstderr:\n%s", want, errs)
		}
	}
}

func TestValidateDefaultsToConfiguredManifests(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "defs", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "reversi.config.yaml"), []byte("manifests: defs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "defs", "r.yaml"), []byte("{tool: r, effect: read_only, permission: p}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Join(dir, "defs", "sub"))
	code, out, errs := runCLI("validate")
	if code != 0 || out != "ok: 1 tool manifests valid\n" {
		t.Fatalf("exit %d stdout %q stderr %q", code, out, errs)
	}
	if err := os.WriteFile(filepath.Join(dir, "reversi.config.yaml"), []byte("manifest: defs\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errs = runCLI("validate"); code != 1 || !strings.Contains(errs, `unknown field "manifest"`) {
		t.Fatalf("config typo: exit %d stderr %q", code, errs)
	}
}

func TestValidateRefusesAnEmptySelection(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "empty.yaml"), []byte("---\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI("validate", dir)
	if code != 1 || out != "" || !strings.Contains(errs, "no tool manifests found in "+dir) {
		t.Fatalf("exit %d stdout %q stderr %q", code, out, errs)
	}
	t.Chdir(dir)
	if err := os.WriteFile("reversi.config.yaml", []byte("manifests: https://example.invalid/reg\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errs = runCLI("validate"); code != 1 || !strings.Contains(errs, "remote registries are not supported yet") {
		t.Fatalf("remote: exit %d stderr %q", code, errs)
	}
}
