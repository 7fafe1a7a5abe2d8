package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	sdkauth "github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/reversi-gitops/reversi/gateway/auth"
	"github.com/reversi-gitops/reversi/gateway/egress"
	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/pkg/signing"
)

// HTTP mode with authentication (seed "MCP gateway", Endpoints (HTTP mode); issue 7):
//
//	/mcp                                    agent role and up (any authenticated principal);
//	                                        without auth.* (loopback only) unauthenticated
//	/operator/mcp                           auditor and up; never served without auth.*
//	/healthz, /readyz                       anyone (no Host check either: probes use pod IPs)
//	/metrics                                auditor and up with auth.*; anyone without (loopback)
//	/.well-known/oauth-protected-resource   anyone: RFC 9728 metadata naming the OIDC issuer
//
// A missing or refused credential is a 401 with WWW-Authenticate: Bearer
// resource_metadata="<resource_url>/.well-known/oauth-protected-resource"; a valid credential
// whose role is too low is a 403. Host and Origin are checked (auth.Guard) before anything on
// the MCP endpoints, /metrics and the metadata.

// Paths of HTTP mode.
const (
	PathAgent            = "/mcp"
	PathOperator         = "/operator/mcp"
	PathResourceMetadata = "/.well-known/oauth-protected-resource"
)

// endpointKey marks, in TokenInfo.Extra, a request that came in on the operator endpoint.
const endpointKey = "reversi/endpoint"

// Security holds HTTP mode's authentication, guards, kill switch and evidence signer.
type security struct {
	auth     *auth.Authenticator // nil: no auth.* configured
	guard    *auth.Guard         // nil in stdio mode
	resource string              // resource_url, or derived from listen
	opServer *mcp.Server         // the operator endpoint's server
	signer   *signing.Signer     // signs export_evidence; nil: unsigned
	halt     haltState
}

// setupSecurity runs at start, before any upstream is contacted: the egress check of every
// url upstream (seed: Config, "A refused upstream stops the gateway at start with
// `upstream <name>: <reason>`"), the authenticator (key file read, OIDC discovery), and the
// Host/Origin guard of HTTP mode.
func (g *Gateway) setupSecurity(ctx context.Context, o Options) error {
	rules := egress.Rules{}
	if o.Egress != nil {
		rules = *o.Egress
	}
	for _, u := range o.Config.Upstreams {
		if u.Stdio() {
			continue
		}
		if err := egress.Check(ctx, u.URL, rules, nil); err != nil {
			return fmt.Errorf("upstream %s: %v", u.Name, err)
		}
	}
	g.sec.signer = o.Signer
	if o.Config.Auth.Enabled() {
		a, err := auth.New(ctx, o.Config.Auth, o.Config.Resolve)
		if err != nil {
			return err
		}
		g.sec.auth = a
	}
	if l := o.Config.Listen; l != nil {
		if !l.Loopback() && g.sec.auth == nil {
			return refuseBeyondLoopback(l.Host)
		}
		gd, err := auth.NewGuard(o.Config)
		if err != nil {
			return err
		}
		g.sec.guard = gd
		g.sec.resource = strings.TrimSuffix(o.Config.ResourceURL, "/")
		if g.sec.resource == "" { // derived: the first allowed host, else the listen address
			host := l.Address()
			if hs := o.Config.AllowedHosts; len(hs) > 0 {
				host = hs[0]
				if _, _, err := net.SplitHostPort(host); err != nil {
					host = net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(l.Port))
				}
			}
			g.sec.resource = "http://" + host
		}
	}
	return nil
}

func refuseBeyondLoopback(host string) error {
	return fmt.Errorf("listen.host %q is not loopback: the gateway refuses to listen beyond loopback without authentication (set auth.keys or auth.oidc in the gateway config)", host)
}

// identity is the authenticated principal of a request; nil when unauthenticated.
func identity(req *mcp.CallToolRequest) *auth.Identity {
	if req == nil {
		return nil
	}
	return identityOf(req.Extra)
}

// identityOf is identity for any request's extra.
func identityOf(extra *mcp.RequestExtra) *auth.Identity {
	if extra == nil {
		return nil
	}
	return auth.FromTokenInfo(extra.TokenInfo)
}

// onOperatorEndpoint reports whether req came in on /operator/mcp.
func onOperatorEndpoint(req *mcp.CallToolRequest) bool {
	if req == nil || req.Extra == nil || req.Extra.TokenInfo == nil {
		return false
	}
	return req.Extra.TokenInfo.Extra[endpointKey] == "operator"
}

// readScope is the actor whose runs req may read: its principal on the agent endpoint, ""
// (any actor) on the operator endpoint (seed: `reversi.*` tools, "any run, any actor").
func (g *Gateway) readScope(req *mcp.CallToolRequest) string {
	if onOperatorEndpoint(req) {
		return ""
	}
	return g.principal(req)
}

// mayRead reports whether req may read a run of actor.
func (g *Gateway) mayRead(req *mcp.CallToolRequest, actor string) bool {
	s := g.readScope(req)
	return s == "" || s == actor
}

// scopeOf is the session scope of req for the engine: nil (the engine's) unless the
// credential carries max_permissions, which caps it (seed: Config, `permissions` "capped by a
// key's max_permissions").
func scopeOf(req *mcp.CallToolRequest, e *engine.Engine) []string {
	id := identity(req)
	if id == nil || id.MaxPermissions == nil {
		return nil
	}
	out := []string{}
	for _, p := range e.Scope() {
		if slices.Contains(id.MaxPermissions, p) {
			out = append(out, p)
		}
	}
	return out
}

// httpHandler is Handler: the endpoints above.
func (g *Gateway) httpHandler() http.Handler {
	mux := http.NewServeMux()
	sec := &g.sec
	// The gateway's own Host/Origin guard (auth.Guard) replaces the SDK's localhost check,
	// which refused a loopback listener's requests for any other Host: behind a reverse proxy
	// (allowed_hosts naming the public name) every request was a 403, and so were LOCALHOST and
	// localhost. (issue 18). The body limit is the gateway's too (mcpEndpoint); the SDK's is
	// kept as a second bound.
	opts := &mcp.StreamableHTTPOptions{SessionTimeout: SessionTimeout, DisableLocalhostProtection: sec.guard != nil,
		MaxRequestBodyBytes: g.limits.RequestBodyBytes}
	agent := g.mcpEndpoint(g.server, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server }, opts))
	guard := func(h http.Handler) http.Handler {
		if sec.guard == nil {
			return h
		}
		return sec.guard.Wrap(h)
	}
	if sec.auth != nil {
		agent = g.requireRole(auth.Agent, "agent", agent)
		op := g.mcpEndpoint(sec.opServer, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return sec.opServer }, opts))
		mux.Handle(PathOperator, guard(g.requireRole(auth.Auditor, "operator", op)))
		mux.Handle(PathResourceMetadata, guard(sdkauth.ProtectedResourceMetadataHandler(g.resourceMetadata())))
		mux.Handle("/metrics", guard(g.requireRole(auth.Auditor, "metrics", g.metrics.handler())))
	} else {
		mux.HandleFunc(PathOperator, func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "the operator endpoint is served only with authentication: set auth.keys or auth.oidc in the gateway config", http.StatusNotFound)
		})
		mux.Handle("/metrics", guard(g.metrics.handler()))
	}
	mux.Handle(PathAgent, guard(agent))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}` + "\n"))
	})
	mux.HandleFunc("/readyz", g.serveReadyz)
	return mux
}

// ResourceMetadataURL is where the 401's WWW-Authenticate points.
func (g *Gateway) ResourceMetadataURL() string { return g.sec.resource + PathResourceMetadata }

func (g *Gateway) resourceMetadata() *oauthex.ProtectedResourceMetadata {
	m := &oauthex.ProtectedResourceMetadata{Resource: g.sec.resource, BearerMethodsSupported: []string{"header"},
		ResourceName: Name}
	if iss := g.sec.auth.Issuer(); iss != "" {
		m.AuthorizationServers = []string{iss}
	}
	return m
}

// requireRole authenticates with the go-sdk's bearer middleware (401 and WWW-Authenticate on
// a missing or bad credential) and refuses, with 403, a principal below min. endpoint names
// what is being reached, for the 403 and for the operator endpoint's read scope.
func (g *Gateway) requireRole(min auth.Role, endpoint string, next http.Handler) http.Handler {
	verify := g.sec.auth.Verify
	if endpoint == "operator" {
		verify = func(ctx context.Context, token string, r *http.Request) (*sdkauth.TokenInfo, error) {
			ti, err := g.sec.auth.Verify(ctx, token, r)
			if err == nil {
				ti.Extra[endpointKey] = "operator"
			}
			return ti, err
		}
	}
	check := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := auth.FromContext(r.Context())
		if id == nil || !id.Role.AtLeast(min) {
			role := "no role"
			if id != nil {
				role = "the " + string(id.Role) + " role"
			}
			http.Error(w, fmt.Sprintf("Forbidden: %s needs the %s role or higher; %s has %s", endpointPath(endpoint), min, principalOf(id), role), http.StatusForbidden)
			return
		}
		if rw, ok := w.(refusalWriter); ok {
			w = rw.ResponseWriter // admitted: the endpoint writes as it would
		}
		next.ServeHTTP(w, r)
	})
	bearer := sdkauth.RequireBearerToken(verify, &sdkauth.RequireBearerTokenOptions{
		ResourceMetadataURL: g.ResourceMetadataURL(),
		// API keys do not expire; OIDC tokens always carry exp, which go-oidc enforces.
		AllowMissingExpiration: true,
	})(check)
	// Authentication reads only the header: a refusal goes out before the body is read, and
	// closes the connection instead of waiting for the rest of the body.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { bearer.ServeHTTP(refusalWriter{w}, r) })
}

func endpointPath(endpoint string) string {
	switch endpoint {
	case "operator":
		return PathOperator
	case "agent":
		return PathAgent
	}
	return "/" + endpoint
}

func principalOf(id *auth.Identity) string {
	if id == nil {
		return "the caller"
	}
	return id.Principal
}

// listenURL is the URL printed at start.
func listenURL(addr string) string {
	return (&url.URL{Scheme: "http", Host: addr, Path: PathAgent}).String()
}
