package policy

import (
	"fmt"
	"math"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// FieldError is the error type of this package: manifest.FieldError, with Tool holding the
// policy's label (its name, or "policy #N" when the name is missing) and Path the field path
// inside the policy ("rules[0].effect").
type FieldError = manifest.FieldError

// Field sets of every object of the format, in the documentation's order (anything else is
// refused).
var (
	PolicyFields         = []string{"policy", "description", "rules", "tests"}
	RuleFields           = []string{"name", "description", "match", "condition", "effect", "reason", "approval", "limit"}
	MatchFields          = []string{"tools", "effects", "permissions", "risk"}
	RiskMatchFields      = []string{"data_class", "blast_radius"}
	LimitFields          = []string{"max", "per", "window"}
	TestFields           = []string{"name", "tool", "args", "actor", "environment", "gateway", "now", "run", "expect", "expect_reason", "expect_rules", "expect_approval"}
	ActorFields          = []string{"principal", "groups"}
	RunFields            = []string{"id", "steps"}
	StepFields           = []string{"tool", "status", "args", "at"}
	ExpectApprovalFields = manifest.ApprovalRuleFields
)

// Bounds of the format.
const (
	// MaxNameLength bounds policy and rule names.
	MaxNameLength = 128
	// MaxLimit is the largest limit.max.
	MaxLimit = 1_000_000
	// MaxConditionBytes bounds one condition's text (a hostile policy cannot make the
	// compiler chew on megabytes).
	MaxConditionBytes = 16 << 10
)

// namePattern is a policy or rule name: a tool name's characters without the slash, which
// separates the two in a rule's ID.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]+$`)

// decoder reads one policy document, collecting every problem.
type decoder struct {
	label string
	line  func(string) int
	errs  []error
}

func (d *decoder) add(path, format string, args ...any) {
	fe := &FieldError{Tool: d.label, Path: path, Message: fmt.Sprintf(format, args...)}
	if d.line != nil {
		fe.Line = d.line(path)
	}
	d.errs = append(d.errs, fe)
}

func join(p, field string) string {
	if p == "" {
		return field
	}
	return p + "." + field
}

func index(p string, i int) string { return fmt.Sprintf("%s[%d]", p, i) }

// decode reads raw strictly. It returns the policy as far as it could be read (never nil)
// and every error.
func decode(raw any, label string, line func(string) int) (*Policy, []error) {
	d := &decoder{label: label, line: line}
	p := &Policy{line: line}
	if m, ok := raw.(map[string]any); ok {
		if n, ok := m["policy"].(string); ok && n != "" {
			d.label = n
		}
	}
	obj := d.object(raw, "", PolicyFields)
	if obj == nil {
		return p, d.errs
	}
	p.Name = d.name(obj, "policy", "", "name the policy, such as payments")
	p.Description = d.str(obj, "description", "")
	rules, ok := obj["rules"]
	switch list, isList := rules.([]any); {
	case !ok:
		d.add("rules", "required: a list of rules, each with a name and an effect")
	case !isList:
		d.add("rules", "must be a list of rules, found %s", manifest.Describe(rules))
	case len(list) == 0:
		d.add("rules", "must list at least one rule")
	default:
		first := map[string]int{}
		for i, r := range list {
			rp := index("rules", i)
			rule := d.rule(r, rp)
			if rule.Name != "" {
				if j, dup := first[rule.Name]; dup {
					d.add(join(rp, "name"), "duplicate rule name %q (also rules[%d]): give each rule its own name", rule.Name, j)
				} else {
					first[rule.Name] = i
				}
			}
			p.Rules = append(p.Rules, rule)
		}
	}
	if tv, ok := obj["tests"]; ok {
		list, isList := tv.([]any)
		if !isList {
			d.add("tests", "must be a list of test cases, found %s", manifest.Describe(tv))
		}
		first := map[string]int{}
		for i, c := range list {
			tp := index("tests", i)
			t := d.test(c, tp, p)
			if t.Name != "" {
				if j, dup := first[t.Name]; dup {
					d.add(join(tp, "name"), "duplicate test name %q (also tests[%d]): give each test its own name", t.Name, j)
				} else {
					first[t.Name] = i
				}
			}
			p.Tests = append(p.Tests, t)
		}
	}
	return p, d.errs
}

func (d *decoder) rule(raw any, p string) Rule {
	var r Rule
	o := d.object(raw, p, RuleFields)
	if o == nil {
		return r
	}
	r.Name = d.name(o, "name", p, "name the rule, such as large-refund-needs-cfo")
	r.Description = d.str(o, "description", p)
	r.Match = d.match(o, p)
	if v, ok := o["condition"]; ok {
		s, isStr := v.(string)
		switch {
		case !isStr:
			d.add(join(p, "condition"), "must be a CEL expression (a string), found %s", manifest.Describe(v))
		case strings.TrimSpace(s) == "":
			d.add(join(p, "condition"), "must not be empty: remove it (the rule then applies to every matched call) or write a CEL expression")
		case len(s) > MaxConditionBytes:
			d.add(join(p, "condition"), "%d bytes long: at most %d; split the rule", len(s), MaxConditionBytes)
		default:
			r.Condition = s
		}
	}
	r.Effect = d.effect(o, p)
	r.Reason = d.str(o, "reason", p)
	if _, has := o["reason"]; has && strings.TrimSpace(r.Reason) == "" {
		d.add(join(p, "reason"), "must not be empty: say why, in words the agent or approver understands")
	}
	if _, has := o["reason"]; !has && (r.Effect == Deny || r.Effect == Advise) {
		what := "the reason shown to the agent"
		if r.Effect == Advise {
			what = "the note added to the call"
		}
		d.add(join(p, "reason"), "required for effect %s: %s", r.Effect, what)
	}
	if v, has := o["approval"]; has {
		ap := join(p, "approval")
		if r.Effect != "" && r.Effect != RequireApproval {
			d.add(ap, "only a require_approval rule names approvers: remove approval or use effect: require_approval")
		} else {
			rules, errs := manifest.DecodeApprovalRules(v, ap, d.line)
			for _, e := range errs {
				e.(*FieldError).Tool = d.label
			}
			d.errs = append(d.errs, errs...)
			r.Approval = rules
		}
	}
	if v, has := o["limit"]; has {
		if r.Effect != "" && r.Effect != Limit {
			d.add(join(p, "limit"), "only a limit rule has a limit: remove it or use effect: limit")
		} else {
			r.Limit = d.limit(v, join(p, "limit"))
		}
	} else if r.Effect == Limit {
		d.add(join(p, "limit"), "required for effect limit: { max: 5, per: run } (per run, actor or gateway; window required for actor and gateway)")
	}
	return r
}

func (d *decoder) effect(o map[string]any, p string) Effect {
	fp := join(p, "effect")
	v, ok := o["effect"]
	names := make([]string, len(Effects))
	for i, e := range Effects {
		names[i] = string(e)
	}
	if !ok {
		d.add(fp, "required: one of %s", strings.Join(names, ", "))
		return ""
	}
	s, _ := v.(string)
	if slices.Contains(Effects, Effect(s)) {
		return Effect(s)
	}
	if s == "allow" {
		d.add(fp, "there is no allow effect: a policy only tightens what the manifests allow; use one of %s", strings.Join(names, ", "))
		return ""
	}
	d.add(fp, "must be one of %s, found %s", strings.Join(names, ", "), manifest.Describe(v))
	return ""
}

func (d *decoder) match(o map[string]any, p string) Match {
	var m Match
	v, ok := o["match"]
	if !ok {
		return m
	}
	mp := join(p, "match")
	mo := d.object(v, mp, MatchFields)
	if mo == nil {
		return m
	}
	m.Tools = d.globs(mo, "tools", mp)
	for i, e := range d.strings(mo, "effects", mp) {
		if !slices.Contains(manifest.Effects, manifest.Effect(e)) {
			d.add(index(join(mp, "effects"), i), "must be a manifest effect (read_only, idempotent, reversible, compensable, irreversible), found %q", e)
			continue
		}
		m.Effects = append(m.Effects, manifest.Effect(e))
	}
	m.Permissions = d.globs(mo, "permissions", mp)
	if rv, ok := mo["risk"]; ok {
		rp := join(mp, "risk")
		if ro := d.object(rv, rp, RiskMatchFields); ro != nil {
			rm := &RiskMatch{DataClass: d.strings(ro, "data_class", rp)}
			for i, b := range d.strings(ro, "blast_radius", rp) {
				if !slices.Contains(manifest.BlastRadii, b) {
					d.add(index(join(rp, "blast_radius"), i), "must be one of %s, found %q", strings.Join(manifest.BlastRadii, ", "), b)
					continue
				}
				rm.BlastRadius = append(rm.BlastRadius, b)
			}
			m.Risk = rm
		}
	}
	return m
}

func (d *decoder) limit(v any, p string) *RuleLimit {
	o := d.object(v, p, LimitFields)
	if o == nil {
		return nil
	}
	l := &RuleLimit{}
	if mv, ok := o["max"]; !ok {
		d.add(join(p, "max"), "required: the most calls allowed, such as 5")
	} else if n, ok := d.integer(mv, join(p, "max")); ok {
		if n < 1 || n > MaxLimit {
			d.add(join(p, "max"), "must be between 1 and %d, found %d (to refuse every call, use effect: deny)", MaxLimit, n)
		} else {
			l.Max = int(n)
		}
	}
	scopes := make([]string, len(LimitScopes))
	for i, s := range LimitScopes {
		scopes[i] = string(s)
	}
	if pv, ok := o["per"]; !ok {
		d.add(join(p, "per"), "required: one of %s", strings.Join(scopes, ", "))
	} else if s, _ := pv.(string); !slices.Contains(LimitScopes, LimitScope(s)) {
		d.add(join(p, "per"), "must be one of %s, found %s", strings.Join(scopes, ", "), manifest.Describe(pv))
	} else {
		l.Per = LimitScope(s)
	}
	if wv, ok := o["window"]; ok {
		ms, err := manifest.ParseDuration(wv)
		if err != nil {
			d.add(join(p, "window"), "%v", err)
		} else {
			l.WindowMs = &ms
		}
	} else if l.Per == PerActor || l.Per == PerGateway {
		d.add(join(p, "window"), "required for per %s: a duration such as 1h or 1d (calls are counted within it)", l.Per)
	}
	return l
}

func (d *decoder) test(raw any, p string, pol *Policy) Test {
	var t Test
	o := d.object(raw, p, TestFields)
	if o == nil {
		return t
	}
	t.Name = d.text(o, "name", p, true, "say what the test checks; it names the test in the report")
	t.Tool = d.text(o, "tool", p, true, "the tool the test calls")
	t.Args = d.anyObject(o, "args", p)
	if av, ok := o["actor"]; ok {
		ap := join(p, "actor")
		if ao := d.object(av, ap, ActorFields); ao != nil {
			t.Actor = Actor{Principal: d.str(ao, "principal", ap), Groups: d.strings(ao, "groups", ap)}
		}
	}
	t.Environment = d.str(o, "environment", p)
	t.Gateway = d.str(o, "gateway", p)
	t.Now = d.timestamp(o, "now", p)
	if rv, ok := o["run"]; ok {
		rp := join(p, "run")
		if ro := d.object(rv, rp, RunFields); ro != nil {
			t.Run.ID = d.str(ro, "id", rp)
			if sv, ok := ro["steps"]; ok {
				sp := join(rp, "steps")
				list, isList := sv.([]any)
				if !isList {
					d.add(sp, "must be a list of {tool, status}, found %s", manifest.Describe(sv))
				}
				for i, e := range list {
					ep := index(sp, i)
					so := d.object(e, ep, StepFields)
					if so == nil {
						continue
					}
					st := TestStep{Tool: d.text(so, "tool", ep, true, "the tool called earlier"), Args: d.anyObject(so, "args", ep), At: d.timestamp(so, "at", ep)}
					if v, ok := so["status"]; !ok {
						d.add(join(ep, "status"), "required: one of %s", strings.Join(StepStatuses, ", "))
					} else if s, _ := v.(string); !slices.Contains(StepStatuses, s) {
						d.add(join(ep, "status"), "must be one of %s, found %s", strings.Join(StepStatuses, ", "), manifest.Describe(v))
					} else {
						st.Status = s
					}
					t.Run.Steps = append(t.Run.Steps, st)
				}
			}
		}
	}
	names := make([]string, len(Decisions))
	for i, dc := range Decisions {
		names[i] = string(dc)
	}
	if v, ok := o["expect"]; !ok {
		d.add(join(p, "expect"), "required: the decision expected, one of %s", strings.Join(names, ", "))
	} else if s, _ := v.(string); !slices.Contains(Decisions, Decision(s)) {
		hint := ""
		if s == "limit" || s == "limit_exceeded" {
			hint = " (a limit that is exceeded denies: expect deny)"
		}
		d.add(join(p, "expect"), "must be one of %s, found %s%s", strings.Join(names, ", "), manifest.Describe(v), hint)
	} else {
		t.Expect = Decision(s)
	}
	t.ExpectReason = d.text(o, "expect_reason", p, false, "a part of the reason expected")
	t.ExpectRules = d.strings(o, "expect_rules", p)
	for i, r := range t.ExpectRules {
		if !strings.Contains(r, "/") && !slices.ContainsFunc(pol.Rules, func(x Rule) bool { return x.Name == r }) {
			d.add(index(join(p, "expect_rules"), i), "no rule %q in this policy: name one of its rules, or <policy>/<rule> for another policy's", r)
		}
	}
	if v, ok := o["expect_approval"]; ok {
		ap := join(p, "expect_approval")
		if t.Expect != "" && t.Expect != DecisionRequireApproval {
			d.add(ap, "only with expect: require_approval: there is no approval to compare otherwise")
		}
		if ao := d.object(v, ap, ExpectApprovalFields); ao != nil {
			ea := &ExpectApproval{Roles: d.strings(ao, "roles", ap), EscalateTo: d.strings(ao, "escalate_to", ap)}
			if qv, ok := ao["quorum"]; ok {
				if n, ok := d.integer(qv, join(ap, "quorum")); ok {
					q := int(n)
					ea.Quorum = &q
				}
			}
			if tv, ok := ao["timeout"]; ok {
				if ms, err := manifest.ParseDuration(tv); err != nil {
					d.add(join(ap, "timeout"), "%v", err)
				} else {
					ea.TimeoutMs = &ms
				}
			}
			if ov, ok := ao["on_timeout"]; ok {
				if s, _ := ov.(string); !slices.Contains(manifest.OnTimeouts, s) {
					d.add(join(ap, "on_timeout"), "must be one of %s, found %s", strings.Join(manifest.OnTimeouts, ", "), manifest.Describe(ov))
				} else {
					ea.OnTimeout = s
				}
			}
			t.ExpectApproval = ea
		}
	}
	return t
}

// object checks that v is an object and refuses, one by one, every field not in fields.
func (d *decoder) object(v any, p string, fields []string) map[string]any {
	m, ok := v.(map[string]any)
	if !ok {
		d.add(p, "must be an object, found %s", manifest.Describe(v))
		return nil
	}
	var unknown []string
	for k := range m {
		if !slices.Contains(fields, k) {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		d.add(join(p, k), "unknown field: remove it or fix its name (known fields: %s)", strings.Join(fields, ", "))
	}
	return m
}

func (d *decoder) str(o map[string]any, key, p string) string {
	v, ok := o[key]
	if !ok {
		return ""
	}
	s, isStr := v.(string)
	if !isStr {
		d.add(join(p, key), "must be a string, found %s", manifest.Describe(v))
	}
	return s
}

// text reads a string that must not be empty when present (and must be present if required).
func (d *decoder) text(o map[string]any, key, p string, required bool, hint string) string {
	v, ok := o[key]
	if !ok {
		if required {
			d.add(join(p, key), "required: %s", hint)
		}
		return ""
	}
	s, isStr := v.(string)
	if !isStr || strings.TrimSpace(s) == "" {
		d.add(join(p, key), "must be a non-empty string: %s (found %s)", hint, manifest.Describe(v))
		return ""
	}
	return s
}

func (d *decoder) name(o map[string]any, key, p, hint string) string {
	s := d.text(o, key, p, true, hint)
	switch {
	case s == "":
	case !namePattern.MatchString(s):
		d.add(join(p, key), "%q is not a name: use letters, digits and _ . : - only", s)
	case len(s) > MaxNameLength:
		d.add(join(p, key), "%d characters long: at most %d", len(s), MaxNameLength)
	}
	return s
}

func (d *decoder) integer(v any, p string) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x), true
		}
	}
	d.add(p, "must be an integer, found %s", manifest.Describe(v))
	return 0, false
}

// strings reads an optional list of non-empty strings.
func (d *decoder) strings(o map[string]any, key, p string) []string {
	v, ok := o[key]
	if !ok {
		return nil
	}
	lp := join(p, key)
	list, isList := v.([]any)
	if !isList {
		d.add(lp, "must be a list of strings, found %s", manifest.Describe(v))
		return nil
	}
	out := make([]string, 0, len(list))
	for i, e := range list {
		s, isStr := e.(string)
		if !isStr || s == "" {
			d.add(index(lp, i), "must be a non-empty string, found %s", manifest.Describe(e))
			continue
		}
		out = append(out, s)
	}
	return out
}

// globs reads a list of path.Match globs.
func (d *decoder) globs(o map[string]any, key, p string) []string {
	list := d.strings(o, key, p)
	out := list[:0]
	for i, g := range list {
		if _, err := path.Match(g, ""); err != nil {
			d.add(index(join(p, key), i), "%q is not a valid glob (path.Match syntax: *, ?, [a-z], \\ escapes)", g)
			continue
		}
		out = append(out, g)
	}
	return out
}

func (d *decoder) anyObject(o map[string]any, key, p string) map[string]any {
	v, ok := o[key]
	if !ok {
		return nil
	}
	m, isObj := v.(map[string]any)
	if !isObj {
		d.add(join(p, key), "must be an object, found %s", manifest.Describe(v))
		return nil
	}
	return m
}

// timestamp reads an RFC 3339 time and returns its text.
func (d *decoder) timestamp(o map[string]any, key, p string) string {
	s := d.text(o, key, p, false, "an RFC 3339 time such as 2026-12-04T10:00:00Z")
	if s == "" {
		return ""
	}
	if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
		d.add(join(p, key), "%q is not an RFC 3339 time: write it like 2026-12-04T10:00:00Z (a zone is required)", s)
		return ""
	}
	return s
}
