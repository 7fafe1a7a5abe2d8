package manifest

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
)

// durationPattern is the string form of a duration: a decimal number and a unit.
var durationPattern = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)$`)

var unitMs = map[string]int64{"ms": 1, "s": 1e3, "m": 60e3, "h": 3600e3, "d": 86400e3}

// maxDurationMs caps durations at 365 days so they always fit an int64 and a JSON number.
const maxDurationMs int64 = 365 * 86400e3

// ParseDuration turns a manifest duration into milliseconds. It accepts a whole number of
// milliseconds (JSON/YAML number) or a string with a unit: `500ms`, `30s`, `15m`, `2h`, `1d`
// (fractions such as `1.5s` allowed). The result must be positive, a whole number of
// milliseconds, and at most 365 days. Source: seed "Tool manifests", Fields ("Durations are…").
func ParseDuration(v any) (int64, error) {
	// ms is exact: strings are computed in decimal (in float64, 1.1h would be
	// 3960000.0000000005 ms and refused as fractional).
	var ms *big.Rat
	switch x := v.(type) {
	case int64:
		ms = new(big.Rat).SetInt64(x)
	case int:
		ms = new(big.Rat).SetInt64(int64(x))
	case float64:
		if math.IsInf(x, 0) || math.IsNaN(x) {
			return 0, fmt.Errorf("invalid duration %v: use a number of milliseconds or a string such as 30s", x)
		}
		ms = new(big.Rat).SetFloat64(x)
	case string:
		m := durationPattern.FindStringSubmatch(x)
		if m == nil {
			return 0, fmt.Errorf("invalid duration %q: use a number of milliseconds or a number with a unit (500ms, 30s, 15m, 2h, 1d)", x)
		}
		ms, _ = new(big.Rat).SetString(m[1])
		ms.Mul(ms, new(big.Rat).SetInt64(unitMs[m[2]]))
	default:
		return 0, fmt.Errorf("invalid duration %s: use a number of milliseconds or a string such as 30s", Describe(v))
	}
	if !ms.IsInt() {
		return 0, fmt.Errorf("invalid duration %v: must be a whole number of milliseconds", v)
	}
	if ms.Sign() <= 0 {
		return 0, fmt.Errorf("invalid duration %v: must be positive", v)
	}
	if ms.Cmp(new(big.Rat).SetInt64(maxDurationMs)) > 0 {
		return 0, fmt.Errorf("invalid duration %v: longer than 365 days", v)
	}
	return ms.Num().Int64(), nil
}

// Describe names a JSON-like value's type (and a short form of the value) for error
// messages: `string "x"`, `number 3`, `a list`, `null`.
func Describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("string %q", x)
	case bool:
		return fmt.Sprintf("boolean %v", x)
	case int64, int, float64:
		return fmt.Sprintf("number %v", x)
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
