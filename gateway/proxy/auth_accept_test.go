package proxy

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/auth"
	"github.com/reversi-gitops/reversi/gateway/auth/authtest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/egress"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/signing"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// Acceptance of issue 7 (seed "MCP gateway", Endpoints (HTTP mode) and `reversi.*` tools):
// a gateway in front of the real server-memory, authenticating with an API key file and a
// real OIDC issuer on 127.0.0.1 (authtest: discovery, JWKS, ES256 tokens from go-jose),
// reached by real go-sdk clients over Streamable HTTP.

const testAudience = "https://gateway.test"

// oidcRoleMap maps the test issuer's groups to Reversi roles.
var oidcRoleMap = map[string]string{"bots": "agent", "audit": "auditor", "approvers": "approver", "ops-team": "operator", "sre": "admin"}

type authFixture struct {
	*fixture
	base   string
	issuer *authtest.Issuer
	keys   map[string]string // principal -> API key secret
	pub    string            // the evidence signing public key file
	keyID  string
}

// keyPrincipals are the API keys of the fixture: principal, role, groups, max_permissions.
var keyPrincipals = []struct {
	principal string
	role      auth.Role
	groups    []string
	maxPerms  []string
}{
	{"ci-bot", auth.Agent, nil, nil},
	{"other-bot", auth.Agent, nil, nil},
	{"reader-bot", auth.Agent, nil, []string{"memory:read"}},
	{"audrey", auth.Auditor, nil, nil},
	{"april", auth.Approver, []string{"ops"}, nil},
	{"bert", auth.Approver, []string{"ops"}, nil},
	{"nina", auth.Approver, nil, nil},
	{"olga", auth.Operator, nil, nil},
	{"adam", auth.Admin, nil, nil},
}

func startAuth(t *testing.T) *authFixture {
	t.Helper()
	is, err := authtest.NewIssuer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = is.Close() })
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "keys.json")
	f := &authFixture{issuer: is, keys: map[string]string{}}
	for _, k := range keyPrincipals {
		var mp *[]string
		if k.maxPerms != nil {
			p := k.maxPerms
			mp = &p
		}
		_, secret, err := auth.AddKey(keyFile, k.principal, k.role, mp, k.groups)
		if err != nil {
			t.Fatal(err)
		}
		f.keys[k.principal] = secret
	}
	if f.keyID, err = signing.GenerateKeyFiles(filepath.Join(dir, "evidence")); err != nil {
		t.Fatal(err)
	}
	f.pub = filepath.Join(dir, "evidence.pub")
	signer, _, err := signing.LoadSigner(filepath.Join(dir, "evidence.key"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	cfg := memoryConfig(t, config.ModeEnforce)
	cfg.Deny = nil
	cfg.Listen = &config.Listen{Host: "127.0.0.1", Port: port}
	cfg.Auth = config.Auth{Keys: keyFile, OIDC: &config.OIDC{Issuer: is.URL, Audience: testAudience, RoleMap: oidcRoleMap}}
	cfg.AllowedOrigins = []string{"https://console.test"}
	ms := loadAgentManifests(t)
	f.fixture = startWith(t, cfg, Options{Manifests: ms, Signer: signer, Load: func(context.Context) (Loaded, error) { return Loaded{Manifests: ms}, nil }})
	f.base = serveOn(t, f.gw, ln)
	return f
}

// serveOn serves the gateway on ln until the test ends and returns its base URL.
func serveOn(t *testing.T, gw *Gateway, ln net.Listener) string {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gw.ServeListener(ctx, ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("ServeListener: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// oidcToken is a token of the test issuer for sub with the given groups.
func (f *authFixture) oidcToken(t *testing.T, sub string, groups ...string) string {
	t.Helper()
	tok, err := f.issuer.Token(authtest.Claims{Subject: sub, Audience: []string{testAudience}, Extra: map[string]any{"groups": groups}})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// headerRT adds headers to every request.
type headerRT struct {
	h    http.Header
	base http.RoundTripper
}

func (h headerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.h {
		r.Header[k] = v
	}
	return h.base.RoundTrip(r)
}

// connect opens an MCP session at base+path with the bearer token (and extra headers).
func dial(t *testing.T, url, token string, extra ...string) (*mcp.ClientSession, error) {
	t.Helper()
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		h.Set(extra[i], extra[i+1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "auth-test", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url, DisableStandaloneSSE: true,
			HTTPClient: &http.Client{Transport: headerRT{h: h, base: http.DefaultTransport}}}, nil)
	if err == nil {
		t.Cleanup(func() { _ = cs.Close() })
	}
	return cs, err
}

func mustConnect(t *testing.T, url, token string, extra ...string) *mcp.ClientSession {
	t.Helper()
	cs, err := dial(t, url, token, extra...)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	return cs
}

func toolNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	sort.Strings(names)
	return names
}

// post sends one JSON-RPC message to url with headers (name, value pairs) and returns the
// response.
func post(t *testing.T, url, body string, headers ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" {
			req.Host = headers[i+1]
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = res.Body.Close() })
	return res
}

const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

func readBody(t *testing.T, res *http.Response) string {
	t.Helper()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

var readTools = []string{ToolDryRunRollback, ToolGetActionTrace, ToolGetRun, ToolListRuns, ToolPlanRollback, ToolPreviewImpact, ToolSearch, ToolValidateManifest}

// operatorTools is what each role reaches on /operator/mcp (seed: the operator table).
func operatorTools(r auth.Role) []string {
	out := append([]string{}, readTools...)
	out = append(out, ToolClassification, ToolListApprovals, ToolExportEvidence, ToolSuggestManifest)
	if r.AtLeast(auth.Approver) {
		out = append(out, ToolApproveAction, ToolDenyAction)
	}
	if r.AtLeast(auth.Operator) {
		out = append(out, ToolExecuteRollback)
	}
	if r.AtLeast(auth.Admin) {
		out = append(out, ToolHalt, ToolResume, ToolReload)
	}
	sort.Strings(out)
	return out
}

func TestAuthRolesReachExactlyTheirTools(t *testing.T) {
	f := startAuth(t)
	upstreamTools := []string{"memory.add_observations", "memory.create_entities", "memory.create_relations", "memory.delete_entities",
		"memory.delete_observations", "memory.delete_relations", "memory.open_nodes", "memory.read_graph", "memory.search_nodes"}
	agentTools := append(append([]string{}, upstreamTools...), readTools...)
	sort.Strings(agentTools)

	type cred struct{ name, token string }
	byRole := map[auth.Role][]cred{}
	for _, k := range keyPrincipals {
		if k.maxPerms == nil && k.principal != "other-bot" && k.principal != "bert" && k.principal != "nina" {
			byRole[k.role] = append(byRole[k.role], cred{"key " + k.principal, f.keys[k.principal]})
		}
	}
	for group, role := range oidcRoleMap {
		byRole[auth.Role(role)] = append(byRole[auth.Role(role)], cred{"oidc " + group, f.oidcToken(t, "oidc-"+group, group)})
	}
	for _, role := range auth.Roles {
		for _, c := range byRole[role] {
			t.Run(string(role)+"/"+c.name, func(t *testing.T) {
				a := mustConnect(t, f.base+PathAgent, c.token)
				if got := toolNames(t, a); !slices.Equal(got, agentTools) {
					t.Errorf("/mcp tools = %v, want %v", got, agentTools)
				}
				// The operator tools do not exist on the agent endpoint.
				res, err := a.CallTool(context.Background(), &mcp.CallToolParams{Name: ToolHalt, Arguments: map[string]any{"reason": "x"}})
				if !refusedUnknown(res, err, ToolHalt) {
					t.Errorf("reversi.halt on /mcp: %v %v, want unknown tool", res, err)
				}
				if role == auth.Agent {
					res := post(t, f.base+PathOperator, initBody, "Authorization", "Bearer "+c.token)
					if body := readBody(t, res); res.StatusCode != http.StatusForbidden || !strings.Contains(body, "needs the auditor role or higher") {
						t.Errorf("agent on /operator/mcp: %d %s", res.StatusCode, body)
					}
					return
				}
				o := mustConnect(t, f.base+PathOperator, c.token)
				want := operatorTools(role)
				if got := toolNames(t, o); !slices.Equal(got, want) {
					t.Errorf("/operator/mcp tools = %v, want %v", got, want)
				}
				// A tool above the role is refused by name, with the role it needs.
				for tool, need := range OperatorRoles {
					if role.AtLeast(need) {
						continue
					}
					res := call(t, o, tool, map[string]any{"id": "apr-x", "reason": "x"})
					if !res.IsError || !strings.Contains(texts(res)[0], "needs the "+string(need)+" role or higher") {
						t.Errorf("%s as %s: %v", tool, role, texts(res))
					}
				}
			})
		}
	}
	if t.Failed() {
		return
	}
	// Nothing changed state: the admin-only tools were refused above.
	if h := f.gw.sec.halt.get(); h.Halted {
		t.Fatal("a refused reversi.halt halted the gateway")
	}
}

func TestAuthRefusalsAre401WithMetadata(t *testing.T) {
	f := startAuth(t)
	wantHeader := `Bearer resource_metadata="` + f.base + PathResourceMetadata + `"`
	mk := func(c authtest.Claims, forged bool) string {
		sign := f.issuer.Token
		if forged {
			sign = f.issuer.Forged
		}
		tok, err := sign(c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	ok := authtest.Claims{Subject: "ana", Audience: []string{testAudience}, Extra: map[string]any{"groups": []string{"sre"}}}
	other, expired := ok, ok
	other.Audience = []string{"https://another-gateway.test"}
	expired.Expiry = time.Now().Add(-2 * time.Minute)
	cases := map[string]string{
		"missing token":     "",
		"another audience":  mk(other, false),
		"expired token":     mk(expired, false),
		"bad signature":     mk(ok, true),
		"unknown API key":   auth.KeyPrefix + "0123456789ab_" + strings.Repeat("A", 43),
		"tampered API key":  f.keys["adam"][:len(f.keys["adam"])-2] + "zz",
		"no role in claims": mk(authtest.Claims{Subject: "ana", Audience: []string{testAudience}, Extra: map[string]any{"groups": []string{"interns"}}}, false),
	}
	for name, tok := range cases {
		for _, path := range []string{PathAgent, PathOperator, "/metrics"} {
			var hdr []string
			if tok != "" {
				hdr = []string{"Authorization", "Bearer " + tok}
			}
			res := post(t, f.base+path, initBody, hdr...)
			body := readBody(t, res)
			if res.StatusCode != http.StatusUnauthorized || res.Header.Get("WWW-Authenticate") != wantHeader {
				t.Errorf("%s on %s: %d %q %s", name, path, res.StatusCode, res.Header.Get("WWW-Authenticate"), body)
			}
		}
	}
	// The same token with the right audience, in time and well signed, passes.
	if _, err := dial(t, f.base+PathAgent, mk(ok, false)); err != nil {
		t.Fatalf("good token: %v", err)
	}
	// The metadata the header points at names the issuer (RFC 9728), for anyone.
	code, body := get(t, f.base+PathResourceMetadata)
	var meta struct {
		Resource             string   `json:"resource"`
		AuthorizationServers []string `json:"authorization_servers"`
	}
	if err := json.Unmarshal(body, &meta); code != 200 || err != nil || meta.Resource != f.base || !slices.Equal(meta.AuthorizationServers, []string{f.issuer.URL}) {
		t.Errorf("metadata: %d %s", code, body)
	}
	// Health is for anyone.
	if code, _ := get(t, f.base+"/healthz"); code != 200 {
		t.Errorf("/healthz: %d", code)
	}
	// /metrics: auditor and up.
	for who, want := range map[string]int{"ci-bot": 403, "audrey": 200} {
		req, _ := http.NewRequest("GET", f.base+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+f.keys[who])
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("/metrics as %s: %d, want %d", who, res.StatusCode, want)
		}
	}
}

func TestAuthForgedHostAndOrigin(t *testing.T) {
	f := startAuth(t)
	tok := "Bearer " + f.keys["ci-bot"]
	port := f.base[strings.LastIndex(f.base, ":")+1:]
	for _, tc := range []struct {
		name    string
		headers []string
		want    int
	}{
		{"forged Host", []string{"Host", "evil.example.com:" + port}, 403},
		{"forged Host on the operator endpoint", []string{"Host", "evil.example.com"}, 403},
		{"foreign Origin", []string{"Origin", "http://evil.example.com"}, 403},
		{"null Origin", []string{"Origin", "null"}, 403},
		{"allowed Origin", []string{"Origin", "https://console.test"}, 200},
		{"same origin", []string{"Origin", f.base}, 200},
		{"localhost Host", []string{"Host", "localhost:" + port}, 200},
	} {
		path := PathAgent
		if strings.Contains(tc.name, "operator") {
			path = PathOperator
		}
		res := post(t, f.base+path, initBody, append([]string{"Authorization", tok}, tc.headers...)...)
		if body := readBody(t, res); res.StatusCode != tc.want {
			t.Errorf("%s: %d, want %d: %s", tc.name, res.StatusCode, tc.want, body)
		}
	}
	// Refused before authentication: a forged Host learns nothing, not even the 401.
	res := post(t, f.base+PathAgent, initBody, "Host", "evil.example.com")
	if res.StatusCode != 403 || res.Header.Get("WWW-Authenticate") != "" {
		t.Errorf("forged Host without a token: %d %q", res.StatusCode, res.Header.Get("WWW-Authenticate"))
	}
}

func TestAuthSessionHijackAndRunContinuation(t *testing.T) {
	f := startAuth(t)
	// ci-bot opens a session; other-bot (also an agent) sends ci-bot's session id.
	res := post(t, f.base+PathAgent, initBody, "Authorization", "Bearer "+f.keys["ci-bot"])
	sid := res.Header.Get("Mcp-Session-Id")
	if res.StatusCode != 200 || sid == "" {
		t.Fatalf("initialize: %d %q %s", res.StatusCode, sid, readBody(t, res))
	}
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	for who, want := range map[string]int{"other-bot": 403, "adam": 403, "ci-bot": 200} {
		res := post(t, f.base+PathAgent, list, "Authorization", "Bearer "+f.keys[who], "Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-06-18")
		if body := readBody(t, res); res.StatusCode != want {
			t.Errorf("%s with ci-bot's session: %d, want %d: %s", who, res.StatusCode, want, body)
		}
	}
	// The same principal through OIDC is the same principal.
	oidcSelf := f.oidcToken(t, "ci-bot", "bots")
	if res := post(t, f.base+PathAgent, list, "Authorization", "Bearer "+oidcSelf, "Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-06-18"); res.StatusCode != 200 {
		t.Errorf("ci-bot by OIDC with its session: %d", res.StatusCode)
	}

	// ci-bot's run: the actor is the authenticated principal.
	a := mustConnect(t, f.base+PathAgent, f.keys["ci-bot"])
	if r := call(t, a, "memory.read_graph", map[string]any{}); r.IsError {
		t.Fatalf("read_graph: %v", texts(r))
	}
	runs, err := f.store.ListRuns(context.Background(), store.RunFilter{Actor: "ci-bot"})
	if err != nil || len(runs) != 1 {
		t.Fatalf("ci-bot's runs: %v %v", runs, err)
	}
	run := runs[0].ID
	// other-bot names ci-bot's run: refused, and nothing is journaled in it.
	before, _ := f.store.Records(context.Background(), run, 0, 0)
	b := mustConnect(t, f.base+PathAgent, f.keys["other-bot"], RunIDHeader, run)
	r := call(t, b, "memory.read_graph", map[string]any{})
	if !r.IsError || !strings.Contains(texts(r)[0], "the run could not be opened") || !strings.Contains(texts(r)[0], "belongs to another principal") {
		t.Errorf("other-bot continuing ci-bot's run: %v", texts(r))
	}
	after, _ := f.store.Records(context.Background(), run, 0, 0)
	if len(after) != len(before) {
		t.Errorf("the refused continuation wrote %d records into ci-bot's run", len(after)-len(before))
	}
	// ci-bot continues its own run in a new session.
	c := mustConnect(t, f.base+PathAgent, f.keys["ci-bot"], RunIDHeader, run)
	if r := call(t, c, "memory.read_graph", map[string]any{}); r.IsError {
		t.Fatalf("ci-bot continuing its run: %v", texts(r))
	}
	if after, _ := f.store.Records(context.Background(), run, 0, 0); len(after) != len(before)+2 {
		t.Errorf("continuation: %d records, want %d", len(after), len(before)+2)
	}
	// The agent read tools show a principal its own runs only; the operator endpoint any.
	if got := agent[ListRunsOut](t, b, ToolListRuns, map[string]any{}); len(got.Runs) != 0 {
		t.Errorf("other-bot sees runs %v", got.Runs)
	}
	if msg := agentErr(t, b, ToolGetRun, map[string]any{"run": run}); !strings.Contains(msg, "not found") {
		t.Errorf("other-bot get_run: %s", msg)
	}
	o := mustConnect(t, f.base+PathOperator, f.keys["audrey"])
	if got := agent[GetRunOut](t, o, ToolGetRun, map[string]any{"run": run}); got.Run.ID != run || len(got.Steps) != 2 {
		t.Errorf("auditor get_run: %+v", got)
	}
	if got := agent[SearchOut](t, o, ToolSearch, map[string]any{"what": "runs", "tool": "memory.read_graph"}); len(got.Runs) != 1 {
		t.Errorf("auditor search: %+v", got)
	}
	// ci-bot's first session, with a call (the fast path serves the session's own principal only, fastcall.go).
	callBody := `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"memory.read_graph","arguments":{}}}`
	for _, who := range []string{"other-bot", "adam", "ci-bot", "other-bot"} {
		want := map[string]int{"other-bot": 403, "adam": 403, "ci-bot": 200}[who]
		res := post(t, f.base+PathAgent, callBody, "Authorization", "Bearer "+f.keys[who], "Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-06-18")
		body := readBody(t, res)
		if res.StatusCode != want {
			t.Errorf("%s calling with ci-bot's session: %d, want %d: %s", who, res.StatusCode, want, body)
		}
		if who == "ci-bot" && (res.Header.Get("Content-Type") != "application/json" || !strings.Contains(body, `"result"`)) {
			t.Errorf("ci-bot's call was not answered by the fast path (a JSON body): %s %s", res.Header.Get("Content-Type"), body)
		}
	}
}

var approvalIDRe = regexp.MustCompile(`apr-[0-9a-f]+`)

func TestAuthOperatorTools(t *testing.T) {
	f := startAuth(t)
	ctx := context.Background()
	bot := mustConnect(t, f.base+PathAgent, f.keys["ci-bot"])
	reader := mustConnect(t, f.base+PathAgent, f.keys["reader-bot"])
	audrey := mustConnect(t, f.base+PathOperator, f.keys["audrey"])
	april := mustConnect(t, f.base+PathOperator, f.keys["april"])
	bert := mustConnect(t, f.base+PathOperator, f.oidcToken(t, "bert", "approvers", "ops"))
	nina := mustConnect(t, f.base+PathOperator, f.keys["nina"])
	adam := mustConnect(t, f.base+PathOperator, f.keys["adam"])

	// max_permissions caps the scope: reader-bot may read, not write.
	if r := call(t, reader, "memory.read_graph", map[string]any{}); r.IsError {
		t.Fatalf("reader-bot read_graph: %v", texts(r))
	}
	ent := map[string]any{"entities": []any{map[string]any{"name": "n1", "entityType": "t", "observations": []any{}}}}
	if r := call(t, reader, "memory.create_entities", ent); !r.IsError || !strings.Contains(texts(r)[0], "outside this session's scope") {
		t.Errorf("reader-bot create_entities: %v", texts(r))
	}
	if r := call(t, bot, "memory.create_entities", ent); r.IsError {
		t.Fatalf("ci-bot create_entities: %v", texts(r))
	}

	// Approvals: delete_entities needs two approvers holding ops.
	del := map[string]any{"entityNames": []any{"n1"}}
	r := call(t, bot, "memory.delete_entities", del)
	id := approvalIDRe.FindString(strings.Join(texts(r), " "))
	if !r.IsError || id == "" {
		t.Fatalf("delete_entities: %v", texts(r))
	}
	la := agent[ListApprovalsOut](t, audrey, ToolListApprovals, map[string]any{"state": "pending"})
	if len(la.Approvals) != 1 || la.Approvals[0].ID != id || la.Approvals[0].Actor != "ci-bot" || la.Approvals[0].Quorum != 2 {
		t.Fatalf("list_approvals: %+v", la)
	}
	if msg := agentErr(t, nina, ToolApproveAction, map[string]any{"id": id}); !strings.Contains(msg, "needs an approver holding one of the roles ops") {
		t.Errorf("nina (no ops group): %s", msg)
	}
	a1 := agent[ApprovalOut](t, april, ToolApproveAction, map[string]any{"id": id, "comment": "fine"})
	if a1.State != "pending" || a1.Approvals != 1 || a1.Decisions[0].By != "april" || !slices.Contains(a1.Decisions[0].Roles, "ops") {
		t.Errorf("april's approval: %+v", a1)
	}
	if msg := agentErr(t, april, ToolApproveAction, map[string]any{"id": id}); !strings.Contains(msg, "april has already decided it") {
		t.Errorf("april twice: %s", msg)
	}
	if r := call(t, bot, "memory.delete_entities", del); !r.IsError {
		t.Fatal("the retry passed before the quorum")
	}
	a2 := agent[ApprovalOut](t, bert, ToolApproveAction, map[string]any{"id": id})
	if a2.State != "approved" || a2.Decisions[1].By != "bert" {
		t.Fatalf("bert's approval (OIDC, group ops): %+v", a2)
	}
	if r := call(t, bot, "memory.delete_entities", del); r.IsError {
		t.Fatalf("the approved retry: %v", texts(r))
	}
	// deny_action on a second request.
	call(t, bot, "memory.create_entities", map[string]any{"entities": []any{map[string]any{"name": "n2", "entityType": "t", "observations": []any{}}}})
	r = call(t, bot, "memory.delete_entities", map[string]any{"entityNames": []any{"n2"}})
	id2 := approvalIDRe.FindString(strings.Join(texts(r), " "))
	if d := agent[ApprovalOut](t, april, ToolDenyAction, map[string]any{"id": id2, "comment": "no"}); d.State != "denied" {
		t.Errorf("deny_action: %+v", d)
	}

	// classification: the banner of the tools served.
	cl := agent[ClassificationOut](t, audrey, ToolClassification, map[string]any{})
	if cl.Mode != "enforce" || !strings.HasPrefix(cl.Banner, "Reversi gateway running in enforce mode.") || len(cl.Tools) != 9 || cl.Classified != 6 {
		t.Errorf("classification: %+v", cl)
	}

	// Kill switch: every upstream call is blocked, journaled, with the reason; then resumed.
	h := agent[HaltOut](t, adam, ToolHalt, map[string]any{"reason": "incident 42"})
	if !h.Halted || h.By != "adam" {
		t.Fatalf("halt: %+v", h)
	}
	r = call(t, bot, "memory.read_graph", map[string]any{})
	if !r.IsError || !strings.HasPrefix(texts(r)[0], "Blocked by Reversi: the gateway is halted (kill switch) by adam") || !strings.Contains(texts(r)[0], "incident 42") {
		t.Errorf("call while halted: %v", texts(r))
	}
	// Blocked calls never reach the upstream: a write does not happen.
	call(t, bot, "memory.create_entities", map[string]any{"entities": []any{map[string]any{"name": "while-halted", "entityType": "t", "observations": []any{}}}})
	if rs := agent[HaltOut](t, adam, ToolResume, map[string]any{}); rs.Halted {
		t.Fatalf("resume: %+v", rs)
	}
	r = call(t, bot, "memory.read_graph", map[string]any{})
	if r.IsError || strings.Contains(strings.Join(texts(r), " "), "while-halted") {
		t.Errorf("after resume: %v", texts(r))
	}
	notes := gatewayRecords(t, f.store, store.KindNote)
	var noteTexts []string
	for _, n := range notes {
		noteTexts = append(noteTexts, n.Note)
	}
	if !slices.Contains(noteTexts, "halted by adam: incident 42") || !slices.Contains(noteTexts, "resumed by adam") {
		t.Errorf("journal notes: %q", noteTexts)
	}
	blocked, err := f.store.SearchRecords(ctx, store.RecordSearch{Actor: "ci-bot", Status: store.Blocked, Text: "kill switch"})
	if err != nil || len(blocked) != 2 {
		t.Errorf("blocked records while halted: %d %v", len(blocked), err)
	}

	// reload: nothing changed on disk.
	rl := agent[ReloadOut](t, adam, ToolReload, map[string]any{})
	if rl.Changed || rl.Tools != 6 || rl.ManifestChecksum != f.gw.Digest() || rl.PolicyChecksum != "" || rl.Error != "" {
		t.Errorf("reload: %+v", rl)
	}

	// export_evidence: signed; the signature covers the payload's digest.
	ev := agent[ExportEvidenceOut](t, audrey, ToolExportEvidence, map[string]any{})
	if !ev.Signed || ev.KeyID != f.keyID || ev.Algorithm != "Ed25519" {
		t.Fatalf("export_evidence: %+v", ev)
	}
	ts, err := signing.LoadTrustSet(f.pub)
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := base64.StdEncoding.DecodeString(ev.Signature)
	if err := ts.Verify(ev.KeyID, sig, []byte(EvidenceSigningPrefix+ev.Digest)); err != nil {
		t.Errorf("signature: %v", err)
	}
	if err := ts.Verify(ev.KeyID, sig, []byte(EvidenceSigningPrefix+ev.Digest+"0")); err == nil {
		t.Error("the signature verifies another digest")
	}
	var p EvidencePayload
	if err := json.Unmarshal([]byte(ev.Payload), &p); err != nil || p.ExportedBy != "audrey" || len(p.Records) != ev.Records || ev.Records < 10 {
		t.Errorf("payload: %v %+v", err, p)
	}
	if !bytes.Contains([]byte(ev.Payload), []byte("halted by adam")) {
		t.Error("the evidence misses the gateway journal")
	}
}

func TestAuthStartRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := store.NewMemory(nil)
	// Beyond loopback without auth: refused before any upstream starts.
	cfg := memoryConfig(t, config.ModeEnforce)
	cfg.Listen = &config.Listen{Host: "0.0.0.0", Port: 7431}
	_, err := New(ctx, Options{Config: cfg, Store: st})
	if err == nil || err.Error() != `listen.host "0.0.0.0" is not loopback: the gateway refuses to listen beyond loopback without authentication (set auth.keys or auth.oidc in the gateway config)` {
		t.Errorf("0.0.0.0 without auth: %v", err)
	}
	// Egress: url upstreams are checked at start with `upstream <name>: <reason>`.
	for _, tc := range []struct {
		url   string
		rules *egress.Rules
		want  string
	}{
		{"http://169.254.169.254/mcp", nil, "upstream meta: 169.254.169.254 is a cloud metadata address, which is always refused"},
		{"http://metadata.google.internal/mcp", &egress.Rules{AllowedHosts: []string{"metadata.google.internal"}}, "upstream meta: metadata.google.internal is a cloud metadata endpoint, which is always refused"},
		{"http://127.0.0.1:9/mcp", &egress.Rules{BlockPrivate: true}, "upstream meta: 127.0.0.1 is a private address and egress.block_private is set in reversi.config.yaml"},
		{"http://127.0.0.1:9/mcp", &egress.Rules{AllowedHosts: []string{"mcp.example.com"}}, "upstream meta: host 127.0.0.1 is not in egress.allowed_hosts (mcp.example.com) of reversi.config.yaml"},
	} {
		cfg := &config.Gateway{Actor: "a", Upstreams: []config.Upstream{{Name: "meta", URL: tc.url, Namespace: true}}}
		_, err := New(ctx, Options{Config: cfg, Store: st, Egress: tc.rules})
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s: %v, want %q", tc.url, err, tc.want)
		}
	}
}

// TestNoAuthLoopback: without auth the agent endpoint is unauthenticated (the config's
// actor) and the operator endpoint is not served.
func TestNoAuthLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := memoryConfig(t, config.ModeObserve)
	cfg.Listen = &config.Listen{Host: "127.0.0.1", Port: ln.Addr().(*net.TCPAddr).Port}
	f := startWith(t, cfg, Options{})
	base := serveOn(t, f.gw, ln)
	a := mustConnect(t, base+PathAgent, "")
	if r := call(t, a, "memory.read_graph", map[string]any{}); r.IsError {
		t.Fatal(texts(r))
	}
	if runs, _ := f.store.ListRuns(context.Background(), store.RunFilter{Actor: "dev-laptop"}); len(runs) != 1 {
		t.Errorf("runs of the config's actor: %v", runs)
	}
	res := post(t, base+PathOperator, initBody)
	if body := readBody(t, res); res.StatusCode != 404 || !strings.Contains(body, "served only with authentication") {
		t.Errorf("/operator/mcp without auth: %d %s", res.StatusCode, body)
	}
	if res := post(t, base+PathAgent, initBody, "Host", "evil.example.com"); res.StatusCode != 403 {
		t.Errorf("forged Host without auth: %d", res.StatusCode)
	}
}

// TestDNSRebindingConformance runs the MCP conformance suite's dns-rebinding-protection
// scenario (@modelcontextprotocol/conformance on Node.js 22) against a loopback gateway
// without auth, the case it is written for.
func TestDNSRebindingConformance(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := memoryConfig(t, config.ModeObserve)
	cfg.Listen = &config.Listen{Host: "127.0.0.1", Port: ln.Addr().(*net.TCPAddr).Port}
	f := startWith(t, cfg, Options{})
	base := serveOn(t, f.gw, ln)
	node, args := upstreams.Conformance(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append(args, "server", "--url", base+PathAgent, "--scenario", "dns-rebinding-protection", "-o", t.TempDir())...)
	out, err := cmd.CombinedOutput()
	t.Logf("conformance:\n%s", out)
	if err != nil {
		t.Fatalf("dns-rebinding-protection: %v", err)
	}
	for _, check := range []string{"localhost-host-rebinding-rejected", "localhost-host-valid-accepted"} {
		if !regexp.MustCompile(`\[` + check + `\s*\]\S*\s+\S*SUCCESS`).Match(out) {
			t.Errorf("%s did not succeed", check)
		}
	}
	if !bytes.Contains(out, []byte("Passed: 2/2, 0 failed")) {
		t.Error("the scenario did not pass 2 of 2 checks")
	}
}
