package engine

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestJSONValue: decoded JSON is validated as is (no copy), typed Go values go through JSON,
// and both give the same verdicts; NaN is still "not JSON".
func TestJSONValue(t *testing.T) {
	sch, err := compileSchema("t", "output", map[string]any{
		"type": "object", "required": []any{"n", "tags"},
		"properties": map[string]any{
			"n":    map[string]any{"type": "integer", "maximum": 10},
			"tags": map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var decoded map[string]any
	if err := json.Unmarshal([]byte(`{"n": 3, "tags": ["a", "b"], "extra": {"x": [null, true, 1.5]}}`), &decoded); err != nil {
		t.Fatal(err)
	}
	got, err := jsonValue(decoded)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprintf("%p", got) != fmt.Sprintf("%p", decoded) {
		t.Errorf("a decoded JSON value was copied; want it validated as is")
	}

	type typed struct {
		N    int      `json:"n"`
		Tags []string `json:"tags"`
	}
	cases := []struct {
		name        string
		plain, goV  any
		wantProblem string // "" when valid
	}{
		{"valid", decoded, typed{N: 3, Tags: []string{"a"}}, ""},
		{"integer above maximum", map[string]any{"n": float64(11), "tags": []any{}}, typed{N: 11, Tags: []string{}}, "/n: "},
		{"not an integer", map[string]any{"n": 2.5, "tags": []any{}}, map[string]any{"n": float32(2.5), "tags": []string{}}, "/n: "},
		{"item not a string", map[string]any{"n": float64(1), "tags": []any{float64(1)}}, map[string]any{"n": 1, "tags": []int{1}}, "/tags/0: "},
	}
	for _, c := range cases {
		if plainJSON(c.goV) {
			t.Errorf("%s: %T counted as plain JSON", c.name, c.goV)
		}
		p1, p2 := checkValue(sch, c.plain), checkValue(sch, c.goV)
		if p1 != p2 {
			t.Errorf("%s: plain %q, typed %q; want the same verdict", c.name, p1, p2)
		}
		if (c.wantProblem == "") != (p1 == "") || !strings.Contains(p1, c.wantProblem) {
			t.Errorf("%s: problem %q, want one containing %q", c.name, p1, c.wantProblem)
		}
	}
	for _, bad := range []any{math.NaN(), map[string]any{"n": math.Inf(1)}} {
		if p := checkValue(sch, bad); !strings.HasPrefix(p, "the value is not JSON: ") {
			t.Errorf("checkValue(%v) = %q, want the not-JSON problem", bad, p)
		}
	}
}
