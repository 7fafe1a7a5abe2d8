package auth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/reversi-gitops/reversi/gateway/config"
)

// Methods an identity was authenticated with.
const (
	MethodKey  = "key"
	MethodOIDC = "oidc"
)

// Identity is an authenticated principal.
type Identity struct {
	// Principal is the actor of the session's runs and the approver of its decisions: the
	// key's principal, or auth.oidc.actor_prefix followed by the token's actor_claim (default
	// sub), as the API server maps the same token to a username (issue 16).
	Principal string
	// UID is the principal's uid: the key's uid, or the token's uid_claim; "" when none.
	// Email is the principal's e-mail: the key's email, or the token's email_claim (default
	// email; a claim named email counts only when email_verified is not false); "" when none.
	// Both go into the ApprovalRequests of the principal's runs (actorUID, actorEmail): an
	// approver with that uid, or named that e-mail, is the actor and is Rejected.
	UID   string
	Email string
	// Role is the highest Reversi role the credential maps to.
	Role Role
	// Groups are the principal's other roles or groups (a key's groups; the token's role
	// claim values), matched against a manifest's approval.roles.
	Groups []string
	// MaxPermissions caps the session scope; nil: no cap.
	MaxPermissions []string
	// Method is MethodKey or MethodOIDC; KeyID names the API key.
	Method string
	KeyID  string
}

// ApproverRoles are the roles an approval decision is made with: the Reversi role and the
// groups.
func (i *Identity) ApproverRoles() []string {
	return append([]string{string(i.Role)}, i.Groups...)
}

// identityKey is the TokenInfo.Extra key holding the *Identity.
const identityKey = "reversi/identity"

// FromTokenInfo returns the identity the authenticator put in ti; nil when there is none.
func FromTokenInfo(ti *sdkauth.TokenInfo) *Identity {
	if ti == nil {
		return nil
	}
	id, _ := ti.Extra[identityKey].(*Identity)
	return id
}

// FromContext returns the identity of an authenticated HTTP request's context; nil when the
// request was not authenticated.
func FromContext(ctx context.Context) *Identity {
	return FromTokenInfo(sdkauth.TokenInfoFromContext(ctx))
}

// Authenticator checks bearer credentials: API keys (KeyPrefix) against the key file, any
// other token as an OIDC JWT. Build it with New.
type Authenticator struct {
	keys *keyRing
	oidc *oidcVerifier
}

// New builds the authenticator of an `auth:` block. The key file is read now (resolve maps
// its path, e.g. config.Gateway.Resolve); OIDC discovery (or the JWKS URL, when jwks_uri is
// set) is fetched now, so a wrong issuer stops the gateway at start. Errors name the field.
func New(ctx context.Context, a config.Auth, resolve func(string) string) (*Authenticator, error) {
	if !a.Enabled() {
		return nil, errors.New("auth: neither auth.keys nor auth.oidc is set")
	}
	au := &Authenticator{}
	if a.Keys != "" {
		p := a.Keys
		if resolve != nil {
			p = resolve(p)
		}
		f, err := LoadKeyFile(p)
		if err != nil {
			return nil, err
		}
		au.keys = newKeyRing(f)
	}
	if a.OIDC != nil {
		v, err := newOIDC(ctx, a.OIDC)
		if err != nil {
			return nil, err
		}
		au.oidc = v
	}
	return au, nil
}

// Issuer is the OIDC issuer URL; empty without auth.oidc.
func (a *Authenticator) Issuer() string {
	if a.oidc == nil {
		return ""
	}
	return a.oidc.issuer
}

// Authenticate checks one bearer credential and returns its identity and expiry (zero for an
// API key, which does not expire). Every refusal wraps the go-sdk's auth.ErrInvalidToken (so
// the middleware answers 401) and says why without echoing the credential.
func (a *Authenticator) Authenticate(ctx context.Context, token string) (*Identity, time.Time, error) {
	switch {
	case strings.HasPrefix(token, KeyPrefix):
		if a.keys == nil {
			return nil, time.Time{}, fmt.Errorf("%w: API keys are not accepted by this gateway (no auth.keys)", sdkauth.ErrInvalidToken)
		}
		id, err := a.keys.check(token)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("%w: %v", sdkauth.ErrInvalidToken, err)
		}
		return id, time.Time{}, nil
	case a.oidc == nil:
		return nil, time.Time{}, fmt.Errorf("%w: not an API key, and this gateway takes no OIDC tokens (no auth.oidc)", sdkauth.ErrInvalidToken)
	}
	id, exp, err := a.oidc.verify(ctx, token)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("%w: %v", sdkauth.ErrInvalidToken, err)
	}
	return id, exp, nil
}

// Verify is the go-sdk TokenVerifier (auth.RequireBearerToken): the identity goes in
// TokenInfo.Extra and the principal in TokenInfo.UserID, which binds MCP sessions to it.
func (a *Authenticator) Verify(ctx context.Context, token string, _ *http.Request) (*sdkauth.TokenInfo, error) {
	id, exp, err := a.Authenticate(ctx, token)
	if err != nil {
		return nil, err
	}
	return &sdkauth.TokenInfo{UserID: id.Principal, Expiration: exp, Extra: map[string]any{identityKey: id}}, nil
}
