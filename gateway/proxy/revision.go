package proxy

// Revision names the signed snapshots the served manifests came from (bundle.Bundle.Revision,
// e.g. `ManifestRegistry agents/memory main@sha1:<40 hex> (sequence N)`), as the last load
// returned it; "" for manifests with no verified snapshot. It is also
// reversi_gateway_manifest_info's revision label.
func (g *Gateway) Revision() string {
	if p := g.metrics.revision.Load(); p != nil {
		return *p
	}
	return ""
}
