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

// plainTrustErr is the error for a trusted manifest key set (where) over plain files at p.
func plainTrustErr(p, where string) string {
	return p + " is not a registry, but trusted manifest keys are set (" + where + "): plain manifest files carry no signatures to check; publish them to a signed registry (reversi manifests publish --key), or unset " + where
}

// Seed: a trusted manifest key "for manifests that are not in a registry is an error", in every
// command that loads the project's manifests; publish, which signs them into a registry, is not
// refused.
func TestTrustedKeyOverPlainFilesIsAnError(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.CopyFS("manifests", os.DirFS(filepath.Join(origDir(t), seedManifests))); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := runCLI("keygen", "keys/mf"); code != 0 {
		t.Fatal(errs)
	}
	if err := os.WriteFile("reversi.config.yaml", []byte("manifest_public_key: keys/mf.pub\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := plainTrustErr("manifests", "manifest_public_key in "+filepath.Join(dir, "reversi.config.yaml"))
	code, out, errs := runCLI("validate")
	if code != 1 || out != "" || errs != want+"\ninvalid: 1 error\n" {
		t.Fatalf("validate: exit %d stdout %q stderr %q\nwant %s", code, out, errs, want)
	}
	for _, args := range [][]string{{"lint"}, {"manifests", "check", "manifests"}, {"test", "-m", "manifests", "nothing.yaml"}} {
		if code, _, errs := runCLI(args...); code != 1 || !strings.Contains(errs, want+"\n") {
			t.Errorf("%v: exit %d stderr %q\nwant %s", args, code, errs, want)
		}
	}
	// The gateway's --manifests: refused before anything starts.
	if code, _, errs := runCLI("gateway", "--upstream-cmd", "true", "--manifests", "manifests", "--store", "memory"); code != 1 || errs != "error: "+want+"\n" {
		t.Errorf("gateway: exit %d stderr %q\nwant %s", code, errs, want)
	}
	// The environment variable names itself.
	pub, err := os.ReadFile("keys/mf.pub")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("REVERSI_MANIFEST_PUBLIC_KEY", string(pub))
	if code, _, errs := runCLI("validate", "manifests"); code != 1 || errs != plainTrustErr("manifests", "$REVERSI_MANIFEST_PUBLIC_KEY")+"\ninvalid: 1 error\n" {
		t.Fatalf("validate with the env key: exit %d stderr %q", code, errs)
	}
	// Publishing the files into a signed registry is what the key is for; the registry validates.
	if code, _, errs := runCLI("manifests", "publish", "manifests", "--registry", "reg", "--by", "alice", "--key", "keys/mf.key", "--status", "approved"); code != 0 {
		t.Fatalf("publish: %q", errs)
	}
	if code, out, errs := runCLI("validate", "reg"); code != 0 || out != "ok: 3 tool manifests valid\n" {
		t.Fatalf("validate reg: %d %q %q", code, out, errs)
	}
}

// Seed: once all manifests are loaded the compensation tool must exist, and a draft is not:
// plain files with an approved tool compensated by a draft do not validate.
func TestValidateRefusesAnApprovedToolCompensatedByADraft(t *testing.T) {
	p := writeFile(t, "pay.yaml", `- tool: pay.charge
  effect: compensable
  permission: pay:write
  compensation:
    tool: pay.refund
- tool: pay.refund
  effect: idempotent
  permission: pay:write
  status: draft
`)
	code, out, errs := runCLI("validate", p)
	want := p + `:5: pay.charge: compensation.tool: tool "pay.refund" is only a draft: drafts are not enforced, so compensation.tool cannot use it; approve pay.refund first (reversi manifests approve pay.refund, or status: approved in plain files)` + "\ninvalid: 1 error\n"
	if code != 1 || out != "" || errs != want {
		t.Fatalf("exit %d stdout %q stderr %q\nwant %q", code, out, errs, want)
	}
	// The gateway loads the same files the same way, and refuses them.
	if code, _, gerrs := runCLI("gateway", "--upstream-cmd", "true", "--manifests", p, "--store", "memory"); code != 1 || gerrs != "error: "+strings.TrimSuffix(want, "\ninvalid: 1 error\n")+"\n" {
		t.Errorf("gateway: exit %d stderr %q", code, gerrs)
	}
	// Published, the flag decides: both approved together is a valid registry.
	reg := filepath.Join(t.TempDir(), "reg")
	if code, _, errs := runCLI("manifests", "publish", p, "--registry", reg, "--by", "alice", "--status", "approved"); code != 0 {
		t.Fatalf("publish --status approved: %q", errs)
	}
	if code, out, errs := runCLI("validate", reg); code != 0 || out != "ok: 2 tool manifests valid\n" {
		t.Fatalf("validate reg: %d %q %q", code, out, errs)
	}
}
