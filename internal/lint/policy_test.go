package lint

import (
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
)

// policyCodes are the codes of Policy: TestPolicyFindings and TestPolicyUnknownArgument
// trigger each (TestPolicyCodesCovered).
var policyCodes = map[string]bool{"L040": true, "L041": true, "L042": true, "L043": true}

func TestPolicyCodesCovered(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range policyFindings(t, []UpstreamTool{{Name: "stripe.refund", InputSchema: map[string]any{"type": "object", "properties": map[string]any{}}}}) {
		seen[f.Code] = true
	}
	for code := range policyCodes {
		if !seen[code] {
			t.Errorf("no policy finding %s", code)
		}
	}
}

func lintManifests(t *testing.T, y string) []*manifest.Manifest {
	t.Helper()
	docs, errs := manifest.ParseFile("m.yaml", []byte(y))
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Fatal(errs)
	}
	return ms
}

const policyLintManifests = `
- { tool: stripe.refund, effect: idempotent, permission: payments:write, risk: { data_class: financial } }
- { tool: stripe.get_charge, effect: read_only, permission: payments:read }
- { tool: memory.delete_entities, effect: irreversible, permission: memory:write }
`

const policyLintSource = `policy: p
rules:
  - name: syntax
    condition: "args.amount >"
    effect: deny
    reason: x
  - name: type
    condition: |
      args.amount > 1 &&
        manifest.efect == "x"
    effect: deny
    reason: x
  - name: typo-glob
    match: { tools: [stripe.refund, stripe.refnd] }
    effect: advise
    reason: x
  - name: contradiction
    match: { tools: ["stripe.*"], effects: [irreversible] }
    effect: deny
    reason: x
  - name: unknown-arg
    match: { tools: [stripe.refund] }
    condition: "has(args.amout) && args.amount > 1000 && args.metadata.reason == 'x'"
    effect: require_approval
  - name: any-tool
    condition: "args.?entityNames.orValue([]).size() > 10 || args.nowhere == 1"
    effect: deny
    reason: x
`

func policyFindings(t *testing.T, tools []UpstreamTool) []Finding {
	t.Helper()
	ps, errs := apipolicy.ParseFile("policy/p.yaml", []byte(policyLintSource))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return Policy(ps, lintManifests(t, policyLintManifests), tools)
}

func findingLines(fs []Finding) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString(f.String())
		b.WriteString("\n")
	}
	return b.String()
}

// Each policy finding is produced, at its file:line, with the rule and its path.
func TestPolicyFindings(t *testing.T) {
	got := findingLines(policyFindings(t, nil))
	for _, want := range []string{
		"error L040 policy/p.yaml:4: p/syntax: rules[0].condition: the condition is not CEL at 1:14: Syntax error:",
		"error L041 policy/p.yaml:10: p/type: rules[1].condition: the condition does not type-check at 2:11: undefined field 'efect'",
		`warning L042 policy/p.yaml:14: p/typo-glob: rules[2].match.tools[1]: match.tools[1] "stripe.refnd" matches no tool: the rule can never fire`,
		"warning L042 policy/p.yaml:18: p/contradiction: rules[3].match: no manifest matches every part of match (tools stripe.*; effects irreversible)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q", want)
		}
	}
	if strings.Contains(got, "L043") {
		t.Error("L043 without an upstream")
	}
	if strings.Count(got, "\n") != 4 || t.Failed() {
		t.Errorf("got:\n%s", got)
	}
}

// With an upstream, an argument no matched tool's input schema has is an error; one that some
// matched tool has is not.
func TestPolicyUnknownArgument(t *testing.T) {
	tools := []UpstreamTool{
		{Name: "stripe.refund", InputSchema: map[string]any{"type": "object", "properties": map[string]any{
			"charge_id": map[string]any{"type": "string"}, "amount": map[string]any{"type": "number"},
			"metadata": map[string]any{"type": "object", "properties": map[string]any{"note": map[string]any{"type": "string"}}}}}},
		{Name: "memory.delete_entities", InputSchema: map[string]any{"type": "object", "properties": map[string]any{"entityNames": map[string]any{"type": "array"}}}},
	}
	var l043 []string
	for _, f := range policyFindings(t, tools) {
		if f.Code == "L043" {
			l043 = append(l043, f.String())
		}
	}
	want := []string{
		`error L043 policy/p.yaml:26: p/any-tool: rules[5].condition: the condition reads args.nowhere, which no input schema of the tools it matches has (stripe.refund: no argument "nowhere" at the top level; it has amount, charge_id, metadata): the value is always missing, so the condition fails on every call and the rule applies (or, under has(), never does)`,
		`error L043 policy/p.yaml:23: p/unknown-arg: rules[4].condition: the condition reads args.amout, which no input schema of the tools it matches has (stripe.refund: no argument "amout" at the top level; it has amount, charge_id, metadata)`,
		`error L043 policy/p.yaml:23: p/unknown-arg: rules[4].condition: the condition reads args.metadata.reason, which no input schema of the tools it matches has (stripe.refund: no argument "reason" at metadata; it has note)`,
	}
	if len(l043) != len(want) {
		t.Fatalf("L043 findings:\n%s", strings.Join(l043, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(l043[i], want[i]) {
			t.Errorf("finding %d:\n%s\nwant prefix\n%s", i, l043[i], want[i])
		}
	}
}
