// Package runs tests issue 8's run mirror end to end: a real control plane (envtest) with the
// controller's admission webhooks, gateways
// (proxy.New, as `reversi gateway --kubeconfig` builds them) on a real SQLite store fronting a
// real server-memory, whose runs are ReversiRuns (gateway/kube.Runs), real kubectl run as users
// minted by envtest, and `reversi rollback --kubeconfig`.
package runs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
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
	// ctlKey is the controller's signing key; the gateway processes get its public keys
	// ($REVERSI_CONTROLLER_KEYS, as a ReversiGateway's pods do).
	ctlKey *controllers.SigningKey
	users  string // folder of the users' kubeconfigs
)

// The agent's identity (the run's actor and the gateway's user).
const actor = "agent-7"

func TestMain(m *testing.M) {
	env, envErr = testenv.Start(testenv.Options{Webhooks: true})
	ctx, cancel := context.WithCancel(context.Background())
	if envErr == nil {
		envErr = startController(ctx)
	}
	if envErr == nil {
		if users, envErr = os.MkdirTemp("", "reversi-runs-"); envErr == nil {
			for _, name := range []string{actor, "ops", "auditor"} {
				if _, envErr = env.UserKubeconfig(users, name); envErr != nil {
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

// startController runs the controller's manager with its admission webhooks (issue 16): the
// runs' creates and status writes are admitted only for the gateway's identity, here the
// agent's user (the standalone `reversi gateway --kubeconfig`, as gateway agents or, without
// --gateway-name, proxy.Name), named as
// `reversi controller --gateway-identity` names it; ops' spec.rollback passes as an operator's.
func startController(ctx context.Context) error {
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"}, WebhookServer: env.WebhookServer()})
	if err != nil {
		return err
	}
	if ctlKey, err = controllers.EphemeralSigningKey(); err != nil {
		return err
	}
	if err := controllers.Setup(mgr, controllers.Options{Webhooks: true, SigningKey: ctlKey, GatewayIdentities: controllers.GatewayIdentities{
		"*/agents": actor, "*/" + proxy.Name: actor}}); err != nil { // proxy.Name: `reversi gateway` without --gateway-name
		return err
	}
	go func() { _ = mgr.Start(ctx) }()
	return nil
}

func kubeconfigOf(t *testing.T, who string) string {
	t.Helper()
	if envErr != nil {
		t.Fatalf("control plane: %v", envErr)
	}
	return filepath.Join(users, who+".kubeconfig")
}

// setupNamespace makes a namespace where the agent's identity may run a gateway's run mirror
// (the verbs kube.NewRuns names), ops may set spec.rollback and auditor may only read runs.
func setupNamespace(t *testing.T, name string) string {
	t.Helper()
	kubeconfigOf(t, actor)
	ctx := t.Context()
	ns := fmt.Sprintf("%s-%d", name, time.Now().UnixNano()%100000)
	role := func(name string, rules ...rbacv1.PolicyRule) client.Object {
		return &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Rules: rules}
	}
	bind := func(name, user string) client.Object {
		return &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	}
	objs := []client.Object{
		role("gateway",
			rbacv1.PolicyRule{APIGroups: []string{"reversi.dev"}, Resources: []string{"reversiruns"}, Verbs: []string{"get", "list", "watch", "create", "update"}},
			rbacv1.PolicyRule{APIGroups: []string{"reversi.dev"}, Resources: []string{"reversiruns/status"}, Verbs: []string{"update"}},
			// `reversi gateway --kubeconfig` also keeps its approval queue in the namespace.
			rbacv1.PolicyRule{APIGroups: []string{"reversi.dev"}, Resources: []string{"approvalrequests"}, Verbs: []string{"get", "list", "watch", "create", "patch"}}),
		bind("gateway", actor),
		role("ops", rbacv1.PolicyRule{APIGroups: []string{"reversi.dev"}, Resources: []string{"reversiruns"}, Verbs: []string{"get", "list", "watch", "patch"}}),
		bind("ops", "ops"),
		role("auditor", rbacv1.PolicyRule{APIGroups: []string{"reversi.dev"}, Resources: []string{"reversiruns"}, Verbs: []string{"get", "list"}}),
		bind("auditor", "auditor"),
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

// fixture is what the gateways of one test share: the SQLite data folder, server-memory's
// graph file and the file the upstreams record every tools/call (with _meta) in.
type fixture struct {
	ns, data, graph, metaLog string
	ms                       []*manifest.Manifest
}

func newFixture(t *testing.T, ns string) *fixture {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "m.yaml")
	if err := os.WriteFile(p, []byte(upstreams.MemoryRollbackManifests), 0o600); err != nil {
		t.Fatal(err)
	}
	docs, errs := manifest.ReadPaths(p)
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Fatal(errs)
	}
	return &fixture{ns: ns, data: filepath.Join(dir, "data"), graph: filepath.Join(dir, "graph.jsonl"), metaLog: filepath.Join(dir, "meta.jsonl"), ms: ms}
}

// statusWrites counts the status updates of ReversiRuns the gateway sends to the API server
// (a transport wrapper: the requests themselves go to the real API server).
type statusWrites struct {
	mu    sync.Mutex
	times map[string][]time.Time // run -> when each PUT .../reversiruns/<run>/status was sent
}

var statusPath = regexp.MustCompile(`/reversiruns/([^/]+)/status$`)

func (w *statusWrites) RoundTrip(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		if m := statusPath.FindStringSubmatch(r.URL.Path); m != nil && r.Method == http.MethodPut {
			w.mu.Lock()
			w.times[m[1]] = append(w.times[m[1]], time.Now())
			w.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

func (w *statusWrites) of(run string) []time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]time.Time(nil), w.times[run]...)
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// gateway starts a gateway replica on the fixture's store and graph, its runs mirrored into the
// namespace as the agent, and returns it with its mirror.
func (f *fixture) gateway(t *testing.T, replica string, writes *statusWrites) (*proxy.Gateway, *kube.Runs) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigOf(t, actor))
	if err != nil {
		t.Fatal(err)
	}
	if writes != nil {
		cfg.WrapTransport = writes.RoundTrip
	}
	ctx := t.Context()
	st, err := store.OpenSQLite(f.data, nil)
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	runs, err := kube.NewRuns(ctx, st, kube.RunsOptions{Config: cfg, Namespace: f.ns, Gateway: "agents", Replica: replica, Stderr: &stderr})
	if err != nil {
		_ = st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := runs.Close(); err != nil {
			t.Errorf("closing the mirror of %s: %v", replica, err)
		}
		if stderr.Len() > 0 {
			t.Logf("gateway %s stderr:\n%s", replica, stderr.String())
		}
	})
	node, args, _ := upstreams.MemoryAt(t, f.graph)
	u := config.Upstream{Name: "mem", Command: node, Args: args, Env: upstreams.RecordMetaEnv(t, f.metaLog, ""), Namespace: true}
	u.Env["MEMORY_FILE_PATH"] = f.graph
	gw, err := proxy.New(ctx, proxy.Options{Store: runs, Manifests: f.ms, Stderr: &stderr,
		Config: &config.Gateway{Mode: config.ModeEnforce, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
			Actor: actor, Upstreams: []config.Upstream{u}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	runs.Attach(gw)
	return gw, runs
}

// session connects an agent to gw; closing it ends the run's session (the run goes Idle).
func session(t *testing.T, gw *proxy.Gateway) *mcp.ClientSession {
	t.Helper()
	ct, stt := mcp.NewInMemoryTransports()
	ss, err := gw.Server().Connect(t.Context(), stt, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) string {
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
	if res.IsError {
		t.Fatalf("call %s: %s", tool, b.String())
	}
	return b.String()
}

// direct reads the graph straight from server-memory (a process of its own on the graph
// file), not through any gateway.
func (f *fixture) direct(t *testing.T, tool string, args map[string]any) any {
	t.Helper()
	node, nargs, envv := upstreams.MemoryAt(t, f.graph)
	cmd := exec.Command(node, nargs...)
	cmd.Env = append(os.Environ(), envv...)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "direct", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil || res.IsError {
		t.Fatalf("direct %s: %v %+v", tool, err, res)
	}
	var v any
	if err := json.Unmarshal([]byte(res.Content[0].(*mcp.TextContent).Text), &v); err != nil {
		t.Fatalf("direct %s: %v", tool, err)
	}
	return v
}

// agentRun is the run of the acceptance: two entities, a relation between them, a read. It
// returns the run's name once its ReversiRun shows the three steps and the run is Idle.
func agentRun(t *testing.T, f *fixture, gw *proxy.Gateway) string {
	t.Helper()
	cs := session(t, gw)
	call(t, cs, "mem.create_entities", map[string]any{"entities": []any{
		map[string]any{"name": "alpha", "entityType": "service", "observations": []any{"v1"}},
		map[string]any{"name": "beta", "entityType": "service", "observations": []any{"v2"}}}})
	call(t, cs, "mem.create_relations", map[string]any{"relations": []any{map[string]any{"from": "alpha", "to": "beta", "relationType": "calls"}}})
	call(t, cs, "mem.read_graph", map[string]any{})
	_ = cs.Close()
	var name string
	waitFor(t, 20*time.Second, func() string {
		var list v1alpha1.ReversiRunList
		if err := env.Client.List(t.Context(), &list, client.InNamespace(f.ns)); err != nil {
			return err.Error()
		}
		if len(list.Items) != 1 {
			return fmt.Sprintf("%d ReversiRuns", len(list.Items))
		}
		r := list.Items[0]
		name = r.Name
		if r.Status.Phase != v1alpha1.RunIdle || r.Status.StepCount != 3 || r.Status.Counts.Succeeded != 3 || len(r.Status.Steps) != 3 {
			return fmt.Sprintf("status %+v", r.Status)
		}
		return ""
	})
	return name
}

func kubectl(t *testing.T, who string, args ...string) string {
	t.Helper()
	out, err := exec.Command(env.Kubectl(), append([]string{"--kubeconfig", kubeconfigOf(t, who)}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %v as %s: %v\n%s", args, who, err, out)
	}
	return string(out)
}

func run(t *testing.T, ns, name string) *v1alpha1.ReversiRun {
	t.Helper()
	r := &v1alpha1.ReversiRun{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, r); err != nil {
		t.Fatal(err)
	}
	return r
}

func waitFor(t *testing.T, timeout time.Duration, cond func() string) {
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
		time.Sleep(50 * time.Millisecond)
	}
}

// waitRolledBack waits for status.rollback to reach a final phase and checks the acceptance:
// Succeeded, each step (newest first) undone and read back, the run RolledBack.
func waitRolledBack(t *testing.T, ns, name string) *v1alpha1.ReversiRun {
	t.Helper()
	var r *v1alpha1.ReversiRun
	waitFor(t, 60*time.Second, func() string {
		r = run(t, ns, name)
		if rb := r.Status.Rollback; rb == nil || (rb.Phase != v1alpha1.RollbackSucceeded && rb.Phase != v1alpha1.RollbackPartiallySucceeded && rb.Phase != v1alpha1.RollbackFailed) {
			return fmt.Sprintf("status.rollback %+v", rb)
		}
		return ""
	})
	rb := r.Status.Rollback
	if rb.Phase != v1alpha1.RollbackSucceeded || r.Status.Phase != v1alpha1.RunRolledBack || rb.StartedAt == nil || rb.CompletedAt == nil || rb.DryRun {
		t.Fatalf("rollback %s (run %s): %+v", rb.Phase, r.Status.Phase, rb)
	}
	want := []v1alpha1.RollbackStep{{Seq: 3, Tool: "mem.create_relations", Compensation: "mem.delete_relations", Result: "verified"},
		{Seq: 1, Tool: "mem.create_entities", Compensation: "mem.delete_entities", Result: "verified"}}
	if len(rb.Steps) != len(want) {
		t.Fatalf("rollback steps %+v, want %+v", rb.Steps, want)
	}
	for i, s := range rb.Steps {
		w := want[i]
		if s.Seq != w.Seq || s.Tool != w.Tool || s.Compensation != w.Compensation || s.Result != w.Result || !strings.Contains(s.Message, "read back with mem.open_nodes") {
			t.Errorf("rollback step %d: %+v, want %+v", i, s, w)
		}
	}
	return r
}

// compensations counts the compensation calls the upstreams received.
func (f *fixture) compensations(t *testing.T) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, c := range upstreams.ReadMetaCalls(t, f.metaLog) {
		if strings.HasPrefix(c.Name, "delete_") {
			n[c.Name]++
		}
	}
	return n
}

// The acceptance of issue 8: `kubectl get reversiruns` shows the run with its columns;
// `kubectl patch` of spec.rollback undoes the run against server-memory, the status reaches
// Succeeded with each step verified, and the graph read directly from the upstream equals the
// graph before the run.
func TestKubectlRollbackUndoesTheRun(t *testing.T) {
	ns := setupNamespace(t, "runs")
	f := newFixture(t, ns)
	f.direct(t, "create_entities", map[string]any{"entities": []any{map[string]any{"name": "keep", "entityType": "service", "observations": []any{"before"}}}})
	before := f.direct(t, "read_graph", map[string]any{})
	gw, _ := f.gateway(t, "a", nil)
	name := agentRun(t, f, gw)
	if during := f.direct(t, "read_graph", map[string]any{}); reflect.DeepEqual(during, before) {
		t.Fatalf("the run changed nothing upstream: %v", during)
	}

	r := run(t, ns, name)
	if r.Spec.Actor != actor || r.Spec.Gateway != "agents" || r.Status.StartedAt == nil || r.Status.LastActivityAt == nil {
		t.Errorf("ReversiRun %s: spec %+v, started %v, last activity %v", name, r.Spec, r.Status.StartedAt, r.Status.LastActivityAt)
	}
	for i, s := range r.Status.Steps {
		if want := []string{"mem.create_entities", "mem.create_relations", "mem.read_graph"}[i]; s.Seq != int64(2*i+1) || s.Tool != want || s.Outcome != "succeeded" {
			t.Errorf("status.steps[%d] %+v, want seq %d %s succeeded", i, s, 2*i+1, want)
		}
	}
	out := kubectl(t, "auditor", "get", "reversiruns", "-n", ns)
	header := regexp.MustCompile(`^NAME\s+ACTOR\s+GATEWAY\s+PHASE\s+STEPS\s+ROLLBACK\s+LAST ACTIVITY\s+AGE\n`)
	row := regexp.MustCompile(`(?m)^` + name + `\s+` + actor + `\s+agents\s+Idle\s+3\s+\d+s\s+\d+s$`) // no rollback yet: that column is empty
	if !header.MatchString(out) || !row.MatchString(out) {
		t.Errorf("kubectl get reversiruns:\n%s", out)
	}
	wide := kubectl(t, "auditor", "get", "reversiruns", "-n", ns, "-o", "wide")
	if !regexp.MustCompile(`BLOCKED\s+PENDING\s+FAILED`).MatchString(wide) {
		t.Errorf("kubectl get reversiruns -o wide:\n%s", wide)
	}
	t.Logf("kubectl get reversiruns -o wide:\n%s", wide)

	kubectl(t, "ops", "patch", "reversirun", name, "-n", ns, "--type", "merge", "-p", `{"spec":{"rollback":{"confirm":true}}}`)
	r = waitRolledBack(t, ns, name)
	if r.Status.Rollback.Replica != "a" || r.Status.Rollback.ObservedGeneration != r.Generation {
		t.Errorf("rollback replica %q, observed generation %d of %d", r.Status.Rollback.Replica, r.Status.Rollback.ObservedGeneration, r.Generation)
	}
	if after := f.direct(t, "read_graph", map[string]any{}); !reflect.DeepEqual(after, before) {
		t.Errorf("the graph after the rollback differs from before the run:\nbefore %v\nafter  %v", before, after)
	}
	if n := f.compensations(t); n["delete_relations"] != 1 || n["delete_entities"] != 1 {
		t.Errorf("compensation calls at the upstream: %v, want one of each", n)
	}
	out = kubectl(t, "auditor", "get", "reversiruns", "-n", ns)
	if !regexp.MustCompile(name + `\s+` + actor + `\s+agents\s+RolledBack\s+3\s+Succeeded\s`).MatchString(out) {
		t.Errorf("kubectl get reversiruns after the rollback:\n%s", out)
	}
}

// Two gateway replicas on one store and one namespace: `reversi rollback --kubeconfig` first
// plans (dry run: nothing runs), then with --confirm exactly one replica claims the rollback
// and the upstream receives each compensation exactly once.
func TestRollbackRunsOnceAcrossReplicas(t *testing.T) {
	ns := setupNamespace(t, "replicas")
	f := newFixture(t, ns)
	before := f.direct(t, "read_graph", map[string]any{})
	a, _ := f.gateway(t, "a", nil)
	f.gateway(t, "b", nil)
	name := agentRun(t, f, a)
	ops := kubeconfigOf(t, "ops")

	var out, errb bytes.Buffer
	if code := cli.Execute([]string{"rollback", name, "--kubeconfig", ops, "-n", ns}, &out, &errb); code != 0 || !strings.Contains(out.String(), "dry run") {
		t.Fatalf("reversi rollback (dry run): %d\n%s%s", code, out.String(), errb.String())
	}
	waitFor(t, 30*time.Second, func() string {
		rb := run(t, ns, name).Status.Rollback
		if rb == nil || !rb.DryRun || len(rb.Steps) != 2 || rb.Steps[0].Compensation != "mem.delete_relations" || rb.Steps[0].Result != "" {
			return fmt.Sprintf("the plan: %+v", rb)
		}
		return ""
	})
	if n := f.compensations(t); len(n) != 0 {
		t.Fatalf("a dry run called compensations: %v", n)
	}

	out.Reset()
	errb.Reset()
	if code := cli.Execute([]string{"rollback", name, "--confirm", "--kubeconfig", ops, "-n", ns}, &out, &errb); code != 0 {
		t.Fatalf("reversi rollback --confirm: %d\n%s%s", code, out.String(), errb.String())
	}
	r := waitRolledBack(t, ns, name)
	if rep := r.Status.Rollback.Replica; rep != "a" && rep != "b" {
		t.Errorf("claimed by %q", rep)
	}
	time.Sleep(2 * time.Second) // room for a second execution, were the claim not exclusive
	if n := f.compensations(t); n["delete_relations"] != 1 || n["delete_entities"] != 1 || len(n) != 2 {
		t.Errorf("compensation calls at the upstreams of both replicas: %v, want exactly one of each", n)
	}
	if rb := run(t, ns, name).Status.Rollback; rb.Phase != v1alpha1.RollbackSucceeded {
		t.Errorf("after a while: %+v", rb)
	}
	if after := f.direct(t, "read_graph", map[string]any{}); !reflect.DeepEqual(after, before) {
		t.Errorf("the graph after the rollback differs from before the run:\nbefore %v\nafter  %v", before, after)
	}
}

// Status writes are batched: an agent making calls as fast as it can (well over 50 in a
// second) causes at most one status write per run per second (plus the final one), the
// writes at least a second apart, and the last write carries every step.
func TestStatusWritesAreBatched(t *testing.T) {
	ns := setupNamespace(t, "batched")
	f := newFixture(t, ns)
	writes := &statusWrites{times: map[string][]time.Time{}}
	gw, _ := f.gateway(t, "a", writes)
	cs := session(t, gw)
	began := time.Now()
	const calls = 200
	for range calls {
		call(t, cs, "mem.read_graph", map[string]any{})
	}
	took := time.Since(began)
	_ = cs.Close()
	var name string
	waitFor(t, 20*time.Second, func() string {
		var list v1alpha1.ReversiRunList
		if err := env.Client.List(t.Context(), &list, client.InNamespace(ns)); err != nil || len(list.Items) != 1 {
			return fmt.Sprintf("%d runs %v", len(list.Items), err)
		}
		r := list.Items[0]
		name = r.Name
		if r.Status.StepCount != calls || r.Status.Counts.Succeeded != calls || r.Status.Phase != v1alpha1.RunIdle || len(r.Status.Steps) != v1alpha1.MaxRunSteps {
			return fmt.Sprintf("status: steps %d, succeeded %d, phase %s, listed %d", r.Status.StepCount, r.Status.Counts.Succeeded, r.Status.Phase, len(r.Status.Steps))
		}
		if last := r.Status.Steps[len(r.Status.Steps)-1]; last.Seq != 2*calls-1 {
			return fmt.Sprintf("the last listed step is %d", last.Seq)
		}
		return ""
	})
	ts := writes.of(name)
	rate := float64(calls) / took.Seconds()
	t.Logf("%d calls in %s (%.0f calls/s): %d status writes", calls, took.Round(time.Millisecond), rate, len(ts))
	if rate < 50 {
		t.Fatalf("the agent made only %.0f calls/s: the test needs more than 50 calls in a second", rate)
	}
	span := ts[len(ts)-1].Sub(began)
	if max := int(span/kube.DefaultStatusInterval) + 1; len(ts) > max || len(ts) < 2 {
		t.Errorf("%d status writes over %s, want at most %d (one per second) and more than 1", len(ts), span.Round(time.Millisecond), max)
	}
	// The interval runs from the start of one write to the next; the PUT follows a ledger read
	// whose length varies on a loaded machine, so two PUTs may be somewhat closer.
	for i := 1; i < len(ts); i++ {
		if gap := ts[i].Sub(ts[i-1]); gap < kube.DefaultStatusInterval-250*time.Millisecond {
			t.Errorf("status writes %d and %d only %s apart", i-1, i, gap)
		}
	}
}

// `reversi gateway --kubeconfig --namespace` (the built binary, over stdio, as an agent spawns
// it) mirrors its run as a ReversiRun and executes spec.rollback set with kubectl, with the
// final status written when the agent disconnects.
func TestGatewayCommandMirrorsRuns(t *testing.T) {
	ns := setupNamespace(t, "command")
	f := newFixture(t, ns)
	dir := t.TempDir()
	bin := filepath.Join(dir, "reversi")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/reversi-gitops/reversi").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	mpath := filepath.Join(dir, "m.yaml")
	if err := os.WriteFile(mpath, []byte(upstreams.MemoryRollbackManifests), 0o600); err != nil {
		t.Fatal(err)
	}
	node, args, _ := upstreams.MemoryAt(t, f.graph)
	cfg := fmt.Sprintf("mode: enforce\nactor: %s\nupstreams:\n  - name: mem\n    command: %q\n    args: [%q]\n    env: { MEMORY_FILE_PATH: %q }\n", actor, node, args[0], f.graph)
	cpath := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cpath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "gateway", "--config", cpath, "--manifests", mpath, "--data", f.data, "--kubeconfig", kubeconfigOf(t, actor), "--namespace", ns)
	cmd.Dir, cmd.Env = dir, append(os.Environ(), controllers.ControllerKeysEnv+"="+string(ctlKey.PublicPEM))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("starting reversi gateway: %v\n%s", err, stderr.String())
	}
	before := f.direct(t, "read_graph", map[string]any{})
	call(t, cs, "mem.create_entities", map[string]any{"entities": []any{map[string]any{"name": "gamma", "entityType": "service", "observations": []any{"x"}}}})
	_ = cs.Close() // the agent goes away: the run is Idle, its last status written
	var name string
	waitFor(t, 30*time.Second, func() string {
		var list v1alpha1.ReversiRunList
		if err := env.Client.List(t.Context(), &list, client.InNamespace(ns)); err != nil || len(list.Items) != 1 {
			return fmt.Sprintf("%d runs %v", len(list.Items), err)
		}
		r := list.Items[0]
		name = r.Name
		if r.Status.StepCount != 1 || r.Status.Counts.Succeeded != 1 || r.Status.Phase != v1alpha1.RunIdle || r.Spec.Gateway != proxy.Name {
			return fmt.Sprintf("run %s: spec %+v status %+v", r.Name, r.Spec, r.Status)
		}
		return ""
	})
	// A second gateway process on the same data folder serves the rollback (the first is gone).
	cmd2 := exec.Command(bin, "gateway", "--config", cpath, "--manifests", mpath, "--data", f.data, "--kubeconfig", kubeconfigOf(t, actor), "--namespace", ns)
	cmd2.Dir, cmd2.Env, cmd2.Stderr = dir, cmd.Env, &stderr
	cs2, err := mcp.NewClient(&mcp.Implementation{Name: "idle", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd2}, nil)
	if err != nil {
		t.Fatalf("starting reversi gateway again: %v\n%s", err, stderr.String())
	}
	defer cs2.Close()
	kubectl(t, "ops", "patch", "reversirun", name, "-n", ns, "--type", "merge", "-p", `{"spec":{"rollback":{"confirm":true}}}`)
	waitFor(t, 30*time.Second, func() string {
		rb := run(t, ns, name).Status.Rollback
		if rb == nil || rb.Phase != v1alpha1.RollbackSucceeded || len(rb.Steps) != 1 || rb.Steps[0].Result != "verified" {
			return fmt.Sprintf("status.rollback %+v\n%s", rb, stderr.String())
		}
		return ""
	})
	if after := f.direct(t, "read_graph", map[string]any{}); !reflect.DeepEqual(after, before) {
		t.Errorf("the graph after the rollback differs from before the run:\nbefore %v\nafter  %v", before, after)
	}
}
