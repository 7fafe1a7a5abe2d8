// Package policy compiles and evaluates policy sets (api/policy) for the gateway and the CLI:
// CEL conditions compiled once per load with cel-go and type-checked against the declared
// variables (env.go), content checks as CEL functions (content.go), the decision for one
// call (Evaluate), the merge of approvals (MergeApproval), limit counters (Counter) and the
// policies' own tests (RunTests). docs/policy.md is the user's page.
//
// Source: issue 21 and DESIGN.md "Policy (#17)"; the approval merge is the seed's ("Tool
// manifests", Approval: "any listed role may approve, the largest quorum wins, the shortest
// timeout wins"). This package imports api/ only.
package policy

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/operators"
	"github.com/google/cel-go/common/types"

	"github.com/reversi-gitops/reversi/api/manifest"
	apipolicy "github.com/reversi-gitops/reversi/api/policy"
)

// The Rule of a *manifest.FieldError for a condition that does not compile (errors.Is works
// on the FieldError): the text is not CEL, or it is CEL that does not type-check against the
// variables and functions (an unknown variable or field, a misspelt function, a non-bool
// result).
var (
	ErrCELSyntax = errors.New("CEL syntax error")
	ErrCELType   = errors.New("CEL type error")
	// ErrSetCost: the set's conditions may together cost more than SetCostLimit in one call.
	ErrSetCost = errors.New("policy set too costly")
)

// Set is a compiled policy set: every rule of every policy, in evaluation order (policies by
// name, then rules as written). It is immutable and safe for concurrent use.
type Set struct {
	policies []*apipolicy.Policy
	rules    []*rule
	checksum string
	adapter  types.Adapter // the CEL environment's: turns the variables into CEL values
	// runReaders are the rules whose condition may read `run` (ReadsRun).
	runReaders []*rule
}

// rule is one compiled rule.
type rule struct {
	id     string
	policy *apipolicy.Policy
	index  int
	r      *apipolicy.Rule
	match  matcher
	prg    cel.Program // nil when the rule has no condition
	// staticCost is the condition's worst-case cost when CEL bounds it statically below
	// CostLimit (evaluated without runtime tracking); 0 when it is tracked at runtime.
	staticCost uint64
	// worst is the most the condition may cost in one evaluation: staticCost, or CostLimit
	// when it is tracked at runtime (0 without a condition).
	worst uint64
	args  []string // argument paths the condition reads
}

// RuleInfo describes a compiled rule, for coverage reports and lint.
type RuleInfo struct {
	// ID is "<policy>/<rule>".
	ID     string
	Policy *apipolicy.Policy
	Rule   *apipolicy.Rule
	// Path is the rule's path in its policy ("rules[2]").
	Path string
	// File and Line locate the rule (empty and 0 when the policy did not come from a file).
	File string
	Line int
	// Args are the argument paths the condition reads (args.a.b, args["a"], has(args.a),
	// args.?a), dotted ("a.b"), sorted, each once.
	Args []string
}

// Compile compiles every rule's condition once, for a set of decoded policies (names
// unique, as api/policy's Decode guarantees). It returns the set, or nil and every error:
// each a *manifest.FieldError with the file, line, policy and path of the condition, and Rule
// ErrCELSyntax or ErrCELType. A set with a broken rule is never returned: enforcing only part
// of a policy would loosen it.
func Compile(ps []*apipolicy.Policy) (*Set, []error) {
	rules, errs := compileAll(ps)
	if len(errs) > 0 {
		return nil, errs
	}
	if err := checkSetCost(rules); err != nil {
		return nil, []error{err}
	}
	sorted := sortedPolicies(ps)
	sum, err := apipolicy.SetChecksum(sorted)
	if err != nil {
		return nil, []error{fmt.Errorf("policy: checksum: %w", err)}
	}
	env, err := celEnv()
	if err != nil {
		return nil, []error{err}
	}
	return &Set{policies: sorted, rules: rules, checksum: sum, adapter: env.CELTypeAdapter(), runReaders: readers(rules, "run")}, nil
}

// Load reads the policy files and folders given (api/policy.ReadPaths) and compiles them:
// the one call a gateway or CLI needs. Every error of reading, decoding and compiling is
// returned, sorted by file and line; the set is nil when there is any.
func Load(paths ...string) (*Set, []error) {
	ps, errs := apipolicy.ReadPaths(paths...)
	if len(errs) > 0 {
		return nil, errs
	}
	return Compile(ps)
}

// Inspect compiles every rule on its own and describes those that compile, with every
// compile error: for lint, which reports the broken rules and still checks the others.
func Inspect(ps []*apipolicy.Policy) ([]RuleInfo, []error) {
	rules, errs := compileAll(ps)
	out := make([]RuleInfo, len(rules))
	for i, r := range rules {
		out[i] = r.info()
	}
	return out, errs
}

func sortedPolicies(ps []*apipolicy.Policy) []*apipolicy.Policy {
	sorted := slices.Clone(ps)
	slices.SortStableFunc(sorted, func(a, b *apipolicy.Policy) int { return cmp.Compare(a.Name, b.Name) })
	return sorted
}

func compileAll(ps []*apipolicy.Policy) ([]*rule, []error) {
	env, err := celEnv()
	if err != nil {
		return nil, []error{err}
	}
	var rules []*rule
	var errs []error
	for _, p := range sortedPolicies(ps) {
		for i := range p.Rules {
			r, es := compileRule(env, p, i)
			errs = append(errs, es...)
			if len(es) == 0 {
				rules = append(rules, r)
			}
		}
	}
	manifest.SortErrors(errs)
	return rules, errs
}

// checkSetCost refuses a set whose conditions may together cost more than SetCostLimit in one
// call (CostLimit bounds each condition, not their sum: thousands of costly rules, advise
// ones included, would hold every call for minutes). It names the costliest policies.
func checkSetCost(rules []*rule) error {
	var total uint64
	per := map[string]uint64{}
	for _, r := range rules {
		total += r.worst
		per[r.policy.Name] += r.worst
	}
	if total <= SetCostLimit {
		return nil
	}
	names := make([]string, 0, len(per))
	for n := range per {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(per[b], per[a]), cmp.Compare(a, b)) })
	var parts []string
	for _, n := range names[:min(3, len(names))] {
		parts = append(parts, fmt.Sprintf("%s %d", n, per[n]))
	}
	return fmt.Errorf("%w: the conditions may cost %d in one call, more than %d (a condition CEL cannot bound statically counts %d); the costliest: %s: merge rules, bound their inputs, or drop some",
		ErrSetCost, total, SetCostLimit, CostLimit, strings.Join(parts, ", "))
}

func rulePath(i int) string { return fmt.Sprintf("rules[%d]", i) }

func compileRule(env *cel.Env, p *apipolicy.Policy, i int) (*rule, []error) {
	r := &rule{id: apipolicy.ID(p.Name, p.Rules[i].Name), policy: p, index: i, r: &p.Rules[i], match: newMatcher(p.Rules[i].Match)}
	src := r.r.Condition
	if src == "" {
		return r, nil
	}
	path := rulePath(i) + ".condition"
	base := p.Line(path)
	// A condition of several lines is a YAML block scalar (condition: |), whose first line is
	// the one after the key; other conditions start on the key's line.
	first := base
	if base > 0 && strings.Contains(strings.TrimRight(src, "\n"), "\n") && !strings.EqualFold(filepath.Ext(p.File), ".json") {
		first = base + 1
	}
	fail := func(kind error, iss *cel.Issues) []error {
		var out []error
		for _, e := range iss.Errors() {
			line := base
			if base > 0 && e.Location.Line() > 0 {
				line = first + e.Location.Line() - 1
			}
			out = append(out, &manifest.FieldError{File: p.File, Line: line, Tool: p.Name, Path: path, Rule: kind,
				Message: fmt.Sprintf("%v at %d:%d of the condition: %s", kind, e.Location.Line(), e.Location.Column()+1, e.Message)})
		}
		if len(out) == 0 {
			out = append(out, &manifest.FieldError{File: p.File, Line: base, Tool: p.Name, Path: path, Rule: kind, Message: fmt.Sprintf("%v: %v", kind, iss.Err())})
		}
		return out
	}
	parsed, iss := env.Parse(src)
	if iss.Err() != nil {
		return nil, fail(ErrCELSyntax, iss)
	}
	checked, iss := env.Check(parsed)
	if iss.Err() != nil {
		return nil, fail(ErrCELType, iss)
	}
	if t := checked.OutputType(); !t.IsExactType(cel.BoolType) && !t.IsExactType(cel.DynType) {
		return nil, []error{&manifest.FieldError{File: p.File, Line: base, Tool: p.Name, Path: path, Rule: ErrCELType,
			Message: fmt.Sprintf("%v: the condition is of type %s; it must be a bool (true applies the rule)", ErrCELType, t)}}
	}
	// A condition whose worst-case cost CEL can bound statically below CostLimit runs without
	// runtime cost tracking (which costs more than the evaluation of a simple condition); any
	// other (a comprehension over the arguments, a regular expression over a string of unknown
	// size) is tracked and stopped at CostLimit. Either way no condition runs past CostLimit.
	opts := []cel.ProgramOption{cel.EvalOptions(cel.OptOptimize)}
	if est, err := env.EstimateCost(checked, noEstimates{}); err != nil || est.Max > CostLimit {
		opts = append(opts, cel.CostLimit(CostLimit))
		r.worst = CostLimit
	} else {
		r.staticCost, r.worst = est.Max, est.Max
	}
	prg, err := env.Program(checked, opts...)
	if err != nil {
		return nil, []error{&manifest.FieldError{File: p.File, Line: base, Tool: p.Name, Path: path, Rule: ErrCELType, Message: fmt.Sprintf("%v: %v", ErrCELType, err)}}
	}
	r.prg = prg
	r.args = argPaths(checked.NativeRep().Expr())
	return r, nil
}

// noEstimates is a checker.CostEstimator that knows nothing: every variable's size is
// unbounded, so only conditions that do not depend on sizes get a static bound.
type noEstimates struct{}

func (noEstimates) EstimateSize(checker.AstNode) *checker.SizeEstimate { return nil }
func (noEstimates) EstimateCallCost(string, string, *checker.AstNode, []checker.AstNode) *checker.CallEstimate {
	return nil
}

func (r *rule) info() RuleInfo {
	path := rulePath(r.index)
	return RuleInfo{ID: r.id, Policy: r.policy, Rule: r.r, Path: path, File: r.policy.File, Line: r.policy.Line(path), Args: r.args}
}

// argPaths lists the argument paths an expression reads: chains of field selections
// (args.a.b, also under has() and with ?.), and constant string or integer indexes
// (args["a"], args.items[0]) starting at the variable args.
func argPaths(root ast.Expr) []string {
	seen := map[string]bool{}
	ast.PreOrderVisit(root, ast.NewExprVisitor(func(e ast.Expr) {
		if p, ok := argPath(e); ok && p != "" {
			seen[p] = true
		}
	}))
	// Keep the longest chains only: args.a.b also reads args.a, which is implied.
	var out []string
	for p := range seen {
		implied := false
		for q := range seen {
			if q != p && strings.HasPrefix(q, p+".") {
				implied = true
				break
			}
		}
		if !implied {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// argPath returns the dotted path e selects under args ("" for args itself), or false.
func argPath(e ast.Expr) (string, bool) {
	switch e.Kind() {
	case ast.IdentKind:
		return "", e.AsIdent() == VarArgs
	case ast.SelectKind:
		s := e.AsSelect()
		p, ok := argPath(s.Operand())
		if !ok {
			return "", false
		}
		return join(p, s.FieldName()), true
	case ast.CallKind:
		c := e.AsCall()
		if (c.FunctionName() != operators.Index && c.FunctionName() != operators.OptSelect && c.FunctionName() != operators.OptIndex) || len(c.Args()) != 2 {
			return "", false
		}
		p, ok := argPath(c.Args()[0])
		if !ok || c.Args()[1].Kind() != ast.LiteralKind {
			return "", false
		}
		switch v := c.Args()[1].AsLiteral().Value().(type) {
		case string:
			return join(p, v), true
		case int64:
			return join(p, fmt.Sprint(v)), true
		}
	}
	return "", false
}

func join(p, seg string) string {
	if p == "" {
		return seg
	}
	return p + "." + seg
}

// Checksum is the set's api/policy.SetChecksum: the gateway's `policy_checksum` ("" for an
// empty set).
func (s *Set) Checksum() string {
	if s == nil {
		return ""
	}
	return s.checksum
}

// Policies returns the set's policies, sorted by name. The caller must not modify them.
func (s *Set) Policies() []*apipolicy.Policy {
	if s == nil {
		return nil
	}
	return s.policies
}

// Rules describes every rule, in evaluation order.
func (s *Set) Rules() []RuleInfo {
	if s == nil {
		return nil
	}
	out := make([]RuleInfo, len(s.rules))
	for i, r := range s.rules {
		out[i] = r.info()
	}
	return out
}

// Len is the number of rules.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.rules)
}
