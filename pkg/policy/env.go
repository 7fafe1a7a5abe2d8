package policy

import (
	"fmt"
	"reflect"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/ext"

	// The rules' time functions take IANA zone names (now.getDayOfWeek("Europe/Paris"));
	// embedding the zone database makes them work in images without one.
	_ "time/tzdata"
)

// The CEL variables a condition can read. Struct types are exposed with ext.NativeTypes, their
// fields named by their json tags, so a misspelt field (manifest.efect) is a type error when
// the policy loads, not a runtime surprise.
//
//	tool         string                  the tool called, as the gateway exposes it
//	args         map(string, dyn)        the call's arguments (JSON values: numbers compare
//	                                     across int and double, so args.amount > 1000 holds
//	                                     for 1500 and 1500.0)
//	manifest     policy.Manifest         the tool's manifest facts (found false, other fields
//	                                     empty, when the tool has none)
//	actor        policy.Actor            principal and groups of whoever makes the call
//	run          policy.Run              the run so far: id, steps, counts per tool, outcomes
//	                                     per status
//	gateway      string                  the gateway's name
//	environment  string                  the gateway's environment (prod, staging, …)
//	now          timestamp               the time of the call (injected in tests)
const (
	VarTool        = "tool"
	VarArgs        = "args"
	VarManifest    = "manifest"
	VarActor       = "actor"
	VarRun         = "run"
	VarGateway     = "gateway"
	VarEnvironment = "environment"
	VarNow         = "now"
)

// Variables lists the CEL variables, in the order of the documentation.
var Variables = []string{VarTool, VarArgs, VarManifest, VarActor, VarRun, VarGateway, VarEnvironment, VarNow}

// Manifest is the `manifest` variable: the facts of the called tool's manifest.
type Manifest struct {
	// Found is false when the tool has no manifest; every other field is then empty.
	Found      bool   `json:"found"`
	Tool       string `json:"tool"`
	Effect     string `json:"effect"`
	Permission string `json:"permission"`
	Status     string `json:"status"`
	Version    int    `json:"version"`
	Owner      string `json:"owner"`
	Oncall     string `json:"oncall"`
	Risk       Risk   `json:"risk"`
	// ApprovalRequired is whether the manifest itself requires approval.
	ApprovalRequired bool `json:"approval_required"`
}

// Risk is `manifest.risk`; empty strings where the manifest says nothing.
type Risk struct {
	DataClass   string `json:"data_class"`
	BlastRadius string `json:"blast_radius"`
	Environment string `json:"environment"`
}

// Actor is the `actor` variable: who makes the call.
type Actor struct {
	Principal string   `json:"principal"`
	Groups    []string `json:"groups"`
}

// Run is the `run` variable: the run so far, without the call being decided. Counts (calls
// per tool) and Outcomes (steps per status) are computed from Steps when nil.
type Run struct {
	ID       string         `json:"id"`
	Steps    []Step         `json:"steps"`
	Counts   map[string]int `json:"counts"`
	Outcomes map[string]int `json:"outcomes"`
}

// Step is one earlier call of the run: the tool and its status (succeeded, failed,
// uncertain, blocked, would_block).
type Step struct {
	Tool   string `json:"tool"`
	Status string `json:"status"`
}

// The content-check functions (content.go), as conditions call them.
const (
	FnHasCardNumber = "has_card_number"
	FnHasSecret     = "has_secret"
	FnHasEmail      = "has_email"
	FnHasPhone      = "has_phone"
	FnJSONSize      = "json_size"
)

// Evaluation bounds. CostLimit is CEL's runtime cost (about one unit per operation and per
// element a comprehension visits): a condition that exceeds it stops with an error, and fails
// closed (see Evaluate). It is what bounds a hostile condition's time (a few milliseconds at
// most), so evaluation takes no context. The content functions cost one unit each; their own
// work is linear in the size of the value, which the gateway bounds.
const (
	CostLimit = 100_000
	// SetCostLimit bounds the sum of a set's conditions' worst-case costs (CostLimit for one
	// CEL cannot bound statically), so one call's evaluation stays bounded however many rules
	// a signed policy ships: Compile refuses a set above it (ErrSetCost).
	SetCostLimit         = 100 * CostLimit
	parserRecursionLimit = 100
)

var boolTrue = types.True

var (
	envOnce sync.Once
	envVal  *cel.Env
	envErr  error
)

// celEnv is the one CEL environment every condition is compiled in: the variables, the
// standard library, cel-go's strings, lists, sets and math extensions, optional values
// (args.?amount.orValue(0)), and the content functions.
func celEnv() (*cel.Env, error) {
	envOnce.Do(func() {
		unary := func(name string, out *cel.Type, f func(ref.Val) ref.Val) cel.EnvOption {
			return cel.Function(name, cel.Overload(name+"_dyn", []*cel.Type{cel.DynType}, out, cel.UnaryBinding(f)))
		}
		envVal, envErr = cel.NewEnv(
			ext.NativeTypes(reflect.TypeFor[Manifest](), reflect.TypeFor[Actor](), reflect.TypeFor[Run](), reflect.TypeFor[Step](), reflect.TypeFor[Risk](),
				ext.ParseStructTag("json")),
			cel.Variable(VarTool, cel.StringType),
			cel.Variable(VarArgs, cel.MapType(cel.StringType, cel.DynType)),
			cel.Variable(VarManifest, cel.ObjectType("policy.Manifest")),
			cel.Variable(VarActor, cel.ObjectType("policy.Actor")),
			cel.Variable(VarRun, cel.ObjectType("policy.Run")),
			cel.Variable(VarGateway, cel.StringType),
			cel.Variable(VarEnvironment, cel.StringType),
			cel.Variable(VarNow, cel.TimestampType),
			ext.Strings(), ext.Lists(), ext.Sets(), ext.Math(),
			cel.OptionalTypes(),
			cel.CrossTypeNumericComparisons(true),
			cel.DefaultUTCTimeZone(true),
			cel.ParserExpressionSizeLimit(16<<10),
			cel.ParserRecursionLimit(parserRecursionLimit),
			unary(FnHasCardNumber, cel.BoolType, func(v ref.Val) ref.Val { return celCheck(cardNumber(v)) }),
			unary(FnHasSecret, cel.BoolType, func(v ref.Val) ref.Val { return celCheck(secret(v)) }),
			unary(FnHasEmail, cel.BoolType, func(v ref.Val) ref.Val { return celCheck(email(v)) }),
			unary(FnHasPhone, cel.BoolType, func(v ref.Val) ref.Val { return celCheck(phone(v)) }),
			unary(FnJSONSize, cel.IntType, func(v ref.Val) ref.Val { return types.Int(JSONSize(v)) }),
		)
		if envErr != nil {
			envErr = fmt.Errorf("policy: building the CEL environment: %w", envErr)
		}
	})
	return envVal, envErr
}
