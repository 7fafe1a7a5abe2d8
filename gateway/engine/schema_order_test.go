package engine

import (
	"testing"
)

// TestProblemsInAStableOrder: the problems of an object's properties come in location order,
// array indexes numerically, the same on every call (jsonschema/v6 reports them in Go map
// order), so the first five listed are always the same five.
func TestProblemsInAStableOrder(t *testing.T) {
	props := map[string]any{"list": map[string]any{"type": "array", "items": map[string]any{"type": "string"}}}
	args := map[string]any{"list": []any{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}}
	for _, k := range []string{"h", "b", "g", "a", "f", "c", "e", "d"} {
		props[k] = map[string]any{"type": "integer"}
		args[k] = "x"
	}
	sch, err := compileSchema("t", "input", map[string]any{"type": "object", "properties": props})
	if err != nil {
		t.Fatal(err)
	}
	want := "/a: got string, want integer; /b: got string, want integer; /c: got string, want integer; " +
		"/d: got string, want integer; /e: got string, want integer (and 15 more)"
	for i := 0; i < 50; i++ {
		if got := checkValue(sch, args); got != want {
			t.Fatalf("call %d: %q\nwant %q", i, got, want)
		}
	}
	// Array indexes compare as numbers.
	arr, err := compileSchema("t", "input", props["list"])
	if err != nil {
		t.Fatal(err)
	}
	got := checkValue(arr, []any{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	if want := "/0: got number, want string; /1: got number, want string; /2: got number, want string; " +
		"/3: got number, want string; /4: got number, want string (and 7 more)"; got != want {
		t.Fatalf("%q\nwant %q", got, want)
	}
	if c := compareLocations([]string{"list", "2"}, []string{"list", "10"}); c >= 0 {
		t.Errorf("/list/2 vs /list/10: %d", c)
	}
	if c := compareLocations([]string{"list"}, []string{"list", "0"}); c >= 0 {
		t.Errorf("/list vs /list/0: %d", c)
	}
}
