package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/config"
	"github.com/reversi-gitops/reversi/gateway/store"
)

// relayUpstream is a go-sdk MCP server over Streamable HTTP on loopback (a real server, issue
// 19) whose tool "work" reports progress on the caller's token, logs to the caller's session,
// asks the caller's client to sample, and answers with what the client sampled; it also offers
// prompts, resources and a template.
func relayUpstream(t *testing.T) string {
	t.Helper()
	s := mcp.NewServer(&mcp.Implementation{Name: "relay-up", Version: "1"}, &mcp.ServerOptions{
		SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { return nil },
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
		CompletionHandler: func(_ context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
			return &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: []string{req.Params.Ref.Name + ":" + req.Params.Argument.Value}}}, nil
		},
	})
	s.AddTool(&mcp.Tool{Name: "work", InputSchema: map[string]any{"type": "object", "properties": map[string]any{"who": map[string]any{"type": "string"}}}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			who := strings.Trim(string(req.Params.Arguments), "{}")
			if tok := req.Params.GetProgressToken(); tok != nil {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Total: 2, Message: "progress of " + who})
			}
			_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: "log of " + who})
			res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10,
				Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "sample for " + who}}}})
			if err != nil {
				return nil, err
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sampled " + res.Content.(*mcp.TextContent).Text}}}, nil
		})
	for _, name := range []string{"greet", "secret"} {
		s.AddPrompt(&mcp.Prompt{Name: name, Arguments: []*mcp.PromptArgument{{Name: "who"}}}, func(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: name + " " + req.Params.Arguments["who"]}}}}, nil
		})
	}
	for _, uri := range []string{"res://open/a", "res://secret/b"} {
		s.AddResource(&mcp.Resource{URI: uri, Name: uri}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, Text: "content of " + uri}}}, nil
		})
	}
	s.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "res://items/{id}", Name: "item"}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: "item " + req.Params.URI}}}, nil
	})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)
	return srv.URL
}

// relayAgent is an agent client of the gateway (in memory) that answers sampling with its own
// name and keeps what it received.
type relayAgent struct {
	name string
	cs   *mcp.ClientSession

	mu       sync.Mutex
	progress []string
	logs     []string
	sampled  []string
}

func (a *relayAgent) seen() (progress, logs, sampled []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.progress), slices.Clone(a.logs), slices.Clone(a.sampled)
}

func connectRelayAgent(t *testing.T, gw *Gateway, name string) *relayAgent {
	t.Helper()
	a := &relayAgent{name: name}
	ct, stt := mcp.NewInMemoryTransports()
	ss, err := gw.Server().Connect(context.Background(), stt, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			a.mu.Lock()
			a.progress = append(a.progress, fmt.Sprintf("%v %s", req.Params.ProgressToken, req.Params.Message))
			a.mu.Unlock()
		},
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			a.mu.Lock()
			a.logs = append(a.logs, fmt.Sprint(req.Params.Data))
			a.mu.Unlock()
		},
		CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			text := req.Params.Messages[0].Content.(*mcp.TextContent).Text
			a.mu.Lock()
			a.sampled = append(a.sampled, text)
			a.mu.Unlock()
			return &mcp.CreateMessageResult{Role: "assistant", Model: name, Content: &mcp.TextContent{Text: "answer of " + name}}, nil
		},
	})
	// 2025-11-25: the protocol the relay of server-to-client requests serves (2026-07-28
	// sessions get input requests instead, SEP-2322).
	cs, err := c.Connect(context.Background(), ct, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	if err := cs.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
		t.Fatal(err)
	}
	a.cs = cs
	return a
}

func relayConfig(url string, session config.SessionMode) *config.Gateway {
	return &config.Gateway{Mode: config.ModeObserve, UnclassifiedReads: config.UnclassifiedBlock, ValidateSchemas: true,
		Actor: "dev-laptop", Upstreams: []config.Upstream{{Name: "up", URL: url, Namespace: true, Session: session}},
		Deny: []string{"up.secret", "res://secret/*"}}
}

// TestRelayPerClientIsolation (issue 19 acceptance): two agents on one HTTP upstream with
// per_client sessions, calling at the same time: each gets only its own progress (with its own
// token), its own logs and its own sampling request, and the upstream gets each agent's answer.
func TestRelayPerClientIsolation(t *testing.T) {
	f := startWith(t, relayConfig(relayUpstream(t), config.SessionPerClient), Options{})
	agents := []*relayAgent{connectRelayAgent(t, f.gw, "alice"), connectRelayAgent(t, f.gw, "bob")}
	var wg sync.WaitGroup
	results := make([]string, len(agents))
	for i, a := range agents {
		wg.Go(func() {
			res, err := a.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "up.work", Arguments: map[string]any{"who": a.name},
				Meta: mcp.Meta{"progressToken": "tok-" + a.name}})
			if err != nil {
				t.Errorf("%s: %v", a.name, err)
				return
			}
			results[i] = strings.Join(texts(res), " ")
		})
	}
	wg.Wait()
	for i, a := range agents {
		if want := "sampled answer of " + a.name; results[i] != want {
			t.Errorf("%s got %q, want %q: the upstream must get this agent's sampling answer", a.name, results[i], want)
		}
		// The log can trail the result (notifications are not ordered with responses).
		deadline := time.Now().Add(5 * time.Second)
		for _, logs, _ := a.seen(); len(logs) == 0 && time.Now().Before(deadline); _, logs, _ = a.seen() {
			time.Sleep(10 * time.Millisecond)
		}
		progress, logs, sampled := a.seen()
		who := fmt.Sprintf(`"who":"%s"`, a.name)
		if want := []string{"tok-" + a.name + " progress of " + who}; !slices.Equal(progress, want) {
			t.Errorf("%s progress %q, want %q", a.name, progress, want)
		}
		if want := []string{"log of " + who}; !slices.Equal(logs, want) {
			t.Errorf("%s logs %q, want %q", a.name, logs, want)
		}
		if want := []string{"sample for " + who}; !slices.Equal(sampled, want) {
			t.Errorf("%s sampling requests %q, want %q", a.name, sampled, want)
		}
	}
	// The sampling request is journaled in the agent's run, with the step of its call.
	runs, err := f.store.ListRuns(context.Background(), store.RunFilter{})
	if err != nil || len(runs) != 2 {
		t.Fatalf("runs %v %v, want one per agent", runs, err)
	}
	for _, run := range runs {
		recs, err := f.store.Records(context.Background(), run.ID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		var intent, sreq *store.Record
		for i := range recs {
			switch recs[i].Kind {
			case store.KindIntent:
				intent = &recs[i]
			case store.KindServerRequest:
				sreq = &recs[i]
			}
		}
		if intent == nil || sreq == nil || sreq.Step != intent.Step || sreq.Reason != "sampling/createMessage" || sreq.Tool != "up" ||
			sreq.Note != "answered" || sreq.ArgsDigest == "" {
			t.Errorf("run %s: intent %+v, server request %+v; want sampling/createMessage of upstream up journaled with the call's step", run.ID, intent, sreq)
		}
	}
}

// TestRelaySharedRefusesAmbiguousRequests: on a shared upstream session, a sampling request
// while one agent's call is in flight goes to that agent; the gateway never guesses between
// two (the refusal names session: per_client).
func TestRelaySharedRefusesAmbiguousRequests(t *testing.T) {
	f := startWith(t, relayConfig(relayUpstream(t), config.SessionShared), Options{})
	alice, bob := connectRelayAgent(t, f.gw, "alice"), connectRelayAgent(t, f.gw, "bob")
	res, err := alice.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "up.work", Arguments: map[string]any{"who": "alice"}})
	if err != nil || strings.Join(texts(res), "") != "sampled answer of alice" {
		t.Fatalf("one call in flight on the shared session: %v %v", texts(res), err)
	}
	// Two requests in flight on the shared session (noted as the call path notes them): a
	// request of the upstream then has no one agent to go to.
	up := f.gw.upstreams[0]
	fa := f.gw.begin(context.Background(), nil, up, 1, nil)
	fb := f.gw.begin(context.Background(), nil, up, 2, nil)
	defer fa.end()
	defer fb.end()
	if _, _, err := f.gw.target(up, nil, up.owner(), "sampling/createMessage"); err == nil || !strings.Contains(err.Error(), "set session: per_client") {
		t.Fatalf("two requests in flight on a shared session: %v, want a refusal naming session: per_client", err)
	}
	if _, _, sampled := bob.seen(); len(sampled) != 0 {
		t.Errorf("bob got alice's sampling request: %q", sampled)
	}
}

// TestRelayGovernance (issue 19): allow/deny apply to exposed prompt names and resource URIs;
// prompts are namespaced; reads are journaled in the agent's run (blocked ones too, with the
// reason), with the prompt's arguments as a digest.
func TestRelayGovernance(t *testing.T) {
	f := startWith(t, relayConfig(relayUpstream(t), ""), Options{})
	a := connectRelayAgent(t, f.gw, "alice")
	ctx := context.Background()
	// The union of the upstreams' capabilities is declared (tools always).
	c := a.cs.InitializeResult().Capabilities
	if c.Tools == nil || c.Prompts == nil || c.Resources == nil || !c.Resources.Subscribe || c.Completions == nil || c.Logging == nil {
		t.Errorf("capabilities %+v, want tools, prompts, resources with subscribe, completions and logging", c)
	}

	prompts, err := a.cs.ListPrompts(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range prompts.Prompts {
		names = append(names, p.Name)
	}
	if !slices.Equal(names, []string{"up.greet"}) {
		t.Errorf("prompts %v, want only up.greet (up.secret is denied)", names)
	}
	got, err := a.cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "up.greet", Arguments: map[string]string{"who": "ann"}})
	if err != nil || got.Messages[0].Content.(*mcp.TextContent).Text != "greet ann" {
		t.Fatalf("prompts/get up.greet: %v %v", got, err)
	}
	if _, err := a.cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "up.secret"}); err == nil || !strings.Contains(err.Error(), `Blocked by Reversi: up.secret is denied by the gateway's deny rule "up.secret"`) {
		t.Errorf("prompts/get of a denied prompt: %v", err)
	}

	resources, err := a.cs.ListResources(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var uris []string
	for _, r := range resources.Resources {
		uris = append(uris, r.URI)
	}
	if !slices.Equal(uris, []string{"res://open/a"}) {
		t.Errorf("resources %v, want only res://open/a", uris)
	}
	for uri, want := range map[string]string{"res://open/a": "content of res://open/a", "res://items/7": "item res://items/7"} {
		rr, err := a.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil || rr.Contents[0].Text != want {
			t.Errorf("resources/read %s: %v %v", uri, rr, err)
		}
	}
	for _, call := range []func() error{
		func() error {
			_, err := a.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "res://secret/b"})
			return err
		},
		func() error { return a.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "res://secret/b"}) },
	} {
		if err := call(); err == nil || !strings.Contains(err.Error(), "Blocked by Reversi: res://secret/b is denied") {
			t.Errorf("a denied resource: %v", err)
		}
	}
	done, err := a.cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "up.greet"}, Argument: mcp.CompleteParamsArgument{Name: "who", Value: "a"}})
	if err != nil || !slices.Equal(done.Completion.Values, []string{"greet:a"}) {
		t.Errorf("completion of up.greet goes upstream under its own name greet: %v %v", done, err)
	}

	runs, err := f.store.ListRuns(ctx, store.RunFilter{})
	if err != nil || len(runs) != 1 {
		t.Fatalf("runs %v %v", runs, err)
	}
	recs, err := f.store.Records(ctx, runs[0].ID, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var reads []string
	for _, r := range recs {
		if r.Kind == store.KindRead {
			reads = append(reads, fmt.Sprintf("%s %s %s digest=%v", r.Reason, r.Tool, r.Decision, r.ArgsDigest != ""))
		}
	}
	slices.Sort(reads)
	want := []string{
		"prompts/get up.greet allow digest=true",
		"prompts/get up.secret block digest=false",
		"resources/read res://items/7 allow digest=false",
		"resources/read res://open/a allow digest=false",
		"resources/read res://secret/b block digest=false",
	}
	if !slices.Equal(reads, want) {
		t.Errorf("read records:\n%s\nwant:\n%s", strings.Join(reads, "\n"), strings.Join(want, "\n"))
	}
	// Reads are not steps: the run has no outcome.
	if counts, _ := f.store.CountOutcomes(ctx, []string{runs[0].ID}); len(counts[runs[0].ID]) != 0 {
		t.Errorf("reads counted as outcomes: %v", counts)
	}
}

// TestRelayCapabilitiesFollowUpstreams: an upstream without prompts, resources, completions or
// logging gives the agent none of them (only tools): the gateway declares the union, nothing more.
func TestRelayCapabilitiesFollowUpstreams(t *testing.T) {
	s := mcp.NewServer(&mcp.Implementation{Name: "tools-only", Version: "1"}, &mcp.ServerOptions{Capabilities: &mcp.ServerCapabilities{}})
	s.AddTool(&mcp.Tool{Name: "t", InputSchema: map[string]any{"type": "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
	})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)
	f := startWith(t, relayConfig(srv.URL, ""), Options{})
	a := connectRelayAgent(t, f.gw, "alice")
	c := a.cs.InitializeResult().Capabilities
	if c.Tools == nil || c.Prompts != nil || c.Resources != nil || c.Completions != nil || c.Logging != nil {
		t.Errorf("capabilities %+v, want tools only", c)
	}
}

// TestRelayKnowsAgentsFromInitialized: an agent that has only initialized is among the agents
// the gateway announces to (list changes, a shared upstream's logs).
func TestRelayKnowsAgentsFromInitialized(t *testing.T) {
	f := startWith(t, relayConfig(relayUpstream(t), ""), Options{})
	ct, stt := mcp.NewInMemoryTransports()
	ss, err := f.gw.Server().Connect(context.Background(), stt, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "quiet", Version: "1"}, nil).Connect(context.Background(), ct, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	deadline := time.Now().Add(5 * time.Second)
	for len(f.gw.agentList()) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("agents %d after an initialized session, want 1", len(f.gw.agentList()))
		}
		time.Sleep(5 * time.Millisecond)
	}
}
