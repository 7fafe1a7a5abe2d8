package redteam

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/auth"
	"github.com/reversi-gitops/reversi/internal/podrun"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/pkg/source/sourcetest"
)

// The approvals world (issue 16): names, identities and manifests.
const (
	opsGW = "ops"

	actor7      = "agent-7" // pay's agent: the runs' actor
	actor7UID   = "u-agent-7"
	actor7Email = "agent-7@corp.example"
	actor9      = "agent-9" // ops's agent

	// The users minted by envtest (client certificates; CN username, O groups).
	alice = "alice" // finance
	bob   = "bob"   // finance
	carol = "carol" // not finance
	// emailAlias is a finance user whose username is the actor's e-mail.
	emailAlias = actor7Email
	// uidAlias is a finance user with the actor's uid under another username. envtest's
	// certificates cannot carry a uid, so it is the admin impersonating it.
	uidAlias = "seven"

	toolCreate = "memory.create_entities"
)

// Reasons, events and texts of issue 16 (design16.md), as strings: the tests are written
// against the design, before the fixes.
const (
	textOtherGateway  = "belongs to another gateway"
	outcomeApproval   = "approval"
	eventIgnored      = "ignored"
	eventCounted      = "counted"
	eventRejected     = "rejected"
	eventApproved     = "approved"
	eventDenied       = "denied"
	eventConsumed     = "consumed"
	textBeforeRequest = "before its request"
)

// approvalManifests: memory.create_entities needs two distinct finance approvers.
const approvalManifests = `- tool: memory.read_graph
  description: Read the whole knowledge graph.
  effect: read_only
  permission: memory:read
- tool: memory.create_entities
  description: Create entities (existing names are left alone). Two of finance sign off on each call.
  effect: idempotent
  permission: memory:write
  approval: {roles: [finance], quorum: 2, timeout: 30m}
`

// createFor is a create_entities call of one entity, its name unique to a test.
func createFor(name string) map[string]any {
	return map[string]any{"entities": []any{map[string]any{"name": name, "entityType": "customer", "observations": []any{"redteam " + name}}}}
}

// approvalsWorld is the world of issue 16's attacks: envtest with the webhook configurations
// of config/webhook, the controller process serving the webhooks, two ReversiGateways (pay and
// ops) in namespace agents, each played as its Deployment's process with its ServiceAccount's
// token, both fronting their own server-memory with the same signed registry; agent-7's API
// key (uid and e-mail) on pay, agent-9's on ops; users minted with groups.
type approvalsWorld struct {
	*world
	ops          *gateway
	agent9Key    string
	users        map[string]string        // username → kubeconfig
	clients      map[string]client.Client // username → client (also uidAlias, impersonated)
	paySA, opsSA client.Client            // the gateways' ServiceAccounts
	paySAName    string                   // system:serviceaccount:agents:<pay's ServiceAccount>
}

func newApprovalsWorld(t *testing.T) *approvalsWorld {
	w := newControlPlane(t, testenv.Options{Webhooks: true})
	aw := &approvalsWorld{world: w, users: map[string]string{}, clients: map[string]client.Client{}}
	env := w.env

	// Approvers: every authenticated user may create Approvals and read requests and runs
	// (config/rbac/approver_role.yaml's rules); the controller decides who counts.
	must(t, w.k8s.Create(w.ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "approver"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"approvalrequests", "reversiruns"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"approvals"}, Verbs: []string{"get", "list", "watch", "create"}},
	}}))
	must(t, w.k8s.Create(w.ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "approvers"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "approver"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}}}))
	for name, groups := range map[string][]string{alice: {"finance"}, bob: {"finance"}, carol: {"sales"}, emailAlias: {"finance"}} {
		kc, err := env.UserKubeconfig(w.dir, name, groups...)
		must(t, err)
		aw.users[name] = kc
		cfg, err := clientcmd.BuildConfigFromFlags("", kc)
		must(t, err)
		aw.clients[name] = aw.newClient(t, cfg)
	}
	imp := rest.CopyConfig(env.Config)
	imp.Impersonate = rest.ImpersonationConfig{UserName: uidAlias, UID: actor7UID, Groups: []string{"finance"}}
	aw.clients[uidAlias] = aw.newClient(t, imp)

	// Keys: the registry writer's, the committer's, the agents' API keys (one Secret; each
	// gateway's agent connects to its own gateway only).
	w.reversi(t, w.dir, "keygen", filepath.Join(w.dir, "writer"))
	w.writerKey = filepath.Join(w.dir, "writer.key")
	writerPub, err := os.ReadFile(filepath.Join(w.dir, "writer.pub"))
	must(t, err)
	w.committer = sourcetest.NewSSHKey(t)
	agent7, key7, err := auth.NewKey(actor7, auth.Agent, nil, nil)
	must(t, err)
	agent9, key9, err := auth.NewKey(actor9, auth.Agent, nil, nil)
	must(t, err)
	w.agentKey, aw.agent9Key = key7, key9
	keyFile, err := json.Marshal(map[string]any{"keys": []any{keyEntryJSON(t, agent7, actor7UID, actor7Email), keyEntryJSON(t, agent9, "", "")}})
	must(t, err)
	w.createKeySecrets(t, writerPub, keyFile)

	// The registry: create_entities needs finance quorum 2.
	w.memory = w.newGitRegistry(t, memoryReg, "registry")
	w.publish(t, w.memory, approvalManifests, "approved")
	w.memory.repo.CommitSigned("memory tools: finance quorum 2 for create_entities", w.committer)

	// The controller serves the webhooks where the API server calls them.
	wh := env.WebhookInstallOptions
	w.controllerFlags = []string{"--webhooks=true", "--webhook-port", strconv.Itoa(wh.LocalServingPort), "--webhook-cert-dir", wh.LocalServingCertDir}
	w.ctrlTemp = filepath.Join(w.dir, "checkouts")
	must(t, os.MkdirAll(w.ctrlTemp, 0o700))
	w.startController(t)
	t.Cleanup(func() { w.controller.Stop() })
	aw.waitWebhookServing(t)
	if err := podrun.Poll(w.ctx, 30*time.Second, func() string {
		if err := aw.forgedApproverDryRun("apr-probe"); err == nil || strings.Contains(err.Error(), "failed calling webhook") {
			return fmt.Sprintf("the webhooks do not refuse an Approval with a hand-written approver: %v", err)
		}
		return ""
	}); err != nil {
		t.Fatalf("world: %v", err)
	}

	w.createRegistry(t, w.memory, v1alpha1.FormatRegistry, &v1alpha1.GitRef{Branch: "main"}, &v1alpha1.RegistryVerification{
		ManifestKeysSecretRef: &v1alpha1.LocalObjectReference{Name: "manifest-keys"},
		Commit:                &v1alpha1.CommitVerification{Mode: "HEAD", SecretRef: v1alpha1.LocalObjectReference{Name: "committers"}}})
	w.waitReady(t, memoryReg, 60*time.Second)
	trusted := &v1alpha1.LocalObjectReference{Name: "manifest-keys"}
	w.pay = w.startGateway(t, payGW, memoryReg, trusted)
	aw.ops = w.startGateway(t, opsGW, memoryReg, trusted)

	aw.paySA = aw.serviceAccountClient(t, w.pay)
	aw.opsSA = aw.serviceAccountClient(t, aw.ops)
	aw.paySAName = "system:serviceaccount:" + ns + ":" + w.pay.pod.Spec.ServiceAccountName
	return aw
}

func (aw *approvalsWorld) newClient(t testing.TB, cfg *rest.Config) client.Client {
	t.Helper()
	c, err := client.New(cfg, client.Options{Scheme: aw.env.Scheme})
	must(t, err)
	return c
}

// serviceAccountClient is a client with a token of the gateway pod's ServiceAccount.
func (aw *approvalsWorld) serviceAccountClient(t testing.TB, g *gateway) client.Client {
	t.Helper()
	sa := g.pod.Spec.ServiceAccountName
	cfg, err := podrun.ServiceAccountKubeconfig(aw.ctx, aw.env.Config, ns, sa, filepath.Join(aw.dir, g.name+"-sa.kubeconfig"))
	must(t, err)
	return aw.newClient(t, cfg)
}

// waitWebhookServing waits until the controller process answers TLS on the host and port the
// webhook configurations name (envtest's LocalServingHost:LocalServingPort).
func (aw *approvalsWorld) waitWebhookServing(t testing.TB) {
	t.Helper()
	wh := aw.env.WebhookInstallOptions
	addr := net.JoinHostPort(wh.LocalServingHost, strconv.Itoa(wh.LocalServingPort))
	if err := podrun.Poll(aw.ctx, 60*time.Second, func() string {
		if exited, err := aw.controller.Exited(); exited {
			return fmt.Sprintf("the controller exited (%v): %s", err, aw.controller.Tail(2048))
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a probe of the port only
		if err != nil {
			return "the webhook server at " + addr + ": " + err.Error()
		}
		_ = conn.Close()
		return ""
	}); err != nil {
		t.Fatal(err)
	}
}

// keyEntryJSON is an API key entry as keys.json holds it, with the optional uid and email of
// issue 16 when auth.KeyEntry declares them (json names "uid" and "email"): the gateway's key
// file is parsed strictly, so fields it does not know yet would stop it. Until the gateway
// side lands the actor has no uid or e-mail in its requests, and the alias attack shows it.
func keyEntryJSON(t testing.TB, e auth.KeyEntry, uid, email string) map[string]any {
	t.Helper()
	b, err := json.Marshal(e)
	must(t, err)
	var m map[string]any
	must(t, json.Unmarshal(b, &m))
	for name, v := range map[string]string{"uid": uid, "email": email} {
		if v != "" && keyEntryHas(name) {
			m[name] = v
		}
	}
	return m
}

func keyEntryHas(jsonName string) bool {
	rt := reflect.TypeFor[auth.KeyEntry]()
	for i := range rt.NumField() {
		if name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ","); name == jsonName {
			return true
		}
	}
	return false
}

// runHeaders sends the API key and the run id the session asks to continue (Reversi-Run-Id).
type runHeaders struct{ key, run string }

func (h runHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+h.key)
	if h.run != "" {
		r.Header.Set("Reversi-Run-Id", h.run)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// session is one agent session on a gateway, in the run the test names.
type session struct {
	g   *gateway
	who string
	run string
	cs  *mcp.ClientSession
}

// open connects who (with key) to g, asking for run id run.
func (aw *approvalsWorld) open(t testing.TB, g *gateway, who, key, run string) *session {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: who, Version: "1"}, nil).Connect(aw.ctx, &mcp.StreamableClientTransport{
		Endpoint: g.endpoint() + "/mcp", HTTPClient: &http.Client{Transport: runHeaders{key: key, run: run}}}, nil)
	if err != nil {
		t.Fatalf("%s cannot connect to gateway %s: %v", who, g.name, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return &session{g: g, who: who, run: run, cs: cs}
}

// open7 is agent-7's session on pay in run.
func (aw *approvalsWorld) open7(t testing.TB, run string) *session {
	return aw.open(t, aw.pay, actor7, aw.agentKey, run)
}

// call makes one tool call; a protocol error counts as a refusal with its text.
func (s *session) call(t testing.TB, tool string, args map[string]any) (string, bool) {
	t.Helper()
	text, isErr, err := podrun.CallTool(s.g.w.ctx, s.cs, tool, args)
	if err != nil {
		return err.Error(), true
	}
	return text, isErr
}

// held makes the call and requires it to be held for approval; it returns the request's name.
func (s *session) held(t testing.TB, tool string, args map[string]any) string {
	t.Helper()
	text, isErr := s.call(t, tool, args)
	m := requestID.FindStringSubmatch(text)
	if !isErr || !strings.Contains(text, "requires approval") || m == nil {
		t.Fatalf("%s on %s in run %s is not held for approval: error=%v %q", tool, s.g.name, s.run, isErr, oneLine(text))
	}
	return m[1]
}

// heldOrPassed makes the call: the request it is held for, or "" when it passed.
func (s *session) heldOrPassed(t testing.TB, tool string, args map[string]any) (string, string) {
	t.Helper()
	text, isErr := s.call(t, tool, args)
	if !isErr {
		return "", text
	}
	if m := requestID.FindStringSubmatch(text); m != nil && strings.Contains(text, "requires approval") {
		return m[1], text
	}
	return "-", text
}

// passesOnce retries the call (it may be held a moment while the gateway's cache catches up
// with the decision) until it passes, then requires the same call again to be held for a new
// request: the approval of id let exactly one execution through.
func (s *session) passesOnce(t testing.TB, tool string, args map[string]any, id string) bool {
	t.Helper()
	var text string
	passed := podrun.Poll(s.g.w.ctx, 20*time.Second, func() string {
		var isErr bool
		text, isErr = s.call(t, tool, args)
		if !isErr {
			return ""
		}
		if !strings.Contains(text, "request "+id) {
			return "stop"
		}
		return "held: " + oneLine(text)
	}) == nil
	if !passed {
		t.Errorf("honest path: the retry of %s after %s was approved did not pass: %q", tool, id, oneLine(text))
		return false
	}
	next, text := s.heldOrPassed(t, tool, args)
	switch next {
	case "":
		t.Errorf("the approval %s let a second execution of %s through: %q", id, tool, oneLine(text))
		return false
	case id, "-":
		t.Errorf("the call after the approved one is not held for a new request: %q", oneLine(text))
		return false
	}
	return true
}

// decide makes who's decision on request with `reversi approve|deny REQUEST --apply` and
// the user's kubeconfig.
func (aw *approvalsWorld) decide(t testing.TB, who, request, decision string) (string, error) {
	t.Helper()
	verb := "approve"
	if decision == v1alpha1.DecisionDeny {
		verb = "deny"
	}
	cmd := exec.CommandContext(aw.ctx, reversiBin, verb, request, "--apply", "--kubeconfig", aw.users[who], "-n", ns, "--reason", "redteam "+who)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// mustDecide is decide, failing the test when the Approval is not created.
func (aw *approvalsWorld) mustDecide(t testing.TB, who, request, decision string) {
	t.Helper()
	if out, err := aw.decide(t, who, request, decision); err != nil {
		t.Fatalf("reversi %s %s as %s: %v\n%s", decision, request, who, err, out)
	}
}

var nameUnsafe = regexp.MustCompile(`[^a-z0-9-]+`)

// approvalName is the name `reversi approve` gives who's Approval of request.
func approvalName(request, who string) string {
	return request + "-" + strings.Trim(nameUnsafe.ReplaceAllString(strings.ToLower(who), "-"), "-")
}

// honest is the honest path: alice and bob (finance) approve id; the request becomes
// Approved with both counted; the agent's retry passes once; the ledger records the
// consumption.
func (aw *approvalsWorld) honest(t testing.TB, s *session, args map[string]any, id string) bool {
	t.Helper()
	aw.mustDecide(t, alice, id, v1alpha1.DecisionApprove)
	aw.mustDecide(t, bob, id, v1alpha1.DecisionApprove)
	ar, ok := aw.waitRequest(t, id, 20*time.Second, func(ar *v1alpha1.ApprovalRequest) string {
		if ar.Status.Phase != v1alpha1.ApprovalApproved || ar.Status.ApprovedCount != 2 {
			return fmt.Sprintf("phase %s, %d approved", ar.Status.Phase, ar.Status.ApprovedCount)
		}
		return ""
	})
	if !ok {
		t.Errorf("honest path: %s is not Approved by alice and bob: phase %s, %d approved, %s; rejected %s",
			id, ar.Status.Phase, ar.Status.ApprovedCount, oneLine(ar.Status.Message), rejectedText(ar))
		return false
	}
	if !s.passesOnce(t, toolCreate, args, id) {
		return false
	}
	aw.wantRecord(t, s.run, id, eventConsumed, "")
	aw.wantRecordCount(t, s.run, id, eventConsumed, 1)
	return true
}

// request reads an ApprovalRequest.
func (aw *approvalsWorld) request(t testing.TB, name string) *v1alpha1.ApprovalRequest {
	t.Helper()
	ar := &v1alpha1.ApprovalRequest{}
	must(t, aw.k8s.Get(aw.ctx, types.NamespacedName{Namespace: ns, Name: name}, ar))
	return ar
}

// waitRequest waits (bounded) until cond of the request says "", and returns it.
func (aw *approvalsWorld) waitRequest(t testing.TB, name string, timeout time.Duration, cond func(*v1alpha1.ApprovalRequest) string) (*v1alpha1.ApprovalRequest, bool) {
	t.Helper()
	ar := &v1alpha1.ApprovalRequest{}
	err := podrun.Poll(aw.ctx, timeout, func() string {
		if err := aw.k8s.Get(aw.ctx, types.NamespacedName{Namespace: ns, Name: name}, ar); err != nil {
			return err.Error()
		}
		return cond(ar)
	})
	return ar, err == nil
}

// waitApproval waits (bounded) until the Approval has a result, and returns it.
func (aw *approvalsWorld) waitApproval(t testing.TB, name string, timeout time.Duration) *v1alpha1.Approval {
	t.Helper()
	apr := &v1alpha1.Approval{}
	_ = podrun.Poll(aw.ctx, timeout, func() string {
		if err := aw.k8s.Get(aw.ctx, types.NamespacedName{Namespace: ns, Name: name}, apr); err != nil {
			return err.Error()
		}
		if apr.Status.Result == "" {
			return "no result"
		}
		return ""
	})
	return apr
}

// wantRejected waits for the Approval's result and requires Rejected with a message
// containing each of contains.
func (aw *approvalsWorld) wantRejected(t testing.TB, name string, contains ...string) {
	t.Helper()
	apr := aw.waitApproval(t, name, 15*time.Second)
	ok := apr.Status.Result == v1alpha1.ResultRejected
	for _, s := range contains {
		ok = ok && strings.Contains(apr.Status.Message, s)
	}
	if !ok {
		t.Errorf("Approval %s (approver %v): result %q %q, want Rejected naming %q", name, approverText(apr.Spec.Approver), apr.Status.Result, apr.Status.Message, contains)
	}
}

func approverText(a *v1alpha1.Approver) string {
	if a == nil {
		return "none"
	}
	return fmt.Sprintf("%s uid %q groups %v", a.Username, a.UID, a.Groups)
}

func rejectedText(ar *v1alpha1.ApprovalRequest) string {
	var parts []string
	for _, r := range ar.Status.Rejected {
		parts = append(parts, r.Username+": "+r.Message)
	}
	return fmt.Sprintf("%d %q", ar.Status.RejectedCount, parts)
}

// reversiRun reads a ReversiRun.
func (aw *approvalsWorld) reversiRun(t testing.TB, name string) *v1alpha1.ReversiRun {
	t.Helper()
	rr := &v1alpha1.ReversiRun{}
	must(t, aw.k8s.Get(aw.ctx, types.NamespacedName{Namespace: ns, Name: name}, rr))
	return rr
}

// records are the run's decision records in its ReversiRun's step list (outcome approval)
// for request ("" any) and event.
func records(rr *v1alpha1.ReversiRun, request, event string) []v1alpha1.RunStep {
	var out []v1alpha1.RunStep
	for _, s := range rr.Status.Steps {
		if s.Outcome != outcomeApproval || s.Approval == nil || s.Approval.Event != event || (request != "" && s.ApprovalRequest != request) {
			continue
		}
		out = append(out, s)
	}
	return out
}

func stepsText(rr *v1alpha1.ReversiRun) string {
	var b strings.Builder
	for _, s := range rr.Status.Steps {
		fmt.Fprintf(&b, "\n    %d %s %s %s", s.Seq, s.Tool, s.Outcome, s.ApprovalRequest)
		if a := s.Approval; a != nil {
			fmt.Fprintf(&b, " [%s %s %v %s %q]", a.Event, a.Approver, a.Groups, a.Decision, a.Reason)
		}
	}
	if b.Len() == 0 {
		return " none"
	}
	return b.String()
}

// wantRecord waits (bounded) for a decision record of the run about request with event (and
// approver, when not "") in the ReversiRun mirror, and returns it.
func (aw *approvalsWorld) wantRecord(t testing.TB, run, request, event, approver string) (v1alpha1.RunStep, bool) {
	t.Helper()
	var rr v1alpha1.ReversiRun
	var found v1alpha1.RunStep
	err := podrun.Poll(aw.ctx, 6*time.Second, func() string {
		if err := aw.k8s.Get(aw.ctx, types.NamespacedName{Namespace: ns, Name: run}, &rr); err != nil {
			return err.Error()
		}
		for _, s := range records(&rr, request, event) {
			if approver == "" || s.Approval.Approver == approver {
				found = s
				return ""
			}
		}
		return "no record"
	})
	if err != nil {
		who := ""
		if approver != "" {
			who = " by " + approver
		}
		t.Errorf("ledger: ReversiRun %s has no decision record (outcome %s) %q%s for %s; its steps:%s", run, outcomeApproval, event, who, request, stepsText(&rr))
		return found, false
	}
	return found, true
}

// wantRecordCount requires exactly n records of event for request in the run's mirror.
func (aw *approvalsWorld) wantRecordCount(t testing.TB, run, request, event string, n int) {
	t.Helper()
	rr := aw.reversiRun(t, run)
	if got := len(records(rr, request, event)); got != n {
		t.Errorf("ledger: ReversiRun %s has %d %q records for %s, want %d; its steps:%s", run, got, event, request, n, stepsText(rr))
	}
}

// succeeded counts the run's steps of tool with outcome succeeded in the ReversiRun mirror,
// once its status has caught up with the ledger (step count stable for two reads).
func (aw *approvalsWorld) succeeded(t testing.TB, run, tool string) int {
	t.Helper()
	time.Sleep(2 * v1alpha1DefaultStatusInterval) // the mirror writes at most once per interval
	n := 0
	for _, s := range aw.reversiRun(t, run).Status.Steps {
		if s.Tool == tool && s.Outcome == "succeeded" {
			n++
		}
	}
	return n
}

// v1alpha1DefaultStatusInterval is gateway/kube.DefaultStatusInterval (1 s).
const v1alpha1DefaultStatusInterval = time.Second

// stays checks cond for d: it returns the first message cond gives (something happened that
// must not), or "".
func (aw *approvalsWorld) stays(d time.Duration, cond func() string) string {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) && aw.ctx.Err() == nil {
		if why := cond(); why != "" {
			return why
		}
		time.Sleep(100 * time.Millisecond)
	}
	return ""
}
