package manifest

import (
	"strings"
	"testing"
)

// DecodeApprovalRules applies the object form's rules, refuses `required` and unknown fields,
// and reports every error at once with the caller's path and line.
func TestDecodeApprovalRules(t *testing.T) {
	r, errs := DecodeApprovalRules(map[string]any{"roles": []any{"cfo"}, "quorum": 2, "timeout": "15m"}, "rules[0].approval", nil)
	if len(errs) > 0 || r.Quorum != 2 || *r.TimeoutMs != 900000 || r.OnTimeout != "deny" || r.Roles[0] != "cfo" {
		t.Fatalf("got %+v, %v", r, errs)
	}
	_, errs = DecodeApprovalRules(map[string]any{"required": true, "quorum": 3, "on_timeout": "escalate"}, "rules[2].approval",
		func(p string) int { return len(p) })
	var got []string
	for _, e := range errs {
		fe := e.(*FieldError)
		if fe.Line != len(fe.Path) {
			t.Errorf("%v: line %d, want the caller's line of %q", fe, fe.Line, fe.Path)
		}
		got = append(got, fe.Error())
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{
		"rules[2].approval.required: unknown field",
		"rules[2].approval.quorum: a quorum above 1 needs roles",
		"rules[2].approval.escalate_to: required when on_timeout is escalate",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("missing %q in:\n%s", want, all)
		}
	}
}
