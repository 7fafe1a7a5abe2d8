package runs

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/reversi-gitops/reversi/api/v1alpha1"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/kube"
	"github.com/reversi-gitops/reversi/gateway/proxy"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/internal/testenv"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// stdioGateway is f.gateway for an agent that names its run (--run-id); it returns the
// gateway and its inner store.
func (f *fixture) stdioGateway(t *testing.T, runID string) (*proxy.Gateway, store.Store) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigOf(t, actor))
	if err != nil {
		t.Fatal(err)
	}
	st := store.NewMemory(nil)
	var stderr bytes.Buffer
	runs, err := kube.NewRuns(t.Context(), st, kube.RunsOptions{Config: cfg, Namespace: f.ns, Gateway: "agents", Replica: "a", Stderr: &stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = runs.Close() })
	node, args, _ := upstreams.MemoryAt(t, f.graph)
	u := config.Upstream{Name: "mem", Command: node, Args: args, Env: upstreams.RecordMetaEnv(t, f.metaLog, ""), Namespace: true}
	u.Env["MEMORY_FILE_PATH"] = f.graph
	gw, err := proxy.New(t.Context(), proxy.Options{Store: runs, Manifests: f.ms, Stderr: &stderr, RunID: runID,
		Config: &config.Gateway{Mode: config.ModeEnforce, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
			Actor: actor, Upstreams: []config.Upstream{u}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	runs.Attach(gw)
	return gw, st
}

func callText(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) (string, bool) {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String(), res.IsError
}

// Run ids belong to one gateway (issue 16): an agent naming the run id of a ReversiRun that
// another gateway owns (its spec.gateway, or a reversi.dev/created-by that is not this
// gateway's identity) is refused with "the run <id> belongs to another gateway", nothing of
// the run opens in this gateway's store, the refusal is in the gateway journal, and the
// object's status is not written. A new run id is claimed by creating its ReversiRun.
func TestRunIDOfAnotherGateway(t *testing.T) {
	ns := setupNamespace(t, "owners")
	f := newFixture(t, ns)
	foreign := []*v1alpha1.ReversiRun{
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "run-other"}, Spec: v1alpha1.ReversiRunSpec{Actor: "agent-1", Gateway: "other"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "run-stamped", Annotations: map[string]string{v1alpha1.AnnotationCreatedBy: "system:serviceaccount:" + ns + ":other-gateway"}},
			Spec: v1alpha1.ReversiRunSpec{Actor: "agent-1", Gateway: "agents"}},
	}
	// Admission refuses these objects (issue 16); the gateway's own check is tested as if
	// the webhook configurations were gone when they were made.
	testenv.WithoutAdmission(t, env.Client, ns, func() {
		for _, r := range foreign {
			if err := env.Client.Create(t.Context(), r); err != nil {
				t.Fatal(err)
			}
		}
	})
	for _, r := range foreign {
		gw, st := f.stdioGateway(t, r.Name)
		text, isErr := callText(t, session(t, gw), "mem.read_graph", map[string]any{})
		want := "the run " + r.Name + " belongs to another gateway"
		if !isErr || !strings.Contains(text, want) {
			t.Fatalf("%s: isError %v %q, want %q", r.Name, isErr, text, want)
		}
		if _, err := st.GetRun(t.Context(), r.Name); err == nil {
			t.Errorf("%s was opened in the gateway's store", r.Name)
		}
		recs, _ := st.Records(t.Context(), store.GatewayJournal, 0, 0)
		if len(recs) == 0 || !strings.Contains(recs[len(recs)-1].Note, want) {
			t.Errorf("%s: the gateway journal %+v", r.Name, recs)
		}
		time.Sleep(1500 * time.Millisecond) // a status write would be due by now
		if got := run(t, ns, r.Name); got.Status.Phase != "" || got.Status.StepCount != 0 {
			t.Errorf("%s: the other gateway's status was written: %+v", r.Name, got.Status)
		}
	}
	// A fresh id is claimed before the run opens.
	gw, _ := f.stdioGateway(t, "run-mine")
	if text, isErr := callText(t, session(t, gw), "mem.read_graph", map[string]any{}); isErr {
		t.Fatalf("run-mine: %s", text)
	}
	if r := run(t, ns, "run-mine"); r.Spec.Gateway != "agents" || r.Spec.Actor != actor {
		t.Fatalf("run-mine: %+v", r.Spec)
	}
}

// A ReversiRun whose reversi.dev/created-by is not this gateway's identity is never rolled
// back by it, even for a run in its store (issue 16: "only A's replicas execute A's
// rollbacks").
func TestRollbackOfAnotherGatewaysRunIsNotExecuted(t *testing.T) {
	ns := setupNamespace(t, "foreign-rollback")
	f := newFixture(t, ns)
	gw, _ := f.gateway(t, "a", nil)
	name := agentRun(t, f, gw)
	r := run(t, ns, name)
	patch := client.MergeFrom(r.DeepCopy())
	r.Annotations = map[string]string{v1alpha1.AnnotationCreatedBy: "system:serviceaccount:" + ns + ":other-gateway"}
	r.Spec.Rollback = &v1alpha1.RunRollback{Confirm: true}
	testenv.WithoutAdmission(t, env.Client, ns, func() { // admission keeps created-by as it was (issue 16)
		if err := env.Client.Patch(t.Context(), r, patch); err != nil {
			t.Fatal(err)
		}
	})
	time.Sleep(3 * time.Second)
	if n := f.compensations(t); len(n) != 0 {
		t.Fatalf("compensations ran for another gateway's ReversiRun: %v", n)
	}
	if rb := run(t, ns, name).Status.Rollback; rb != nil {
		t.Fatalf("status.rollback written: %+v", rb)
	}
}
