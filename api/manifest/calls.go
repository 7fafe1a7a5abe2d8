package manifest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// This file holds the pure, per-call semantics of a manifest: what the gateway's engine and
// `reversi test` both decide from a manifest, a call's arguments and its result, with no I/O.
// Source: seed "Tool manifests", Compensation, Verification, Duplicate calls, Lifecycle.

// Outcome is how a forwarded call ended (seed "MCP gateway", What happens to a call).
type Outcome string

const (
	Succeeded Outcome = "succeeded"
	Failed    Outcome = "failed"    // the upstream answered isError
	Uncertain Outcome = "uncertain" // transport error or timeout: the upstream may have acted
)

// PlanAction is what a rollback does with one step.
type PlanAction string

const (
	PlanCompensate    PlanAction = "compensate"
	PlanSkip          PlanAction = "skip"
	PlanUnrecoverable PlanAction = "unrecoverable"
	PlanNotUndone     PlanAction = "not_undone"
)

// PlanActions lists every action.
var PlanActions = []PlanAction{PlanCompensate, PlanSkip, PlanUnrecoverable, PlanNotUndone}

// Step is the rollback plan for one call. For PlanCompensate, Handle holds the undo call's
// arguments (the resolved argument_map), Tool the compensation tool, Kind and Residue what a
// reviewer must know. For PlanUnrecoverable, Missing lists the references that had no value.
type Step struct {
	Action  PlanAction
	Reason  string
	Tool    string
	Handle  map[string]any
	Kind    string
	Residue []string
	Missing []string
}

// IdempotentReason is the plan's reason for a step of an idempotent tool.
const IdempotentReason = "idempotent: safe to repeat, no undo needed"

// PlanStep decides what a rollback does for one journaled call of the tool m describes.
// args and result are the call's arguments and its (structured) result, both JSON-like.
func PlanStep(m *Manifest, outcome Outcome, args, result any) Step {
	switch {
	case m.Effect == ReadOnly:
		return Step{Action: PlanSkip, Reason: "read_only: changes nothing"}
	case m.Effect == Idempotent:
		// Seed "Effects": "idempotent: safe to repeat, no undo needed".
		return Step{Action: PlanSkip, Reason: IdempotentReason}
	case outcome == Failed:
		return Step{Action: PlanSkip, Reason: "the call failed: nothing to undo"}
	case m.Compensation == nil:
		return Step{Action: PlanNotUndone, Reason: fmt.Sprintf("%s: no compensation is declared", m.Effect)}
	}
	c := m.Compensation
	handle, missing := ResolveMap(c.ArgumentMap, args, result)
	if len(missing) > 0 {
		return Step{Action: PlanUnrecoverable, Tool: c.Tool, Kind: c.Kind, Residue: c.Residue, Missing: missing,
			Reason: "a referenced value was missing: " + strings.Join(missing, ", ")}
	}
	return Step{Action: PlanCompensate, Tool: c.Tool, Handle: handle, Kind: c.Kind, Residue: c.Residue,
		Reason: "run " + c.Tool}
}

// VerificationArguments resolves the read-back's arguments from the original call and result.
// It returns nil, nil when the manifest declares no verification; missing lists references
// without a value.
func VerificationArguments(m *Manifest, args, result any) (values map[string]any, missing []string) {
	if m.Compensation == nil || m.Compensation.Verification == nil {
		return nil, nil
	}
	return ResolveMap(m.Compensation.Verification.Arguments, args, result)
}

// ResolveMap resolves every reference of refs; missing lists (sorted) the references that had
// no value. Source: seed, Compensation ("marked unrecoverable rather than guessed").
func ResolveMap(refs map[string]string, args, result any) (map[string]any, []string) {
	out := make(map[string]any, len(refs))
	var missing []string
	for k, ref := range refs {
		v, ok := Resolve(ref, args, result)
		if !ok {
			missing = append(missing, ref)
			continue
		}
		out[k] = v
	}
	sort.Strings(missing)
	return out, missing
}

// Resolve looks up one reference ($args.path or $result.path; a `*` segment maps over an array,
// see Wildcard). ok is false when the reference is malformed or the value is absent (a JSON
// null counts as absent: it cannot be undone with).
func Resolve(ref string, args, result any) (any, bool) {
	var root any
	var path string
	switch {
	case strings.HasPrefix(ref, "$args."):
		root, path = args, strings.TrimPrefix(ref, "$args.")
	case strings.HasPrefix(ref, "$result."):
		root, path = result, strings.TrimPrefix(ref, "$result.")
	default:
		return nil, false
	}
	v, ok := LookupRef(root, path)
	return v, ok && v != nil
}

// Lookup follows a dotted path (`items.0.id`: object fields and array indexes) into a
// JSON-like value.
func Lookup(v any, path string) (any, bool) {
	for _, seg := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			next, ok := x[seg]
			if !ok {
				return nil, false
			}
			v = next
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// CheckExpect compares a read-back answer with `expect` (dotted path → value, deep equality,
// numbers compared by value). It returns "" when every entry matches, else the first mismatch
// in path order, e.g. `refunded: expected true, got false`.
func CheckExpect(expect map[string]any, got any) string {
	paths := make([]string, 0, len(expect))
	for p := range expect {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		v, ok := Lookup(got, p)
		if !ok {
			return fmt.Sprintf("%s: expected %s, got nothing", p, jsonText(expect[p]))
		}
		if !JSONEqual(expect[p], v) {
			return fmt.Sprintf("%s: expected %s, got %s", p, jsonText(expect[p]), jsonText(v))
		}
	}
	return ""
}

// JSONEqual reports whether two JSON-like values are equal as JSON (2500 == 2500.0, key order
// ignored).
func JSONEqual(a, b any) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// CheckStatus refuses a call to a draft manifest (seed: Lifecycle). Deprecated manifests run;
// Note returns their notice.
func CheckStatus(m *Manifest) error {
	if m.Status == Draft {
		return fmt.Errorf("the manifest for %s is a draft: a reviewer must approve it before the tool can be called", m.Tool)
	}
	return nil
}

// Note returns the notice recorded on every call of a deprecated tool, or "".
func Note(m *Manifest) string {
	if m.Status != Deprecated {
		return ""
	}
	if m.ReplacedBy == "" {
		return "manifest deprecated"
	}
	return "manifest deprecated; use " + m.ReplacedBy
}

// CheckRequires refuses a call when a required tool has not succeeded earlier in the run.
func CheckRequires(m *Manifest, succeeded func(tool string) bool) error {
	for _, r := range m.Requires {
		if !succeeded(r.Tool) {
			return fmt.Errorf("%s requires %s to have succeeded earlier in the run", m.Tool, r.Tool)
		}
	}
	return nil
}

// DuplicateKey renders the manifest's idempotency key for a call and qualifies it with the
// tool and scope ("global", "run:<run>", "actor:<actor>"), so equal strings mean duplicate
// calls. It returns "" when the manifest declares no idempotency, and an error (the call is
// refused rather than guessed) when an argument is missing or not a plain value.
func DuplicateKey(m *Manifest, args any, run, actor string) (string, error) {
	if m.Idempotency == nil {
		return "", nil
	}
	key, err := RenderKey(m.Idempotency.Key, args)
	if err != nil {
		return "", err
	}
	scope := "run:" + run // the seed's default scope
	switch m.Idempotency.Scope {
	case "global":
		scope = "global"
	case "actor":
		scope = "actor:" + actor
	}
	return m.Tool + "\x00" + scope + "\x00" + key, nil
}

// RenderKey fills the {{args.field}} placeholders of an idempotency key template. A missing
// argument or one that is not a string, number or boolean is an error.
func RenderKey(template string, args any) (string, error) {
	var err error
	out := placeholderPattern.ReplaceAllStringFunc(template, func(ph string) string {
		inner := strings.TrimSpace(ph[2 : len(ph)-2])
		path, ok := strings.CutPrefix(inner, "args.")
		if !ok {
			err = fmt.Errorf("the duplicate-call key has an unknown placeholder %s", ph)
			return ""
		}
		v, found := Lookup(args, path)
		switch x := v.(type) {
		case string:
			return x
		case bool, int64, int, float64, json.Number:
			return jsonText(x)
		}
		if err == nil {
			if !found || v == nil {
				err = fmt.Errorf("the duplicate-call key cannot be built: argument %s is missing", path)
			} else {
				err = fmt.Errorf("the duplicate-call key cannot be built: argument %s is not a plain value", path)
			}
		}
		return ""
	})
	if err != nil {
		return "", err
	}
	return out, nil
}
