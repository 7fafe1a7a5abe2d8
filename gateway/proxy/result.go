package proxy

import (
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/rollback"
)

// resultFor is rollback.ResultValue(res) when the plan can read `$result` (a manifest that is not
// read_only and declares a compensation: manifest.PlanStep reads the result only then), nil
// otherwise. ResultValue copies structuredContent through JSON, which profiled as a sixth of
// the gateway's own CPU per read_only call (BENCHMARKS.md, gateway). raw, when set, is the
// passed-through result res was lightly decoded from: its content is decoded only here, for a
// `$result` read from a single text block.
func resultFor(m *manifest.Manifest, res *mcp.CallToolResult, raw json.RawMessage) any {
	if m == nil || m.Effect == manifest.ReadOnly || m.Compensation == nil {
		return nil
	}
	if raw != nil && res.StructuredContent == nil {
		full, err := fullResult(raw)
		if err != nil {
			return nil
		}
		res = full
	}
	return rollback.ResultValue(res)
}
