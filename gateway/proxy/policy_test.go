package proxy

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	dto "github.com/prometheus/client_model/go"

	"github.com/reversi-gitops/reversi/api/manifest"
	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/pkg/policy"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// policyFixtures is test/fixtures/policy: issue 21's four rules and the manifests they are
// written against.
var policyFixtures = filepath.Join("..", "..", "test", "fixtures", "policy")

// policyConfig fronts server-memory ("memory") and two tools servers ("stripe": refund and
// get_charge; "mail": send), so that every tool of the fixtures is an upstream tool.
func policyConfig(t *testing.T, mode config.Mode) *config.Gateway {
	t.Helper()
	cfg := memoryConfig(t, mode)
	cfg.Deny = nil
	cfg.Upstreams[0].Env["MEMORY_FILE_PATH"] = filepath.Join(t.TempDir(), "memory.jsonl")
	bin := upstreams.Tools(t)
	cfg.Upstreams = append(cfg.Upstreams,
		config.Upstream{Name: "stripe", Command: bin, Args: []string{"refund", "get_charge"}, Env: map[string]string{}, Namespace: true},
		config.Upstream{Name: "mail", Command: bin, Args: []string{"send"}, Env: map[string]string{}, Namespace: true})
	return cfg
}

func policyFixtureManifests(t *testing.T) []*manifest.Manifest {
	t.Helper()
	docs, errs := manifest.ReadPaths(filepath.Join(policyFixtures, "manifests"))
	ms, verrs := manifest.ValidateDocuments(docs)
	if errs = append(errs, verrs...); len(errs) > 0 {
		t.Fatal(errs)
	}
	return ms
}

// policyGW is a gateway enforcing the fixtures at a fixed time, with its store.
type policyGW struct {
	gw *Gateway
	st *store.SQLite
}

func startPolicyGateway(t *testing.T, cfg *config.Gateway, env string, now time.Time, stdin io.Reader, stdout io.Writer) *policyGW {
	t.Helper()
	set, errs := policy.Load(filepath.Join(policyFixtures, "policy"))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	// One clock for the gateway and its store: the store checks a request's expiry (the
	// gateway's now plus the policy's timeout) against its own now.
	clock := func() time.Time { return now }
	st, err := store.OpenSQLite(t.TempDir(), clock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gw, err := New(ctx, Options{Config: cfg, Manifests: policyFixtureManifests(t), Policy: set, Environment: env,
		Now: clock, Store: st, Stdin: stdin, Stdout: stdout, Stderr: &syncBuffer{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	return &policyGW{gw: gw, st: st}
}

// stdioPolicyClient serves a policy gateway on pipes (MCP over stdio, as `reversi gateway`
// without listen) and connects a go-sdk client to them.
func stdioPolicyClient(t *testing.T, mode config.Mode, env string, now time.Time) (*policyGW, *mcp.ClientSession) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	p := startPolicyGateway(t, policyConfig(t, mode), env, now, inR, outW)
	served := make(chan error, 1)
	go func() { served <- p.gw.Serve(context.Background()); _ = outW.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.Close()
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Error("the stdio gateway did not stop after its client left")
		}
	})
	return p, cs
}

// httpPolicyClient serves a policy gateway over Streamable HTTP on 127.0.0.1 and connects a
// go-sdk client to its agent endpoint.
func httpPolicyClient(t *testing.T, mode config.Mode, env string, now time.Time) (*policyGW, *mcp.ClientSession) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := policyConfig(t, mode)
	cfg.Listen = &config.Listen{Host: "127.0.0.1", Port: ln.Addr().(*net.TCPAddr).Port}
	p := startPolicyGateway(t, cfg, env, now, nil, nil)
	url := serveOn(t, p.gw, ln) + PathAgent
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return p, cs
}

var policyFriday = time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)

// outcomes are the statuses and notes of tool's outcomes in the gateway's one run.
func outcomes(t *testing.T, st store.Store, tool string) (status []store.Status, notes []string) {
	t.Helper()
	_, recs := onlyRun(t, st)
	for _, s := range stepsOf(recs, tool) {
		status, notes = append(status, s[1].Status), append(notes, s[1].Note)
	}
	return status, notes
}

// The four rules of issue 21, each enforced by the gateway over stdio and over HTTP against
// real upstreams: a large refund waits for finance and the CFO (the merged quorum and timeout
// on the request), an irreversible call on a Friday in prod is refused with its reason, a
// card number is blocked where a non-Luhn number passes, and the sixth deletion of a run is
// blocked. Each refusal is journaled blocked with the rule that fired.
func TestPolicyEnforcedOverStdioAndHTTP(t *testing.T) {
	for name, connect := range map[string]func(*testing.T, config.Mode, string, time.Time) (*policyGW, *mcp.ClientSession){
		"stdio": stdioPolicyClient, "http": httpPolicyClient} {
		t.Run(name, func(t *testing.T) {
			p, cs := connect(t, config.ModeEnforce, "prod", policyFriday)
			ctx := context.Background()

			// (a) A refund over 1,000: finance and the CFO, two approvals, within 15 minutes.
			res := call(t, cs, "stripe.refund", map[string]any{"charge_id": "ch_1", "amount": 1500})
			if !res.IsError || !strings.Contains(texts(res)[0], "requires approval: request ") {
				t.Fatalf("large refund: %q", texts(res))
			}
			reqs, err := p.st.ListApprovals(ctx, store.ApprovalFilter{})
			if err != nil || len(reqs) != 1 {
				t.Fatalf("approvals %+v %v", reqs, err)
			}
			if a := reqs[0]; !slices.Equal(a.Roles, []string{"finance", "cfo"}) || a.Quorum != 2 ||
				!a.Expires.Equal(policyFriday.Add(15*time.Minute)) || !strings.Contains(a.Reason, "refunds over 1,000 need the CFO") {
				t.Fatalf("request %+v", a)
			}

			// (b) Friday, prod: the irreversible e-mail is refused with the rule's reason.
			res = call(t, cs, "mail.send", map[string]any{"to": "customer@example.com", "subject": "Your refund"})
			if want := "Blocked by Reversi: no irreversible call in prod on a Friday"; !res.IsError || !strings.HasPrefix(texts(res)[0], want) {
				t.Fatalf("friday: %q", texts(res))
			}

			// (c) A card number is blocked; a number failing the Luhn check passes.
			obs := func(text string) map[string]any {
				return map[string]any{"observations": []any{map[string]any{"entityName": "alice", "contents": []any{text}}}}
			}
			if res := call(t, cs, "memory.create_entities", map[string]any{"entities": []any{map[string]any{"name": "alice", "entityType": "person", "observations": []any{}}}}); res.IsError {
				t.Fatalf("create: %q", texts(res))
			}
			if res := call(t, cs, "memory.add_observations", obs("pays with 4111 1111 1111 1111")); !res.IsError || !strings.Contains(texts(res)[0], "card number") {
				t.Fatalf("card: %q", texts(res))
			}
			if res := call(t, cs, "memory.add_observations", obs("order 4111 1111 1111 1112")); res.IsError {
				t.Fatalf("not a card: %q", texts(res))
			}

			// (d) Five deletions pass, the sixth is blocked.
			for i := range 6 {
				res := call(t, cs, "memory.delete_observations", map[string]any{"deletions": []any{map[string]any{"entityName": "alice", "observations": []any{"x"}}}})
				switch {
				case i < 5 && res.IsError:
					t.Fatalf("deletion %d: %q", i+1, texts(res))
				case i == 5 && (!res.IsError || !strings.Contains(texts(res)[0], "at most 5 calls of rule deletions/at-most-5-deletions-per-run per run")):
					t.Fatalf("sixth deletion: %q", texts(res))
				}
			}

			if run, _ := onlyRun(t, p.st); run.Environment != "prod" {
				t.Fatalf("the run was not recorded in its environment: %+v", run)
			}
			// Metrics: the policy's time per call, and the rules that fired by effect.
			var h, c dto.Metric
			if err := p.gw.metrics.policyTime.Write(&h); err != nil || h.GetHistogram().GetSampleCount() < 10 {
				t.Fatalf("policy_evaluation_seconds: %v %v", h.GetHistogram(), err)
			}
			if err := p.gw.metrics.policyRules.WithLabelValues("deletions/at-most-5-deletions-per-run", "limit").Write(&c); err != nil || c.GetCounter().GetValue() != 1 {
				t.Fatalf("policy_rules_fired_total for the limit: %v %v", c.GetCounter(), err)
			}
			status, notes := outcomes(t, p.st, "mail.send")
			if !slices.Equal(status, []store.Status{store.Blocked}) || !strings.Contains(notes[0], "policy change-freeze/no-irreversible-on-friday-in-prod: deny") {
				t.Fatalf("mail.send journaled %v %q", status, notes)
			}
			status, _ = outcomes(t, p.st, "memory.delete_observations")
			if want := []store.Status{store.Succeeded, store.Succeeded, store.Succeeded, store.Succeeded, store.Succeeded, store.Blocked}; !slices.Equal(status, want) {
				t.Fatalf("deletions journaled %v", status)
			}
		})
	}
}

// In advise and observe a policy denial does not block: the call runs and is journaled
// would_block with the rule's reason, as for manifest rules.
func TestPolicyWouldBlockInAdviseAndObserve(t *testing.T) {
	for _, mode := range []config.Mode{config.ModeAdvise, config.ModeObserve} {
		t.Run(string(mode), func(t *testing.T) {
			p, cs := stdioPolicyClient(t, mode, "prod", policyFriday)
			res := call(t, cs, "mail.send", map[string]any{"to": "customer@example.com"})
			if res.IsError {
				t.Fatalf("%s blocked: %q", mode, texts(res))
			}
			if advisory := slices.ContainsFunc(texts(res), func(s string) bool { return strings.Contains(s, "Friday") }); advisory != (mode == config.ModeAdvise) {
				t.Fatalf("advisory text %v in %s: %q", advisory, mode, texts(res))
			}
			_, recs := onlyRun(t, p.st)
			steps := stepsOf(recs, "mail.send")
			if len(steps) != 1 || steps[0][0].Decision != "would_block" || steps[0][1].Status != store.Succeeded || !strings.Contains(steps[0][1].Note, "would_block: ") ||
				!strings.Contains(steps[0][1].Note, "on a Friday") {
				t.Fatalf("journal %+v", steps)
			}
		})
	}
}

// reversi.reload returns the policy set's checksum; a policy that no longer compiles is
// refused and the previous one keeps serving.
func TestPolicyReload(t *testing.T) {
	dir := t.TempDir()
	good, err := os.ReadFile(filepath.Join(policyFixtures, "policy", "content.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "content.yaml")
	if err := os.WriteFile(file, good, 0o600); err != nil {
		t.Fatal(err)
	}
	ms := policyFixtureManifests(t)
	load := func(context.Context) (Loaded, error) {
		set, errs := policy.Load(dir)
		if len(errs) > 0 {
			return Loaded{}, errs[0]
		}
		return Loaded{Manifests: ms, Policy: set}, nil
	}
	initial, _ := load(context.Background())
	st, err := store.OpenSQLite(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	gw, err := New(context.Background(), Options{Config: policyConfig(t, config.ModeEnforce), Manifests: ms, Policy: initial.Policy, Load: load, Store: st, Stderr: &syncBuffer{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	f := &fixture{gw: gw, store: st}
	cs := f.client(t)
	card := map[string]any{"query": "4111 1111 1111 1111"}
	if res := call(t, cs, "memory.search_nodes", card); !res.IsError {
		t.Fatal("the card number passed")
	}
	if r := gw.Reload(context.Background()); r.Changed || r.PolicyChecksum != initial.Policy.Checksum() || r.PolicyChecksum == "" {
		t.Fatalf("unchanged reload: %+v", r)
	}
	broken := strings.Replace(string(good), "has_card_number(args)", "has_card_number(args", 1)
	if err := os.WriteFile(file, []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := gw.Reload(context.Background()); r.Err == nil || !strings.Contains(r.Err.Error(), "content.yaml:") || r.PolicyChecksum != initial.Policy.Checksum() {
		t.Fatalf("broken reload: %+v", r)
	}
	if res := call(t, cs, "memory.search_nodes", card); !res.IsError {
		t.Fatal("the card number passed after a refused reload")
	}
	if err := os.WriteFile(file, []byte("policy: content\nrules:\n  - name: note-only\n    effect: advise\n    reason: looked at\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := gw.Reload(context.Background()); !r.Changed || r.Err != nil || r.PolicyChecksum == initial.Policy.Checksum() {
		t.Fatalf("changed reload: %+v", r)
	}
	if res := call(t, cs, "memory.search_nodes", card); res.IsError {
		t.Fatalf("after the rule was removed: %q", texts(res))
	}
	// An emptied policy folder loads as no policy: the reload says so in the journal.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if r := gw.Reload(context.Background()); !r.Changed || r.Err != nil || r.PolicyChecksum != "" {
		t.Fatalf("emptied reload: %+v", r)
	}
	recs, err := st.Records(context.Background(), store.GatewayJournal, 0, 0)
	if err != nil || len(recs) == 0 || !strings.Contains(recs[len(recs)-1].Note, "policy removed (was ") {
		t.Fatalf("journal %+v %v", recs, err)
	}
}

// A policy reading environment on a gateway given none warns at start.
func TestPolicyEnvironmentUnsetWarns(t *testing.T) {
	set, errs := policy.Load(filepath.Join(policyFixtures, "policy"))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for env, want := range map[string]bool{"": true, "prod": false} {
		st := store.NewMemory(nil)
		errw := &syncBuffer{}
		gw, err := New(context.Background(), Options{Config: policyConfig(t, config.ModeEnforce), Policy: set, Environment: env, Store: st, Stderr: errw})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(errw.String(), EnvironmentUnsetWarning); got != want {
			t.Errorf("environment %q: warned %v, want %v:\n%s", env, got, want, errw)
		}
		_ = gw.Close()
		_ = st.Close()
	}
}

// The `run` variable is read whole from the store for every call a rule reading it matches:
// a run past MaxPolicyRecords records is refused (the rule then denies) instead of read, so a
// long run cannot make every call cost its whole journal. Intents are folded into steps with
// their outcomes' statuses.
func TestRunStepsIsBounded(t *testing.T) {
	ctx := context.Background()
	st := store.NewMemory(nil)
	defer st.Close()
	g := &Gateway{store: st}
	if steps, err := g.runSteps(ctx, "no-such-run"); err != nil || steps != nil {
		t.Fatalf("a run's first call: %v %v", steps, err)
	}
	run, err := st.CreateRun(ctx, store.Run{Actor: "a", Gateway: "gw"})
	if err != nil {
		t.Fatal(err)
	}
	step, err := st.RecordIntent(ctx, store.Intent{Run: run.ID, Tool: "memory.delete_entities", Mode: "enforce", Decision: "allow"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.RecordOutcome(ctx, run.ID, step, store.StepOutcome{Status: store.Succeeded}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RecordIntent(ctx, store.Intent{Run: run.ID, Tool: "memory.read_graph", Mode: "enforce", Decision: "allow"}); err != nil {
		t.Fatal(err)
	}
	steps, err := g.runSteps(ctx, run.ID)
	want := []policy.Step{{Tool: "memory.delete_entities", Status: "succeeded"}, {Tool: "memory.read_graph", Status: "in_flight"}}
	if err != nil || !slices.Equal(steps, want) {
		t.Fatalf("steps %v %v, want %v", steps, err, want)
	}
	for i := 4; i <= MaxPolicyRecords; i++ { // three records so far
		if _, err := st.AppendEvent(ctx, store.Event{Run: run.ID, Kind: store.KindNote, Note: "n"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.runSteps(ctx, run.ID); err != nil {
		t.Fatalf("a run of exactly MaxPolicyRecords records: %v", err)
	}
	if _, err := st.AppendEvent(ctx, store.Event{Run: run.ID, Kind: store.KindNote, Note: "n"}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.runSteps(ctx, run.ID); err == nil || !strings.Contains(err.Error(), "more than 20000 records") {
		t.Fatalf("a run past the bound: %v", err)
	}
}
