package proxy

// SetRevision names the source revision of the manifests served (reversi_gateway_manifest_info's
// revision label), e.g. the revision of the ConfigMap bundle a gateway pod loaded
// (gateway/kube). Call it after a successful Reload.
func (g *Gateway) SetRevision(revision string) { g.metrics.setRevision(revision) }
