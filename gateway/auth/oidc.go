package auth

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"github.com/reversi-gitops/reversi/gateway/config"
)

// Defaults of auth.oidc (seed "MCP gateway", Config: "optional role_claim, actor_claim").
const (
	DefaultActorClaim = "sub"
	// DefaultEmailClaim is the claim read as the principal's e-mail (issue 16).
	DefaultEmailClaim = "email"
)

// DefaultRoleClaims are read, in order, when role_claim is not set.
var DefaultRoleClaims = []string{"roles", "groups"}

// signingAlgs are the asymmetric JWS algorithms accepted (never HS*, never none).
var signingAlgs = []string{oidc.RS256, oidc.RS384, oidc.RS512, oidc.ES256, oidc.ES384, oidc.ES512,
	oidc.PS256, oidc.PS384, oidc.PS512, oidc.EdDSA}

// oidcVerifier checks bearer JWTs with coreos/go-oidc: signature against the issuer's JWKS,
// iss, aud (the configured audience is required) and exp.
type oidcVerifier struct {
	issuer     string
	verifier   *oidc.IDTokenVerifier
	roleMap    map[string]string
	roleClaims []string
	actorClaim string
	// actorPrefix, uidClaim, emailClaim: see config.OIDC.
	actorPrefix string
	uidClaim    string
	emailClaim  string
}

func newOIDC(ctx context.Context, c *config.OIDC) (*oidcVerifier, error) {
	if c.Audience == "" {
		return nil, errors.New("auth.oidc.audience: required: tokens must name this gateway as their audience")
	}
	v := &oidcVerifier{issuer: c.Issuer, roleMap: c.RoleMap, roleClaims: DefaultRoleClaims, actorClaim: DefaultActorClaim,
		actorPrefix: c.ActorPrefix, uidClaim: c.UIDClaim, emailClaim: DefaultEmailClaim}
	if c.EmailClaim != "" {
		v.emailClaim = c.EmailClaim
	}
	if c.RoleClaim != "" {
		v.roleClaims = []string{c.RoleClaim}
	}
	if c.ActorClaim != "" {
		v.actorClaim = c.ActorClaim
	}
	cfg := &oidc.Config{ClientID: c.Audience, SupportedSigningAlgs: signingAlgs}
	// The key set fetches keys with a context that outlives start-up.
	bg := context.WithoutCancel(ctx)
	if c.JWKSURI != "" {
		v.verifier = oidc.NewVerifier(c.Issuer, oidc.NewRemoteKeySet(bg, c.JWKSURI), cfg)
		return v, nil
	}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	p, err := oidc.NewProvider(dctx, c.Issuer)
	if err != nil {
		return nil, fmt.Errorf("auth.oidc.issuer %s: discovery failed: %w (check the issuer URL, or set jwks_uri)", c.Issuer, err)
	}
	v.verifier = p.VerifierContext(bg, cfg)
	return v, nil
}

// verify returns the token's identity and expiry.
func (v *oidcVerifier) verify(ctx context.Context, raw string) (*Identity, time.Time, error) {
	tok, err := v.verifier.Verify(ctx, raw)
	if err != nil {
		return nil, time.Time{}, err
	}
	var claims map[string]any
	if err := tok.Claims(&claims); err != nil {
		return nil, time.Time{}, err
	}
	id, err := v.identity(claims)
	if err != nil {
		return nil, time.Time{}, err
	}
	values := id.Groups
	best := -1
	for _, val := range values {
		if r, ok := v.roleMap[val]; ok && Role(r).rank() > best {
			id.Role, best = Role(r), Role(r).rank()
		}
	}
	if best < 0 {
		return nil, time.Time{}, fmt.Errorf("none of the token's %s values (%s) is in auth.oidc.role_map, so it has no Reversi role",
			strings.Join(v.roleClaims, "/"), strings.Join(values, ", "))
	}
	return id, tok.Expiry, nil
}

// identity maps the claims to the principal the way the API server maps the same token to a
// username (issue 16; Kubernetes "Authenticating", OpenID Connect tokens): actor_prefix
// followed by the actor_claim's value, where a claim named email counts only when
// email_verified is absent or true; uid_claim's value is the uid; email_claim's value
// (default email) is the e-mail, left out when email_verified is false. Groups are the role
// claims' values.
func (v *oidcVerifier) identity(claims map[string]any) (*Identity, error) {
	actor, _ := claims[v.actorClaim].(string)
	if strings.TrimSpace(actor) == "" {
		return nil, fmt.Errorf("the token has no %q claim (auth.oidc.actor_claim) to name the principal", v.actorClaim)
	}
	verified, hasVerified := claims["email_verified"].(bool)
	if v.actorClaim == "email" && hasVerified && !verified {
		return nil, errors.New("the token's email claim names the principal (auth.oidc.actor_claim), but email_verified is false")
	}
	if _, present := claims["email_verified"]; present && !hasVerified {
		return nil, errors.New("the token's email_verified claim is not a boolean")
	}
	id := &Identity{Principal: v.actorPrefix + actor, Method: MethodOIDC}
	if v.uidClaim != "" {
		switch u := claims[v.uidClaim].(type) {
		case string:
			id.UID = u
		case nil:
		default:
			return nil, fmt.Errorf("the token's %q claim (auth.oidc.uid_claim) is not a string", v.uidClaim)
		}
	}
	if e, ok := claims[v.emailClaim].(string); ok && (!hasVerified || verified) {
		id.Email = e
	}
	for _, name := range v.roleClaims {
		id.Groups = append(id.Groups, claimStrings(claims[name])...)
	}
	return id, nil
}

// claimStrings reads a claim that is a string (space separated) or a list of strings.
func claimStrings(v any) []string {
	switch t := v.(type) {
	case string:
		return strings.Fields(t)
	case []any:
		var out []string
		for _, e := range t {
			if s, ok := e.(string); ok && !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}
