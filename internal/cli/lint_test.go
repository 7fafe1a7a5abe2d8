package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const seedManifests = "../../test/fixtures/manifests"

// The seed's `reversi lint manifests` output, word for word.
const seedLintOutput = `warning L011 stripe.refund: mutating tool has no owner: nobody is named to ask when it misbehaves
warning L012 stripe.refund: no risk.data_class: policy and retention cannot treat sensitive data differently
info L022 stripe.refund: no timeout_ms: a hung call is only bounded by the gateway default
0 errors, 2 warnings, 1 notes
`

func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = Execute(args, &out, &errb)
	return code, out.String(), errb.String()
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLintSeedExample(t *testing.T) {
	code, out, errs := runCLI("lint", seedManifests)
	if code != 0 || out != seedLintOutput || errs != "" {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit 0 and stdout:\n%s", code, out, errs, seedLintOutput)
	}
}

func TestLintStrictFailsOnWarnings(t *testing.T) {
	code, out, _ := runCLI("lint", "--strict", seedManifests)
	if code != 1 || out != seedLintOutput {
		t.Errorf("exit %d, stdout:\n%s\nwant exit 1 and the same report", code, out)
	}
}

func TestLintJSON(t *testing.T) {
	code, out, _ := runCLI("lint", "--json", seedManifests)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	var got struct {
		Findings []map[string]any `json:"findings"`
		Errors   *int             `json:"errors"`
		Warnings *int             `json:"warnings"`
		Notes    *int             `json:"notes"`
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("not the report JSON: %v\n%s", err, out)
	}
	if got.Errors == nil || got.Warnings == nil || got.Notes == nil || *got.Errors != 0 || *got.Warnings != 2 || *got.Notes != 1 {
		t.Errorf("counts = %v %v %v, want 0 2 1", got.Errors, got.Warnings, got.Notes)
	}
	want := []map[string]any{
		{"level": "warning", "code": "L011", "tool": "stripe.refund", "path": "owner", "message": "mutating tool has no owner: nobody is named to ask when it misbehaves"},
		{"level": "warning", "code": "L012", "tool": "stripe.refund", "path": "risk.data_class", "message": "no risk.data_class: policy and retention cannot treat sensitive data differently"},
		{"level": "info", "code": "L022", "tool": "stripe.refund", "path": "timeout_ms", "message": "no timeout_ms: a hung call is only bounded by the gateway default"},
	}
	gotJSON, _ := json.Marshal(got.Findings)
	wantJSON, _ := json.Marshal(want)
	if !bytes.Equal(gotJSON, wantJSON) {
		t.Errorf("findings = %s\nwant %s", gotJSON, wantJSON)
	}
}

func TestLintJSONNoFindings(t *testing.T) {
	p := writeFile(t, "clean.yaml", "tool: a.read\ndescription: Read.\neffect: read_only\npermission: a:read\n")
	code, out, _ := runCLI("lint", "--json", p)
	want := `{"findings":[],"errors":0,"warnings":0,"notes":0}`
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(out)); err != nil || code != 0 || compact.String() != want {
		t.Errorf("exit %d, stdout %s (%v), want exit 0 and %s", code, out, err, want)
	}
}

func TestLintErrorFindingExits1(t *testing.T) {
	p := writeFile(t, "cycle.yaml", `
- tool: a
  description: A.
  effect: idempotent
  permission: x:write
  owner: o
  risk: {data_class: internal}
  timeout_ms: 1s
  requires: [b]
- tool: b
  description: B.
  effect: idempotent
  permission: x:write
  owner: o
  risk: {data_class: internal}
  timeout_ms: 1s
  requires: [a]
`)
	code, out, _ := runCLI("lint", p)
	want := "error L023 a: requires forms a cycle a -> b -> a: no tool in it can be called, since each waits for another to succeed first\n" +
		"1 errors, 0 warnings, 0 notes\n"
	if code != 1 || out != want {
		t.Errorf("exit %d, stdout:\n%s\nwant exit 1 and:\n%s", code, out, want)
	}
}

func TestLintInvalidManifests(t *testing.T) {
	p := writeFile(t, "bad.yaml", "tool: a\neffect: sometimes\npermission: x:read\n")
	code, out, errs := runCLI("lint", p)
	if code != 1 || out != "" || !strings.Contains(errs, "effect: must be one of") || !strings.Contains(errs, "invalid: 1 error") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s\nwant exit 1, no findings and the validation error", code, out, errs)
	}
}

// lint --policy adds the policy findings, each with file:line, and exits 1 on their errors; a
// policy that does not decode is reported as invalid.
func TestLintPolicy(t *testing.T) {
	pol := writeFile(t, "p.yaml", `policy: p
rules:
  - name: typo
    match: { tools: [stripe.refnd] }
    effect: advise
    reason: x
  - name: broken
    condition: "args.amount >> 3"
    effect: deny
    reason: x
`)
	code, out, _ := runCLI("lint", seedManifests, "--policy", pol)
	for _, want := range []string{
		"error L040 " + pol + ":8: p/broken: rules[1].condition: the condition is not CEL at 1:14: Syntax error:",
		"warning L042 " + pol + `:4: p/typo: rules[0].match.tools[0]: match.tools[0] "stripe.refnd" matches no tool`,
		"1 errors, 3 warnings, 1 notes",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q", want)
		}
	}
	if code != 1 || t.Failed() {
		t.Errorf("exit %d\n%s", code, out)
	}
	bad := writeFile(t, "bad.yaml", "policy: p\nrules: [{name: r, effect: allow}]\n")
	code, out, errs := runCLI("lint", seedManifests, "--policy", bad)
	if code != 1 || out != "" || !strings.Contains(errs, bad+":2: p: rules[0].effect: there is no allow effect") {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
}
