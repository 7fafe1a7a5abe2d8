package gateway

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/reversi-gitops/reversi/gateway/engine"
	"github.com/reversi-gitops/reversi/test/upstreams"
)

// Issue 19: the whole MCP protocol through the `reversi gateway` process, proved with the same
// real clients that work against server-everything directly (test/upstreams TestTSRelayDirect,
// TestConformanceDirect). Each test runs its client direct first: a feature or check that fails
// direct is the harness's problem (the test stops), one that fails only through the gateway is
// the gateway's loss (the test fails listing it).

// relayGateway starts `reversi gateway` (store memory) listening on 127.0.0.1 in mode, in front
// of the Streamable HTTP upstream "everything" at url, with namespace (false exposes the
// upstream's names as they are) and manifests (YAML; none when empty). It returns the gateway's
// /mcp URL.
func relayGateway(t *testing.T, url, mode string, namespace bool, manifests string) string {
	t.Helper()
	dir := t.TempDir()
	u := fmt.Sprintf("%q", url)
	cfg := fmt.Sprintf("mode: %s\nactor: relay-agent\nlisten: {host: 127.0.0.1, port: %d}\nupstreams:\n  - name: everything\n    url: %s\n    namespace: %t\n",
		mode, freePort(t), u, namespace)
	args := []string{"gateway", "--config", writeFile(t, dir, "gateway.yaml", cfg), "--store", "memory"}
	if manifests != "" {
		args = append(args, "--manifests", writeFile(t, dir, "manifests.yaml", manifests))
	}
	gw, _ := startHTTP(t, bins.reversi, args...)
	return gw
}

// TestRelayTSClient: ts-relay.mjs (the TypeScript SDK client) against server-everything through
// the gateway in observe mode, the upstream namespaced "everything": every feature that works
// direct works through the gateway (resources and templates listed and read, a subscription's
// updates, prompts, completions, log level and messages, progress, the upstream's sampling and
// elicitation requests answered by the agent, roots, cancellation reaching the upstream).
func TestRelayTSClient(t *testing.T) {
	ev := upstreams.StartEverythingHTTP(t)
	direct := upstreams.RunTSRelay(t, ev.URL, "")
	if lost := direct.Lost(); len(lost) > 0 {
		t.Fatalf("ts-relay fails against server-everything directly (the harness, not the gateway):\n  %s", strings.Join(lost, "\n  "))
	}
	if err := upstreams.CancelReached(ev.Received(t)); err != nil {
		t.Fatalf("direct: %v", err)
	}
	seen := len(ev.Received(t))

	gw := relayGateway(t, ev.URL, "observe", true, "")
	through := upstreams.RunTSRelay(t, gw, "everything.")
	var b strings.Builder
	upstreams.TSRelayTable(&b, []string{"direct", "gateway"}, direct, through)
	t.Logf("ts-relay, direct and through the gateway:\n%s", b.String())

	lost := through.Lost()
	if err := upstreams.CancelReached(ev.Received(t)[seen:]); err != nil {
		lost = append(lost, "cancel (upstream side): "+err.Error())
	}
	if len(lost) > 0 {
		t.Errorf("through the gateway, %d of the %d features that work direct are lost:\n  %s\nclient errors: %q",
			len(lost), len(upstreams.TSRelayFeatures), strings.Join(lost, "\n  "), through.Errors)
	}
}

// enforceManifests are reviewed manifests for two of server-everything's tools (not namespaced).
// The conformance suite calls none of server-everything's tools (only its own test_* tools,
// which no manifest describes), so in enforce mode its calls are blocked; the checks that pass
// direct must still pass.
const enforceManifests = `
- tool: echo
  description: Echo a message back.
  effect: read_only
  permission: everything:read
- tool: get-sum
  description: Add two numbers.
  effect: read_only
  permission: everything:read
`

// TestConformanceThroughGateway runs the conformance suite's server scenarios against
// server-everything over Streamable HTTP directly, then through the gateway (upstream with
// `namespace: false`, since the suite calls tools and prompts by their own names) in observe
// mode without manifests and in enforce mode with reviewed manifests, prints the
// scenario/check table, and fails listing every check that passes direct but not through the
// gateway (issue 19's first acceptance criterion).
func TestConformanceThroughGateway(t *testing.T) {
	ev := upstreams.StartEverythingHTTP(t)
	dir := t.TempDir()
	direct := upstreams.RunConformance(t, ev.URL, filepath.Join(dir, "direct"))
	if len(upstreams.PassingChecks(direct)) == 0 {
		t.Fatalf("no check passes against server-everything directly (the harness, not the gateway): %v", direct)
	}

	observe := relayGateway(t, ev.URL, "observe", false, "")
	enforce := relayGateway(t, ev.URL, "enforce", false, enforceManifests)
	// Enforce is in force: a reviewed tool runs, another is blocked.
	cs := connectHTTP(t, enforce)
	if res := call(t, cs, "echo", map[string]any{"message": "reviewed"}); res.IsError || !strings.Contains(text(res), "reviewed") {
		t.Fatalf("echo (reviewed) in enforce: %s", text(res))
	}
	if res := call(t, cs, "get-env", map[string]any{}); !res.IsError || !strings.HasPrefix(text(res), engine.BlockedPrefix) {
		t.Fatalf("get-env (no manifest) in enforce: %s, want %q", text(res), engine.BlockedPrefix)
	}
	_ = cs.Close()

	obs := upstreams.RunConformance(t, observe, filepath.Join(dir, "observe"))
	enf := upstreams.RunConformance(t, enforce, filepath.Join(dir, "enforce"))
	var b strings.Builder
	lost := upstreams.CompareConformance(&b, upstreams.ConformanceRun{Name: "direct", Checks: direct},
		upstreams.ConformanceRun{Name: "observe", Checks: obs}, upstreams.ConformanceRun{Name: "enforce", Checks: enf})
	t.Logf("conformance server scenarios against server-everything (! marks a check lost through the gateway):\n%s", b.String())
	if len(lost) > 0 {
		lines := make([]string, len(lost))
		for i, l := range lost {
			lines[i] = l.String()
		}
		t.Errorf("%d checks pass direct but not through the gateway:\n  %s", len(lost), strings.Join(lines, "\n  "))
	}
}
