package engine

import (
	"bytes"
	"encoding/json"
	"math"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// jsonValue returns v as jsonschema validates it: v itself when it is already a plain JSON
// value (what encoding/json and the MCP SDK decode into: nil, bool, string, float64,
// json.Number, []any, map[string]any), otherwise v passed through JSON (so typed Go values,
// e.g. structs or []string, are accepted). The walk replaces a marshal and a parse on every
// call's arguments and structuredContent; profiled as the gateway's largest own cost per call
// (BENCHMARKS.md, gateway).
func jsonValue(v any) (any, error) {
	if plainJSON(v) {
		return v, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return jsonschema.UnmarshalJSON(bytes.NewReader(b))
}

// plainJSON reports whether v holds only the types of a decoded JSON value, and no float
// that JSON cannot carry (NaN, ±Inf: json.Marshal refuses them, and so must the check).
func plainJSON(v any) bool {
	switch x := v.(type) {
	case nil, bool, string, json.Number:
		return true
	case float64:
		return !math.IsNaN(x) && !math.IsInf(x, 0)
	case []any:
		for _, e := range x {
			if !plainJSON(e) {
				return false
			}
		}
		return true
	case map[string]any:
		for _, e := range x {
			if !plainJSON(e) {
				return false
			}
		}
		return true
	default:
		return false
	}
}
