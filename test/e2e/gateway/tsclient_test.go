package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/gateway/store"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// tsOutput is what ts-client.mjs prints.
type tsOutput struct {
	Tools  []string `json:"tools"`
	Result *struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		StructuredContent map[string]any `json:"structuredContent"`
		IsError           bool           `json:"isError"`
	} `json:"result"`
}

func (o tsOutput) text() string {
	var parts []string
	for _, c := range o.Result.Content {
		parts = append(parts, c.Text)
	}
	return strings.Join(parts, "\n")
}

// runTS runs ts-client.mjs (the TypeScript SDK's Client, which validates results against the
// tools' output schemas) with args and returns its output, its stderr and whether it failed.
func runTS(t *testing.T, args ...string) (tsOutput, string, error) {
	t.Helper()
	node, script := upstreams.TSClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append(script, args...)...)
	cmd.Dir = t.TempDir()
	cmd.Env = env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var out tsOutput
	if err == nil {
		if jerr := json.Unmarshal(stdout.Bytes(), &out); jerr != nil {
			t.Fatalf("ts-client output %q: %v", stdout.String(), jerr)
		}
	}
	return out, stderr.String(), err
}

// mustTS is runTS that fails the test when the client fails.
func mustTS(t *testing.T, args ...string) tsOutput {
	t.Helper()
	out, stderr, err := runTS(t, args...)
	if err != nil {
		t.Fatalf("ts-client %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	if out.Result == nil && slices.Contains(args, "--call") {
		t.Fatalf("ts-client printed no result")
	}
	return out
}

// checkWeather checks server-everything's get-structured-content result: structuredContent
// that matches the tool's output schema (temperature, conditions, humidity; nothing else),
// unchanged from the upstream (the text block carries the same JSON).
func checkWeather(t *testing.T, out tsOutput) {
	t.Helper()
	r := out.Result
	if r.IsError {
		t.Fatalf("get-structured-content: isError: %s", out.text())
	}
	sc := r.StructuredContent
	_, tok := sc["temperature"].(float64)
	_, cok := sc["conditions"].(string)
	_, hok := sc["humidity"].(float64)
	if !tok || !cok || !hok || len(sc) != 3 {
		t.Fatalf("structuredContent %v does not match get-structured-content's output schema", sc)
	}
	var fromText map[string]any
	if err := json.Unmarshal([]byte(out.text()), &fromText); err != nil || fmt.Sprint(fromText) != fmt.Sprint(sc) {
		t.Fatalf("structuredContent %v differs from the upstream's text %q (%v)", sc, out.text(), err)
	}
}

// TestTSClientStdio: the TypeScript client spawns `reversi gateway` in front of
// server-everything (one upstream from flags: names kept) and lists and calls tools over stdio.
func TestTSClientStdio(t *testing.T) {
	data := t.TempDir()
	node, args, _ := upstreams.Everything(t)
	gw := []string{"--", bins.reversi, "gateway", "--store", "sqlite", "--data", data,
		"--upstream-cmd", node, "--upstream-arg", args[0], "--upstream-arg", args[1]}

	out := mustTS(t, append([]string{"--call", "get-structured-content", "--args", `{"location":"Chicago"}`}, gw...)...)
	for _, want := range []string{"echo", "get-structured-content", "get-sum", "trigger-long-running-operation"} {
		if !slices.Contains(out.Tools, want) {
			t.Errorf("tools %v lack %s", out.Tools, want)
		}
	}
	for _, n := range out.Tools {
		if strings.Contains(n, ".") && !strings.HasPrefix(n, "reversi.") { // the gateway's own tools
			t.Errorf("tool %s is namespaced; one upstream from flags keeps its names", n)
		}
	}
	checkWeather(t, out)

	out = mustTS(t, append([]string{"--call", "get-sum", "--args", `{"a":2,"b":40}`}, gw...)...)
	if out.Result.IsError || !strings.Contains(out.text(), "42") {
		t.Fatalf("get-sum through the gateway: %+v", out.Result)
	}

	// Both calls are in the ledger, each in its own run (one session is one run).
	recs := records(t, openLedger(t, data))
	for _, tool := range []string{"get-structured-content", "get-sum"} {
		if o := outcomes(recs, tool); len(o) != 1 || o[0].Status != store.Succeeded {
			t.Errorf("outcomes of %s: %+v", tool, o)
		}
	}
}

// TestTSClientHTTP: the TypeScript client over Streamable HTTP against a gateway (enforce, with
// manifests) in front of two upstreams, namespaced: server-memory and server-everything.
func TestTSClientHTTP(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	mnode, margs, _ := upstreams.MemoryAt(t, filepath.Join(dir, "graph.jsonl"))
	menv := []string{"MEMORY_FILE_PATH=" + filepath.Join(dir, "graph.jsonl")}
	enode, eargs, eenv := upstreams.Everything(t)
	cfg := fmt.Sprintf("mode: enforce\nactor: ts-agent\nlisten: {host: 127.0.0.1, port: %d}\nupstreams:\n", freePort(t)) +
		upstreamYAML("mem", mnode, margs, menv) + upstreamYAML("ev", enode, eargs, eenv)
	manifests := `
- tool: mem.create_entities
  description: Create entities.
  effect: compensable
  permission: mem:write
  compensation:
    tool: mem.delete_entities
    argument_map:
      entityNames: $result.entities.0.name
- tool: mem.delete_entities
  description: Delete entities.
  effect: irreversible
  permission: mem:write
- tool: mem.read_graph
  description: Read the graph.
  effect: read_only
  permission: mem:read
- tool: ev.get-structured-content
  description: Weather.
  effect: read_only
  permission: ev:read
`
	url, _ := startHTTP(t, bins.reversi, "gateway", "--config", writeFile(t, dir, "gateway.yaml", cfg),
		"--manifests", writeFile(t, dir, "manifests.yaml", manifests), "--store", "sqlite", "--data", data)

	out := mustTS(t, "--url", url, "--call", "mem.create_entities", "--args",
		`{"entities":[{"name":"alice","entityType":"person","observations":["likes tea"]}]}`)
	for _, want := range []string{"mem.create_entities", "mem.read_graph", "ev.echo", "ev.get-structured-content"} {
		if !slices.Contains(out.Tools, want) {
			t.Errorf("tools %v lack %s", out.Tools, want)
		}
	}
	if r := out.Result; r.IsError || fmt.Sprint(r.StructuredContent["entities"]) != "[map[entityType:person name:alice observations:[likes tea]]]" {
		t.Fatalf("mem.create_entities: %+v", r)
	}

	checkWeather(t, mustTS(t, "--url", url, "--call", "ev.get-structured-content", "--args", `{"location":"New York"}`))

	// Enforce: a tool without a manifest is blocked, and the TS client reads the isError result.
	out = mustTS(t, "--url", url, "--call", "ev.echo", "--args", `{"message":"hi"}`)
	if !out.Result.IsError || !strings.HasPrefix(out.text(), engine.BlockedPrefix) {
		t.Fatalf("ev.echo without a manifest in enforce: %+v", out.Result)
	}

	recs := records(t, openLedger(t, data))
	if o := outcomes(recs, "mem.create_entities"); len(o) != 1 || o[0].Status != store.Succeeded ||
		o[0].CompensationTool != "mem.delete_entities" || fmt.Sprint(o[0].Handle) != "map[entityNames:alice]" {
		t.Fatalf("ledger outcome of mem.create_entities: %+v", o)
	}
	if o := outcomes(recs, "ev.echo"); len(o) != 1 || o[0].Status != store.Blocked {
		t.Fatalf("ledger outcome of ev.echo: %+v", o)
	}
}

// TestTSClientOutputSchemas (issue 19): bad-output-server's weather returns structuredContent
// that breaks its own output schema. Directly, the TypeScript client throws on it. Through the
// gateway the breaking structuredContent is dropped (the text stays) and the mismatch journaled;
// with output_schemas: advertise (the default) the schema is listed, so the TypeScript client
// still throws, for the missing structuredContent: the documented case that output_schemas: hide
// is for, under which the client gets the result.
func TestTSClientOutputSchemas(t *testing.T) {
	bnode, bargs, benv := upstreams.BadOutput(t)
	_, direct, err := runTS(t, append([]string{"--call", "weather", "--args", `{"city":"Oslo"}`, "--", bnode}, bargs...)...)
	if err == nil || !strings.Contains(direct, "Structured content does not match the tool's output schema") {
		t.Fatalf("the TS client accepted the broken result without the gateway (err %v):\n%s", err, direct)
	}
	gateway := func(t *testing.T, setting string) (url, data string) {
		dir := t.TempDir()
		data = filepath.Join(dir, "data")
		cfg := fmt.Sprintf("mode: observe\nactor: ts-agent\n%slisten: {host: 127.0.0.1, port: %d}\nupstreams:\n", setting, freePort(t)) +
			upstreamYAML("bad", bnode, bargs, benv)
		url, _ = startHTTP(t, bins.reversi, "gateway", "--config", writeFile(t, dir, "gateway.yaml", cfg), "--store", "sqlite", "--data", data)
		return url, data
	}
	journaled := func(t *testing.T, data string, n int) {
		t.Helper()
		o := outcomes(records(t, openLedger(t, data)), "bad.weather")
		if len(o) != n {
			t.Fatalf("ledger outcomes of bad.weather: %+v, want %d", o, n)
		}
		for _, r := range o {
			if r.Status != store.Succeeded || !strings.Contains(r.Note, "result does not match the tool's output schema") {
				t.Errorf("ledger outcome of bad.weather: %+v", r)
			}
		}
	}

	t.Run("advertise", func(t *testing.T) {
		url, data := gateway(t, "")
		_, stderr, err := runTS(t, "--url", url, "--call", "bad.weather", "--args", `{"city":"Oslo"}`)
		if err == nil || !strings.Contains(stderr, "Tool bad.weather has an output schema but did not return structured content") {
			t.Fatalf("the TS client with the schema advertised (err %v):\n%s", err, stderr)
		}
		// A client that does not validate (go-sdk's) sees what the gateway sent: the text only.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "go-sdk", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		res := call(t, cs, "bad.weather", map[string]any{"city": "Oslo"})
		if tc, ok := res.Content[0].(*mcp.TextContent); res.IsError || res.StructuredContent != nil || !ok || tc.Text != "weather in Oslo: warm" {
			t.Fatalf("bad.weather through the gateway: %+v", res)
		}
		journaled(t, data, 2)
	})

	t.Run("hide", func(t *testing.T) {
		url, data := gateway(t, "output_schemas: hide\n")
		out := mustTS(t, "--url", url, "--call", "bad.weather", "--args", `{"city":"Oslo"}`)
		if r := out.Result; r.IsError || r.StructuredContent != nil || out.text() != "weather in Oslo: warm" {
			t.Fatalf("bad.weather through the gateway: %+v", r)
		}
		journaled(t, data, 1)
	})
}
