package auth_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/reversi-gitops/reversi/gateway/auth"
	"github.com/reversi-gitops/reversi/gateway/auth/authtest"
	"github.com/reversi-gitops/reversi/gateway/config"
)

func TestRoleOrder(t *testing.T) {
	for i, r := range auth.Roles {
		for j, min := range auth.Roles {
			if got := r.AtLeast(min); got != (i >= j) {
				t.Errorf("%s.AtLeast(%s) = %v", r, min, got)
			}
		}
	}
	if auth.Role("root").AtLeast(auth.Agent) {
		t.Error("an unknown role reaches agent")
	}
	if _, err := auth.ParseRole("root"); err == nil || !strings.Contains(err.Error(), "agent, auditor, approver, operator, admin") {
		t.Errorf("ParseRole(root) = %v", err)
	}
}

func TestKeyFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "keys.json")
	perms := []string{"memory:read"}
	e1, s1, err := auth.AddKey(p, "ci-bot", auth.Agent, &perms, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, s2, err := auth.AddKey(p, "olga", auth.Operator, nil, []string{"ops"})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", fi, err)
	}
	data, _ := os.ReadFile(p)
	if strings.Contains(string(data), s1) || strings.Contains(string(data), strings.SplitN(s1, "_", 3)[2]) {
		t.Fatal("the key file holds a secret")
	}
	a, err := auth.New(context.Background(), config.Auth{Keys: p}, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, exp, err := a.Authenticate(context.Background(), s1)
	if err != nil || id.Principal != "ci-bot" || id.Role != auth.Agent || id.KeyID != e1.ID || !exp.IsZero() ||
		len(id.MaxPermissions) != 1 || id.MaxPermissions[0] != "memory:read" {
		t.Fatalf("key 1: %+v %v %v", id, exp, err)
	}
	id, _, err = a.Authenticate(context.Background(), s2)
	if err != nil || id.Principal != "olga" || id.Role != auth.Operator || id.MaxPermissions != nil ||
		strings.Join(id.ApproverRoles(), ",") != "operator,ops" {
		t.Fatalf("key 2: %+v %v", id, err)
	}
	// A changed character, another key's id with this secret, junk and an OIDC-looking token.
	last := "A"
	if strings.HasSuffix(s1, "A") {
		last = "B"
	}
	tampered := s1[:len(s1)-1] + last
	swapped := auth.KeyPrefix + strings.SplitN(s2, "_", 3)[1] + "_" + strings.SplitN(s1, "_", 3)[2]
	for _, bad := range []string{tampered, swapped, auth.KeyPrefix + "nothing", "eyJhbGciOi.x.y"} {
		if _, _, err := a.Authenticate(context.Background(), bad); !errors.Is(err, sdkauth.ErrInvalidToken) {
			t.Errorf("%q: %v, want ErrInvalidToken", bad, err)
		}
	}

	for _, tc := range []struct{ file, want string }{
		{`{"keys":[{"id":"abc","principal":"","role":"boss","hash":"md5:1"}]}`, "keys[0]: id \"abc\""},
		{`{"keys":[{"id":"abc","principal":"","role":"boss","hash":"md5:1"}]}`, "keys[0]: principal: required"},
		{`{"keys":[{"id":"abc","principal":"","role":"boss","hash":"md5:1"}]}`, `keys[0]: role: "boss" is not a Reversi role`},
		{`{"keys":[{"id":"abc","principal":"","role":"boss","hash":"md5:1"}]}`, "keys[0]: hash: expected sha256"},
		{`{"keys":[],"extra":1}`, "unknown field"},
	} {
		if _, err := auth.ParseKeyFile([]byte(tc.file)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseKeyFile(%s) = %v, want %q", tc.file, err, tc.want)
		}
	}
	e := e1
	e.Hash = auth.HashSecret("x")
	dup, _ := jsonKeys(e, e)
	if _, err := auth.ParseKeyFile(dup); err == nil || !strings.Contains(err.Error(), "appears twice") {
		t.Errorf("duplicate id: %v", err)
	}
}

func TestOIDC(t *testing.T) {
	is, err := authtest.NewIssuer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = is.Close() })
	const aud = "https://gateway.test"
	cfg := config.Auth{OIDC: &config.OIDC{Issuer: is.URL, Audience: aud, RoleMap: map[string]string{"bots": "agent", "ops": "operator", "sre": "admin"}}}
	a, err := auth.New(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Issuer() != is.URL {
		t.Errorf("Issuer = %q", a.Issuer())
	}
	tok := func(c authtest.Claims, forged bool) string {
		t.Helper()
		f := is.Token
		if forged {
			f = is.Forged
		}
		s, err := f(c)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	good := authtest.Claims{Subject: "ana", Audience: []string{aud}, Extra: map[string]any{"groups": []string{"bots", "ops"}}}
	id, exp, err := a.Authenticate(context.Background(), tok(good, false))
	if err != nil || id.Principal != "ana" || id.Role != auth.Operator || id.Method != auth.MethodOIDC || time.Until(exp) < 50*time.Minute {
		t.Fatalf("good token: %+v %v %v", id, exp, err)
	}
	if g := strings.Join(id.Groups, ","); g != "bots,ops" {
		t.Errorf("groups %q", g)
	}
	// roles (a space-separated string) is read before groups; the highest mapped role wins.
	c := good
	c.Extra = map[string]any{"roles": "sre bots"}
	if id, _, err := a.Authenticate(context.Background(), tok(c, false)); err != nil || id.Role != auth.Admin {
		t.Fatalf("roles claim: %+v %v", id, err)
	}

	refused := map[string]string{}
	c = good
	c.Audience = []string{"https://other.test"}
	refused["another audience"] = tok(c, false)
	c = good
	c.Expiry = time.Now().Add(-time.Minute)
	refused["expired"] = tok(c, false)
	refused["bad signature"] = tok(good, true)
	c = good
	c.Issuer = "https://elsewhere.test"
	refused["another issuer"] = tok(c, false)
	c = good
	c.Extra = map[string]any{"groups": []string{"interns"}}
	refused["no mapped role"] = tok(c, false)
	c = good
	c.Subject = ""
	refused["no subject"] = tok(c, false)
	refused["not a JWT"] = "hello"
	for name, raw := range refused {
		if _, _, err := a.Authenticate(context.Background(), raw); !errors.Is(err, sdkauth.ErrInvalidToken) {
			t.Errorf("%s: %v, want ErrInvalidToken", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}

	// actor_claim and role_claim.
	cfg.OIDC.ActorClaim, cfg.OIDC.RoleClaim = "email", "team"
	a2, err := auth.New(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	c = good
	c.Extra = map[string]any{"email": "ana@example.com", "team": []string{"ops"}, "groups": []string{"sre"}}
	if id, _, err := a2.Authenticate(context.Background(), tok(c, false)); err != nil || id.Principal != "ana@example.com" || id.Role != auth.Operator {
		t.Fatalf("actor_claim/role_claim: %+v %v", id, err)
	}
	// jwks_uri skips discovery.
	cfg.OIDC.JWKSURI = is.URL + "/jwks"
	cfg.OIDC.Issuer = is.URL
	a3, err := auth.New(context.Background(), config.Auth{OIDC: &config.OIDC{Issuer: is.URL, Audience: aud, JWKSURI: is.URL + "/jwks", RoleMap: map[string]string{"ops": "approver"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if id, _, err := a3.Authenticate(context.Background(), tok(good, false)); err != nil || id.Role != auth.Approver {
		t.Fatalf("jwks_uri: %+v %v", id, err)
	}
	// A wrong issuer stops the start.
	_, err = auth.New(context.Background(), config.Auth{OIDC: &config.OIDC{Issuer: is.URL + "/nope", Audience: aud}}, nil)
	if err == nil || !strings.Contains(err.Error(), "discovery failed") {
		t.Errorf("wrong issuer: %v", err)
	}
}

func TestGuard(t *testing.T) {
	loop := &config.Gateway{Listen: &config.Listen{Host: "127.0.0.1", Port: 7431}, AllowedOrigins: []string{"https://console.example.com"}}
	gd, err := auth.NewGuard(loop)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host, origin string
		ok           bool
	}{
		{"127.0.0.1:7431", "", true},
		{"localhost:9", "", true},
		{"[::1]:7431", "", true},
		{"LOCALHOST.", "", true},
		{"evil.example.com", "", false},
		{"evil.example.com:7431", "http://evil.example.com:7431", false},
		{"127.0.0.1:7431", "http://evil.example.com", false},
		{"127.0.0.1:7431", "null", false},
		{"127.0.0.1:7431", "http://127.0.0.1:7431", true}, // same origin
		{"127.0.0.1:7431", "http://127.0.0.1:7432", false},
		{"127.0.0.1:7431", "https://console.example.com", true},
		{"127.0.0.1:7431", "https://CONSOLE.example.com:443", true},
	} {
		r := httptest.NewRequest("POST", "http://x/mcp", nil)
		r.Host = tc.host
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if why := gd.Check(r); (why == "") != tc.ok {
			t.Errorf("Host %q Origin %q: %q, want ok=%v", tc.host, tc.origin, why, tc.ok)
		}
	}
	// Beyond loopback: allowed_hosts or resource_url name the accepted hosts; neither is an error.
	wide := &config.Gateway{Listen: &config.Listen{Host: "0.0.0.0", Port: 7431}}
	if _, err := auth.NewGuard(wide); err == nil || !strings.Contains(err.Error(), "set allowed_hosts") {
		t.Errorf("no allowed hosts beyond loopback: %v", err)
	}
	wide.ResourceURL = "https://gateway.example.com"
	gd, err = auth.NewGuard(wide)
	if err != nil {
		t.Fatal(err)
	}
	for host, ok := range map[string]bool{"gateway.example.com": true, "127.0.0.1:7431": false, "10.0.0.5:7431": false} {
		r := httptest.NewRequest("GET", "http://x/mcp", nil)
		r.Host = host
		if why := gd.Check(r); (why == "") != ok {
			t.Errorf("beyond loopback, Host %q: %q", host, why)
		}
	}
	wide.AllowedHosts = []string{"gw.ns.svc:7431"}
	gd, _ = auth.NewGuard(wide)
	for host, ok := range map[string]bool{"gw.ns.svc:7431": true, "gw.ns.svc:80": false, "gateway.example.com": false} {
		r := httptest.NewRequest("GET", "http://x/mcp", nil)
		r.Host = host
		if why := gd.Check(r); (why == "") != ok {
			t.Errorf("allowed_hosts, Host %q: %q", host, why)
		}
	}
}

// TestOIDCIdentityLikeTheAPIServer: the principal is actor_prefix followed by the actor claim,
// as the API server maps the same token to a username; uid_claim and email_claim give the
// identity the approver check compares; a principal named by the email claim needs
// email_verified not false, and an unverified e-mail is not taken. Source: issue 16.
func TestOIDCIdentityLikeTheAPIServer(t *testing.T) {
	is, err := authtest.NewIssuer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = is.Close() })
	const aud = "https://gateway.test"
	newAuth := func(o config.OIDC) *auth.Authenticator {
		o.Issuer, o.Audience, o.RoleMap = is.URL, aud, map[string]string{"bots": "agent"}
		a, err := auth.New(context.Background(), config.Auth{OIDC: &o}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	tok := func(sub string, extra map[string]any) string {
		extra["groups"] = []string{"bots"}
		s, err := is.Token(authtest.Claims{Subject: sub, Audience: []string{aud}, Extra: extra})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ctx := context.Background()
	a := newAuth(config.OIDC{ActorPrefix: "oidc:", UIDClaim: "oid"})
	id, _, err := a.Authenticate(ctx, tok("agent-7", map[string]any{"oid": "u-7", "email": "agent-7@corp.example"}))
	if err != nil || id.Principal != "oidc:agent-7" || id.UID != "u-7" || id.Email != "agent-7@corp.example" {
		t.Fatalf("identity %+v %v", id, err)
	}
	if id, _, err := a.Authenticate(ctx, tok("agent-7", map[string]any{"email": "x@corp.example", "email_verified": false})); err != nil || id.Email != "" || id.UID != "" {
		t.Fatalf("unverified e-mail taken: %+v %v", id, err)
	}
	if _, _, err := a.Authenticate(ctx, tok("agent-7", map[string]any{"oid": 7})); err == nil || !strings.Contains(err.Error(), "uid_claim") {
		t.Fatalf("a uid that is not a string: %v", err)
	}
	b := newAuth(config.OIDC{ActorClaim: "email", EmailClaim: "mail"})
	if _, _, err := b.Authenticate(ctx, tok("s", map[string]any{"email": "agent-7@corp.example", "email_verified": false})); err == nil ||
		!strings.Contains(err.Error(), "email_verified is false") {
		t.Fatalf("unverified email as the principal: %v", err)
	}
	id, _, err = b.Authenticate(ctx, tok("s", map[string]any{"email": "agent-7@corp.example", "email_verified": true, "mail": "seven@corp.example"}))
	if err != nil || id.Principal != "agent-7@corp.example" || id.Email != "seven@corp.example" {
		t.Fatalf("email claim: %+v %v", id, err)
	}
}

// TestKeyIdentity: a key may carry the principal's uid and e-mail; bad ones are refused with
// the entry named.
func TestKeyIdentity(t *testing.T) {
	p := filepath.Join(t.TempDir(), "keys.json")
	_, secret, err := auth.AddKey(p, "agent-7", auth.Agent, nil, nil, auth.KeyIdentity{UID: "u-7", Email: "agent-7@corp.example"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(context.Background(), config.Auth{Keys: p}, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := a.Authenticate(context.Background(), secret)
	if err != nil || id.UID != "u-7" || id.Email != "agent-7@corp.example" {
		t.Fatalf("identity %+v %v", id, err)
	}
	if _, _, err := auth.AddKey(p, "x", auth.Agent, nil, nil, auth.KeyIdentity{Email: "not-an-address"}); err == nil || !strings.Contains(err.Error(), "email") {
		t.Fatalf("bad email: %v", err)
	}
	// The refusal says which field by its type (the CLI names its flag from it), in the same words.
	for ident, want := range map[auth.KeyIdentity]string{
		{UID: "a b"}:              `uid "a b": at most 253 characters, no spaces`,
		{Email: "not-an-address"}: `email "not-an-address": expected name@domain (at most 253 characters)`,
	} {
		_, _, err := auth.NewKey("x", auth.Agent, nil, nil, ident)
		var ie *auth.IdentityError
		if !errors.As(err, &ie) || ie.Field != strings.Fields(want)[0] || err.Error() != want {
			t.Errorf("%+v: %v (%#v), want an *IdentityError %q", ident, err, ie, want)
		}
	}
	bad := `{"keys":[{"id":"0123456789ab","principal":"p","role":"agent","hash":"sha256:` + strings.Repeat("0", 64) + `","uid":"a b"}]}`
	if _, err := auth.ParseKeyFile([]byte(bad)); err == nil || !strings.Contains(err.Error(), `keys[0]: uid "a b"`) {
		t.Fatalf("bad uid: %v", err)
	}
}
