// Package config reads the MCP gateway's own config file, gateway.yaml, and the one-upstream
// command-line form that replaces it. Source: seed "MCP gateway", Config (the example file, the
// field table and the notes under it), Endpoints (listen, allowed_hosts, allowed_origins,
// resource_url, "refuses to listen beyond loopback without authentication"), Console on the
// gateway's port, and Observe first (modes).
//
// Reading is strict: unknown fields are refused at every level, duplicate keys are refused, and
// every problem is reported at once as a *manifest.FieldError naming the file, the line and the
// field path ("upstreams[1].headers.Authorization"). The file is parsed with manifest.ParseFile,
// so YAML and JSON are read exactly as manifests are.
//
// The file is read at start only; the seed has it restart to change (Hot reload). Hot reload of
// manifests is configured in reversi.config.yaml (internal/config, `reload:`).
package config

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Mode is how the gateway treats a call that breaks a rule. Source: seed "MCP gateway", Modes.
type Mode string

// The modes. ModeAuto (no `mode:` and no `--mode`) is decided at start by EffectiveMode.
const (
	ModeAuto    Mode = ""
	ModeEnforce Mode = "enforce"
	ModeAdvise  Mode = "advise"
	ModeObserve Mode = "observe"
)

// EffectiveMode resolves ModeAuto: an explicit mode always wins; without one the gateway runs in
// observe when no manifests loaded and enforce otherwise. Source: seed "MCP gateway", Observe
// first.
func (g *Gateway) EffectiveMode(manifestsLoaded bool) Mode {
	switch {
	case g.Mode != ModeAuto:
		return g.Mode
	case manifestsLoaded:
		return ModeEnforce
	}
	return ModeObserve
}

// Values of `unclassified_reads`. Source: seed "MCP gateway", Modes.
const (
	UnclassifiedBlock   = "block"
	UnclassifiedObserve = "observe"
)

// Values of `output_schemas` (issue 19): whether the agent's tools/list shows upstream tools'
// outputSchema. With advertise (the default) a client that validates results, such as the
// TypeScript SDK's Client.callTool, throws on the result of a call whose structuredContent the
// gateway dropped for breaking the schema; hide lists the tools without outputSchema, and the
// gateway still checks results against the upstream's schemas (seed "MCP gateway", Schema
// validation).
const (
	OutputSchemasAdvertise = "advertise"
	OutputSchemasHide      = "hide"
)

// Console modes. Source: seed "MCP gateway", Console on the gateway's port.
const (
	ConsoleOff   = "off"
	ConsoleOpen  = "open"
	ConsoleLogin = "login"
)

// Defaults from the seed's field table.
const (
	DefaultActor       = "mcp-client"
	DefaultListenHost  = "127.0.0.1"
	DefaultConsoleRole = "operator"
)

// Gateway is gateway.yaml. Every field of the seed's table is here; the comments give each
// default as Load fills it in.
type Gateway struct {
	// File is the path the config was read from (empty for FromFlags); Dir is its folder.
	File string
	// Dir is the folder relative paths (auth.keys, an upstream's cwd) are resolved against by
	// Resolve; empty when the config did not come from a file.
	Dir string

	// Mode is enforce, advise or observe; ModeAuto ("") when absent (see EffectiveMode).
	Mode Mode
	// UnclassifiedReads is block (default) or observe.
	UnclassifiedReads string
	// ValidateSchemas checks calls against the upstream's schemas; default true.
	ValidateSchemas bool
	// OutputSchemas is advertise (default) or hide: `output_schemas`, whether upstream tools
	// are listed with their outputSchema (see OutputSchemasAdvertise).
	OutputSchemas string
	// Console is the console on the gateway's port; default mode off.
	Console Console
	// Actor is the principal of unauthenticated sessions; default mcp-client.
	Actor string
	// Permissions is the scope of every session; nil means every permission in the manifests.
	Permissions []string
	// Upstreams are the MCP servers fronted; at least one.
	Upstreams []Upstream
	// Allow and Deny are tool-name globs in path.Match syntax; empty means no rule.
	Allow, Deny []string
	// Listen is the HTTP address; nil means MCP over stdio.
	Listen *Listen
	// ResourceURL is the public URL for OAuth protected-resource metadata; empty means derived.
	ResourceURL string
	// Auth holds the API key file and OIDC settings; zero means no authentication.
	Auth Auth
	// AllowedHosts are the Host header values accepted; nil means derived (loopback only when
	// bound to loopback).
	AllowedHosts []string
	// AllowedOrigins are the Origin header values accepted; nil means none.
	AllowedOrigins []string
	// CallTimeout bounds a forwarded tools/call whose manifest sets no timeout: `call_timeout`,
	// default DefaultCallTimeout (issue 18: every path that waits on an upstream has a deadline).
	CallTimeout time.Duration
	// Limits bound what an upstream or a client can make the gateway spend: `limits:`.
	Limits Limits
	// Policy is the policy file or folder (`policy:`, relative to the config's folder, see
	// Resolve); "" means --policy or reversi.config.yaml's policy: decide (issue 21).
	Policy string
	// Environment is the policy's `environment` variable (`environment:`, e.g. prod); the
	// --environment flag overrides it.
	Environment string
	// Notifications are the receivers of the approval events (`notifications:`, issue 24;
	// see Notification). reversi.config.yaml may list more; the gateway sends to both.
	Notifications []Notification
}

// DefaultCallTimeout is `call_timeout` when absent.
const DefaultCallTimeout = 60 * time.Second

// Limits is `limits:` (issue 18). Every field has a default (DefaultLimits) and a metric when
// hit (reversi_gateway_limit_hits_total{limit="<field name>"}). Sizes are in bytes, durations
// in the manifest duration syntax (500ms, 30s, 2m) or milliseconds.
type Limits struct {
	// ToolsPerUpstream is the most tools one upstream may list (tools_per_upstream).
	ToolsPerUpstream int
	// PagesPerListing is the most tools/list pages one listing follows (pages_per_listing).
	PagesPerListing int
	// MessageBytes is the largest JSON-RPC message read from an upstream (message_bytes).
	MessageBytes int64
	// ListingBytes is the most bytes (as JSON) the tools of one upstream's listing may take,
	// over all its pages (listing_bytes).
	ListingBytes int64
	// RequestBodyBytes is the largest HTTP request body a client may send, and the longest line
	// a stdio client may send (request_body_bytes).
	RequestBodyBytes int64
	// HeaderBytes is the most bytes of request line and headers an HTTP request may have
	// (header_bytes): read before authentication, so anyone can make the gateway hold them.
	HeaderBytes int64
	// BatchSize is the most messages one JSON-RPC batch may hold; 0 refuses batches
	// (batch_size).
	BatchSize int
	// CallsPerSession and CallsPerPrincipal are the most tools/call requests (and relayed
	// requests: prompts, resources, completions) in flight for one session and for one
	// principal across sessions (calls_per_session, calls_per_principal).
	CallsPerSession, CallsPerPrincipal int
	// Connections is the most HTTP connections open at once (connections).
	Connections int
	// Sessions and SessionsPerPrincipal are the most MCP sessions open at once over HTTP, in
	// all and for one principal (sessions, sessions_per_principal).
	Sessions, SessionsPerPrincipal int
	// ReadTimeout bounds reading a whole HTTP request, WriteTimeout writing a response (on the
	// MCP endpoints each write and flush of it, so that SSE streams and long calls live),
	// IdleTimeout a keep-alive connection between requests (read_timeout, write_timeout,
	// idle_timeout).
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// SubscriptionsPerSession is the most resource URIs one agent session may be subscribed
	// to at once (subscriptions_per_session); each is kept and forwarded upstream.
	SubscriptionsPerSession int
	// ServerRequestsPerSession is the most requests (sampling, elicitation, roots) one upstream
	// session may have waiting for its agent's answer at once; the others are refused to the
	// upstream (server_requests_per_session).
	ServerRequestsPerSession int
}

// Console is `console:`. Mode is off (default), open or login; Role applies to open mode only
// and defaults to operator there (auditor, approver or operator; never admin).
type Console struct {
	Mode string
	Role string
}

// Upstream is one entry of `upstreams:`. Exactly one of Command (stdio), URL (Streamable
// HTTP) or Socket (stdio framing over a Unix socket, issue 23) is set. Args, Env and Headers hold the values after ${NAME} expansion.
//
// A stdio upstream does not inherit the gateway's environment: Env is all the process gets
// (seed: "A stdio upstream does not inherit the gateway's environment, only what you list").
type Upstream struct {
	// Name matches ^[A-Za-z0-9_-]+$ and is unique; it prefixes tool names when Namespace is set.
	Name string
	// Command, Args, Env and Cwd describe a stdio upstream. Cwd is as written; see Resolve.
	Command string
	Args    []string
	Env     map[string]string
	Cwd     string
	// URL (http or https) and Headers describe a Streamable HTTP upstream.
	URL     string
	Headers map[string]string
	// Socket is the absolute path of a Unix socket that speaks MCP's stdio framing
	// (newline-delimited JSON-RPC), such as the one `reversi stdio-bridge --listen
	// unix://<path>` serves in front of a stdio server in a sidecar (issue 23). The gateway
	// dials it as it would start a command: one connection per upstream session.
	Socket string
	// Namespace exposes tools and prompts as <name>.<tool>; default true.
	Namespace bool
	// Session is `session:`: SessionPerClient (one upstream session per agent session, the
	// default for url upstreams) or SessionShared (one for all agents, the default for stdio
	// upstreams, whose servers often keep state per process). Issue 19.
	Session SessionMode
	// NoResources is `resources: false` (default true): the upstream's resources and templates
	// are not relayed, e.g. for two servers that list the same URIs (a clash otherwise).
	NoResources bool
}

// SessionMode says how agent sessions map to upstream sessions (`session:`).
type SessionMode string

// The values of `session:`.
const (
	SessionShared    SessionMode = "shared"
	SessionPerClient SessionMode = "per_client"
)

// PerClient reports whether each agent session gets its own upstream session: `session:`,
// or when it is not set ("") true for a url upstream and false for a stdio one (command or
// socket).
func (u *Upstream) PerClient() bool {
	return u.Session == SessionPerClient || u.Session == "" && !u.Stdio()
}

// Stdio reports whether the upstream speaks MCP's stdio framing: a command, or a socket.
// Neither is a network destination (no egress check).
func (u *Upstream) Stdio() bool { return u.Command != "" || u.Socket != "" }

// Listen is `listen:`: host (default 127.0.0.1) and port (1 to 65535, required).
type Listen struct {
	Host string
	Port int
}

// Address is host:port for net.Listen.
func (l *Listen) Address() string {
	return net.JoinHostPort(l.Host, strconv.Itoa(l.Port))
}

// Loopback reports whether the listen host is a loopback address or "localhost".
func (l *Listen) Loopback() bool { return IsLoopbackHost(l.Host) }

// IsLoopbackHost reports whether host is "localhost" (any case, optionally with a trailing dot)
// or a loopback IP address such as 127.0.0.1 or ::1. Any other name counts as non-loopback,
// since it could resolve anywhere.
func IsLoopbackHost(host string) bool {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"))
	return ip != nil && ip.IsLoopback()
}

// Auth is `auth:`. Keys is the API key file (as written; see Resolve); OIDC is nil when absent.
type Auth struct {
	Keys string
	OIDC *OIDC
}

// Enabled reports whether any authentication is configured.
func (a Auth) Enabled() bool { return a.Keys != "" || a.OIDC != nil }

// OIDC is `auth.oidc:`. Issuer and Audience are required; RoleMap maps a token's role claim
// values to Reversi roles; RoleClaim, ActorClaim and JWKSURI are optional (empty means the
// gateway's default). ActorPrefix, UIDClaim and EmailClaim map the token to the identity the
// API server gives it (issue 16): the principal is ActorPrefix followed by the ActorClaim's
// value (the API server's username prefix and claim), UIDClaim names the uid claim (default
// none) and EmailClaim the e-mail claim (default email).
type OIDC struct {
	Issuer      string
	Audience    string
	RoleMap     map[string]string
	RoleClaim   string
	ActorClaim  string
	ActorPrefix string
	UIDClaim    string
	EmailClaim  string
	JWKSURI     string
}

// Resolve makes a path from the config relative to the config file's folder; absolute paths,
// empty paths and configs not read from a file are returned unchanged.
func (g *Gateway) Resolve(p string) string {
	if p == "" || filepath.IsAbs(p) || g.Dir == "" {
		return p
	}
	return filepath.Join(g.Dir, p)
}

// defaults returns a Gateway with the seed's defaults filled in.
func defaults() *Gateway {
	return &Gateway{
		UnclassifiedReads: UnclassifiedBlock,
		ValidateSchemas:   true,
		OutputSchemas:     OutputSchemasAdvertise,
		Console:           Console{Mode: ConsoleOff},
		Actor:             DefaultActor,
		CallTimeout:       DefaultCallTimeout,
		Limits:            DefaultLimits(),
	}
}

// LookupFunc looks up an environment variable, as os.LookupEnv does.
type LookupFunc func(name string) (string, bool)

// Load reads gateway.yaml at path with the process environment for ${NAME} expansion. See
// LoadEnv.
func Load(path string) (*Gateway, []error) { return LoadEnv(path, os.LookupEnv) }

// LoadEnv reads the file at path and calls Parse. A file that cannot be read is one error.
func LoadEnv(path string, lookup LookupFunc) (*Gateway, []error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, []error{err}
	}
	return Parse(path, data, lookup)
}
