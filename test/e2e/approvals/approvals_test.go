// Package approvals tests issue 8's approval flow end to end: a real control plane (envtest)
// with the controller manager (ApprovalRequest reconciler and the Approval webhook), a real
// gateway fronting server-memory whose approval queue is in Kubernetes (gateway/kube), real
// kubectl run as users minted by envtest, and `reversi approve`/`reversi deny`.
package approvals

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/controllers"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/kube"
	"github.com/reversi-gitops/reversi/gateway/proxy"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/internal/cli"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

var (
	env    *testenv.Env
	envErr error
	users  string // folder of the users' kubeconfigs
	// ctlKey is the controller's signing key: it signs Approved decisions, and the in-process
	// gateways verify them with its public keys (as with $REVERSI_CONTROLLER_KEYS).
	ctlKey *controllers.SigningKey
)

// The agent's identity (the run's actor and the gateway's user) is agent-7.
const actor = "agent-7"

func TestMain(m *testing.M) {
	env, envErr = testenv.Start(testenv.Options{Webhooks: true})
	ctx, cancel := context.WithCancel(context.Background())
	if envErr == nil {
		envErr = startController(ctx)
	}
	if envErr == nil {
		if users, envErr = os.MkdirTemp("", "reversi-approvals-"); envErr == nil {
			for name, groups := range map[string][]string{"alice": {"finance"}, "bob": {"finance"}, "mallory": nil, actor: {"finance"}} {
				if _, envErr = env.UserKubeconfig(users, name, groups...); envErr != nil {
					break
				}
			}
		}
	}
	code := m.Run()
	cancel()
	if env != nil {
		_ = env.Stop()
	}
	if users != "" {
		_ = os.RemoveAll(users)
	}
	os.Exit(code)
}

func startController(ctx context.Context) error {
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"}, WebhookServer: env.WebhookServer()})
	if err != nil {
		return err
	}
	// The in-process gateways run as the agent's user (the standalone `reversi gateway
	// --kubeconfig`): the install names it, as `reversi controller --gateway-identity` does.
	if ctlKey, err = controllers.EphemeralSigningKey(); err != nil {
		return err
	}
	if err := controllers.Setup(mgr, controllers.Options{Webhooks: true, SigningKey: ctlKey, GatewayIdentities: controllers.GatewayIdentities{"*/agents": actor}}); err != nil {
		return err
	}
	go func() { _ = mgr.Start(ctx) }()
	return nil
}

func kubeconfigOf(t testing.TB, who string) string {
	t.Helper()
	if envErr != nil {
		t.Fatalf("control plane: %v", envErr)
	}
	return filepath.Join(users, who+".kubeconfig")
}

// setupNamespace makes a namespace where every authenticated user is an approver
// (config/rbac/approver_role.yaml's rules) and the agent's identity may run a gateway's
// approval queue (get, list, watch, create, patch ApprovalRequests).
func setupNamespace(t testing.TB, name string) string {
	t.Helper()
	kubeconfigOf(t, actor)
	ctx := t.Context()
	ns := fmt.Sprintf("%s-%d", name, time.Now().UnixNano()%100000)
	objs := []client.Object{
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "approver"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"reversi.dev"}, Resources: []string{"approvalrequests", "reversiruns"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"reversi.dev"}, Resources: []string{"approvals"}, Verbs: []string{"get", "list", "watch", "create"}},
		}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "approvers"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "approver"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:authenticated"}}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gateway"}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"reversi.dev"}, Resources: []string{"approvalrequests"}, Verbs: []string{"get", "list", "watch", "create", "patch"}},
		}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gateway"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "gateway"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: actor}}},
	}
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

const manifests = `
- tool: memory.read_graph
  effect: read_only
  permission: memory:read
- tool: memory.create_entities
  effect: compensable
  permission: memory:write
  compensation:
    tool: memory.delete_entities
    argument_map:
      name: $args.entities.0.name
- tool: memory.delete_entities
  effect: irreversible
  permission: memory:write
  approval: {roles: [finance], quorum: 2, timeout: 10m}
  audit: {redaction: [$args.entityNames.1]}
- tool: memory.add_observations
  effect: idempotent
  permission: memory:write
  approval: {roles: [finance], quorum: 1, timeout: 2s, on_timeout: deny}
`

// gateway is a gateway (proxy.New, as `reversi gateway --kubeconfig` builds it) fronting
// server-memory, authenticated to the API server as the agent, with a session connected.
func gateway(t testing.TB, ns string) (*mcp.ClientSession, store.Store) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(p, []byte(manifests), 0o600); err != nil {
		t.Fatal(err)
	}
	docs, errs := manifest.ReadPaths(p)
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Fatal(errs)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigOf(t, actor))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	st, err := kube.New(ctx, store.NewMemory(nil), kube.Options{Config: cfg, Namespace: ns, Gateway: "agents", Replica: "test", ControllerKeys: ctlKey.Trust})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	cmd, args, envv := upstreams.Memory(t)
	u := config.Upstream{Name: "memory", Command: cmd, Args: args, Env: map[string]string{}, Namespace: true}
	for _, kv := range envv {
		k, v, _ := strings.Cut(kv, "=")
		u.Env[k] = v
	}
	gw, err := proxy.New(ctx, proxy.Options{Store: st, Manifests: ms, Stderr: &bytes.Buffer{},
		Config: &config.Gateway{Mode: config.ModeEnforce, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
			Actor: actor, Upstreams: []config.Upstream{u}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	ct, stt := mcp.NewInMemoryTransports()
	ss, err := gw.Server().Connect(ctx, stt, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs, st
}

func call(t testing.TB, cs *mcp.ClientSession, tool string, args map[string]any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String(), res.IsError
}

var requestID = regexp.MustCompile(`request (apr-[0-9a-f]+) is waiting`)

// blocked calls tool and expects the approval block; it returns the request's name.
func blocked(t testing.TB, cs *mcp.ClientSession, tool string, args map[string]any) string {
	t.Helper()
	text, isErr := call(t, cs, tool, args)
	m := requestID.FindStringSubmatch(text)
	if !isErr || !strings.HasPrefix(text, "Blocked by Reversi: "+tool+" requires approval") || m == nil {
		t.Fatalf("%s: isError %v %q, want the approval block naming a request", tool, isErr, text)
	}
	return m[1]
}

func kubectl(t testing.TB, who, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(env.Kubectl(), append([]string{"--kubeconfig", kubeconfigOf(t, who)}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func approvalYAML(ns, name, request, decision string) string {
	return fmt.Sprintf("apiVersion: reversi.dev/v1alpha1\nkind: Approval\nmetadata: {name: %s, namespace: %s}\nspec:\n  requestRef: {name: %s}\n  decision: %s\n", name, ns, request, decision)
}

func request(t testing.TB, ns, name string) *v1alpha1.ApprovalRequest {
	t.Helper()
	ar := &v1alpha1.ApprovalRequest{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, ar); err != nil {
		t.Fatal(err)
	}
	return ar
}

func waitFor(t testing.TB, timeout time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		why := cond()
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func reversi(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Execute(args, &out, &errb)
	return out.String() + errb.String(), code
}

// The acceptance of issue 8: a call of a tool with approval {roles: [finance], quorum: 2} is
// blocked with an ApprovalRequest; alice's `kubectl apply` leaves it Pending (1/2), mallory's
// Approval is Rejected, the agent's own is Rejected, and bob's approves it; the agent's retry
// then passes (once), and the time from bob's kubectl apply to the passing retry is logged.
func TestApprovalThroughTheGateway(t *testing.T) {
	ns := setupNamespace(t, "agents")
	cs, st := gateway(t, ns)
	if text, isErr := call(t, cs, "memory.create_entities", map[string]any{"entities": []any{
		map[string]any{"name": "ledger", "entityType": "book", "observations": []any{"2026"}}}}); isErr {
		t.Fatalf("create_entities: %s", text)
	}
	del := map[string]any{"entityNames": []any{"ledger", "secret-entity"}}
	id := blocked(t, cs, "memory.delete_entities", del)

	ar := request(t, ns, id)
	if ar.Spec.Tool != "memory.delete_entities" || ar.Spec.Actor != actor || ar.Spec.Gateway != "agents" || *ar.Spec.Quorum != 2 ||
		len(ar.Spec.Roles) != 1 || ar.Spec.Roles[0] != "finance" || ar.Spec.ExpiresAt == nil || !strings.HasPrefix(ar.Spec.ArgumentsDigest, "sha256:") {
		t.Fatalf("the ApprovalRequest: %+v", ar.Spec)
	}
	if want := `{"entityNames":["ledger","[redacted]"]}`; ar.Spec.ArgumentsPreview != want {
		t.Errorf("argumentsPreview %q, want %q (audit.redaction)", ar.Spec.ArgumentsPreview, want)
	}
	if again := blocked(t, cs, "memory.delete_entities", del); again != id {
		t.Errorf("the retry while pending names %s, want the same request %s", again, id)
	}

	// alice: `reversi approve` prints the YAML, kubectl applies it.
	yaml, code := reversi(t, "approve", id, "--kubeconfig", kubeconfigOf(t, "alice"), "-n", ns, "--reason", "FIN-12")
	if code != 0 || !strings.Contains(yaml, "name: "+id+"-alice") || !strings.Contains(yaml, "decision: Approve") || strings.Contains(yaml, "\n  approver:") {
		t.Fatalf("reversi approve: %d\n%s", code, yaml)
	}
	if out, err := kubectl(t, "alice", yaml, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply by alice: %v\n%s", err, out)
	}
	waitFor(t, 20*time.Second, func() string {
		if ar := request(t, ns, id); ar.Status.ApprovedCount != 1 || ar.Status.Phase != v1alpha1.ApprovalPending {
			return fmt.Sprintf("after alice: %s %d", ar.Status.Phase, ar.Status.ApprovedCount)
		}
		return ""
	})
	blocked(t, cs, "memory.delete_entities", del) // 1 of 2: still blocked

	// mallory (no role) and the agent itself do not count; mallory cannot pose as alice.
	for _, who := range []string{"mallory", actor} {
		if out, err := kubectl(t, who, approvalYAML(ns, id+"-"+who, id, "Approve"), "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply by %s: %v\n%s", who, err, out)
		}
	}
	forged := approvalYAML(ns, id+"-forged", id, "Approve") + "  approver: {username: alice, groups: [finance]}\n"
	if out, err := kubectl(t, "mallory", forged, "apply", "-f", "-"); err == nil || !strings.Contains(out, "denied the request") {
		t.Errorf("a forged approver was not refused at admission: %v\n%s", err, out)
	}
	for who, want := range map[string]string{"mallory": "mallory holds none of the roles [finance]", actor: actor + " opened run"} {
		waitFor(t, 20*time.Second, func() string {
			apr := &v1alpha1.Approval{}
			if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: id + "-" + who}, apr); err != nil {
				return err.Error()
			}
			if apr.Status.Result != v1alpha1.ResultRejected || !strings.Contains(apr.Status.Message, want) {
				return fmt.Sprintf("%s's approval: %s %q", who, apr.Status.Result, apr.Status.Message)
			}
			return ""
		})
	}
	blocked(t, cs, "memory.delete_entities", del)

	// bob applies his Approval with kubectl; the agent retries until the call passes.
	began := time.Now()
	if out, err := kubectl(t, "bob", approvalYAML(ns, id+"-bob", id, "Approve"), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply by bob: %v\n%s", err, out)
	}
	applied := time.Since(began)
	var tries int
	var text string
	for isErr := true; isErr; tries++ {
		if time.Since(began) > 20*time.Second {
			t.Fatalf("the retry is still blocked 20 s after bob's approval: %s", text)
		}
		text, isErr = call(t, cs, "memory.delete_entities", del)
		if isErr && !strings.Contains(text, "requires approval: request "+id) {
			t.Fatalf("retry: %s", text)
		}
	}
	t.Logf("approval latency: kubectl apply -> retry passes %s (kubectl itself %s, %d calls of the retry)", time.Since(began).Round(time.Millisecond), applied.Round(time.Millisecond), tries)

	if graph, _ := call(t, cs, "memory.read_graph", map[string]any{}); strings.Contains(graph, "ledger") {
		t.Errorf("the approved delete did not reach server-memory: %s", graph)
	}
	ar = request(t, ns, id)
	if ar.Status.Phase != v1alpha1.ApprovalApproved || ar.Annotations[v1alpha1.AnnotationConsumedAt] == "" || ar.Annotations[v1alpha1.AnnotationConsumedBy] != "test" {
		t.Errorf("after the retry: phase %s, annotations %v", ar.Status.Phase, ar.Annotations)
	}
	// The approval is used: the same call again needs a new request.
	if next := blocked(t, cs, "memory.delete_entities", del); next == id {
		t.Errorf("a consumed approval let a second call through the same request %s", id)
	}
	// The decisions are records of the run (issue 16): who approved, with which groups, and
	// the consumption; each Approval the controller rejected is a rejected record.
	runs, err := st.ListRuns(t.Context(), store.RunFilter{})
	if err != nil || len(runs) != 1 {
		t.Fatalf("runs %+v %v", runs, err)
	}
	final := request(t, ns, id)
	rejected := len(final.Status.Rejected)
	want := "requested:::"
	for _, c := range final.Status.Approvals { // the groups as the controller recorded them
		want += fmt.Sprintf(",counted:%s:%s:%s", c.Username, strings.Join(c.Groups, "+"), c.Decision)
	}
	want += ",approved:::,consumed:::"
	if len(final.Status.Approvals) != 2 {
		t.Fatalf("counted approvals %+v", final.Status.Approvals)
	}
	waitFor(t, 10*time.Second, func() string {
		recs, _ := st.Records(t.Context(), runs[0].ID, 0, 0)
		var evs []string
		n := 0
		for _, r := range recs {
			if r.Kind != store.KindApproval || r.Approval != id {
				continue
			}
			if r.Event == store.EventRejected {
				n++
				continue
			}
			evs = append(evs, fmt.Sprintf("%s:%s:%s:%s", r.Event, r.Approver, strings.Join(r.Groups, "+"), r.Decision))
		}
		// "approved" comes from the informer, "consumed" from the retry's intent: either may
		// be journaled first.
		slices.Sort(evs)
		wantEvs := strings.Split(want, ",")
		slices.Sort(wantEvs)
		if got := strings.Join(evs, ","); got != strings.Join(wantEvs, ",") || n != rejected {
			return fmt.Sprintf("decision records %s and %d rejected, want %s and %d", got, n, want, rejected)
		}
		return ""
	})
}

// A Deny by a finance user (`reversi deny --apply`) denies; a request that expires with
// on_timeout deny is Expired and the retry stays blocked.
func TestDenyAndExpiryThroughTheGateway(t *testing.T) {
	ns := setupNamespace(t, "deny")
	cs, _ := gateway(t, ns)
	del := map[string]any{"entityNames": []any{"nobody"}}
	id := blocked(t, cs, "memory.delete_entities", del)
	out, code := reversi(t, "deny", id, "--kubeconfig", kubeconfigOf(t, "bob"), "-n", ns, "--apply", "--reason", "not today")
	if code != 0 || !strings.Contains(out, "approval.reversi.dev/"+id+"-bob created") {
		t.Fatalf("reversi deny --apply: %d\n%s", code, out)
	}
	if out, code := reversi(t, "deny", id, "--kubeconfig", kubeconfigOf(t, "bob"), "-n", ns, "--apply"); code == 0 || !strings.Contains(out, "bob already decided") {
		t.Errorf("a second decision by bob: %d\n%s", code, out)
	}
	waitFor(t, 20*time.Second, func() string {
		if ar := request(t, ns, id); ar.Status.Phase != v1alpha1.ApprovalDenied {
			return "phase " + ar.Status.Phase
		}
		return ""
	})
	waitFor(t, 10*time.Second, func() string {
		text, isErr := call(t, cs, "memory.delete_entities", del)
		if !isErr || !strings.Contains(text, "approval "+id+" for this call was denied") {
			return "retry after the deny: " + text
		}
		return ""
	})

	obs := map[string]any{"observations": []any{map[string]any{"entityName": "x", "contents": []any{"y"}}}}
	exp := blocked(t, cs, "memory.add_observations", obs)
	waitFor(t, 20*time.Second, func() string {
		if ar := request(t, ns, exp); ar.Status.Phase != v1alpha1.ApprovalExpired {
			return "phase " + ar.Status.Phase
		}
		return ""
	})
	waitFor(t, 10*time.Second, func() string {
		text, isErr := call(t, cs, "memory.add_observations", obs)
		if !isErr || !strings.Contains(text, "approval "+exp+" for this call was expired") {
			return "retry after expiry: " + text
		}
		return ""
	})
}

// Two gateway replicas on the same namespace and the same store (as replicas sharing
// Postgres) race to consume one approval: exactly one intent wins, the other gets ErrConsumed;
// the reversi.dev/consumedAt annotation is only a mirror, so removing it lets nothing run
// again; a copy of the request that another identity made is ignored and journaled. Source:
// issue 16 ("Consumption is durable and private", "A gateway honours only requests it created").
func TestConsumeOnceAcrossReplicas(t *testing.T) {
	ns := setupNamespace(t, "replicas")
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigOf(t, actor))
	if err != nil {
		t.Fatal(err)
	}
	shared := store.NewMemory(nil)
	if _, err := shared.CreateRun(t.Context(), store.Run{ID: "run-1", Actor: actor, Gateway: "agents"}); err != nil {
		t.Fatal(err)
	}
	var replicas []*kube.Store
	for _, name := range []string{"a", "b"} {
		s, err := kube.New(t.Context(), shared, kube.Options{Config: cfg, Namespace: ns, Gateway: "agents", Replica: name, ControllerKeys: ctlKey.Trust})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		replicas = append(replicas, s)
	}
	digest := "sha256:" + strings.Repeat("0f", 32)
	a, err := replicas[0].CreateApproval(t.Context(), store.ApprovalRequest{Tool: "memory.delete_entities", ArgsDigest: digest,
		Run: "run-1", Actor: actor, Roles: []string{"finance"}, Quorum: 2, Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if a.UID == "" || a.SpecDigest == "" {
		t.Fatalf("the request is not recorded with its uid and spec digest: %+v", a)
	}
	if _, err := replicas[0].Decide(t.Context(), a.ID, store.Decision{By: "alice", Approve: true}); !errors.Is(err, store.ErrNotAllowed) {
		t.Errorf("Decide through the gateway: %v, want ErrNotAllowed", err)
	}
	intent := func(r *kube.Store, run string) error {
		_, err := r.RecordIntent(context.Background(), store.Intent{Run: run, Tool: "memory.delete_entities", ArgsDigest: digest, Approval: a.ID})
		return err
	}
	if err := intent(replicas[1], "run-1"); !errors.Is(err, store.ErrNotApproved) {
		t.Errorf("consuming a pending request: %v", err)
	}
	for _, who := range []string{"alice", "bob"} {
		if out, err := kubectl(t, who, approvalYAML(ns, a.ID+"-"+who, a.ID, "Approve"), "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply by %s: %v\n%s", who, err, out)
		}
	}
	waitFor(t, 20*time.Second, func() string {
		for _, r := range replicas {
			if got, err := r.GetApproval(t.Context(), a.ID); err != nil || got.State != store.ApprovalApproved {
				return fmt.Sprintf("a replica sees %s %v", got.State, err)
			}
		}
		return ""
	})
	if _, err := shared.CreateRun(t.Context(), store.Run{ID: "run-2", Actor: actor, Gateway: "agents"}); err != nil {
		t.Fatal(err)
	}
	if err := intent(replicas[0], "run-2"); !errors.Is(err, store.ErrMismatch) {
		t.Errorf("consuming for another run: %v", err)
	}
	errs := make(chan error, 2)
	for _, r := range replicas {
		go func() { errs <- intent(r, "run-1") }()
	}
	e1, e2 := <-errs, <-errs
	if (e1 == nil) == (e2 == nil) || !errors.Is(errors.Join(e1, e2), store.ErrConsumed) {
		t.Fatalf("two replicas consuming: %v and %v, want exactly one success and one ErrConsumed", e1, e2)
	}
	// The annotation mirrors the consumption; removing it changes nothing.
	waitFor(t, 10*time.Second, func() string {
		if request(t, ns, a.ID).Annotations[v1alpha1.AnnotationConsumedAt] == "" {
			return "no consumedAt mirror"
		}
		return ""
	})
	if out, err := kubectl(t, actor, "", "annotate", "-n", ns, "approvalrequest", a.ID, v1alpha1.AnnotationConsumedAt+"-"); err != nil {
		t.Fatalf("kubectl annotate: %v\n%s", err, out)
	}
	waitFor(t, 10*time.Second, func() string {
		if request(t, ns, a.ID).Annotations[v1alpha1.AnnotationConsumedAt] != "" {
			return "annotation still there"
		}
		return ""
	})
	for _, r := range replicas {
		if err := intent(r, "run-1"); !errors.Is(err, store.ErrConsumed) {
			t.Errorf("a replay after the annotation was removed: %v, want ErrConsumed", err)
		}
	}
	// The decisions are records of the run, each once although both replicas watched them.
	waitFor(t, 10*time.Second, func() string {
		recs, _ := shared.Records(t.Context(), "run-1", 0, 0)
		var evs []string
		for _, r := range recs {
			if r.Kind == store.KindApproval {
				evs = append(evs, string(r.Event)+":"+r.Approver)
			}
		}
		slices.Sort(evs)
		if got := strings.Join(evs, ","); got != "approved:,consumed:,counted:alice,counted:bob,requested:" {
			return "decision records " + got
		}
		return ""
	})
}

// A copy of a held request with loosened rules (no roles, quorum 1), made by another identity
// and approved by someone outside finance, is ignored: the gateway honours only the request it
// created (its UID and spec digest), lists only that one, refuses an intent naming the copy,
// and journals the copy once as ignored. The same holds for a request deleted and created again
// under the same name. Source: issue 16 ("A forged request is honoured").
func TestCopiedRequestIgnored(t *testing.T) {
	ns := setupNamespace(t, "copies")
	gw, inner := queueOfRun1(t, ns)
	if gw.Identity() != actor {
		t.Fatalf("SelfSubjectReview: identity %q, want %q", gw.Identity(), actor)
	}
	digest := "sha256:" + strings.Repeat("0f", 32)
	real, err := gw.CreateApproval(t.Context(), store.ApprovalRequest{Tool: "memory.delete_entities", ArgsDigest: digest,
		Run: "run-1", Actor: actor, ActorEmail: "agent-7@corp.example", Roles: []string{"finance"}, Quorum: 2, Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if ar := request(t, ns, real.ID); ar.Spec.ActorEmail != "agent-7@corp.example" {
		t.Errorf("actorEmail %q", ar.Spec.ActorEmail)
	}
	cp := request(t, ns, real.ID).DeepCopy()
	cp.ObjectMeta = metav1.ObjectMeta{Namespace: ns, Name: real.ID + "-copy",
		Annotations: map[string]string{v1alpha1.AnnotationCreatedBy: "system:serviceaccount:" + ns + ":other-gateway"}}
	cp.Spec.Roles, cp.Spec.Quorum = nil, ptr.To(int32(1))
	cp.Status = v1alpha1.ApprovalRequestStatus{}
	// Admission refuses such copies (issue 16); the gateway's own check is tested as if the
	// webhook configurations were gone when they were made.
	testenv.WithoutAdmission(t, env.Client, ns, func() {
		if err := env.Client.Create(t.Context(), cp); err != nil {
			t.Fatal(err)
		}
	})
	if out, err := kubectl(t, "mallory", approvalYAML(ns, cp.Name+"-mallory", cp.Name, "Approve"), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply by mallory: %v\n%s", err, out)
	}
	waitFor(t, 20*time.Second, func() string {
		if ar := request(t, ns, cp.Name); ar.Status.Phase != v1alpha1.ApprovalApproved {
			return "the copy is " + ar.Status.Phase
		}
		return ""
	})
	list, err := gw.ListApprovals(t.Context(), store.ApprovalFilter{Run: "run-1"})
	if err != nil || len(list) != 1 || list[0].ID != real.ID || list[0].State != store.ApprovalPending {
		t.Fatalf("the gateway lists %+v %v, want only its own pending request", list, err)
	}
	if _, err := gw.GetApproval(t.Context(), cp.Name); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetApproval of the copy: %v, want ErrNotFound", err)
	}
	if _, err := gw.RecordIntent(t.Context(), store.Intent{Run: "run-1", Tool: "memory.delete_entities", ArgsDigest: digest, Approval: cp.Name}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("an intent naming the copy: %v, want ErrNotFound", err)
	}
	// The real request, deleted and created again with loosened rules under its own name.
	if err := env.Client.Delete(t.Context(), request(t, ns, real.ID)); err != nil {
		t.Fatal(err)
	}
	again := cp.DeepCopy()
	again.ObjectMeta = metav1.ObjectMeta{Namespace: ns, Name: real.ID}
	testenv.WithoutAdmission(t, env.Client, ns, func() {
		if err := env.Client.Create(t.Context(), again); err != nil {
			t.Fatal(err)
		}
	})
	if out, err := kubectl(t, "mallory", approvalYAML(ns, real.ID+"-mallory", real.ID, "Approve"), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply by mallory: %v\n%s", err, out)
	}
	waitFor(t, 20*time.Second, func() string {
		if ar := request(t, ns, real.ID); ar.Status.Phase != v1alpha1.ApprovalApproved {
			return "the replacement is " + ar.Status.Phase
		}
		return ""
	})
	if _, err := gw.GetApproval(t.Context(), real.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetApproval of the replacement: %v, want ErrNotFound", err)
	}
	if _, err := gw.RecordIntent(t.Context(), store.Intent{Run: "run-1", Tool: "memory.delete_entities", ArgsDigest: digest, Approval: real.ID}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("an intent naming the replacement: %v, want ErrNotFound", err)
	}
	waitFor(t, 10*time.Second, func() string {
		recs, _ := inner.Records(t.Context(), "run-1", 0, 0)
		ignored := map[string]int{}
		for _, r := range recs {
			if r.Kind == store.KindApproval && r.Event == store.EventIgnored {
				ignored[r.Approval]++
			}
		}
		if ignored[cp.Name] != 1 || ignored[real.ID] != 1 {
			return fmt.Sprintf("ignored records %v, want one for the copy and one for the replacement", ignored)
		}
		return ""
	})
}

// queueOfRun1 is the Kubernetes approval queue of gateway "agents" in ns, as the agent's
// identity, over a memory store that holds run-1 of the actor.
func queueOfRun1(t *testing.T, ns string) (*kube.Store, store.Store) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigOf(t, actor))
	if err != nil {
		t.Fatal(err)
	}
	inner := store.NewMemory(nil)
	if _, err := inner.CreateRun(t.Context(), store.Run{ID: "run-1", Actor: actor, Gateway: "agents"}); err != nil {
		t.Fatal(err)
	}
	gw, err := kube.New(t.Context(), inner, kube.Options{Config: cfg, Namespace: ns, Gateway: "agents", Replica: "a", ControllerKeys: ctlKey.Trust})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	return gw, inner
}
