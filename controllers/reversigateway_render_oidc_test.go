package controllers

import (
	"testing"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/config"
)

// TestRenderOIDCIdentity: spec.auth.oidc actorPrefix, uidClaim and emailClaim reach gateway.yaml
// as actor_prefix, uid_claim and email_claim, which the gateway reads strictly (issue 16: the
// gateway maps a token to the username the API server gives it).
func TestRenderOIDCIdentity(t *testing.T) {
	gw := &v1alpha1.ReversiGateway{}
	gw.Name, gw.Namespace = "pay", "payments"
	gw.Spec.Upstreams = []v1alpha1.GatewayUpstream{{Name: "stripe", URL: "http://stripe-mcp.tools.svc:8080/mcp"}}
	gw.Spec.Auth = &v1alpha1.GatewayAuth{OIDC: &v1alpha1.GatewayOIDC{Issuer: "https://id.example", Audience: "https://pay",
		ActorClaim: "email", ActorPrefix: "oidc:", UIDClaim: "oid", EmailClaim: "mail"}}
	rc, err := renderConfig(gw)
	if err != nil {
		t.Fatal(err)
	}
	g, errs := config.Parse("gateway.yaml", rc.data, nil)
	if len(errs) > 0 {
		t.Fatalf("gateway.yaml refused: %v\n%s", errs, rc.data)
	}
	if o := g.Auth.OIDC; o == nil || o.ActorClaim != "email" || o.ActorPrefix != "oidc:" || o.UIDClaim != "oid" || o.EmailClaim != "mail" {
		t.Fatalf("parsed %+v from\n%s", o, rc.data)
	}
}
