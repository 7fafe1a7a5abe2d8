package proxy

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/rollback"
)

// resultFor is rollback.ResultValue(res) when the plan can read `$result` (a manifest that is not
// read_only and declares a compensation: manifest.PlanStep reads the result only then), nil
// otherwise. ResultValue copies structuredContent through JSON, which profiled as a sixth of
// the gateway's own CPU per read_only call (BENCHMARKS.md, gateway).
func resultFor(m *manifest.Manifest, res *mcp.CallToolResult) any {
	if m == nil || m.Effect == manifest.ReadOnly || m.Compensation == nil {
		return nil
	}
	return rollback.ResultValue(res)
}
