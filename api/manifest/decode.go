package manifest

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode"
)

// space is the class of unicode.IsSpace (RE2's \s is ASCII only and lacks \v), so "no
// whitespace" means the same in permissions, references, placeholders and expect paths.
const space = `\t\n\v\f\r\x{85}\p{Z}`

var (
	toolNamePattern    = regexp.MustCompile(`^[A-Za-z0-9_.:/-]+$`)
	referencePattern   = regexp.MustCompile(`^\$(args|result)(\.[^.` + space + `]+)+$`)
	placeholderPattern = regexp.MustCompile(`\{\{([^{}]*)\}\}`)
	argsPlaceholder    = regexp.MustCompile(`^[` + space + `]*args(\.[^.{}` + space + `]+)+[` + space + `]*$`)
)

// Field sets of every object of the format, in the seed's order (used to refuse unknown fields).
var (
	manifestFields     = []string{"tool", "description", "effect", "permission", "approval", "compensation", "requires", "version", "status", "replaced_by", "owner", "oncall", "risk", "timeout_ms", "retry", "idempotency", "audit", "schema_hash"}
	approvalFields     = []string{"required", "roles", "quorum", "timeout", "on_timeout", "escalate_to"}
	compensationFields = []string{"tool", "argument_map", "kind", "residue", "requires_approval", "timeout_ms", "verification"}
	verificationFields = []string{"tool", "arguments", "expect", "retries", "backoff_ms"}
	requirementFields  = []string{"tool", "status"}
	riskFields         = []string{"data_class", "blast_radius", "environment"}
	retryFields        = []string{"attempts", "base_ms", "max_ms"}
	idempotencyFields  = []string{"key", "scope"}
	auditFields        = []string{"retention_days", "evidence_export", "redaction"}
)

// decoder turns one raw object into a normalised Manifest, recording every problem.
type decoder struct {
	el errorList
}

// decode reads raw strictly and applies defaults, normalisation and the single-manifest rules
// of the seed's "What the validator enforces" and Fields tables. It returns the manifest as far
// as it could be read (never nil) and every error found.
func decode(raw any, label string, line func(string) int) (*Manifest, []error) {
	d := &decoder{el: errorList{tool: label, line: line}}
	m := &Manifest{Version: DefaultVersion, Status: Approved}
	// Name errors after the tool from the start, unknown fields included.
	if raw, ok := raw.(map[string]any); ok {
		if t, ok := raw["tool"].(string); ok && t != "" {
			d.el.tool = t // even when malformed: FieldError quotes control characters
		}
	}
	obj := d.object(raw, "", manifestFields)
	if obj == nil {
		return m, d.el.errs
	}

	m.Tool = d.toolName(obj, "tool", "", true, "name the tool as the upstream exposes it")
	m.Description = d.str(obj, "description", "")
	m.Effect = Effect(d.enum(obj, "effect", "", true, effectNames()))
	m.Permission = d.str(obj, "permission", "")
	if _, ok := obj["permission"]; !ok {
		d.el.add("permission", "required: the permission a run's scope must contain, such as payments:write")
	} else if _, isStr := obj["permission"].(string); isStr && (m.Permission == "" || strings.ContainsFunc(m.Permission, isSpace)) {
		d.el.add("permission", "%q is not a permission: use one word without whitespace, such as payments:write", m.Permission)
	}
	if v, ok := obj["version"]; ok {
		if n, ok := d.integer(v, "version"); ok {
			if n < 1 {
				d.el.add("version", "must be a positive integer")
			} else {
				m.Version = int(n)
			}
		}
	}
	if s := d.enum(obj, "status", "", false, statusNames()); s != "" {
		m.Status = Status(s)
	}
	m.ReplacedBy = d.toolName(obj, "replaced_by", "", false, "")
	m.Owner = d.str(obj, "owner", "")
	m.Oncall = d.str(obj, "oncall", "")
	m.SchemaHash = d.str(obj, "schema_hash", "")
	if h, isStr := obj["schema_hash"].(string); isStr && h == "" { // a non-string is reported once, by str
		d.el.add("schema_hash", "must not be empty: remove it or let suggest-manifest fill it in")
	}
	m.TimeoutMs = d.duration(obj, "timeout_ms", "")
	m.Risk = d.risk(obj)
	m.Retry = d.retry(obj)
	m.Idempotency = d.idempotency(obj)
	m.Audit = d.audit(obj)
	m.Requires = d.requires(obj, m.Tool)
	m.Compensation = d.compensation(obj, m.Tool)
	m.Approval = d.approval(obj, m.Effect)

	// Rules across fields of one manifest.
	if m.Effect != "" {
		_, hasComp := obj["compensation"]
		switch {
		case m.Effect.NeedsCompensation() && !hasComp:
			d.el.add("compensation", "required for %s tool: name the tool that undoes it and its argument_map", article(m.Effect))
		case !m.Effect.NeedsCompensation() && hasComp:
			d.el.add("compensation", "not allowed for %s tool: only reversible and compensable tools declare a compensation; remove it or change effect", article(m.Effect))
		}
		if _, hasRetry := obj["retry"]; hasRetry && !m.Effect.Retryable() {
			d.el.add("retry", "only read_only and idempotent tools may retry: retrying %s tool could repeat its effect; remove retry", article(m.Effect))
		}
	}
	if m.ReplacedBy != "" {
		if m.Status != Deprecated {
			d.el.add("replaced_by", "only a deprecated tool names a replacement: set status: deprecated or remove replaced_by")
		}
		if m.ReplacedBy == m.Tool {
			d.el.add("replaced_by", "a tool cannot replace itself: name the tool to use instead")
		}
	}
	return m, d.el.errs
}

// isSpace is any Unicode whitespace: an em space in a permission is still whitespace.
// article puts "a" or "an" before an effect name.
func article(e Effect) string {
	if strings.ContainsRune("aeiou", rune(e[0])) {
		return "an " + string(e)
	}
	return "a " + string(e)
}

func isSpace(r rune) bool { return unicode.IsSpace(r) }

func effectNames() []string {
	out := make([]string, len(Effects))
	for i, e := range Effects {
		out[i] = string(e)
	}
	return out
}

func statusNames() []string {
	out := make([]string, len(Statuses))
	for i, s := range Statuses {
		out[i] = string(s)
	}
	return out
}

// object checks that v is an object and refuses, one by one, every field not in fields.
func (d *decoder) object(v any, path string, fields []string) map[string]any {
	m, ok := v.(map[string]any)
	if !ok {
		d.el.add(path, "must be an object, found %s", Describe(v))
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
		d.el.add(joinPath(path, k), "unknown field: remove it or fix its name (known fields: %s)", strings.Join(fields, ", "))
	}
	return m
}

func (d *decoder) str(obj map[string]any, key, path string) string {
	v, ok := obj[key]
	if !ok {
		return ""
	}
	s, ok := v.(string)
	if !ok {
		d.el.add(joinPath(path, key), "must be a string, found %s", Describe(v))
	}
	return s
}

func (d *decoder) boolean(obj map[string]any, key, path string) bool {
	v, ok := obj[key]
	if !ok {
		return false
	}
	b, ok := v.(bool)
	if !ok {
		d.el.add(joinPath(path, key), "must be true or false, found %s", Describe(v))
	}
	return b
}

func (d *decoder) integer(v any, path string) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x), true
		}
	}
	d.el.add(path, "must be an integer, found %s", Describe(v))
	return 0, false
}

// bounded reads an optional integer in [lo, hi]; def when absent.
func (d *decoder) bounded(obj map[string]any, key, path string, lo, hi int64, def int) int {
	v, ok := obj[key]
	if !ok {
		return def
	}
	p := joinPath(path, key)
	n, ok := d.integer(v, p)
	if !ok {
		return def
	}
	if n < lo || n > hi {
		d.el.add(p, "must be between %d and %d, found %d", lo, hi, n)
		return def
	}
	return int(n)
}

func (d *decoder) enum(obj map[string]any, key, path string, required bool, values []string) string {
	p := joinPath(path, key)
	v, ok := obj[key]
	if !ok {
		if required {
			d.el.add(p, "required: one of %s", strings.Join(values, ", "))
		}
		return ""
	}
	s, isStr := v.(string)
	if !isStr || !slices.Contains(values, s) {
		d.el.add(p, "must be one of %s, found %s", strings.Join(values, ", "), Describe(v))
		return ""
	}
	return s
}

func (d *decoder) toolName(obj map[string]any, key, path string, required bool, hint string) string {
	p := joinPath(path, key)
	v, ok := obj[key]
	if !ok {
		if required {
			d.el.add(p, "required: %s", hint)
		}
		return ""
	}
	s, isStr := v.(string)
	if !isStr {
		d.el.add(p, "must be a tool name (string), found %s", Describe(v))
		return ""
	}
	d.checkToolName(s, p)
	return s
}

func (d *decoder) checkToolName(s, p string) {
	switch {
	case s == "":
		d.el.add(p, "must not be empty: name the tool")
	case !toolNamePattern.MatchString(s):
		d.el.add(p, "%q is not a tool name: use letters, digits and _ . : / - only", s)
	case len(s) > MaxToolNameLength: // ASCII only by now, so bytes are characters
		d.el.add(p, "tool name is %d characters long: at most %d", len(s), MaxToolNameLength)
	}
}

func (d *decoder) duration(obj map[string]any, key, path string) *int64 {
	v, ok := obj[key]
	if !ok {
		return nil
	}
	ms, err := ParseDuration(v)
	if err != nil {
		d.el.add(joinPath(path, key), "%v", err)
		return nil
	}
	return &ms
}

// strings reads an optional list of non-empty strings.
func (d *decoder) strings(obj map[string]any, key, path string) []string {
	v, ok := obj[key]
	if !ok {
		return nil
	}
	p := joinPath(path, key)
	list, ok := v.([]any)
	if !ok {
		d.el.add(p, "must be a list of strings, found %s", Describe(v))
		return nil
	}
	out := make([]string, 0, len(list))
	for i, e := range list {
		s, ok := e.(string)
		if !ok || s == "" {
			d.el.add(indexPath(p, i), "must be a non-empty string, found %s", Describe(e))
			continue
		}
		out = append(out, s)
	}
	return out
}

func (d *decoder) reference(s, p string) {
	if !referencePattern.MatchString(s) {
		d.el.add(p, "%q is not a reference: use $args.<path> or $result.<path>, such as $args.id or $result.charge_id", s)
	}
}

// references reads an object whose values are all references ($args.…, $result.…).
func (d *decoder) references(obj map[string]any, key, path string) map[string]string {
	v, ok := obj[key]
	if !ok {
		return nil
	}
	p := joinPath(path, key)
	m, ok := v.(map[string]any)
	if !ok {
		d.el.add(p, "must be an object of argument names to references, found %s", Describe(v))
		return nil
	}
	out := make(map[string]string, len(m))
	for _, k := range sortedKeys(m) {
		if k == "" {
			d.el.add(joinPath(p, k), "an argument name must not be empty: name the argument the value goes to")
			continue
		}
		s, ok := m[k].(string)
		if !ok {
			d.el.add(joinPath(p, k), "must be a reference such as $args.id or $result.charge_id, found %s", Describe(m[k]))
			continue
		}
		d.reference(s, joinPath(p, k))
		out[k] = s
	}
	return out
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (d *decoder) approval(obj map[string]any, effect Effect) Approval {
	v, ok := obj["approval"]
	a := Approval{Required: effect == Irreversible}
	if !ok {
		return a
	}
	const p = "approval"
	switch x := v.(type) {
	case string:
		switch x {
		case "never":
			if effect == Irreversible {
				d.el.add(p, "an irreversible tool cannot set approval: never: it always needs approval; use always or the object form")
			}
		case "always":
			a.Required = true
		default:
			d.el.add(p, "must be never, always or an object, found %s", Describe(v))
		}
		return a
	case map[string]any:
		o := d.object(x, p, approvalFields)
		required := true
		if _, has := o["required"]; has {
			required = d.boolean(o, "required", p)
		}
		r := d.approvalRules(o, p)
		if !required {
			if effect == Irreversible {
				d.el.add(p+".required", "an irreversible tool cannot set approval: never: it always needs approval; remove required: false")
			}
			return a
		}
		a.Required = true
		if len(r.Roles) > 0 || r.Quorum != DefaultQuorum || r.TimeoutMs != nil || r.OnTimeout != "deny" || len(r.EscalateTo) > 0 {
			a.Rules = r
		}
		return a
	default:
		d.el.add(p, "must be never, always or an object, found %s", Describe(v))
		return a
	}
}

// approvalRules reads the rule fields of an approval object o at path p (its unknown fields
// are refused by the caller): roles, quorum (1 to 10, default 1), timeout, on_timeout (default
// deny) and escalate_to, with the rules across them (seed: Approval).
func (d *decoder) approvalRules(o map[string]any, p string) *ApprovalRules {
	r := &ApprovalRules{
		Roles:      d.strings(o, "roles", p),
		Quorum:     d.bounded(o, "quorum", p, 1, 10, DefaultQuorum),
		TimeoutMs:  d.duration(o, "timeout", p),
		OnTimeout:  d.enum(o, "on_timeout", p, false, OnTimeouts),
		EscalateTo: d.strings(o, "escalate_to", p),
	}
	if r.OnTimeout == "" {
		r.OnTimeout = "deny"
	}
	if r.Quorum > 1 && len(r.Roles) == 0 {
		d.el.add(p+".quorum", "a quorum above 1 needs roles: name the roles or groups that may approve")
	}
	if r.OnTimeout == "escalate" && len(r.EscalateTo) == 0 {
		d.el.add(p+".escalate_to", "required when on_timeout is escalate: name the roles asked next")
	}
	return r
}

// ApprovalRuleFields are the fields of an approval object other than `required`: what
// DecodeApprovalRules accepts.
var ApprovalRuleFields = []string{"roles", "quorum", "timeout", "on_timeout", "escalate_to"}

// DecodeApprovalRules reads raw, an approval object without `required` (as a policy's
// require_approval rule writes it), strictly and with the manifest's rules: roles (non-empty
// strings), quorum 1 to 10 (default 1; above 1 needs roles), timeout (a duration, in
// milliseconds in the result), on_timeout deny (default) or escalate (which needs
// escalate_to). path is where the object is ("rules[0].approval"), used in the errors; line,
// when not nil, gives the line of a path. It returns the rules read (never nil) and every
// error, each a *FieldError with Tool empty. Source: seed "Tool manifests", Approval.
func DecodeApprovalRules(raw any, path string, line func(path string) int) (*ApprovalRules, []error) {
	d := &decoder{el: errorList{line: line}}
	o := d.object(NormaliseNumbers(raw), path, ApprovalRuleFields)
	if o == nil {
		return &ApprovalRules{Quorum: DefaultQuorum, OnTimeout: "deny"}, d.el.errs
	}
	return d.approvalRules(o, path), d.el.errs
}

func (d *decoder) requires(obj map[string]any, self string) []Requirement {
	v, ok := obj["requires"]
	if !ok {
		return nil
	}
	const p = "requires"
	list, ok := v.([]any)
	if !ok {
		d.el.add(p, "must be a list of tool names or {tool, status: succeeded} objects, found %s", Describe(v))
		return nil
	}
	var out []Requirement
	seen := map[string]int{}
	for i, e := range list {
		ep := indexPath(p, i)
		var r Requirement
		switch x := e.(type) {
		case string:
			d.checkToolName(x, ep)
			r = Requirement{Tool: x, Status: RequirementSucceeded}
		case map[string]any:
			o := d.object(x, ep, requirementFields)
			r.Tool = d.toolName(o, "tool", ep, true, "name the tool that must have succeeded first")
			r.Status = RequirementSucceeded
			if s := d.enum(o, "status", ep, false, []string{RequirementSucceeded}); s != "" {
				r.Status = s
			}
		default:
			d.el.add(ep, "must be a tool name or {tool, status: succeeded}, found %s", Describe(e))
			continue
		}
		if r.Tool == "" {
			continue
		}
		if r.Tool == self {
			d.el.add(ep, "a tool cannot require itself: remove this entry")
			continue
		}
		if j, dup := seen[r.Tool]; dup {
			d.el.add(ep, "%q is already listed at requires[%d]: list each tool once", r.Tool, j)
			continue
		}
		seen[r.Tool] = i
		out = append(out, r)
	}
	return out
}

func (d *decoder) compensation(obj map[string]any, self string) *Compensation {
	v, ok := obj["compensation"]
	if !ok {
		return nil
	}
	const p = "compensation"
	o := d.object(v, p, compensationFields)
	if o == nil {
		return nil
	}
	c := &Compensation{
		Tool:             d.toolName(o, "tool", p, true, "name the tool that undoes this one"),
		ArgumentMap:      d.references(o, "argument_map", p),
		Kind:             d.enum(o, "kind", p, false, Kinds),
		Residue:          d.strings(o, "residue", p),
		RequiresApproval: d.boolean(o, "requires_approval", p),
		TimeoutMs:        d.duration(o, "timeout_ms", p),
		Verification:     d.verification(o),
	}
	if c.Kind == "" {
		c.Kind = KindCompensation
	}
	if c.Tool != "" && c.Tool == self {
		d.el.add(p+".tool", "a tool cannot compensate itself: name the tool that undoes it")
	}
	if c.Kind == KindInverse && len(c.Residue) > 0 {
		d.el.add(p+".residue", "kind: inverse restores the exact prior state and cannot list residue: use kind: compensation or remove residue")
	}
	return c
}

func (d *decoder) verification(comp map[string]any) *Verification {
	v, ok := comp["verification"]
	if !ok {
		return nil
	}
	const p = "compensation.verification"
	o := d.object(v, p, verificationFields)
	if o == nil {
		return nil
	}
	ver := &Verification{
		Tool:      d.toolName(o, "tool", p, true, "name the read_only tool that reads the result back"),
		Arguments: d.references(o, "arguments", p),
		Retries:   d.bounded(o, "retries", p, 1, 10, DefaultVerifyRetries),
		BackoffMs: DefaultVerifyBackoff,
	}
	if b := d.duration(o, "backoff_ms", p); b != nil {
		ver.BackoffMs = *b
	}
	switch e := o["expect"].(type) {
	case map[string]any:
		if len(e) == 0 {
			d.el.add(p+".expect", "must have at least one entry: a dotted path and the value expected, such as refunded: true")
		}
		for _, k := range sortedKeys(e) {
			if !validDottedPath(k) {
				d.el.add(joinPath(p+".expect", k), "%q is not a dotted path: use field names and array indexes separated by dots, such as items.0.id", k)
			}
		}
		ver.Expect = e
	case nil:
		if _, has := o["expect"]; has {
			d.el.add(p+".expect", "must be an object of dotted paths to expected values, found null")
		} else {
			d.el.add(p+".expect", "required: at least one dotted path and the value expected, such as refunded: true")
		}
	default:
		d.el.add(p+".expect", "must be an object of dotted paths to expected values, found %s", Describe(e))
	}
	return ver
}

func validDottedPath(s string) bool {
	if s == "" {
		return false
	}
	for _, seg := range strings.Split(s, ".") {
		if seg == "" || strings.ContainsFunc(seg, isSpace) {
			return false
		}
	}
	return true
}

func (d *decoder) risk(obj map[string]any) *Risk {
	v, ok := obj["risk"]
	if !ok {
		return nil
	}
	o := d.object(v, "risk", riskFields)
	if o == nil {
		return nil
	}
	return &Risk{
		DataClass:   d.str(o, "data_class", "risk"),
		BlastRadius: d.enum(o, "blast_radius", "risk", false, BlastRadii),
		Environment: d.str(o, "environment", "risk"),
	}
}

func (d *decoder) retry(obj map[string]any) *Retry {
	v, ok := obj["retry"]
	if !ok {
		return nil
	}
	o := d.object(v, "retry", retryFields)
	if o == nil {
		return nil
	}
	r := &Retry{Attempts: d.bounded(o, "attempts", "retry", 1, 10, DefaultRetryAttempts), BaseMs: DefaultRetryBaseMs, MaxMs: DefaultRetryMaxMs}
	if b := d.duration(o, "base_ms", "retry"); b != nil {
		r.BaseMs = *b
	}
	if mx := d.duration(o, "max_ms", "retry"); mx != nil {
		r.MaxMs = *mx
	}
	return r
}

func (d *decoder) idempotency(obj map[string]any) *Idempotency {
	v, ok := obj["idempotency"]
	if !ok {
		return nil
	}
	const p = "idempotency"
	o := d.object(v, p, idempotencyFields)
	if o == nil {
		return nil
	}
	i := &Idempotency{Key: d.str(o, "key", p), Scope: d.enum(o, "scope", p, false, IdempotencyScopes)}
	if i.Scope == "" {
		i.Scope = "run"
	}
	if _, has := o["key"]; !has {
		d.el.add(p+".key", "required: a template with at least one {{args.field}}, such as charge-{{args.order_id}}")
	} else if _, isStr := o["key"].(string); isStr {
		if msg := checkKeyTemplate(i.Key); msg != "" {
			d.el.add(p+".key", "%s", msg)
		}
	}
	return i
}

// checkKeyTemplate returns why an idempotency key template is invalid, or "".
func checkKeyTemplate(key string) string {
	found := placeholderPattern.FindAllStringSubmatch(key, -1)
	args := 0
	for _, f := range found {
		if !argsPlaceholder.MatchString(f[1]) {
			return fmt.Sprintf("placeholder {{%s}} is not an argument: only {{args.field}} placeholders are allowed", f[1])
		}
		args++
	}
	if args == 0 {
		return "needs at least one {{args.field}} placeholder, such as charge-{{args.order_id}}: a constant key would make every call a duplicate"
	}
	return ""
}

func (d *decoder) audit(obj map[string]any) *Audit {
	v, ok := obj["audit"]
	if !ok {
		return nil
	}
	const p = "audit"
	o := d.object(v, p, auditFields)
	if o == nil {
		return nil
	}
	a := &Audit{EvidenceExport: d.enum(o, "evidence_export", p, false, EvidenceExports), Redaction: d.strings(o, "redaction", p)}
	if rv, has := o["retention_days"]; has {
		if n, ok := d.integer(rv, p+".retention_days"); ok {
			if n < 1 {
				d.el.add(p+".retention_days", "must be a positive number of days")
			} else {
				a.RetentionDays = int(n)
			}
		}
	}
	if list, ok := o["redaction"].([]any); ok {
		for i, e := range list {
			if s, ok := e.(string); ok && s != "" {
				d.reference(s, indexPath(p+".redaction", i))
			}
		}
	}
	return a
}
