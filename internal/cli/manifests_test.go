package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The seed's walkthrough: keygen, publish as alice with a note, approve as bob with four eyes,
// history showing both versions signed. Unlike the seed's listing, create_charge is approved
// after the tools it names: approving it while its compensation and verification tools have
// only drafts is refused (seed: "Once all manifests are loaded: the compensation tool … must
// exist"; a draft "is simply absent from the loaded registry").
func TestSeedRegistryWalkthrough(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.Mkdir("keys", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS("manifests", os.DirFS(filepath.Join(origDir(t), seedManifests))); err != nil {
		t.Fatal(err)
	}

	code, out, errs := runCLI("keygen", "keys/mf")
	if code != 0 || !regexp.MustCompile(`^keys/mf.key \(private\) and keys/mf.pub, key id [0-9a-f]{16}\n$`).MatchString(out) {
		t.Fatalf("keygen: %d %q %q", code, out, errs)
	}
	code, out, errs = runCLI("manifests", "publish", "manifests", "--registry", "reg", "--by", "alice", "--key", "keys/mf.key", "--note", "first draft")
	want := regexp.MustCompile(`^stripe.get_charge v1 draft [0-9a-f]{12}\nstripe.create_charge v1 draft [0-9a-f]{12}\nstripe.refund v1 draft [0-9a-f]{12}\n$`)
	if code != 0 || !want.MatchString(out) {
		t.Fatalf("publish: %d %q %q", code, out, errs)
	}
	// The seed's walkthrough: create_charge is approved first. Its compensation and
	// verification tools are still drafts, so the registry does not load until they are
	// approved too; the writer says so and writes the version.
	code, out, errs = runCLI("manifests", "approve", "stripe.create_charge", "--registry", "reg", "--by", "bob", "--key", "keys/mf.key", "--four-eyes")
	warned := "warning: " +
		`stripe.create_charge: compensation.tool: tool "stripe.refund" is only a draft: drafts are not enforced, so compensation.tool cannot use it; approve stripe.refund first (reversi manifests approve stripe.refund, or status: approved in plain files): the registry does not load until then` + "\n" +
		"warning: " + `stripe.create_charge: compensation.verification.tool: tool "stripe.get_charge" is only a draft: drafts are not enforced, so compensation.verification.tool cannot use it; approve stripe.get_charge first (reversi manifests approve stripe.get_charge, or status: approved in plain files): the registry does not load until then` + "\n"
	if code != 0 || out != "stripe.create_charge v2 approved by bob\n" || errs != warned {
		t.Fatalf("approve before its compensation: %d %q %q", code, out, errs)
	}
	if code, _, errs = runCLI("validate", "reg"); code != 1 || !strings.Contains(errs, `tool "stripe.refund" is only a draft`) {
		t.Fatalf("validate of a registry leaning on drafts: %d %q", code, errs)
	}
	code, _, errs = runCLI("manifests", "approve", "stripe.refund", "--registry", "reg", "--by", "alice", "--four-eyes")
	if code != 1 || !strings.Contains(errs, "four eyes: alice wrote stripe.refund v1 and cannot approve it") {
		t.Fatalf("four eyes: %d %q", code, errs)
	}
	if code, out, errs = runCLI("manifests", "approve", "stripe.refund", "--registry", "reg", "--by", "bob", "--key", "keys/mf.key", "--four-eyes"); code != 0 || out != "stripe.refund v2 approved by bob\n" {
		t.Fatalf("approve refund: %d %q %q", code, out, errs)
	}
	code, out, _ = runCLI("manifests", "list", "--registry", "reg")
	if code != 0 || !strings.Contains(out, "stripe.refund v2 approved ") || !strings.Contains(out, "stripe.get_charge v1 draft ") || !strings.Contains(out, "(enforced: none)") {
		t.Fatalf("list: %d %q", code, out)
	}
	code, out, errs = runCLI("manifests", "deprecate", "stripe.refund", "--registry", "reg", "--by", "carol", "--replaced-by", "stripe.get_charge")
	if code != 1 || !strings.Contains(errs, "--replaced-by: stripe.get_charge has no [approved deprecated] version") {
		t.Fatalf("deprecate with a draft-only replacement: %d %q %q", code, out, errs)
	}
	code, out, errs = runCLI("manifests", "approve", "stripe.get_charge", "--registry", "reg", "--by", "bob", "--key", "keys/mf.key", "--four-eyes")
	if code != 0 || out != "stripe.get_charge v2 approved by bob\n" || errs != "" {
		t.Fatalf("approve get_charge: %d %q %q", code, out, errs)
	}
	code, out, _ = runCLI("manifests", "history", "stripe.create_charge", "--registry", "reg")
	hist := regexp.MustCompile(`^v1 draft \S+Z by alice ([0-9a-f]{12}) signed - first draft\nv2 approved \S+Z by alice, approved by bob ([0-9a-f]{12}) signed - approved from v1\n$`)
	m := hist.FindStringSubmatch(out)
	if code != 0 || m == nil || m[1] == m[2] {
		t.Fatalf("history: %d %q", code, out)
	}
	code, out, _ = runCLI("manifests", "verify", "--registry", "reg", "--trust", "keys/mf.pub")
	if code != 0 || out != "ok: 3 tools, 6 versions (6 signed), every signature checked against 1 trusted key\n" {
		t.Fatalf("verify: %d %q", code, out)
	}
	code, out, _ = runCLI("manifests", "diff", "stripe.create_charge", "1", "2", "--registry", "reg")
	if code != 0 || out != "--- stripe.create_charge v1\n+++ stripe.create_charge v2\n- status: \"draft\"\n+ status: \"approved\"\n- version: 1\n+ version: 2\n" {
		t.Fatalf("diff: %d %q", code, out)
	}

	code, out, _ = runCLI("manifests", "export", "--registry", "reg", "--format", "crd", "-n", "agents")
	if code != 0 || strings.Count(out, "kind: ToolManifest") != 3 || !strings.Contains(out, "name: stripe-create-charge-") ||
		!strings.Contains(out, "reversi.dev/signature: ") || !strings.Contains(out, "namespace: agents") || strings.Contains(out, "\nstatus:") {
		t.Fatalf("export: %d %q", code, out)
	}

	// The registry is the config's manifests: and the key its manifest_public_key.
	if err := os.WriteFile("reversi.config.yaml", []byte("manifests: reg\nmanifest_public_key: keys/mf.pub\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, _ = runCLI("manifests", "verify"); code != 0 || !strings.HasPrefix(out, "ok: 3 tools") {
		t.Fatalf("verify from config: %d %q", code, out)
	}
	// validate, lint and test read a registry folder as its loaded (approved) versions.
	if code, out, errs = runCLI("validate"); code != 0 || out != "ok: 3 tool manifests valid\n" {
		t.Fatalf("validate of the registry: %d %q %q", code, out, errs)
	}
	if code, out, _ = runCLI("manifests", "rollback", "stripe.create_charge", "--version", "1", "--by", "carol"); code != 0 || !regexp.MustCompile(`^stripe.create_charge v3 draft [0-9a-f]{12} - rollback to v1\n$`).MatchString(out) {
		t.Fatalf("rollback: %d %q", code, out)
	}
	// carol signed nothing: with the trusted key set, verify names the unsigned version.
	code, out, _ = runCLI("manifests", "verify")
	if code != 1 || !strings.Contains(out, "tools/stripe.create_charge/v3.json: stripe.create_charge v3: not signed, but trusted keys are set") ||
		!strings.Contains(out, "index.json: index.json is not signed, but trusted keys are set") || !strings.HasSuffix(out, "FAIL: 2 problems in "+filepath.Join(dir, "reg")+"\n") {
		t.Fatalf("verify unsigned: %d %q", code, out)
	}
}

func TestVerifyExitsOneOnATamperedRegistry(t *testing.T) {
	dir := t.TempDir()
	reg := filepath.Join(dir, "reg")
	if code, _, errs := runCLI("manifests", "publish", seedManifests, "--registry", reg, "--by", "alice", "--status", "approved"); code != 0 {
		t.Fatal(errs)
	}
	p := filepath.Join(reg, "tools", "stripe.refund", "v1.json")
	data, _ := os.ReadFile(p)
	if err := os.WriteFile(p, []byte(strings.Replace(string(data), "payments:write", "payments:read", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runCLI("manifests", "verify", "--registry", reg)
	if code != 1 || !strings.Contains(out, "tools/stripe.refund/v1.json: stripe.refund v1: edited after publishing") {
		t.Fatalf("verify: %d %q", code, out)
	}
	if code, _, errs := runCLI("manifests", "verify", "--registry", dir); code != 1 || !strings.Contains(errs, "is not a registry") {
		t.Fatalf("verify of a plain folder: %d %q", code, errs)
	}
}

func TestSigningKeyWarnings(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "k")
	if code, _, errs := runCLI("keygen", key); code != 0 {
		t.Fatal(errs)
	}
	if code, _, errs := runCLI("keygen", key); code != 1 || !strings.Contains(errs, "already exists") {
		t.Fatalf("second keygen: %d %q", code, errs)
	}
	if err := os.Chmod(key+".key", 0o640); err != nil {
		t.Fatal(err)
	}
	code, _, errs := runCLI("manifests", "publish", seedManifests, "--registry", filepath.Join(dir, "reg"), "--by", "a", "--key", key+".key")
	if code != 0 || !strings.Contains(errs, "is readable by others (mode 0640)") {
		t.Fatalf("loose key: %d %q", code, errs)
	}
	if err := os.WriteFile(key+".key", []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errs = runCLI("manifests", "publish", seedManifests, "--registry", filepath.Join(dir, "reg"), "--by", "a", "--key", key+".key")
	if code != 1 || !strings.Contains(errs, "signing key "+key+".key: not a PEM") {
		t.Fatalf("malformed key: %d %q", code, errs)
	}
	if es, _ := os.ReadFile(filepath.Join(dir, "reg", "index.json")); strings.Count(string(es), `"version"`) != 3 {
		t.Fatalf("a refused publish wrote versions:\n%s", es)
	}
}

var startDir, _ = os.Getwd()

// origDir is the package folder, for tests that t.Chdir away.
func origDir(*testing.T) string { return startDir }
