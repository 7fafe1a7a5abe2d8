package config

import (
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/reversi-gitops/reversi/api/manifest"
)

var (
	upstreamNamePattern = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	envNamePattern      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	headerNamePattern   = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
)

// reservedUpstreamName would namespace tools as reversi.<tool>, which are the gateway's own.
const reservedUpstreamName = "reversi"

// Reversi roles a token may map to (seed "MCP gateway", Endpoints and reversi.* tools).
var roles = []string{"agent", "auditor", "approver", "operator", "admin"}

// Parse decodes gateway.yaml (or .json, by extension) from data. file names the source in
// errors. lookup expands ${NAME} in upstream args, env values and header values; nil means no
// variable is defined. Parse returns nil and every problem when the file has any; otherwise the
// Gateway with the seed's defaults filled in.
//
// Upstreams named validly are checked for uniqueness even when they have other faults.
//
// Errors (each a *manifest.FieldError with file, line and field path): YAML or JSON syntax,
// duplicate keys, unknown fields, wrong types, values outside the seed's enumerations (and
// issue 19's output_schemas: advertise or hide), the upstream rules (unique names matching
// ^[A-Za-z0-9_-]+$, exactly one of command, url or socket, an http(s) url, an absolute socket
// path, command-only and HTTP-only fields not mixed, an undefined ${NAME}), malformed
// allow/deny globs, a port outside 1..65535, a non-loopback listen host without auth, and the
// console rules (open needs a loopback listen host and a role other than admin; login needs
// auth; open and login need listen).
func Parse(file string, data []byte, lookup LookupFunc) (*Gateway, []error) {
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	docs, perrs := manifest.ParseFile(file, data)
	var errs []error
	for _, e := range perrs {
		if fe, ok := e.(*manifest.FieldError); ok {
			c := *fe
			c.Tool = "" // ParseFile labels problems after a manifest's tool; gateway.yaml has none
			e = &c
		}
		errs = append(errs, e)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	switch len(docs) {
	case 0:
		return nil, []error{&manifest.FieldError{File: file, Message: "empty: gateway.yaml needs at least upstreams:"}}
	case 1:
	default:
		return nil, []error{&manifest.FieldError{File: file, Line: docs[1].Line(""), Message: fmt.Sprintf("%d objects: gateway.yaml holds one", len(docs))}}
	}
	d := &decoder{file: file, doc: &docs[0], lookup: lookup}
	g := d.gateway(docs[0].Value)
	if len(d.errs) > 0 {
		manifest.SortErrors(d.errs)
		return nil, d.errs
	}
	g.File = file
	g.Dir = filepath.Dir(file)
	return g, nil
}

// decoder turns the parsed value into a Gateway, collecting every problem.
type decoder struct {
	file   string
	doc    *manifest.Document
	lookup LookupFunc
	errs   []error
}

func (d *decoder) fail(p, format string, args ...any) {
	d.errs = append(d.errs, &manifest.FieldError{File: d.file, Line: d.doc.Line(p), Path: p, Message: fmt.Sprintf(format, args...)})
}

func join(p, field string) string {
	if p == "" {
		return field
	}
	return p + "." + field
}

func index(p string, i int) string { return fmt.Sprintf("%s[%d]", p, i) }

// object checks that v is an object with only the known fields; nil (with an error) otherwise.
func (d *decoder) object(v any, p string, known ...string) map[string]any {
	m, ok := v.(map[string]any)
	if !ok {
		d.fail(p, "expected an object, found %s", manifest.Describe(v))
		return nil
	}
	var unknown []string
	for k := range m {
		if !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		d.fail(join(p, k), "unknown field %q (known: %s)", k, strings.Join(known, ", "))
	}
	return m
}

// str reads an optional string field; null counts as absent.
func (d *decoder) str(m map[string]any, p, key string) (string, bool) {
	v, ok := m[key]
	if !ok || v == nil {
		return "", false
	}
	s, ok := v.(string)
	if !ok {
		d.fail(join(p, key), "expected a string, found %s", manifest.Describe(v))
		return "", false
	}
	return s, true
}

// nonEmpty reads an optional string field that must not be empty when given.
func (d *decoder) nonEmpty(m map[string]any, p, key string) (string, bool) {
	s, ok := d.str(m, p, key)
	if ok && strings.TrimSpace(s) == "" {
		d.fail(join(p, key), "must not be empty: give a value or leave the field out")
		return "", false
	}
	return s, ok
}

func (d *decoder) enum(m map[string]any, p, key string, allowed ...string) (string, bool) {
	s, ok := d.str(m, p, key)
	if ok && !slices.Contains(allowed, s) {
		d.fail(join(p, key), "%q is not one of %s", s, strings.Join(allowed, ", "))
		return "", false
	}
	return s, ok
}

func (d *decoder) boolean(m map[string]any, p, key string) (bool, bool) {
	v, ok := m[key]
	if !ok || v == nil {
		return false, false
	}
	b, ok := v.(bool)
	if !ok {
		d.fail(join(p, key), "expected true or false, found %s", manifest.Describe(v))
	}
	return b, ok
}

// strList reads an optional list of non-empty strings; each element is passed to check (if
// any) with its path.
func (d *decoder) strList(m map[string]any, p, key string, check func(p, s string) bool) ([]string, bool) {
	v, ok := m[key]
	if !ok || v == nil {
		return nil, false
	}
	l, ok := v.([]any)
	if !ok {
		d.fail(join(p, key), "expected a list of strings, found %s", manifest.Describe(v))
		return nil, false
	}
	out := make([]string, 0, len(l))
	for i, e := range l {
		ep := index(join(p, key), i)
		s, ok := e.(string)
		switch {
		case !ok:
			d.fail(ep, "expected a string, found %s", manifest.Describe(e))
		case strings.TrimSpace(s) == "":
			d.fail(ep, "must not be empty")
		case check == nil || check(ep, s):
			out = append(out, s)
		}
	}
	return out, true
}

// strMap reads an optional object of string values; keys are checked with keyOK (message
// keyRule) and values passed to value (which may expand them).
func (d *decoder) strMap(m map[string]any, p, key string, keyOK *regexp.Regexp, keyRule string, value func(p, s string) string) (map[string]string, bool) {
	v, ok := m[key]
	if !ok || v == nil {
		return nil, false
	}
	o, ok := v.(map[string]any)
	if !ok {
		d.fail(join(p, key), "expected an object of strings, found %s", manifest.Describe(v))
		return nil, false
	}
	keys := make([]string, 0, len(o))
	for k := range o {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make(map[string]string, len(o))
	for _, k := range keys {
		kp := join(join(p, key), k)
		if keyOK != nil && !keyOK.MatchString(k) {
			d.fail(kp, "%q is not a valid name: %s", k, keyRule)
			continue
		}
		s, ok := o[k].(string)
		if !ok {
			d.fail(kp, "expected a string, found %s", manifest.Describe(o[k]))
			continue
		}
		if value != nil {
			s = value(kp, s)
		}
		out[k] = s
	}
	return out, true
}

// expand replaces every ${NAME} in s from the lookup function; an undefined variable, an
// unterminated ${ or an invalid name inside ${…} is an error at p. Text that is not ${…} is
// kept as written (there is no escape: a literal "${" cannot be written). Expanded values are
// never repeated in errors, since they are usually secrets. Source: seed "MCP gateway", Config
// ("${NAME} in args, env and headers expands from the environment").
func (d *decoder) expand(p, s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		rest := s[i+2:]
		j := strings.IndexByte(rest, '}')
		if j < 0 {
			d.fail(p, "unterminated ${: write ${NAME}")
			return ""
		}
		name := rest[:j]
		if !envNamePattern.MatchString(name) {
			d.fail(p, "${%s}: not a variable name (letters, digits and _, not starting with a digit)", name)
		} else if v, ok := d.lookup(name); !ok {
			d.fail(p, "environment variable %s is not set", name)
		} else {
			b.WriteString(v)
		}
		s = rest[j+1:]
	}
}

var topFields = []string{"mode", "unclassified_reads", "validate_schemas", "output_schemas", "console", "actor", "permissions", "upstreams", "allow", "deny", "listen", "resource_url", "auth", "allowed_hosts", "allowed_origins", "call_timeout", "limits", "policy", "environment", "notifications"}

func (d *decoder) gateway(v any) *Gateway {
	g := defaults()
	m := d.object(v, "", topFields...)
	if m == nil {
		return g
	}
	if s, ok := d.enum(m, "", "mode", string(ModeEnforce), string(ModeAdvise), string(ModeObserve)); ok {
		g.Mode = Mode(s)
	}
	if s, ok := d.enum(m, "", "unclassified_reads", UnclassifiedBlock, UnclassifiedObserve); ok {
		g.UnclassifiedReads = s
	}
	if b, ok := d.boolean(m, "", "validate_schemas"); ok {
		g.ValidateSchemas = b
	}
	if s, ok := d.enum(m, "", "output_schemas", OutputSchemasAdvertise, OutputSchemasHide); ok {
		g.OutputSchemas = s
	}
	if s, ok := d.nonEmpty(m, "", "actor"); ok {
		g.Actor = s
	}
	if s, ok := d.nonEmpty(m, "", "policy"); ok {
		g.Policy = s
	}
	if s, ok := d.nonEmpty(m, "", "environment"); ok {
		g.Environment = s
	}
	g.Permissions, _ = d.strList(m, "", "permissions", nil)
	g.Allow, _ = d.strList(m, "", "allow", d.glob)
	g.Deny, _ = d.strList(m, "", "deny", d.glob)
	g.Upstreams = d.upstreams(m)
	if v, ok := m["listen"]; ok && v != nil {
		g.Listen = d.listen(v)
	}
	if s, ok := d.nonEmpty(m, "", "resource_url"); ok && d.httpURL("resource_url", s) {
		g.ResourceURL = s
	}
	if v, ok := m["auth"]; ok && v != nil {
		g.Auth = d.auth(v)
	}
	g.AllowedHosts, _ = d.strList(m, "", "allowed_hosts", d.host)
	g.AllowedOrigins, _ = d.strList(m, "", "allowed_origins", d.origin)
	if v, ok := m["console"]; ok && v != nil {
		g.Console = d.console(v)
	}
	d.duration(m, "", "call_timeout", &g.CallTimeout)
	if v, ok := m["limits"]; ok && v != nil {
		g.Limits = d.limits(v)
	}
	g.Notifications = d.notifications(m)
	d.crossChecks(g, m)
	return g
}

// glob checks a tool-name glob with path.Match syntax.
func (d *decoder) glob(p, s string) bool {
	if _, err := path.Match(s, ""); err != nil {
		d.fail(p, "%q is not a valid glob (path.Match syntax: *, ?, [a-z], \\ escapes)", s)
		return false
	}
	return true
}

// httpURL checks an absolute http or https URL with a host.
func (d *decoder) httpURL(p, s string) bool {
	if err := checkHTTPURL(s); err != nil {
		d.fail(p, "%v", err)
		return false
	}
	return true
}

func checkHTTPURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http or https URL", s)
	}
	return nil
}

// host checks an allowed_hosts entry: a host name or address, optionally with a port.
func (d *decoder) host(p, s string) bool {
	if strings.ContainsAny(s, "/ \t@") {
		d.fail(p, "%q is not a host name: write the name only, such as gateway.example.com", s)
		return false
	}
	return true
}

// origin checks an allowed_origins entry: scheme://host[:port] and nothing else.
func (d *decoder) origin(p, s string) bool {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		d.fail(p, "%q is not an origin: write scheme://host[:port], such as https://app.example.com", s)
		return false
	}
	return true
}

func (d *decoder) upstreams(m map[string]any) []Upstream {
	v, ok := m["upstreams"]
	if !ok || v == nil {
		d.fail("upstreams", "required: list at least one upstream MCP server")
		return nil
	}
	l, ok := v.([]any)
	if !ok {
		d.fail("upstreams", "expected a list of upstreams, found %s", manifest.Describe(v))
		return nil
	}
	if len(l) == 0 {
		d.fail("upstreams", "required: list at least one upstream MCP server")
		return nil
	}
	var out []Upstream
	first := map[string]string{}
	for i, e := range l {
		p := index("upstreams", i)
		u, named := d.upstream(e, p)
		if !named {
			continue
		}
		if prev, dup := first[u.Name]; dup {
			d.fail(join(p, "name"), "upstream %q is already defined at %s: names must be unique", u.Name, prev)
			continue
		}
		first[u.Name] = p
		out = append(out, u)
	}
	return out
}

func (d *decoder) upstream(v any, p string) (Upstream, bool) {
	u := Upstream{Namespace: true}
	m := d.object(v, p, "name", "command", "args", "env", "cwd", "url", "headers", "socket", "namespace", "session", "resources")
	if m == nil {
		return u, false
	}
	name, ok := d.str(m, p, "name")
	switch {
	case !ok:
		d.fail(join(p, "name"), "required: name the upstream (letters, digits, _ and -)")
	case !upstreamNamePattern.MatchString(name):
		d.fail(join(p, "name"), "%q is not a valid upstream name: use letters, digits, _ and - only", name)
	case name == reservedUpstreamName:
		d.fail(join(p, "name"), "%q is reserved for the gateway's own tools: pick another name", name)
	}
	u.Name = name
	cmd, hasCmd := d.nonEmpty(m, p, "command")
	rawURL, hasURL := d.nonEmpty(m, p, "url")
	sock, hasSock := d.nonEmpty(m, p, "socket")
	const one = "give exactly one of command (stdio), url (Streamable HTTP) or socket (stdio over a Unix socket, e.g. reversi stdio-bridge)"
	switch {
	case hasCmd && hasURL:
		d.fail(join(p, "url"), "%s, not both command and url", one)
	case hasSock && hasCmd:
		d.fail(join(p, "socket"), "%s, not both command and socket", one)
	case hasSock && hasURL:
		d.fail(join(p, "socket"), "%s, not both url and socket", one)
	case !hasCmd && !hasURL && !hasSock && m["command"] == nil && m["url"] == nil && m["socket"] == nil:
		d.fail(p, "%s", one)
	}
	u.Command = cmd
	if hasURL && d.httpURL(join(p, "url"), rawURL) {
		u.URL = rawURL
	}
	if hasSock {
		if !filepath.IsAbs(sock) {
			d.fail(join(p, "socket"), "%q is not an absolute path: give the Unix socket's full path, e.g. /run/reversi/%s.sock", sock, name)
		} else {
			u.Socket = filepath.Clean(sock)
		}
	}
	expand := d.expand
	u.Args, _ = d.strListRaw(m, p, "args", expand)
	u.Env, _ = d.strMap(m, p, "env", envNamePattern, "letters, digits and _, not starting with a digit", expand)
	u.Cwd, _ = d.nonEmpty(m, p, "cwd")
	u.Headers, _ = d.strMap(m, p, "headers", headerNamePattern, "an HTTP header name", expand)
	if hasURL || hasSock {
		kind := "a url"
		if hasSock {
			kind = "a socket (its server's command, arguments and environment are the bridge's)"
		}
		for _, k := range []string{"args", "env", "cwd"} {
			if m[k] != nil {
				d.fail(join(p, k), "applies to a command (stdio) upstream only; this one has %s", kind)
			}
		}
	}
	if (hasCmd || hasSock) && m["headers"] != nil {
		kind := "command"
		if hasSock {
			kind = "socket"
		}
		d.fail(join(p, "headers"), "applies to a url (Streamable HTTP) upstream only; this one has a %s", kind)
	}
	if b, ok := d.boolean(m, p, "namespace"); ok {
		u.Namespace = b
	}
	if b, ok := d.boolean(m, p, "resources"); ok {
		u.NoResources = !b
	}
	if s, ok := d.nonEmpty(m, p, "session"); ok {
		switch SessionMode(s) {
		case SessionShared, SessionPerClient:
			u.Session = SessionMode(s)
		default:
			d.fail(join(p, "session"), "%q is not a session mode: use shared or per_client", s)
		}
	}
	return u, upstreamNamePattern.MatchString(u.Name)
}

// strListRaw reads a list of strings (empty strings allowed, as an argument may be empty),
// passing each through value.
func (d *decoder) strListRaw(m map[string]any, p, key string, value func(p, s string) string) ([]string, bool) {
	v, ok := m[key]
	if !ok || v == nil {
		return nil, false
	}
	l, ok := v.([]any)
	if !ok {
		d.fail(join(p, key), "expected a list of strings, found %s", manifest.Describe(v))
		return nil, false
	}
	out := make([]string, 0, len(l))
	for i, e := range l {
		ep := index(join(p, key), i)
		s, ok := e.(string)
		if !ok {
			d.fail(ep, "expected a string, found %s (quote numbers and flags)", manifest.Describe(e))
			continue
		}
		out = append(out, value(ep, s))
	}
	return out, true
}

func (d *decoder) listen(v any) *Listen {
	l := &Listen{Host: DefaultListenHost}
	m := d.object(v, "listen", "host", "port")
	if m == nil {
		return l
	}
	if s, ok := d.nonEmpty(m, "listen", "host"); ok {
		l.Host = s
	}
	pv, ok := m["port"]
	switch n, isInt := pv.(int64); {
	case !ok || pv == nil:
		d.fail("listen.port", "required: the TCP port to listen on (1 to 65535)")
	case !isInt:
		d.fail("listen.port", "expected a whole number from 1 to 65535, found %s", manifest.Describe(pv))
	case n < 1 || n > 65535:
		d.fail("listen.port", "%d is not a port: use 1 to 65535", n)
	default:
		l.Port = int(n)
	}
	return l
}

func (d *decoder) console(v any) Console {
	c := Console{Mode: ConsoleOff}
	m := d.object(v, "console", "mode", "role")
	if m == nil {
		return c
	}
	if s, ok := d.enum(m, "console", "mode", ConsoleOff, ConsoleOpen, ConsoleLogin); ok {
		c.Mode = s
	}
	role, hasRole := d.str(m, "console", "role")
	switch {
	case !hasRole:
		if c.Mode == ConsoleOpen {
			c.Role = DefaultConsoleRole
		}
	case c.Mode != ConsoleOpen:
		d.fail("console.role", "applies to console mode open only (in login mode the role comes from the credential)")
	case role == "admin":
		d.fail("console.role", "the gateway refuses to start an open console with the admin role: use auditor, approver or operator")
	case !slices.Contains([]string{"auditor", "approver", "operator"}, role):
		d.fail("console.role", "%q is not one of auditor, approver, operator", role)
	default:
		c.Role = role
	}
	return c
}

func (d *decoder) auth(v any) Auth {
	var a Auth
	m := d.object(v, "auth", "keys", "oidc")
	if m == nil {
		return a
	}
	a.Keys, _ = d.nonEmpty(m, "auth", "keys")
	if m["keys"] == nil && m["oidc"] == nil {
		// Otherwise `auth: {}` would pass for authentication in the listen and console rules.
		d.fail("auth", "give keys, oidc or both (leave auth out for no authentication)")
		return a
	}
	ov, ok := m["oidc"]
	if !ok || ov == nil {
		return a
	}
	const p = "auth.oidc"
	o := d.object(ov, p, "issuer", "audience", "role_map", "role_claim", "actor_claim", "actor_prefix", "uid_claim", "email_claim", "jwks_uri")
	if o == nil {
		return a
	}
	oidc := &OIDC{}
	if s, ok := d.nonEmpty(o, p, "issuer"); !ok {
		if o["issuer"] == nil {
			d.fail(join(p, "issuer"), "required: the OIDC issuer URL")
		}
	} else if d.httpURL(join(p, "issuer"), s) {
		oidc.Issuer = s
	}
	if s, ok := d.nonEmpty(o, p, "audience"); ok {
		oidc.Audience = s
	} else if o["audience"] == nil {
		d.fail(join(p, "audience"), "required: the audience tokens must carry (usually the gateway's URL)")
	}
	oidc.RoleMap, _ = d.strMap(o, p, "role_map", nil, "", func(vp, s string) string {
		if !slices.Contains(roles, s) {
			d.fail(vp, "%q is not a Reversi role: use one of %s", s, strings.Join(roles, ", "))
		}
		return s
	})
	oidc.RoleClaim, _ = d.nonEmpty(o, p, "role_claim")
	oidc.ActorClaim, _ = d.nonEmpty(o, p, "actor_claim")
	oidc.ActorPrefix, _ = d.nonEmpty(o, p, "actor_prefix")
	oidc.UIDClaim, _ = d.nonEmpty(o, p, "uid_claim")
	oidc.EmailClaim, _ = d.nonEmpty(o, p, "email_claim")
	for _, f := range []struct{ name, v string }{{"actor_prefix", oidc.ActorPrefix}, {"uid_claim", oidc.UIDClaim}, {"email_claim", oidc.EmailClaim}} {
		if len(f.v) > 253 || strings.ContainsAny(f.v, " \t\n") {
			d.fail(join(p, f.name), "%q: at most 253 characters, no spaces", f.v)
		}
	}
	if s, ok := d.nonEmpty(o, p, "jwks_uri"); ok && d.httpURL(join(p, "jwks_uri"), s) {
		oidc.JWKSURI = s
	}
	a.OIDC = oidc
	return a
}

// crossChecks applies the rules that span fields. Source: seed "MCP gateway", Endpoints ("The
// gateway refuses to listen beyond loopback without authentication") and Console on the
// gateway's port ("It needs HTTP mode", "refuses to start if listen.host is not loopback or if
// the role is admin", login "needs auth.keys or auth.oidc").
func (d *decoder) crossChecks(g *Gateway, m map[string]any) {
	authSet := m["auth"] != nil // a broken auth block is reported on its own; don't pile on
	if g.Listen != nil && !g.Listen.Loopback() && !authSet {
		d.fail("listen.host", "%q is not loopback: the gateway refuses to listen beyond loopback without authentication (set auth.keys or auth.oidc)", g.Listen.Host)
	}
	switch g.Console.Mode {
	case ConsoleOpen, ConsoleLogin:
		if g.Listen == nil {
			d.fail("console.mode", "console %s needs HTTP mode: set listen", g.Console.Mode)
			return
		}
	}
	if g.Console.Mode == ConsoleOpen && !g.Listen.Loopback() {
		d.fail("console.mode", "console open needs a loopback listen.host, not %q: use login with auth instead", g.Listen.Host)
	}
	if g.Console.Mode == ConsoleLogin && !authSet {
		d.fail("console.mode", "console login needs auth.keys or auth.oidc")
	}
}
