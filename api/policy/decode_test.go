package policy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
)

const fixtures = "../../test/fixtures/policy/policy"

func errorsText(errs []error) string {
	var b strings.Builder
	for _, e := range errs {
		b.WriteString(e.Error())
		b.WriteString("\n")
	}
	return b.String()
}

// A policy with a mistake at every level: every error is reported at once, each with its file,
// line, policy and path, sorted by line.
func TestDecodeReportsEveryErrorWithLine(t *testing.T) {
	src := `policy: payments
descripton: typo
rules:
  - name: r1
    effect: allow
  - name: r1
    effect: deny
  - name: r3
    match: { tools: ["stripe.[refund"], effects: [deleting], risk: { blast_radius: [huge], owner: x } }
    effect: require_approval
    approval: { roles: [cfo], quorum: 11, required: true }
  - name: r4
    effect: limit
    limit: { max: 0, per: actor }
  - name: r5
    effect: advise
    condition: "  "
    limit: { max: 3, per: run }
  - name: bad/name
    effect: deny
    reason: x
    approval: { roles: [a] }
tests:
  - name: t
    tool: stripe.refund
    expect: limit_exceeded
    now: "2026-12-04 10:00"
    run: { steps: [{ tool: a, status: done }] }
    expect_rules: [nope]
  - name: t
    tool: stripe.refund
    expect: allow
    expect_approval: { quorum: 2 }
`
	_, errs := ParseFile("policy/payments.yaml", []byte(src))
	got := errorsText(errs)
	for _, want := range []string{
		"policy/payments.yaml:2: payments: descripton: unknown field",
		"policy/payments.yaml:5: payments: rules[0].effect: there is no allow effect: a policy only tightens what the manifests allow; use one of deny, require_approval, advise, limit",
		"policy/payments.yaml:6: payments: rules[1].name: duplicate rule name \"r1\" (also rules[0])",
		"policy/payments.yaml:6: payments: rules[1].reason: required for effect deny",
		"policy/payments.yaml:9: payments: rules[2].match.tools[0]: \"stripe.[refund\" is not a valid glob",
		"policy/payments.yaml:9: payments: rules[2].match.effects[0]: must be a manifest effect",
		"policy/payments.yaml:9: payments: rules[2].match.risk.blast_radius[0]: must be one of low, medium, high, critical",
		"policy/payments.yaml:9: payments: rules[2].match.risk.owner: unknown field",
		"policy/payments.yaml:11: payments: rules[2].approval.quorum: must be between 1 and 10, found 11",
		"policy/payments.yaml:11: payments: rules[2].approval.required: unknown field",
		"policy/payments.yaml:14: payments: rules[3].limit.max: must be between 1 and 1000000, found 0",
		"policy/payments.yaml:14: payments: rules[3].limit.window: required for per actor",
		"policy/payments.yaml:17: payments: rules[4].condition: must not be empty",
		"policy/payments.yaml:18: payments: rules[4].limit: only a limit rule has a limit",
		"payments: rules[4].reason: required for effect advise",
		"policy/payments.yaml:19: payments: rules[5].name: \"bad/name\" is not a name",
		"policy/payments.yaml:22: payments: rules[5].approval: only a require_approval rule names approvers",
		"policy/payments.yaml:26: payments: tests[0].expect: must be one of allow, deny, require_approval, advise, found string \"limit_exceeded\" (a limit that is exceeded denies: expect deny)",
		"policy/payments.yaml:27: payments: tests[0].now: \"2026-12-04 10:00\" is not an RFC 3339 time",
		"policy/payments.yaml:28: payments: tests[0].run.steps[0].status: must be one of succeeded, failed, uncertain, blocked, would_block",
		"policy/payments.yaml:29: payments: tests[0].expect_rules[0]: no rule \"nope\" in this policy",
		"policy/payments.yaml:30: payments: tests[1].name: duplicate test name \"t\" (also tests[0])",
		"policy/payments.yaml:33: payments: tests[1].expect_approval: only with expect: require_approval",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q", want)
		}
	}
	if t.Failed() {
		t.Logf("got:\n%s", got)
	}
	for i := 1; i < len(errs); i++ {
		if errs[i-1].(*FieldError).Line > errs[i].(*FieldError).Line {
			t.Errorf("not sorted by line: %v before %v", errs[i-1], errs[i])
		}
	}
}

// Missing required fields and wrong shapes are named; a policy with errors is not returned;
// a duplicate policy name across files is reported at the second.
func TestDecodeRequiredAndSet(t *testing.T) {
	ps, errs := ParseFile("p.json", []byte(`[{"rules": "x"}, {"policy": "a", "rules": []}, {"policy": "b", "rules": [{"effect": "deny", "reason": "r"}], "tests": [{"expect": "allow"}]}]`))
	got := errorsText(errs)
	for _, want := range []string{
		"p.json:1: policy #1: policy: required",
		"p.json:1: policy #1: rules: must be a list of rules",
		"p.json:1: a: rules: must list at least one rule",
		"p.json:1: b: rules[0].name: required",
		"p.json:1: b: tests[0].name: required",
		"p.json:1: b: tests[0].tool: required",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if len(ps) != 0 {
		t.Errorf("%d policies returned despite errors", len(ps))
	}

	dir := t.TempDir()
	one := "policy: same\nrules: [{name: r, effect: deny, reason: x}]\n"
	for _, f := range []string{"a.yaml", "b.yaml"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(one), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ps, errs = ReadPaths(dir)
	if len(ps) != 1 || len(errs) != 1 || !strings.Contains(errs[0].Error(), "b.yaml:1: same: policy: duplicate policy name: also at "+filepath.Join(dir, "a.yaml")+":1") {
		t.Errorf("got %d policies, %v", len(ps), errs)
	}
	// A YAML problem (duplicate key) is reported with its line, not labelled as a manifest.
	_, errs = ParseFile("d.yaml", []byte("policy: d\npolicy: e\nrules: [{name: r, effect: deny, reason: x}]\n"))
	if len(errs) != 1 || errs[0].Error() != `d.yaml:2: policy: duplicate key "policy" (first at line 1): keep one` {
		t.Errorf("got %v", errs)
	}
}

// The fixtures decode; the decoded form marshals to JSON that decodes to the same policy
// (canonical JSON is a fixed point), and durations become milliseconds.
func TestFixturesDecodeAndRoundTrip(t *testing.T) {
	ps, errs := ReadPaths(fixtures+"/payments.yaml", fixtures+"/change-freeze.yaml", fixtures+"/content.yaml", fixtures+"/deletions.yaml")
	if len(errs) > 0 || len(ps) != 4 {
		t.Fatalf("%d policies: %v", len(ps), errs)
	}
	pay := ps[0]
	r := pay.Rules[0]
	if pay.Name != "payments" || r.Effect != RequireApproval || *r.Approval.TimeoutMs != 3600000 || r.Approval.Quorum != 1 ||
		r.Match.Tools[0] != "stripe.refund" || pay.Line("rules[0].condition") != 12 || pay.File != fixtures+"/payments.yaml" {
		t.Errorf("payments: %+v line %d", r, pay.Line("rules[0].condition"))
	}
	if l := ps[3].Rules[0].Limit; l.Max != 5 || l.Per != PerRun || l.Window() != 0 {
		t.Errorf("limit %+v", l)
	}
	for _, p := range ps {
		b, err := CanonicalJSON(p)
		if err != nil {
			t.Fatal(err)
		}
		var raw any
		if err := json.Unmarshal(b, &raw); err != nil {
			t.Fatal(err)
		}
		again, errs := Validate(raw)
		if len(errs) > 0 {
			t.Fatalf("%s: canonical JSON does not decode: %v\n%s", p.Name, errs, b)
		}
		b2, _ := CanonicalJSON(again)
		if string(b) != string(b2) {
			t.Errorf("%s: not a fixed point:\n%s\n%s", p.Name, b, b2)
		}
	}
}

// The set checksum ignores file names and order, and changes with any content.
func TestSetChecksum(t *testing.T) {
	a, _ := ParseFile("a.yaml", []byte("policy: a\nrules: [{name: r, effect: deny, reason: x}]\n"))
	b, _ := ParseFile("b.yaml", []byte("policy: b\nrules: [{name: r, effect: advise, reason: y}]\n"))
	b2, _ := ParseFile("elsewhere.json", []byte(`{"rules": [{"reason": "y", "effect": "advise", "name": "r"}], "policy": "b"}`))
	c, _ := ParseFile("b.yaml", []byte("policy: b\nrules: [{name: r, effect: advise, reason: z}]\n"))
	sum := func(ps ...*Policy) string {
		s, err := SetChecksum(ps)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ab := sum(a[0], b[0])
	if len(ab) != 64 || ab != sum(b[0], a[0]) || ab != sum(a[0], b2[0]) {
		t.Errorf("checksum depends on order or file: %s %s %s", ab, sum(b[0], a[0]), sum(a[0], b2[0]))
	}
	if ab == sum(a[0], c[0]) || ab == sum(a[0]) {
		t.Error("checksum does not change with the content")
	}
	if sum() != "" {
		t.Error("an empty set has a checksum")
	}
}

// GlobMatch has the gateway's deny semantics: a name within a matched name before a slash
// matches too.
func TestGlobMatch(t *testing.T) {
	for _, c := range []struct {
		glob, name string
		want       bool
	}{
		{"stripe.refund", "stripe.refund", true},
		{"stripe.*", "stripe.refund", true},
		{"stripe.*", "stripe.team/refund", true},
		{"fs", "fs/secret", true},
		{"*.delete_*", "memory.delete_entities", true},
		{"stripe.*", "stripe", false},
		{"stripe.refund", "stripe.refunds", false},
		{"[", "[", false},
	} {
		if got := GlobMatch(c.glob, c.name); got != c.want {
			t.Errorf("GlobMatch(%q, %q) = %v", c.glob, c.name, got)
		}
	}
	m := Match{Tools: []string{"svc.*"}, Effects: []manifest.Effect{manifest.Irreversible}, Permissions: []string{"svc:*"},
		Risk: &RiskMatch{DataClass: []string{"pii"}}}
	mf := &manifest.Manifest{Tool: "svc.send", Effect: manifest.Irreversible, Permission: "svc:send", Risk: &manifest.Risk{DataClass: "pii"}}
	if !m.Matches("svc.send", mf) || m.Matches("svc.send", nil) || m.Matches("other.send", mf) {
		t.Error("Matches")
	}
	mf.Risk = nil
	if m.Matches("svc.send", mf) {
		t.Error("a risk match matched a manifest without risk")
	}
}
