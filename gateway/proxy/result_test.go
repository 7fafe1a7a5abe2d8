package proxy

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
)

// TestResultFor: the result is copied for `$result` only when the plan can read it.
func TestResultFor(t *testing.T) {
	res := &mcp.CallToolResult{StructuredContent: map[string]any{"entities": []any{map[string]any{"name": "a"}}}}
	comp := &manifest.Compensation{Tool: "undo"}
	for _, c := range []struct {
		name string
		m    *manifest.Manifest
		want bool
	}{
		{"unclassified", nil, false},
		{"read_only", &manifest.Manifest{Effect: manifest.ReadOnly}, false},
		{"irreversible without compensation", &manifest.Manifest{Effect: manifest.Irreversible}, false},
		{"compensable", &manifest.Manifest{Effect: manifest.Compensable, Compensation: comp}, true},
	} {
		got := resultFor(c.m, res, nil)
		if (got != nil) != c.want {
			t.Errorf("%s: result %v, want copied: %v", c.name, got, c.want)
		}
	}
}
