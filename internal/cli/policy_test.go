package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/internal/config"
)

const policyFixtureDir = "../../test/fixtures/policy"

// Policies in the registry, like manifests: publish as alice, four eyes refuse her approval,
// bob approves, history and diff read the versions, verify checks every signature, and the
// gateway's load of the registry enforces the served policies. A tampered version is refused
// with its file and what to do; an unsigned one under a trusted key too.
func TestPolicyRegistryWalkthrough(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	fix := filepath.Join(origDir(t), policyFixtureDir)
	if err := os.CopyFS("project", os.DirFS(fix)); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := runCLI("keygen", "mf"); code != 0 {
		t.Fatal(errs)
	}
	code, out, errs := runCLI("manifests", "publish", "project/manifests", "--registry", "reg", "--by", "alice", "--key", "mf.key", "--status", "approved")
	if code != 0 {
		t.Fatalf("manifests publish: %d %q %q", code, out, errs)
	}
	code, out, errs = runCLI("policy", "publish", "project/policy", "--registry", "reg", "--by", "alice", "--key", "mf.key", "--note", "issue 21")
	want := regexp.MustCompile(`^change-freeze v1 draft [0-9a-f]{12}\ncontent v1 draft [0-9a-f]{12}\ndeletions v1 draft [0-9a-f]{12}\npayments v1 draft [0-9a-f]{12}\n$`)
	if code != 0 || !want.MatchString(out) {
		t.Fatalf("policy publish: %d %q %q", code, out, errs)
	}
	// Drafts are not served.
	l, err := loadGateway("reg", nil)
	if err != nil || l.Policy != nil {
		t.Fatalf("drafts enforced: %v %v", l.Policy, err)
	}
	code, _, errs = runCLI("policy", "approve", "content", "--registry", "reg", "--by", "alice", "--key", "mf.key", "--four-eyes")
	if code != 1 || !strings.Contains(errs, "four eyes: alice wrote policy content v1 and cannot approve it") {
		t.Fatalf("four eyes: %d %q", code, errs)
	}
	for _, name := range []string{"change-freeze", "content", "deletions", "payments"} {
		code, out, errs = runCLI("policy", "approve", name, "--registry", "reg", "--by", "bob", "--key", "mf.key", "--four-eyes")
		if code != 0 || out != name+" v2 approved by bob\n" {
			t.Fatalf("approve %s: %d %q %q", name, code, out, errs)
		}
	}
	code, out, _ = runCLI("policy", "history", "content", "--registry", "reg")
	hist := regexp.MustCompile(`^v1 draft \S+ by alice ([0-9a-f]{12}) signed - issue 21\nv2 approved \S+ by alice, approved by bob ([0-9a-f]{12}) signed - approved from v1\n$`)
	if m := hist.FindStringSubmatch(out); code != 0 || m == nil || m[1] != m[2] {
		t.Fatalf("history: %d %q", code, out)
	}
	// A change to the policy: v3 draft, and diff names the changed field by path.
	pol := filepath.Join("project", "policy", "content.yaml")
	data, _ := os.ReadFile(pol)
	if err := os.WriteFile(pol, []byte(strings.Replace(string(data), "pass the card vault's token instead", "use the vault token", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errs = runCLI("policy", "publish", pol, "--registry", "reg", "--by", "carol", "--key", "mf.key"); code != 0 || !strings.HasPrefix(out, "content v3 draft ") {
		t.Fatalf("publish v3: %d %q %q", code, out, errs)
	}
	code, out, _ = runCLI("policy", "diff", "content", "2", "v3", "--registry", "reg")
	if code != 0 || !strings.HasPrefix(out, "--- content v2\n+++ content v3\n- rules[0].reason: ") || !strings.Contains(out, "\n+ rules[0].reason: \"the arguments carry a payment card number: use the vault token\"\n") {
		t.Fatalf("diff: %d %q", code, out)
	}
	code, out, _ = runCLI("policy", "verify", "--registry", "reg", "--trust", "mf.pub")
	if code != 0 || !strings.HasPrefix(out, "ok: 4 policies, 9 versions (9 signed); 12 tools, 12 versions (12 signed); every signature checked against 1 trusted key") {
		t.Fatalf("verify: %d %q", code, out)
	}

	// The gateway's load of the registry enforces its served policies (v2 of content: the
	// draft v3 is not served), verified against the trusted key.
	t.Setenv(config.TrustedKeysEnv, "mf.pub")
	l, err = loadGateway("reg", nil)
	if err != nil || l.Policy == nil || len(l.Policy.Policies()) != 4 {
		t.Fatalf("load: %v %v", l.Policy, err)
	}
	for _, p := range l.Policy.Policies() {
		if p.Name == "content" && !strings.Contains(p.Rules[0].Reason, "pass the card vault's token") {
			t.Fatalf("the draft is enforced: %s", p.Rules[0].Reason)
		}
	}
	// The same policy given locally too is an error, not a silent pick.
	if _, err := loadGateway("reg", []string{pol}); err == nil || !strings.Contains(err.Error(), "policy content is also served by the registry reg") {
		t.Fatalf("local and registry policy of one name: %v", err)
	}

	// Tampered: the served version's file is edited (the card rule loosened to advice).
	file := filepath.Join("reg", "policies", "content", "v2.json")
	orig, _ := os.ReadFile(file)
	if err := os.WriteFile(file, []byte(strings.Replace(string(orig), `"effect": "deny"`, `"effect": "advise"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadGateway("reg", nil); err == nil || !strings.Contains(err.Error(), "policies/content/v2.json: policy content v2: edited after publishing") || !strings.Contains(err.Error(), "publish changes as a new version instead") {
		t.Fatalf("tampered policy: %v", err)
	}
	code, out, _ = runCLI("policy", "verify", "--registry", "reg", "--trust", "mf.pub")
	if code != 1 || !strings.Contains(out, "policies/content/v2.json: policy content v2: edited after publishing") || !strings.Contains(out, "FAIL: 1 problem in reg") {
		t.Fatalf("verify of a tampered policy: %d %q", code, out)
	}
	if err := os.WriteFile(file, orig, 0o644); err != nil {
		t.Fatal(err)
	}

	// Unsigned: approved without --key (the index is signed again by the key's holder, as a
	// rotation would): refused under the trusted key.
	if code, _, errs = runCLI("policy", "approve", "content", "--registry", "reg", "--by", "bob", "--four-eyes"); code != 0 {
		t.Fatal(errs)
	}
	if code, _, errs = runCLI("manifests", "sign", "--registry", "reg", "--key", "mf.key"); code != 0 {
		t.Fatal(errs)
	}
	if _, err := loadGateway("reg", nil); err == nil || !strings.Contains(err.Error(), "policies/content/v4.json: policy content v4: not signed") || !strings.Contains(err.Error(), "reversi policy publish --key") {
		t.Fatalf("unsigned policy: %v", err)
	}
}

func TestPolicyPublishRefusesInvalidPolicies(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.WriteFile("bad.yaml", []byte("policy: bad\nrules:\n  - name: r\n    condition: 'args.amount >'\n    effect: deny\n    reason: x\n  - name: q\n    effct: deny\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI("policy", "publish", "bad.yaml", "--registry", "reg", "--by", "alice")
	if code != 1 || !strings.Contains(out+errs, "bad.yaml:") || strings.Contains(out+errs, "v1 draft") {
		t.Fatalf("publish of an invalid policy: %d %q %q", code, out, errs)
	}
	if _, err := os.Stat(filepath.Join("reg", "index.json")); err == nil {
		t.Fatal("a refused publish wrote the registry")
	}
}
