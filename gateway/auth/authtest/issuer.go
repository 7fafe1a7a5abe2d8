// Package authtest is a small OIDC issuer for tests and benchmarks: an HTTP server on
// 127.0.0.1 serving OpenID discovery and a JWKS, and access tokens signed with go-jose. It is
// a real issuer over the network as far as the gateway (coreos/go-oidc) can tell.
package authtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Issuer serves /.well-known/openid-configuration and /jwks on 127.0.0.1.
type Issuer struct {
	// URL is the issuer URL (http://127.0.0.1:<port>).
	URL    string
	key    *ecdsa.PrivateKey
	other  *ecdsa.PrivateKey // a key the JWKS does not publish
	srv    *http.Server
	signer jose.Signer
	forger jose.Signer
}

// NewIssuer starts an issuer; Close stops it.
func NewIssuer() (*Issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	is := &Issuer{URL: "http://" + ln.Addr().String(), key: key, other: other}
	opts := (&jose.SignerOptions{}).WithType("JWT")
	// Both signers use the published key id: the forged token differs only in its signature.
	if is.signer, err = jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: key, KeyID: "k1"}}, opts); err != nil {
		return nil, err
	}
	if is.forger, err = jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: other, KeyID: "k1"}}, opts); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]any{
			"issuer": is.URL, "jwks_uri": is.URL + "/jwks",
			"authorization_endpoint": is.URL + "/authorize", "token_endpoint": is.URL + "/token",
			"response_types_supported": []string{"code"}, "subject_types_supported": []string{"public"},
			"id_token_signing_alg_values_supported": []string{"ES256"},
		})
	})
	mux.HandleFunc("/jwks", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "ES256", Use: "sig"}}})
	})
	is.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = is.srv.Serve(ln) }()
	return is, nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// Close stops the server.
func (is *Issuer) Close() error { return is.srv.Close() }

// Claims of a token. Zero Expiry means one hour from now; Issuer "" means the issuer's URL.
type Claims struct {
	Issuer   string
	Subject  string
	Audience []string
	Expiry   time.Time
	// Extra claims (e.g. "roles": []string{"ops"}).
	Extra map[string]any
}

// Token signs c with the issuer's published key.
func (is *Issuer) Token(c Claims) (string, error) { return is.sign(is.signer, c) }

// Forged signs c with a key the issuer does not publish, under the published key id.
func (is *Issuer) Forged(c Claims) (string, error) { return is.sign(is.forger, c) }

func (is *Issuer) sign(s jose.Signer, c Claims) (string, error) {
	if c.Issuer == "" {
		c.Issuer = is.URL
	}
	if c.Expiry.IsZero() {
		c.Expiry = time.Now().Add(time.Hour)
	}
	std := jwt.Claims{Issuer: c.Issuer, Subject: c.Subject, Audience: jwt.Audience(c.Audience),
		Expiry: jwt.NewNumericDate(c.Expiry), IssuedAt: jwt.NewNumericDate(time.Now().Add(-time.Minute))}
	b := jwt.Signed(s).Claims(std)
	if c.Extra != nil {
		b = b.Claims(c.Extra)
	}
	tok, err := b.Serialize()
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return tok, nil
}
