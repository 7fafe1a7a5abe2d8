package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/reversi-gitops/reversi/api/manifest"
)

func env(vars map[string]string) LookupFunc {
	return func(n string) (string, bool) { v, ok := vars[n]; return v, ok }
}

func TestSeedExampleLoads(t *testing.T) {
	g, errs := LoadEnv("testdata/gateway.yaml", env(map[string]string{"GITHUB_MCP_TOKEN": "s3cret"}))
	if len(errs) > 0 {
		t.Fatalf("seed example refused: %v", errs)
	}
	want := &Gateway{
		File: "testdata/gateway.yaml", Dir: "testdata",
		Mode: ModeEnforce, UnclassifiedReads: "block", ValidateSchemas: true, OutputSchemas: "advertise",
		Console: Console{Mode: "off"}, Actor: "dev-laptop",
		Permissions: []string{"fs:read", "fs:write"},
		Upstreams: []Upstream{
			{Name: "github", URL: "https://mcp.example.com/mcp", Headers: map[string]string{"Authorization": "Bearer s3cret"}, Namespace: true},
			{Name: "fs", Command: "reversi-connectors", Args: []string{"serve", "fs", "--root", "./sandbox"}, Namespace: true},
		},
		Allow: []string{"fs.*", "github.get_*"}, Deny: []string{"fs.remove_dir"},
		Listen:      &Listen{Host: "127.0.0.1", Port: 7431},
		ResourceURL: "https://gateway.example.com",
		Auth: Auth{Keys: "./keys.json", OIDC: &OIDC{Issuer: "https://id.example.com/realm", Audience: "https://gateway.example.com",
			RoleMap: map[string]string{"bot": "agent", "ops": "operator"}}},
		AllowedHosts: []string{"gateway.example.com"}, AllowedOrigins: []string{},
		CallTimeout: DefaultCallTimeout, Limits: DefaultLimits(),
	}
	if !reflect.DeepEqual(g, want) {
		t.Fatalf("got  %+v\nwant %+v", g, want)
	}
	if g.Resolve(g.Auth.Keys) != filepath.Join("testdata", "keys.json") || g.Listen.Address() != "127.0.0.1:7431" {
		t.Fatalf("resolve %s address %s", g.Resolve(g.Auth.Keys), g.Listen.Address())
	}
	// Without the token the same file names the variable, the line and the header.
	_, errs = LoadEnv("testdata/gateway.yaml", env(nil))
	if len(errs) != 1 || errs[0].Error() != "testdata/gateway.yaml:10: upstreams[0].headers.Authorization: environment variable GITHUB_MCP_TOKEN is not set" {
		t.Fatalf("missing token: %v", errs)
	}
}

func TestDefaults(t *testing.T) {
	g, errs := Parse("g.yaml", []byte("upstreams: [{name: fs, command: srv}]\n"), nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if g.Mode != ModeAuto || g.UnclassifiedReads != "block" || !g.ValidateSchemas || g.OutputSchemas != "advertise" || g.Console != (Console{Mode: "off"}) ||
		g.Actor != "mcp-client" || g.Permissions != nil || g.Listen != nil || g.Auth.Enabled() || !g.Upstreams[0].Namespace || !g.Upstreams[0].Stdio() {
		t.Fatalf("defaults: %+v", g)
	}
	if g.EffectiveMode(false) != ModeObserve || g.EffectiveMode(true) != ModeEnforce {
		t.Fatal("automatic mode: observe without manifests, enforce with")
	}
	g.Mode = ModeAdvise
	if g.EffectiveMode(false) != ModeAdvise {
		t.Fatal("an explicit mode wins")
	}
	if g, errs := Parse("g.yaml", []byte("upstreams: [{name: fs, command: srv}]\noutput_schemas: hide\n"), nil); len(errs) > 0 || g.OutputSchemas != OutputSchemasHide {
		t.Fatalf("output_schemas: hide: %+v %v", g, errs)
	}
	g, errs = Parse("g.yaml", []byte("upstreams: [{name: fs, command: srv}]\nlisten: {port: 80}\nconsole: {mode: open}\n"), nil)
	if len(errs) > 0 || g.Listen.Host != "127.0.0.1" || g.Console.Role != "operator" {
		t.Fatalf("listen host and console role defaults: %+v %v", g, errs)
	}
}

// policy: and environment: (issue 21): the policy path is resolved against the config's folder;
// an empty value is refused with its line.
func TestPolicyAndEnvironment(t *testing.T) {
	g, errs := Parse("conf/g.yaml", []byte("upstreams: [{name: fs, command: srv}]\npolicy: policy\nenvironment: prod\n"), nil)
	if len(errs) > 0 || g.Policy != "policy" || g.Environment != "prod" || g.Resolve(g.Policy) != filepath.Join("conf", "policy") {
		t.Fatalf("%+v %v", g, errs)
	}
	_, errs = Parse("g.yaml", []byte("upstreams: [{name: fs, command: srv}]\npolicy: \"\"\n"), nil)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "g.yaml:2: policy: must not be empty") {
		t.Fatalf("empty policy: %v", errs)
	}
}

// up is a valid upstreams block on line 1, so each case's fault is on line 2 or later.
const up = "upstreams: [{name: fs, command: srv}]\n"

func TestEachRuleReportsFileLineAndPath(t *testing.T) {
	for _, c := range []struct {
		name, body string
		line       int
		path, msg  string
	}{
		{"unknown top field", up + "modes: enforce\n", 2, "modes", `unknown field "modes"`},
		{"unknown nested field", up + "listen: {port: 1, hots: x}\n", 2, "listen.hots", `unknown field "hots"`},
		{"unknown upstream field", "upstreams:\n  - name: fs\n    command: srv\n    environment: {}\n", 4, "upstreams[0].environment", `unknown field "environment"`},
		{"unknown oidc field", up + "auth:\n  oidc: {issuer: https://i, audience: a, roles: {}}\n", 3, "auth.oidc.roles", `unknown field "roles"`},
		{"duplicate key", up + "actor: a\nactor: b\n", 3, "actor", `duplicate key "actor" (first at line 2)`},
		{"mode", up + "mode: strict\n", 2, "mode", `"strict" is not one of enforce, advise, observe`},
		{"unclassified_reads", up + "unclassified_reads: allow\n", 2, "unclassified_reads", `"allow" is not one of block, observe`},
		{"validate_schemas type", up + "validate_schemas: \"yes\"\n", 2, "validate_schemas", `expected true or false, found string "yes"`},
		{"output_schemas", up + "output_schemas: drop\n", 2, "output_schemas", `"drop" is not one of advertise, hide`},
		{"empty actor", up + "actor: \"\"\n", 2, "actor", "must not be empty"},
		{"permissions type", up + "permissions: fs:read\n", 2, "permissions", "expected a list of strings"},
		{"no upstreams", "actor: a\n", 1, "upstreams", "required: list at least one upstream"},
		{"empty upstreams", "upstreams: []\n", 1, "upstreams", "required: list at least one upstream"},
		{"bad name", "upstreams:\n  - name: my.fs\n    command: srv\n", 2, "upstreams[0].name", `"my.fs" is not a valid upstream name`},
		{"missing name", "upstreams:\n  - command: srv\n", 2, "upstreams[0].name", "required: name the upstream"},
		{"reserved name", "upstreams:\n  - name: reversi\n    command: srv\n", 2, "upstreams[0].name", "reserved for the gateway's own tools"},
		{"duplicate name", "upstreams:\n  - name: fs\n    command: a\n  - name: fs\n    url: http://x\n", 4, "upstreams[1].name", `upstream "fs" is already defined at upstreams[0]`},
		{"both command and url", "upstreams:\n  - name: fs\n    command: a\n    url: https://x\n", 4, "upstreams[0].url", "exactly one of command (stdio), url (Streamable HTTP) or socket (stdio over a Unix socket, e.g. reversi stdio-bridge), not both command and url"},
		{"both command and socket", "upstreams:\n  - name: fs\n    command: a\n    socket: /run/reversi/fs.sock\n", 4, "upstreams[0].socket", "not both command and socket"},
		{"both url and socket", "upstreams:\n  - name: fs\n    url: https://x\n    socket: /run/reversi/fs.sock\n", 4, "upstreams[0].socket", "not both url and socket"},
		{"relative socket", "upstreams:\n  - name: fs\n    socket: run/fs.sock\n", 3, "upstreams[0].socket", `"run/fs.sock" is not an absolute path: give the Unix socket's full path, e.g. /run/reversi/fs.sock`},
		{"empty socket", "upstreams:\n  - name: fs\n    socket: \"\"\n", 3, "upstreams[0].socket", "must not be empty"},
		{"args on socket", "upstreams:\n  - name: fs\n    socket: /run/reversi/fs.sock\n    args: [x]\n", 4, "upstreams[0].args", "applies to a command (stdio) upstream only; this one has a socket"},
		{"headers on socket", "upstreams:\n  - name: fs\n    socket: /run/reversi/fs.sock\n    headers: {X: y}\n", 4, "upstreams[0].headers", "applies to a url (Streamable HTTP) upstream only; this one has a socket"},
		{"neither command nor url", "upstreams:\n  - name: fs\n", 2, "upstreams[0]", "give exactly one of command (stdio), url (Streamable HTTP) or socket"},
		{"url scheme", "upstreams:\n  - name: gh\n    url: ftp://x/mcp\n", 3, "upstreams[0].url", `"ftp://x/mcp" is not an http or https URL`},
		{"headers on stdio", "upstreams:\n  - name: fs\n    command: a\n    headers: {X: y}\n", 4, "upstreams[0].headers", "applies to a url (Streamable HTTP) upstream only"},
		{"env on url", "upstreams:\n  - name: gh\n    url: https://x\n    env: {A: b}\n", 4, "upstreams[0].env", "applies to a command (stdio) upstream only"},
		{"env name", "upstreams:\n  - name: fs\n    command: a\n    env: {1A: b}\n", 4, "upstreams[0].env.1A", `"1A" is not a valid name`},
		{"header name", "upstreams:\n  - name: gh\n    url: https://x\n    headers: {\"X Y\": b}\n", 4, "upstreams[0].headers.X Y", "an HTTP header name"},
		{"arg type", "upstreams:\n  - name: fs\n    command: a\n    args: [serve, 3]\n", 4, "upstreams[0].args[1]", "expected a string, found number 3"},
		{"namespace type", "upstreams:\n  - name: fs\n    command: a\n    namespace: no-thanks\n", 4, "upstreams[0].namespace", "expected true or false"},
		{"session", "upstreams:\n  - name: fs\n    command: a\n    session: per-agent\n", 4, "upstreams[0].session", `"per-agent" is not a session mode: use shared or per_client`},
		{"resources type", "upstreams:\n  - name: fs\n    command: a\n    resources: none\n", 4, "upstreams[0].resources", "expected true or false"},
		{"missing variable", "upstreams:\n  - name: fs\n    command: a\n    env:\n      TOKEN: ${FS_TOKEN}\n", 5, "upstreams[0].env.TOKEN", "environment variable FS_TOKEN is not set"},
		{"unterminated variable", "upstreams:\n  - name: fs\n    command: a\n    args: [\"${HOME\"]\n", 4, "upstreams[0].args[0]", "unterminated ${"},
		{"bad variable name", "upstreams:\n  - name: fs\n    command: a\n    args: [\"${A-B}\"]\n", 4, "upstreams[0].args[0]", "${A-B}: not a variable name"},
		{"allow glob", up + "allow: [\"fs.[a\"]\n", 2, "allow[0]", `"fs.[a" is not a valid glob`},
		{"deny glob", up + "deny:\n  - ok.*\n  - \"x\\\\\"\n", 4, "deny[1]", "is not a valid glob"},
		{"port missing", up + "listen: {host: 127.0.0.1}\n", 2, "listen.port", "required: the TCP port"},
		{"port range", up + "listen: {port: 70000}\n", 2, "listen.port", "70000 is not a port: use 1 to 65535"},
		{"port zero", up + "listen: {port: 0}\n", 2, "listen.port", "0 is not a port"},
		{"port type", up + "listen: {port: \"7431\"}\n", 2, "listen.port", `expected a whole number from 1 to 65535, found string "7431"`},
		{"beyond loopback", up + "listen:\n  host: 0.0.0.0\n  port: 7431\n", 3, "listen.host", "refuses to listen beyond loopback without authentication"},
		{"hostname is not loopback", up + "listen: {host: gateway.example.com, port: 7431}\n", 2, "listen.host", "refuses to listen beyond loopback without authentication"},
		{"resource_url", up + "resource_url: gateway.example.com\n", 2, "resource_url", "is not an http or https URL"},
		{"allowed_hosts", up + "allowed_hosts: [\"https://gateway.example.com/\"]\n", 2, "allowed_hosts[0]", "is not a host name"},
		{"allowed_origins", up + "allowed_origins: [\"https://app.example.com/path\"]\n", 2, "allowed_origins[0]", "is not an origin"},
		{"empty auth", up + "listen: {host: 0.0.0.0, port: 80}\nauth: {}\n", 3, "auth", "give keys, oidc or both"},
		{"oidc issuer required", up + "auth:\n  oidc:\n    audience: a\n", 3, "auth.oidc.issuer", "required: the OIDC issuer URL"},
		{"oidc audience required", up + "auth:\n  oidc:\n    issuer: https://id\n", 3, "auth.oidc.audience", "required: the audience"},
		{"oidc role_map", up + "auth:\n  oidc: {issuer: https://id, audience: a, role_map: {bot: root}}\n", 3, "auth.oidc.role_map.bot", `"root" is not a Reversi role`},
		{"oidc jwks_uri", up + "auth:\n  oidc: {issuer: https://id, audience: a, jwks_uri: keys}\n", 3, "auth.oidc.jwks_uri", "is not an http or https URL"},
		{"oidc actor_prefix empty", up + "auth:\n  oidc: {issuer: https://id, audience: a, actor_prefix: \"\"}\n", 3, "auth.oidc.actor_prefix", "must not be empty"},
		{"oidc uid_claim spaces", up + "auth:\n  oidc: {issuer: https://id, audience: a, uid_claim: \"o id\"}\n", 3, "auth.oidc.uid_claim", "no spaces"},
		{"oidc email_claim type", up + "auth:\n  oidc: {issuer: https://id, audience: a, email_claim: [mail]}\n", 3, "auth.oidc.email_claim", ""},
		{"console mode", up + "console: {mode: public}\n", 2, "console.mode", `"public" is not one of off, open, login`},
		{"console needs listen", up + "console: {mode: login}\nauth: {keys: k.json}\n", 2, "console.mode", "console login needs HTTP mode: set listen"},
		{"console open beyond loopback", up + "listen: {host: 10.0.0.1, port: 80}\nauth: {keys: k.json}\nconsole: {mode: open}\n", 4, "console.mode", "console open needs a loopback listen.host"},
		{"console open admin", up + "listen: {port: 80}\nconsole:\n  mode: open\n  role: admin\n", 5, "console.role", "refuses to start an open console with the admin role"},
		{"console role in login", up + "listen: {port: 80}\nauth: {keys: k.json}\nconsole:\n  mode: login\n  role: auditor\n", 6, "console.role", "applies to console mode open only"},
		{"console login needs auth", up + "listen: {port: 80}\nconsole: {mode: login}\n", 3, "console.mode", "console login needs auth.keys or auth.oidc"},
		{"not an object", "just text\n", 1, "", "expected an object"},
		{"list of objects", up + "---\n- " + up, 3, "", "2 objects: gateway.yaml holds one"},
		{"two documents", up + "---\n" + up, 3, "", "2 objects: gateway.yaml holds one"},
		{"syntax", "upstreams: [\n", 1, "", "invalid YAML"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, errs := Parse("gw.yaml", []byte(c.body), nil)
			if g != nil || len(errs) != 1 {
				t.Fatalf("want exactly one error, got %v (config %+v)", errs, g)
			}
			var fe *manifest.FieldError
			if !errors.As(errs[0], &fe) {
				t.Fatalf("%T is not a *manifest.FieldError: %v", errs[0], errs[0])
			}
			if fe.File != "gw.yaml" || fe.Line != c.line || fe.Path != c.path || fe.Tool != "" || !strings.Contains(fe.Message, c.msg) {
				t.Fatalf("got %q (line %d, path %q), want line %d, path %q, message with %q", fe.Error(), fe.Line, fe.Path, c.line, c.path, c.msg)
			}
		})
	}
}

func TestEveryFaultReportedAtOnceInLineOrder(t *testing.T) {
	body := `mode: strict
upstreams:
  - name: fs
    command: srv
    url: https://x
  - name: bad name
    url: https://y
    headers: { Authorization: "Bearer ${MISSING}" }
listen: { host: 0.0.0.0, port: 0 }
console: { mode: open, role: admin }
extra: 1
`
	_, errs := Parse("gw.yaml", []byte(body), nil)
	want := []string{
		`gw.yaml:1: mode: "strict" is not one of enforce, advise, observe`,
		"gw.yaml:5: upstreams[0].url: give exactly one of command (stdio), url (Streamable HTTP) or socket (stdio over a Unix socket, e.g. reversi stdio-bridge), not both command and url",
		`gw.yaml:6: upstreams[1].name: "bad name" is not a valid upstream name: use letters, digits, _ and - only`,
		"gw.yaml:8: upstreams[1].headers.Authorization: environment variable MISSING is not set",
		"gw.yaml:9: listen.port: 0 is not a port: use 1 to 65535",
		`gw.yaml:9: listen.host: "0.0.0.0" is not loopback: the gateway refuses to listen beyond loopback without authentication (set auth.keys or auth.oidc)`,
		"gw.yaml:10: console.role: the gateway refuses to start an open console with the admin role: use auditor, approver or operator",
		`gw.yaml:10: console.mode: console open needs a loopback listen.host, not "0.0.0.0": use login with auth instead`,
		`gw.yaml:11: extra: unknown field "extra" (known: mode, unclassified_reads, validate_schemas, output_schemas, console, actor, permissions, upstreams, allow, deny, listen, resource_url, auth, allowed_hosts, allowed_origins, call_timeout, limits, policy, environment, notifications)`,
	}
	var got []string
	for _, e := range errs {
		got = append(got, e.Error())
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestExpansion(t *testing.T) {
	vars := env(map[string]string{"TOKEN": "t0k", "ROOT": "/srv", "EMPTY": "", "NESTED": "${TOKEN}"})
	for _, c := range []struct{ in, out string }{
		{"plain", "plain"},
		{"${TOKEN}", "t0k"},
		{"Bearer ${TOKEN}", "Bearer t0k"},
		{"${ROOT}/a:${ROOT}/b", "/srv/a:/srv/b"},
		{"x${EMPTY}y", "xy"},                         // set but empty is not missing
		{"$TOKEN and $ and }", "$TOKEN and $ and }"}, // only ${NAME} expands
		{"${NESTED}", "${TOKEN}"},                    // values are not expanded again
	} {
		body := "upstreams:\n  - name: fs\n    command: srv\n    args: [" + quote(c.in) + "]\n    env: {V: " + quote(c.in) + "}\n" +
			"  - name: gh\n    url: https://x\n    headers: {X-V: " + quote(c.in) + "}\n"
		g, errs := Parse("gw.yaml", []byte(body), vars)
		if len(errs) > 0 {
			t.Fatalf("%q: %v", c.in, errs)
		}
		if g.Upstreams[0].Args[0] != c.out || g.Upstreams[0].Env["V"] != c.out || g.Upstreams[1].Headers["X-V"] != c.out {
			t.Errorf("%q: args %q env %q header %q, want %q", c.in, g.Upstreams[0].Args[0], g.Upstreams[0].Env["V"], g.Upstreams[1].Headers["X-V"], c.out)
		}
	}
	// Names are never expanded: not the upstream's, the command, env keys or header keys.
	g, errs := Parse("gw.yaml", []byte("upstreams:\n  - name: fs\n    command: ${ROOT}/bin\n    cwd: ${ROOT}\n"), vars)
	if len(errs) > 0 || g.Upstreams[0].Command != "${ROOT}/bin" || g.Upstreams[0].Cwd != "${ROOT}" {
		t.Fatalf("command and cwd are taken literally: %+v %v", g, errs)
	}
	// Every missing variable is named, and a value is never echoed in an error.
	_, errs = Parse("gw.yaml", []byte("upstreams:\n  - name: fs\n    command: a\n    args: [\"${A}${TOKEN}${B}\"]\n"), vars)
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), "variable A is") || !strings.Contains(errs[1].Error(), "variable B is") ||
		strings.Contains(errs[0].Error()+errs[1].Error(), "t0k") {
		t.Fatalf("missing variables: %v", errs)
	}
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }

func TestJSONAndNullsAndAuthOpensListen(t *testing.T) {
	body := `{"upstreams": [{"name": "fs", "command": "srv", "namespace": false}],
 "listen": {"host": "0.0.0.0", "port": 8080}, "auth": {"keys": "/etc/keys.json"}, "actor": null}`
	g, errs := Parse("gw.json", []byte(body), nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if g.Upstreams[0].Namespace || g.Listen.Loopback() || g.Actor != DefaultActor || g.Resolve(g.Auth.Keys) != "/etc/keys.json" {
		t.Fatalf("%+v", g)
	}
	_, errs = Parse("gw.json", []byte(`{"upstreams": [], "upstreams": []}`), nil)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "gw.json:1: upstreams: duplicate key") {
		t.Fatalf("JSON duplicate: %v", errs)
	}
}

// TestSessionModes (issue 19): per_client is the default for url upstreams, shared for stdio
// ones (command or socket, issue 23); session: and resources: override.
func TestSessionModes(t *testing.T) {
	g, errs := Parse("gw.yaml", []byte("upstreams:\n  - {name: a, command: srv}\n  - {name: b, url: http://x/mcp}\n"+
		"  - {name: c, command: srv, session: per_client}\n  - {name: d, url: http://y/mcp, session: shared, resources: false}\n"+
		"  - {name: e, socket: /run/reversi/e.sock}\n  - {name: f, socket: /run/reversi//f.sock, session: per_client}\n"), nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if e, f := g.Upstreams[4], g.Upstreams[5]; e.Socket != "/run/reversi/e.sock" || f.Socket != "/run/reversi/f.sock" || !e.Stdio() || e.Command != "" || e.URL != "" {
		t.Errorf("socket upstreams: %+v %+v", e, f)
	}
	for i, want := range []bool{false, true, true, false, false, true} {
		if got := g.Upstreams[i].PerClient(); got != want {
			t.Errorf("upstream %s: per_client %v, want %v", g.Upstreams[i].Name, got, want)
		}
	}
	if g.Upstreams[1].NoResources || !g.Upstreams[3].NoResources {
		t.Errorf("resources: %+v", g.Upstreams)
	}
}

// TestOIDCIdentityFields: actor_prefix, uid_claim and email_claim are read (issue 16).
func TestOIDCIdentityFields(t *testing.T) {
	g, errs := Parse("gw.yaml", []byte("upstreams:\n  - name: fs\n    command: srv\nauth:\n  oidc: {issuer: https://id, audience: a, actor_claim: email, actor_prefix: \"oidc:\", uid_claim: oid, email_claim: mail}\n"), nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if o := g.Auth.OIDC; o.ActorClaim != "email" || o.ActorPrefix != "oidc:" || o.UIDClaim != "oid" || o.EmailClaim != "mail" {
		t.Fatalf("%+v", o)
	}
}

func TestLoopbackHosts(t *testing.T) {
	for h, want := range map[string]bool{"127.0.0.1": true, "127.8.0.1": true, "::1": true, "[::1]": true, "localhost": true, "LOCALHOST.": true,
		"0.0.0.0": false, "::": false, "10.0.0.1": false, "gateway.example.com": false, "localhost.example.com": false} {
		if IsLoopbackHost(h) != want {
			t.Errorf("%s: loopback %v, want %v", h, !want, want)
		}
	}
}

func TestLoadReadsTheProcessEnvironment(t *testing.T) {
	p := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(p, []byte("upstreams:\n  - name: fs\n    command: srv\n    env: {HOME: \"${GW_TEST_HOME}\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GW_TEST_HOME", "/home/gw")
	g, errs := Load(p)
	if len(errs) > 0 || g.Upstreams[0].Env["HOME"] != "/home/gw" || g.File != p || g.Dir != filepath.Dir(p) {
		t.Fatalf("%+v %v", g, errs)
	}
	if _, errs := Load(filepath.Join(t.TempDir(), "absent.yaml")); len(errs) != 1 || !os.IsNotExist(errs[0]) {
		t.Fatalf("absent file: %v", errs)
	}
}

// TestLimits: call_timeout and limits: are read, defaults fill the rest, and every bad value is
// reported at once with its path.
func TestLimits(t *testing.T) {
	g, errs := Parse("gw.yaml", []byte("upstreams: [{name: a, command: x}]\ncall_timeout: 5s\nlimits: {tools_per_upstream: 10, message_bytes: 65536, batch_size: 4, read_timeout: 2s}\n"), nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	want := DefaultLimits()
	want.ToolsPerUpstream, want.MessageBytes, want.BatchSize, want.ReadTimeout = 10, 65536, 4, 2*time.Second
	if g.CallTimeout != 5*time.Second || g.Limits != want {
		t.Fatalf("call_timeout %s, limits %s; want 5s, %s", g.CallTimeout, g.Limits, want)
	}
	_, errs = Parse("gw.yaml", []byte("upstreams: [{name: a, command: x}]\ncall_timeout: soon\nlimits: {tools_per_upstream: 0, message_bytes: 10, batch_size: x, idle_timeout: -1, pages: 3}\n"), nil)
	var got []string
	for _, e := range errs {
		got = append(got, e.Error())
	}
	for _, w := range []string{"call_timeout: invalid duration", "limits.tools_per_upstream: 0 is out of range", "limits.message_bytes: 10 bytes is out of range",
		"limits.batch_size: expected a whole number", "limits.idle_timeout:", `limits.pages: unknown field "pages"`} {
		if !strings.Contains(strings.Join(got, "\n"), w) {
			t.Errorf("missing %q in:\n%s", w, strings.Join(got, "\n"))
		}
	}
}
