package controllers

import (
	"bytes"
	"testing"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/config"
)

// TestRenderOutputSchemas: spec.outputSchemas reaches gateway.yaml as output_schemas (issue 19),
// and an unset one leaves the gateway's default, advertise.
func TestRenderOutputSchemas(t *testing.T) {
	for _, c := range []struct{ spec, want string }{{"hide", config.OutputSchemasHide}, {"advertise", config.OutputSchemasAdvertise}, {"", config.OutputSchemasAdvertise}} {
		gw := &v1alpha1.ReversiGateway{}
		gw.Name, gw.Namespace = "pay", "payments"
		gw.Spec.Upstreams = []v1alpha1.GatewayUpstream{{Name: "stripe", URL: "http://stripe-mcp.tools.svc:8080/mcp"}}
		gw.Spec.OutputSchemas = c.spec
		gw.Spec.Auth = &v1alpha1.GatewayAuth{OIDC: &v1alpha1.GatewayOIDC{Issuer: "https://id.example", Audience: "https://pay"}} // pods listen beyond loopback
		rc, err := renderConfig(gw)
		if err != nil {
			t.Fatal(err)
		}
		g, errs := config.Parse("gateway.yaml", rc.data, nil)
		if len(errs) > 0 {
			t.Fatalf("gateway.yaml refused: %v\n%s", errs, rc.data)
		}
		if g.OutputSchemas != c.want || (c.spec == "") == bytes.Contains(rc.data, []byte("output_schemas")) {
			t.Errorf("spec.outputSchemas %q: parsed %q from\n%s", c.spec, g.OutputSchemas, rc.data)
		}
	}
}
